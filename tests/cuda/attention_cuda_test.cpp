// GPU tests of the CUDA attention kernels against the fp64 reference (skipped without a GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "dcp/detail/attention_cuda.h"
#include "dcp/error.h"

#include "attention_cuda_check.h"

namespace {

using dcp::cuda::check::CaseConfig;

struct Shape {
  int hq, hkv, dim;
};

class CudaAttention : public ::testing::TestWithParam<Shape> {};

// A random tile list of shape s, both passes through `route`.
CaseConfig shape_case(const Shape& s, uint64_t seed, dcp::cuda::AttnKernelRoute route) {
  CaseConfig cfg;
  cfg.seed = seed + static_cast<uint64_t>(s.hkv * 10 + s.dim);
  cfg.num_q_heads = s.hq;
  cfg.num_kv_heads = s.hkv;
  cfg.head_dim = s.dim;
  cfg.forward_route = route;
  cfg.backward_route = route;
  return cfg;
}

// Every route the device has (mma; on sm_90 wgmma and wgmma-basic), forward and backward alike.
TEST_P(CudaAttention, MatchesFp64ReferenceOnRandomTileLists) {
  if (!dcp::cuda::check::gpu_available()) GTEST_SKIP() << "no CUDA GPU on this machine";
  const Shape s = GetParam();
  for (const dcp::cuda::AttnKernelRoute route : dcp::cuda::check::kernel_routes()) {
    for (uint64_t seed = 1; seed <= 2; ++seed) {
      const CaseConfig cfg = shape_case(s, seed * 1000, route);
      const auto r = dcp::cuda::check::run_case(cfg);
      ASSERT_TRUE(r.ran);
      EXPECT_TRUE(dcp::cuda::check::passed(r)) << dcp::cuda::check::describe(cfg, r);
      EXPECT_GT(r.num_empty_rows, 0) << "the random lists are meant to contain fully masked rows";
    }
  }
}

// The deterministic backward (Hopper, route wgmma), every method (two passes; one pass with dQ
// rounded to per-row units, over the key blocks' units or, ordered, over the default work with
// both kernels): against fp64 like the default, and four runs bitwise identical.
// Lists of up to 8 blocks of up to 420 tokens, so that dQ rows meet the tiles of many key blocks
// and head groups, and full and short sub-tiles both occur; units of one tile and of a few, so
// that several items take turns at the same dK / dV rows.
TEST_P(CudaAttention, DeterministicBackwardRepeatsBitwise) {
  if (!dcp::cuda::check::gpu_available()) GTEST_SKIP() << "no CUDA GPU on this machine";
  const auto routes = dcp::cuda::check::kernel_routes();
  if (std::find(routes.begin(), routes.end(), dcp::cuda::AttnKernelRoute::Wgmma) == routes.end())
    GTEST_SKIP() << "the deterministic backward needs an sm_90 device";
  const Shape s = GetParam();
  for (const int method : {0, 1, 2}) {
    const bool fused = method > 0;
    const char* name = method == 0 ? "two passes: " : method == 1 ? "one pass:   " : "ordered:    ";
    for (uint64_t seed = 1; seed <= 3; ++seed) {
      CaseConfig cfg = shape_case(s, seed * 7919, dcp::cuda::AttnKernelRoute::Wgmma);
      cfg.num_blocks = seed == 1 ? 5 : seed == 2 ? 8 : 6;
      cfg.max_block_len = seed == 1 ? 160 : seed == 2 ? 300 : 420;
      cfg.deterministic_backward = true;
      cfg.det_unit_rows = seed == 2 ? 1 : seed == 3 ? 600 : 0;  // cut units: dK/dV in turns
      cfg.det_fused = fused;
      cfg.det_ordered = method == 2;
      const auto r = dcp::cuda::check::run_case(cfg);
      ASSERT_TRUE(r.ran);
      EXPECT_TRUE(dcp::cuda::check::passed(r)) << name << dcp::cuda::check::describe(cfg, r);
      std::printf("%s %s\n", name, dcp::cuda::check::describe(cfg, r).c_str());
    }
  }
}

// Targeted forward scenarios (full, causal, partial with many ranges and empty rows, multi-tile
// items with accumulate; odd lengths) through every route, per element against fp64.
TEST(CudaAttentionForward, TargetedScenariosEveryRoute) {
  if (!dcp::cuda::check::gpu_available()) GTEST_SKIP() << "no CUDA GPU on this machine";
  for (const dcp::cuda::AttnKernelRoute route : dcp::cuda::check::kernel_routes()) {
    for (const auto& c : dcp::cuda::check::forward_cases(route)) {
      const auto r = dcp::cuda::check::run_forward_case(c);
      ASSERT_TRUE(r.ran);
      EXPECT_TRUE(dcp::cuda::check::passed(r)) << dcp::cuda::check::describe(c, r);
    }
  }
}

// Targeted backward scenarios (full, causal, partial with many ranges and empty rows, multi-tile
// lists sharing keys and q rows with explicit operand rows; odd lengths; outputs that start
// non-zero; tiles of kAttnHeadMajorRows rows, whose first keys sum over thousands of rows)
// through every route, per element against fp64.
TEST(CudaAttentionBackward, TargetedScenariosEveryRoute) {
  if (!dcp::cuda::check::gpu_available()) GTEST_SKIP() << "no CUDA GPU on this machine";
  for (const dcp::cuda::AttnKernelRoute route : dcp::cuda::check::kernel_routes()) {
    int empty_rows = 0;
    for (const auto& c : dcp::cuda::check::backward_cases(route)) {
      const auto r = dcp::cuda::check::run_backward_case(c);
      ASSERT_TRUE(r.ran);
      EXPECT_TRUE(dcp::cuda::check::passed(r)) << dcp::cuda::check::describe(c, r);
      empty_rows += r.num_empty_rows;
    }
    EXPECT_GT(empty_rows, 0) << "the partial scenarios are meant to contain rows with no key";
  }
}

// GQA 1, 4 and 8 at head dims 64 and 128.
INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttention,
                         ::testing::Values(Shape{8, 8, 64}, Shape{8, 2, 64}, Shape{8, 1, 64}, Shape{8, 8, 128},
                                           Shape{8, 2, 128}, Shape{8, 1, 128}),
                         [](const ::testing::TestParamInfo<Shape>& param_info) {
                           const Shape& s = param_info.param;
                           return "gqa" + std::to_string(s.hq / s.hkv) + "_d" + std::to_string(s.dim);
                         });

}  // namespace

// Host-side parts (run without a GPU): work lists, validation, mask-area FLOPs.
namespace {

using dcp::cuda::AttnShape;
using dcp::cuda::AttnTile;
using dcp::cuda::TileKind;

TEST(CudaAttentionHost, WorkListsCoverEveryChunkAndHead) {
  const AttnShape shape{8, 2, 128, 0.088F};
  std::vector<AttnTile> tiles(2);
  tiles[0].q_len = 300;  // 3 forward chunks of 128 rows
  tiles[0].kv_len = 200;  // 2 backward chunks of 128 keys
  tiles[0].kind = TileKind::CausalDiagonal;
  tiles[0].kv_head_end = 2;
  tiles[1].q_len = 128;
  tiles[1].kv_len = 129;
  tiles[1].kv_head_begin = 1;  // head group: kv head 1, q heads 4..7
  tiles[1].kv_head_end = 2;
  const auto fwd = dcp::cuda::make_forward_work(tiles, shape);
  ASSERT_EQ(fwd.size(), 3U * 8U + 1U * 4U);
  EXPECT_EQ(fwd.front().chunk, 2) << "causal chunks are issued longest first";
  for (std::size_t i = 24; i < fwd.size(); ++i) EXPECT_GE(fwd[i].head, 4);
  const auto bwd = dcp::cuda::make_backward_work(tiles, shape);
  ASSERT_EQ(bwd.size(), 2U * 2U + 2U * 1U);
  EXPECT_EQ(bwd.back().head, 1);
}

TEST(CudaAttentionHost, WideBackwardItemsComeFirstInOrder) {
  const AttnShape shape{8, 2, 128, 0.088F};
  std::vector<AttnTile> tiles(3);
  tiles[0].q_len = 256;  // causal diagonal: 64-row kernel
  tiles[0].kv_len = 256;
  tiles[0].kind = TileKind::CausalDiagonal;
  tiles[0].kv_head_end = 2;
  tiles[1].q_len = 300;  // Full, 333 keys: chunks 0 and 1 are full (wide), chunk 2 holds 77 keys
  tiles[1].kv_len = 333;
  tiles[1].kind = TileKind::Full;
  tiles[1].kv_head_end = 2;
  tiles[2].q_len = 64;  // Full, one full chunk
  tiles[2].kv_len = 128;
  tiles[2].kind = TileKind::Full;
  tiles[2].kv_head_end = 2;
  const std::vector<dcp::cuda::AttnWorkItem> before = dcp::cuda::make_backward_work(tiles, shape);
  std::vector<dcp::cuda::AttnWorkItem> work = before;
  const int32_t wide = dcp::cuda::partition_backward_work(work, tiles, shape, 0);
  ASSERT_EQ(wide, 2 * 2 + 1 * 2);
  ASSERT_EQ(work.size(), before.size());
  auto is_wide = [&](const dcp::cuda::AttnWorkItem& w) { return w.tile != 0 && !(w.tile == 1 && w.chunk == 2); };
  auto key = [](const dcp::cuda::AttnWorkItem& w) { return std::tuple(w.tile, w.chunk, w.head); };
  std::vector<std::tuple<int, int, int>> expect;
  for (const auto& w : before)
    if (is_wide(w)) expect.push_back(key(w));
  for (const auto& w : before)
    if (!is_wide(w)) expect.push_back(key(w));
  for (std::size_t i = 0; i < work.size(); ++i) EXPECT_EQ(key(work[i]), expect[i]) << "item " << i;
  // Head dim 64 has no wide kernel: nothing moves.
  std::vector<dcp::cuda::AttnWorkItem> work64 = before;
  EXPECT_EQ(dcp::cuda::partition_backward_work(work64, tiles, AttnShape{8, 2, 64, 0.125F}, 0), 0);
  for (std::size_t i = 0; i < work64.size(); ++i) EXPECT_EQ(key(work64[i]), key(before[i]));
  // Tiles shorter than the floor stay in the 64-row kernel: here only tile 1's 300 rows reach 256.
  std::vector<dcp::cuda::AttnWorkItem> floored = before;
  EXPECT_EQ(dcp::cuda::partition_backward_work(floored, tiles, shape, 256), 2 * 2);
  EXPECT_EQ(dcp::cuda::partition_backward_work(floored, tiles, shape), 0) << "every tile is below the default floor";
  // An item naming a tile outside the list is refused.
  work64.front().tile = 7;
  EXPECT_THROW(dcp::cuda::partition_backward_work(work64, tiles, shape, 0), dcp::Error);
}

// The wide kernel's steps cover a tile's rows in order without gaps or overlaps, take as many
// steps as ceil(q_len / 80), and on a length that is a multiple of 16 (at least 256) are all full
// boxes (80 or 64 rows), the 80-row ones first.
TEST(CudaAttentionHost, WideBackwardStepsTileTheRows) {
  for (int32_t q_len = 1; q_len <= 9000; ++q_len) {
    const dcp::cuda::WideBackwardSteps w = dcp::cuda::wide_backward_steps(q_len);
    ASSERT_EQ(w.per_head, (q_len + 79) / 80) << "q_len " << q_len;
    ASSERT_GE(w.n80, 0) << "q_len " << q_len;
    ASSERT_LE(w.n80, w.per_head) << "q_len " << q_len;
    int32_t covered = 0;
    int32_t short_steps = 0;
    for (int32_t s = 0; s < w.per_head; ++s) {
      ASSERT_EQ(w.row0(s), covered) << "q_len " << q_len << " step " << s;
      const int32_t rows = w.rows(s, q_len);
      ASSERT_GE(rows, 1) << "q_len " << q_len << " step " << s;
      ASSERT_LE(rows, s < w.n80 ? 80 : 64) << "q_len " << q_len << " step " << s;
      if (rows != 80 && rows != 64) ++short_steps;
      covered += rows;
    }
    ASSERT_EQ(covered, q_len) << "q_len " << q_len;
    if (q_len % 16 == 0 && q_len >= 256) {
      EXPECT_EQ(short_steps, 0) << "q_len " << q_len;
      EXPECT_LE(w.per_head - w.n80, 4) << "q_len " << q_len;
    } else {
      EXPECT_LE(short_steps, 1) << "q_len " << q_len;
    }
  }
  // The block sizes in use: 1024 = 12 x 80 + 64, 2048 = 24 x 80 + 2 x 64, 4096 = 48 x 80 + 4 x 64.
  EXPECT_EQ(dcp::cuda::wide_backward_steps(1024).n80, 12);
  EXPECT_EQ(dcp::cuda::wide_backward_steps(2048).n80, 24);
  EXPECT_EQ(dcp::cuda::wide_backward_steps(4096).n80, 48);
  EXPECT_EQ(dcp::cuda::wide_backward_steps(4096).per_head, 52);
}

TEST(CudaAttentionHost, RejectsBadShapesAndTiles) {
  std::vector<AttnTile> tiles(1);
  tiles[0].q_len = 10;
  tiles[0].kv_len = 10;
  tiles[0].kv_head_end = 1;
  EXPECT_THROW(dcp::cuda::make_forward_work(tiles, AttnShape{8, 2, 96, 0.1F}), dcp::Error);
  EXPECT_THROW(dcp::cuda::make_forward_work(tiles, AttnShape{6, 4, 64, 0.1F}), dcp::Error);
  tiles[0].kv_head_end = 3;
  EXPECT_THROW(dcp::cuda::make_backward_work(tiles, AttnShape{8, 2, 64, 0.1F}), dcp::Error);
}

TEST(CudaAttentionHost, MaskAreaFlops) {
  const AttnShape shape{4, 1, 64, 0.125F};
  std::vector<AttnTile> tiles(3);
  for (auto& t : tiles) {
    t.q_len = 10;
    t.kv_len = 10;
    t.kv_head_end = 1;
  }
  tiles[1].kind = TileKind::CausalDiagonal;
  tiles[2].kind = TileKind::Partial;
  std::vector<int32_t> offsets(11);
  std::vector<int32_t> ranges;
  for (int i = 0; i < 10; ++i) {  // row i: keys [0, 2) and [5, 5 + i), clipped to 10
    offsets[static_cast<std::size_t>(i)] = static_cast<int32_t>(ranges.size() / 2);
    ranges.insert(ranges.end(), {0, 2, 5, 5 + i});
  }
  offsets[10] = static_cast<int32_t>(ranges.size() / 2);
  double partial_area = 0;
  for (int i = 0; i < 10; ++i) partial_area += 2 + std::min(i, 5);
  const double per_area = 4.0 * 64 * 4;
  EXPECT_DOUBLE_EQ(dcp::cuda::attention_forward_flops(tiles, shape, offsets, ranges),
                   per_area * (100 + 55 + partial_area));
}

}  // namespace
