// Exact areas of slope-0/1 trapezoids against per-row loops.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "blocks/brute.h"
#include "dcp/detail/area.h"

namespace dcp {
namespace {

using test::Rng;

int64_t loop_area(int64_t r0, int64_t r1, const std::vector<AffineBound>& lo, const std::vector<AffineBound>& hi) {
  int64_t total = 0;
  for (int64_t r = r0; r < r1; ++r) {
    int64_t l = lo.front().at(r);
    int64_t u = hi.front().at(r);
    for (const AffineBound& b : lo) l = std::max(l, b.at(r));
    for (const AffineBound& b : hi) u = std::min(u, b.at(r));
    total += std::max<int64_t>(0, u - l);
  }
  return total;
}

std::vector<AffineBound> random_bounds(Rng& rng, int64_t max_count) {
  std::vector<AffineBound> out(static_cast<size_t>(rng.uniform(1, max_count)));
  for (AffineBound& b : out) b = {rng.uniform(-300, 300), rng.uniform(0, 1)};
  return out;
}

TEST(Area, AffineAreaMatchesRowLoop) {
  Rng rng(0xa4ea0002);
  for (int rep = 0; rep < 20000; ++rep) {
    const int64_t r0 = rng.uniform(-100, 200);
    const int64_t r1 = r0 + rng.uniform(-2, 250);
    const std::vector<AffineBound> lo = random_bounds(rng, 4);
    const std::vector<AffineBound> hi = random_bounds(rng, 4);
    ASSERT_EQ(affine_area(r0, r1, lo, hi), loop_area(r0, r1, lo, hi)) << "rep " << rep;
  }
}

TEST(Area, PieceAreasMatchRowLoop) {
  Rng rng(0xa4ea0003);
  for (int rep = 0; rep < 20000; ++rep) {
    MaskPiece p;
    p.row_begin = rng.uniform(0, 200);
    p.row_end = p.row_begin + rng.uniform(1, 200);
    p.lo = {rng.uniform(-200, 200), rng.uniform(0, 1)};
    p.hi = {rng.uniform(-200, 300), rng.uniform(0, 1)};
    const int64_t q0 = rng.uniform(0, 300);
    const int64_t q1 = q0 + rng.uniform(0, 150);
    const int64_t k0 = rng.uniform(-50, 300);
    const int64_t k1 = k0 + rng.uniform(0, 150);
    int64_t want = 0;
    int64_t want_causal = 0;
    for (int64_t r = std::max(q0, p.row_begin); r < std::min(q1, p.row_end); ++r) {
      want += std::max<int64_t>(0, std::min(p.hi.at(r), k1) - std::max(p.lo.at(r), k0));
    }
    const int64_t n = q1 - q0;
    for (int64_t r = std::max(q0, p.row_begin); r < std::min(q0 + n, p.row_end); ++r) {
      want_causal += std::max<int64_t>(0, std::min({p.hi.at(r), r + 1, q0 + n}) - std::max(p.lo.at(r), q0));
    }
    ASSERT_EQ(piece_area(p, q0, q1, k0, k1), want) << "rep " << rep;
    ASSERT_EQ(piece_area_causal(p, q0, n), want_causal) << "rep " << rep;
  }
}

TEST(Area, LargeCoordinatesStayExact) {
  // A causal triangle of 2^20 rows: n(n+1)/2, computed without visiting rows.
  const int64_t n = int64_t{1} << 20;
  const MaskPiece causal{0, n, {0, 0}, {1, 1}};
  EXPECT_EQ(piece_area(causal, 0, n, 0, n), n * (n + 1) / 2);
  EXPECT_EQ(piece_area_causal(causal, 0, n), n * (n + 1) / 2);
  // Window of w keys: rows [w, n) see exactly w keys.
  const int64_t w = 4096;
  const MaskPiece window{w, n, {1 - w, 1}, {1, 1}};
  EXPECT_EQ(piece_area(window, 0, n, 0, n), (n - w) * w);
}

}  // namespace
}  // namespace dcp
