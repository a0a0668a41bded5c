// Host tests of make_forward_run_work (no GPU needed): every (run, 128-row chunk, q head) is one
// item, which names its run's first tile, tile count and accumulate flag; runs come heaviest first
// with ties in list order, each chunk by chunk or, when its K and V are large, kv head by kv head;
// bad runs are refused with a message.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "check_util.h"
#include "dcp/detail/attention_cuda.h"
#include "dcp/error.h"

namespace {

using dcp::cuda::AttnRun;
using dcp::cuda::AttnShape;
using dcp::cuda::AttnTile;
using dcp::cuda::AttnWorkItem;
using dcp::cuda::TileKind;
constexpr int kChunk = dcp::cuda::kAttnForwardChunkRows;

AttnTile tile(int q_begin, int q_len, int kv_begin, int kv_len, TileKind kind) {
  AttnTile t = dcp::cuda::check::tile_of(q_begin, q_len, kv_begin, kv_len, kind, 0, 2);
  t.out_begin = q_begin;  // tiles of a run share their output rows
  return t;
}

// Cost of a run as the order promises it: keys, half of a causal diagonal tile's.
double run_cost(const std::vector<AttnTile>& tiles, const AttnRun& r) {
  double cost = 0;
  for (int i = r.first; i < r.first + r.count; ++i)
    cost += tiles[static_cast<size_t>(i)].kv_len * (tiles[static_cast<size_t>(i)].kind == TileKind::CausalDiagonal ? 0.5 : 1.0);
  return cost;
}

TEST(ForwardRunWork, EveryChunkAndHeadOnceHeaviestRunsFirst) {
  dcp::cuda::check::Rng rng(7);
  const AttnShape shape{8, 2, 128, 0.1F};
  for (int trial = 0; trial < 20; ++trial) {
    // Runs of one to four tiles of a q block each; some runs of equal cost (ties keep list order).
    std::vector<AttnTile> tiles;
    std::vector<AttnRun> runs;
    const int num_runs = rng.uniform_int(1, 12);
    for (int r = 0; r < num_runs; ++r) {
      const int q_len = rng.uniform_int(1, 700);
      const int count = rng.uniform_int(1, 4);
      const int q_begin = 1000 * r;
      runs.push_back(AttnRun{static_cast<int32_t>(tiles.size()), count, rng.uniform_int(0, 1) == 0});
      for (int k = 0; k < count; ++k) {
        const TileKind kind = k == count - 1 && rng.uniform_int(0, 1) == 0 ? TileKind::CausalDiagonal : TileKind::Full;
        const int kv_len = trial % 3 == 0 ? 512 : 64 * rng.uniform_int(1, 16);
        tiles.push_back(tile(q_begin, q_len, 512 * k, kind == TileKind::CausalDiagonal ? q_len : kv_len, kind));
      }
    }
    const std::vector<AttnWorkItem> work = dcp::cuda::make_forward_run_work(tiles, runs, shape);

    std::map<std::tuple<int, int, int>, int> seen;  // (run's first tile, chunk, head) -> items
    std::map<int, size_t> run_at;                   // first tile -> run
    for (size_t r = 0; r < runs.size(); ++r) run_at[runs[r].first] = r;
    std::vector<size_t> order;  // runs in the order their first item appears
    for (const AttnWorkItem& w : work) {
      ASSERT_TRUE(run_at.count(w.tile)) << "item of tile " << w.tile << ", which begins no run";
      const AttnRun& run = runs[run_at[w.tile]];
      EXPECT_EQ(w.num_tiles, run.count);
      EXPECT_EQ(w.accumulate, run.accumulate ? 1 : 0);
      EXPECT_GE(w.head, 0);
      EXPECT_LT(w.head, shape.num_q_heads);
      EXPECT_LT(w.chunk * kChunk, tiles[static_cast<size_t>(w.tile)].q_len);
      ++seen[{w.tile, w.chunk, w.head}];
      if (order.empty() || order.back() != run_at[w.tile]) order.push_back(run_at[w.tile]);
    }
    size_t expected = 0;
    for (const AttnRun& r : runs) {
      const int chunks = (tiles[static_cast<size_t>(r.first)].q_len + kChunk - 1) / kChunk;
      expected += static_cast<size_t>(chunks) * shape.num_q_heads;
      for (int c = 0; c < chunks; ++c)
        for (int h = 0; h < shape.num_q_heads; ++h) EXPECT_EQ((seen[{r.first, c, h}]), 1) << "run at " << r.first;
    }
    EXPECT_EQ(work.size(), expected);
    // A run's items are contiguous, and the runs come heaviest first, ties in list order.
    ASSERT_EQ(order.size(), runs.size());
    for (size_t i = 1; i < order.size(); ++i) {
      const double a = run_cost(tiles, runs[order[i - 1]]), b = run_cost(tiles, runs[order[i]]);
      EXPECT_TRUE(a > b || (a == b && order[i - 1] < order[i])) << "run " << order[i - 1] << " before " << order[i];
    }
  }
}

// Inside a run: chunk by chunk (every q head of a chunk together) while the run's K and V over all
// kv heads stay within kAttnForwardHeadMajorBytes, kv head by kv head above it (each chunk's q heads
// of that kv head together).
TEST(ForwardRunWork, KvHeadMajorOnlyForRunsWhoseKvExceedsTheBound) {
  const AttnShape shape{8, 2, 128, 0.1F};  // 4 q heads a kv head
  const double bytes_per_key = 2.0 * shape.num_kv_heads * shape.head_dim * 2.0;
  const int bound_keys = static_cast<int>(dcp::cuda::kAttnForwardHeadMajorBytes / bytes_per_key);
  for (const int keys : {bound_keys, bound_keys + 1, 3 * bound_keys}) {
    // A run of two Full tiles of 384 q rows (3 chunks) reading `keys` keys in all.
    const std::vector<AttnTile> tiles{tile(0, 384, 0, keys / 2, TileKind::Full),
                                      tile(0, 384, keys / 2, keys - keys / 2, TileKind::Full)};
    const std::vector<AttnWorkItem> work =
        dcp::cuda::make_forward_run_work(tiles, std::vector<AttnRun>{{0, 2, false}}, shape);
    ASSERT_EQ(work.size(), 3u * 8u);
    const bool head_major = keys * bytes_per_key > dcp::cuda::kAttnForwardHeadMajorBytes;
    for (size_t i = 0; i < work.size(); ++i) {
      const int n = static_cast<int>(i);
      const int chunk = head_major ? (n / 4) % 3 : n / 8;
      const int head = head_major ? (n / 12) * 4 + n % 4 : n % 8;
      EXPECT_EQ(work[i].chunk, chunk) << "item " << i << " of a run of " << keys << " keys";
      EXPECT_EQ(work[i].head, head) << "item " << i << " of a run of " << keys << " keys";
    }
  }
}

TEST(ForwardRunWork, RefusesBadRuns) {
  const AttnShape shape{8, 2, 128, 0.1F};
  const std::vector<AttnTile> tiles{tile(0, 256, 0, 256, TileKind::Full), tile(0, 256, 256, 256, TileKind::Full),
                                    tile(256, 256, 0, 256, TileKind::Full)};
  auto refuses = [&](std::vector<AttnRun> runs, const std::string& words) {
    try {
      dcp::cuda::make_forward_run_work(tiles, runs, shape);
      ADD_FAILURE() << "accepted a bad run (" << words << ")";
    } catch (const dcp::Error& e) {
      EXPECT_EQ(e.kind(), dcp::ErrorKind::InvalidInput);
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refuses({AttnRun{2, 2, false}}, "outside the list");
  refuses({AttnRun{0, 0, false}}, "empty");
  refuses({AttnRun{1, 2, false}}, "other q rows");
  EXPECT_EQ(dcp::cuda::make_forward_run_work(tiles, std::vector<AttnRun>{{0, 2, false}, {2, 1, true}}, shape).size(),
            2u * 2u * 8u);
}

}  // namespace
