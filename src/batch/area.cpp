// Exact area of slope-0/1 trapezoids, without visiting rows.
//
// With slopes restricted to {0, 1}, the minimum of the upper bounds is min(U0, U1 + r) (U0 the
// smallest constant, U1 the smallest offset of the diagonal bounds) and the maximum of the lower
// bounds is max(L0, L1 + r). Each has at most one kink, so [r0, r1) splits into at most three
// runs on which the width is affine with slope -1, 0 or +1; the positive part of an affine run
// is an arithmetic series.
#include "dcp/detail/area.h"

#include <algorithm>
#include <array>

#include "dcp/error.h"

namespace dcp {
namespace {

// The envelope of a set of bounds of slopes 0 and 1: `has0`/`has1` say which classes exist.
struct Envelope {
  bool has0 = false;
  bool has1 = false;
  int64_t c0 = 0;  // constant bound (min for uppers, max for lowers)
  int64_t c1 = 0;  // offset of the diagonal bound
};

// The tightest bound of each slope: `pick` is std::min for upper bounds, std::max for lower ones.
template <class Pick>
Envelope envelope(std::span<const AffineBound> bounds, Pick pick) {
  Envelope e;
  for (const AffineBound& b : bounds) {
    DCP_ASSERT(b.slope == 0 || b.slope == 1);
    if (b.slope == 0) {
      e.c0 = e.has0 ? pick(e.c0, b.c) : b.c;
      e.has0 = true;
    } else {
      e.c1 = e.has1 ? pick(e.c1, b.c) : b.c;
      e.has1 = true;
    }
  }
  return e;
}

Envelope upper_envelope(std::span<const AffineBound> bounds) {
  return envelope(bounds, [](int64_t a, int64_t b) { return std::min(a, b); });
}

Envelope lower_envelope(std::span<const AffineBound> bounds) {
  return envelope(bounds, [](int64_t a, int64_t b) { return std::max(a, b); });
}

// Sum over t in [0, n) of max(0, f + s*t), s in {-1, 0, 1}.
int64_t positive_series(int64_t f, int64_t s, int64_t n) {
  if (n <= 0) return 0;
  if (s == 0) return f > 0 ? f * n : 0;
  if (s > 0) {
    const int64_t t0 = f >= 1 ? 0 : 1 - f;  // first t with f + t >= 1
    if (t0 >= n) return 0;
    const int64_t count = n - t0;
    const int64_t first = f + t0;
    return count * first + count * (count - 1) / 2;
  }
  const int64_t count = std::min(n, std::max<int64_t>(0, f));  // t < f
  return count * f - count * (count - 1) / 2;
}

int64_t envelope_area(int64_t r0, int64_t r1, const Envelope& lo, const Envelope& hi) {
  if (r0 >= r1) return 0;
  DCP_ASSERT((lo.has0 || lo.has1) && (hi.has0 || hi.has1));
  // Kinks: the diagonal upper bound stops being the minimum after r = U0 - U1; the diagonal
  // lower bound becomes the maximum from r = L0 - L1 on.
  std::array<int64_t, 4> cuts{r0, r1, r1, r1};
  int num_cuts = 2;
  if (hi.has0 && hi.has1) cuts[num_cuts++] = std::clamp(hi.c0 - hi.c1, r0, r1);
  if (lo.has0 && lo.has1) cuts[num_cuts++] = std::clamp(lo.c0 - lo.c1, r0, r1);
  std::sort(cuts.begin(), cuts.begin() + num_cuts);
  int64_t total = 0;
  for (int k = 0; k + 1 < num_cuts; ++k) {
    const int64_t a = cuts[static_cast<size_t>(k)];
    const int64_t b = cuts[static_cast<size_t>(k) + 1];
    if (a >= b) continue;
    // On a tie at r = a the bound that wins for r > a is chosen.
    const bool hi_diag = hi.has1 && (!hi.has0 || hi.c1 + a < hi.c0);
    const bool lo_diag = lo.has1 && (!lo.has0 || lo.c1 + a >= lo.c0);
    const int64_t u = hi_diag ? hi.c1 + a : hi.c0;
    const int64_t l = lo_diag ? lo.c1 + a : lo.c0;
    const int64_t slope = (hi_diag ? 1 : 0) - (lo_diag ? 1 : 0);
    total += positive_series(u - l, slope, b - a);
  }
  return total;
}

void add_bound(Envelope& e, AffineBound b, bool upper) {
  DCP_ASSERT(b.slope == 0 || b.slope == 1);
  int64_t& c = b.slope == 0 ? e.c0 : e.c1;
  bool& has = b.slope == 0 ? e.has0 : e.has1;
  c = !has ? b.c : (upper ? std::min(c, b.c) : std::max(c, b.c));
  has = true;
}

}  // namespace

int64_t affine_area(int64_t r0, int64_t r1, std::span<const AffineBound> lowers,
                    std::span<const AffineBound> uppers) {
  return envelope_area(r0, r1, lower_envelope(lowers), upper_envelope(uppers));
}

int64_t piece_area(const MaskPiece& piece, int64_t q0, int64_t q1, int64_t k0, int64_t k1) {
  const int64_t r0 = std::max(q0, piece.row_begin);
  const int64_t r1 = std::min(q1, piece.row_end);
  if (r0 >= r1 || k0 >= k1) return 0;
  Envelope lo;
  Envelope hi;
  add_bound(lo, piece.lo, false);
  add_bound(lo, {k0, 0}, false);
  add_bound(hi, piece.hi, true);
  add_bound(hi, {k1, 0}, true);
  return envelope_area(r0, r1, lo, hi);
}

int64_t piece_area_causal(const MaskPiece& piece, int64_t q0, int64_t n) {
  const int64_t r0 = std::max(q0, piece.row_begin);
  const int64_t r1 = std::min(q0 + n, piece.row_end);
  if (r0 >= r1) return 0;
  Envelope lo;
  Envelope hi;
  add_bound(lo, piece.lo, false);
  add_bound(lo, {q0, 0}, false);
  add_bound(hi, piece.hi, true);
  add_bound(hi, {1, 1}, true);  // keys <= row; also below q0 + n on these rows
  return envelope_area(r0, r1, lo, hi);
}

}  // namespace dcp
