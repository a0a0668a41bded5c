// Host tests of make_backward_runs (no GPU needed), from random stage lists against the promises
// the wide kernel relies on: every wide (tile, chunk, kv head) of the input is walked exactly once;
// a run's tiles are consecutive copies that share kv rows, kv_len, dK / dV rows, head group and
// q_len, and lie in one window of max_rows q rows; runs come in window order; the other items
// follow unchanged; bad input is refused with a message.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "check_util.h"
#include "dcp/detail/attention_cuda.h"
#include "dcp/error.h"

namespace {

using dcp::cuda::AttnShape;
using dcp::cuda::AttnTile;
using dcp::cuda::AttnWorkItem;
using dcp::cuda::TileKind;
using dcp::cuda::check::tile_of;
constexpr int kChunk = dcp::cuda::kAttnBackwardChunkRows;

// Tiles (i, j <= i) of a few causal sequences cut into blocks of random lengths (some of them
// equal, so that key blocks have several tiles of one q_len), diagonals causal, some tiles split
// into two head groups, dK / dV rows sometimes elsewhere, in shuffled order.
std::vector<AttnTile> random_tiles(dcp::cuda::check::Rng& rng, int hkv) {
  std::vector<AttnTile> tiles;
  int row = 0;
  const int seqs = rng.uniform_int(1, 3);
  for (int s = 0; s < seqs; ++s) {
    std::vector<int> begin{row};
    const int blocks = rng.uniform_int(1, 8);
    const int common = 16 * rng.uniform_int(1, 40);
    for (int b = 0; b < blocks; ++b) begin.push_back(begin.back() + (rng.uniform() < 0.7 ? common : rng.uniform_int(1, 700)));
    row = begin.back();
    for (int i = 0; i < blocks; ++i) {
      for (int j = 0; j <= i; ++j) {
        const int q0 = begin[static_cast<size_t>(i)], kv0 = begin[static_cast<size_t>(j)];
        const int q_len = begin[static_cast<size_t>(i) + 1] - q0, kv_len = begin[static_cast<size_t>(j) + 1] - kv0;
        const TileKind kind = i == j ? TileKind::CausalDiagonal : TileKind::Full;
        const bool split = hkv >= 2 && rng.uniform() < 0.2;
        const int cut = split ? hkv / 2 : hkv;
        tiles.push_back(tile_of(q0, q_len, kv0, kv_len, kind, 0, cut));
        if (split) tiles.push_back(tile_of(q0, q_len, kv0, kv_len, kind, cut, hkv));
      }
    }
  }
  if (rng.uniform() < 0.5)
    for (AttnTile& t : tiles) t.dkv_begin = t.kv_begin + 7;
  for (size_t i = tiles.size(); i > 1; --i) std::swap(tiles[i - 1], tiles[static_cast<size_t>(rng.uniform_int(0, static_cast<int>(i) - 1))]);
  return tiles;
}

// A tile's identity beyond its position (runs walk copies).
auto key_of(const AttnTile& t) {
  return std::make_tuple(t.q_begin, t.q_len, t.kv_begin, t.kv_len, t.dkv_begin, t.kv_head_begin, t.kv_head_end, static_cast<int>(t.kind));
}

TEST(BackwardRuns, EveryWideItemOnceRunsShareTheirKeyBlockAndWindow) {
  dcp::cuda::check::Rng rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    const int hkv = trial % 3 == 0 ? 1 : 4;
    const AttnShape shape{8, hkv, 128, 0.1F};
    const std::vector<AttnTile> input = random_tiles(rng, hkv);
    std::vector<AttnWorkItem> work = dcp::cuda::make_backward_work(input, shape);
    const int32_t num_wide = dcp::cuda::partition_backward_work(work, input, shape, trial % 2 == 0 ? 0 : 256);
    const std::vector<AttnWorkItem> before = work;
    std::vector<AttnTile> tiles = input;
    const int max_rows = trial % 4 == 0 ? 1 << 20 : 16 * rng.uniform_int(1, 100);
    const int32_t wide = dcp::cuda::make_backward_runs(tiles, work, num_wide, shape, max_rows);
    SCOPED_TRACE("trial " + std::to_string(trial) + ", max_rows " + std::to_string(max_rows));

    ASSERT_GE(tiles.size(), input.size());
    for (size_t i = 0; i < input.size(); ++i) EXPECT_EQ(key_of(tiles[i]), key_of(input[i])) << "input tile " << i << " moved";
    // The other items follow in their order.
    ASSERT_EQ(work.size() - static_cast<size_t>(wide), before.size() - static_cast<size_t>(num_wide));
    for (size_t i = 0; i + static_cast<size_t>(num_wide) < before.size(); ++i) {
      EXPECT_EQ(work[static_cast<size_t>(wide) + i].tile, before[static_cast<size_t>(num_wide) + i].tile);
      EXPECT_EQ(work[static_cast<size_t>(wide) + i].chunk, before[static_cast<size_t>(num_wide) + i].chunk);
    }
    // Wide items: each (tile, chunk, head) of the input's wide items walked once.
    std::map<std::tuple<std::tuple<int, int, int, int, int, int, int, int>, int, int>, int> expect, seen;
    for (int32_t i = 0; i < num_wide; ++i) {
      const AttnWorkItem& w = before[static_cast<size_t>(i)];
      ++expect[{key_of(input[static_cast<size_t>(w.tile)]), w.chunk, w.head}];
    }
    int64_t last_window = -1;
    for (int32_t i = 0; i < wide; ++i) {
      const AttnWorkItem& w = work[static_cast<size_t>(i)];
      ASSERT_GE(w.num_tiles, 1);
      ASSERT_GE(w.tile, static_cast<int32_t>(input.size())) << "a wide item walks copies";
      ASSERT_LE(static_cast<size_t>(w.tile + w.num_tiles), tiles.size());
      const AttnTile& first = tiles[static_cast<size_t>(w.tile)];
      const int64_t window = first.q_begin / max_rows;
      EXPECT_GE(window, last_window) << "runs in window order";
      last_window = window;
      for (int k = 0; k < w.num_tiles; ++k) {
        const AttnTile& t = tiles[static_cast<size_t>(w.tile + k)];
        EXPECT_EQ(t.kind, TileKind::Full);
        EXPECT_EQ(t.kv_begin, first.kv_begin);
        EXPECT_EQ(t.kv_len, first.kv_len);
        EXPECT_EQ(t.dkv_begin, first.dkv_begin);
        EXPECT_EQ(t.kv_head_begin, first.kv_head_begin);
        EXPECT_EQ(t.kv_head_end, first.kv_head_end);
        EXPECT_EQ(t.q_len, first.q_len);
        EXPECT_EQ(t.q_begin / max_rows, window);
        EXPECT_LE((w.chunk + 1) * kChunk, t.kv_len) << "a wide item is a whole 128-key chunk";
        ++seen[{key_of(t), w.chunk, w.head}];
      }
    }
    EXPECT_EQ(seen, expect);
  }
}

// A key block of 1024-row tiles over q rows [0, 8192): runs of four tiles at max_rows 4096, the
// two windows in order; each run's items head-major (4096 rows), chunk-major below that.
TEST(BackwardRuns, FourTileRunsAtTheDefaultRows) {
  const AttnShape shape{8, 2, 128, 0.1F};
  std::vector<AttnTile> tiles;
  for (int i = 1; i <= 8; ++i) tiles.push_back(tile_of(1024 * i, 1024, 0, 1024, TileKind::Full, 0, 2));
  std::vector<AttnWorkItem> work = dcp::cuda::make_backward_work(tiles, shape);
  const int32_t num_wide = dcp::cuda::partition_backward_work(work, tiles, shape);
  ASSERT_EQ(num_wide, 8 * 8 * 2);
  const int32_t wide = dcp::cuda::make_backward_runs(tiles, work, num_wide, shape);
  // Windows [0, 4096): q blocks 1-3; [4096, 8192): 4-7; [8192, ...): 8.
  ASSERT_EQ(wide, 3 * 8 * 2);
  const int counts[] = {3, 4, 1};
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < 16; ++i) {
      const AttnWorkItem& w = work[static_cast<size_t>(16 * r + i)];
      EXPECT_EQ(w.num_tiles, counts[r]);
      EXPECT_EQ(tiles[static_cast<size_t>(w.tile)].q_begin, r == 0 ? 1024 : 4096 * r);
      // Run 1 holds 4096 rows: head-major; the others chunk-major.
      EXPECT_EQ(w.head, r == 1 ? i / 8 : i % 2);
      EXPECT_EQ(w.chunk, r == 1 ? i % 8 : i / 2);
    }
  }
}

// A tile whose wide items are not all of its chunks and heads (a caller's own list) stays a run of
// its own with those items; bad input is refused.
TEST(BackwardRuns, PartialItemSetsStayAloneBadInputIsRefused) {
  const AttnShape shape{8, 2, 128, 0.1F};
  std::vector<AttnTile> tiles{tile_of(0, 256, 0, 256, TileKind::Full, 0, 2), tile_of(256, 256, 0, 256, TileKind::Full, 0, 2),
                              tile_of(512, 256, 512, 256, TileKind::CausalDiagonal, 0, 2)};
  std::vector<AttnWorkItem> work{{0, 0, 0, 0}, {0, 1, 0, 0}, {0, 0, 1, 0}, {0, 1, 1, 0}, {1, 1, 0, 0}, {2, 0, 0, 0}};
  const int32_t wide = dcp::cuda::make_backward_runs(tiles, work, 5, shape, 1 << 20);
  ASSERT_EQ(wide, 5);
  ASSERT_EQ(tiles.size(), 5U);
  EXPECT_EQ(work[0].num_tiles, 1);
  EXPECT_EQ(tiles[static_cast<size_t>(work[0].tile)].q_begin, 0);
  EXPECT_EQ(tiles[static_cast<size_t>(work[4].tile)].q_begin, 256);
  EXPECT_EQ(work[4].chunk, 1);
  EXPECT_EQ(work[5].tile, 2);

  std::vector<AttnTile> t2 = tiles;
  std::vector<AttnWorkItem> w2{{2, 0, 0, 0}};
  EXPECT_THROW(dcp::cuda::make_backward_runs(t2, w2, 1, shape), dcp::Error) << "a wide item on a causal diagonal";
  EXPECT_THROW(dcp::cuda::make_backward_runs(t2, w2, 2, shape), dcp::Error) << "num_wide past the list";
  EXPECT_THROW(dcp::cuda::make_backward_runs(t2, w2, 0, shape, 0), dcp::Error) << "max_rows 0";
  try {
    std::vector<AttnWorkItem> w3{{9, 0, 0, 0}};
    (void)dcp::cuda::make_backward_runs(t2, w3, 1, shape);
    ADD_FAILURE() << "no error";
  } catch (const dcp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("wide item 0"), std::string::npos) << e.what();
  }
}

}  // namespace
