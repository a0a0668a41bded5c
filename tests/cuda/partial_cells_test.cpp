// Host tests of the cell classes of Partial tiles (no GPU needed): every cell's bits equal a
// brute-force walk over its (row, key) pairs, the cells of one tile sit where cells_begin says,
// only Partial tiles get cells, each q chunk's key span and each key chunk's row span is the span
// of its allowed pairs, the backward work leaves out exactly the chunks with no allowed pair, and
// rows outside the mask lists are refused with a message; the backward work's order of items.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "check_util.h"
#include "dcp/detail/attention_cuda.h"
#include "dcp/detail/rng.h"
#include "dcp/error.h"

namespace {

using dcp::cuda::AttnShape;
using dcp::cuda::AttnTile;
using dcp::cuda::AttnWorkItem;
using dcp::cuda::TileKind;
using dcp::cuda::kAttnCellAny;
using dcp::cuda::kAttnCellKeys;
using dcp::cuda::kAttnCellNotFull;
using dcp::cuda::kAttnCellRows;

using Rand = dcp::cuda::check::Rng;

struct List {
  std::vector<AttnTile> tiles;
  std::vector<int32_t> row_offsets, ranges;
  bool allowed(const AttnTile& t, int r, int k) const {
    const auto ri = static_cast<std::size_t>(t.range_row_begin + r);
    for (int32_t q = row_offsets[ri]; q < row_offsets[ri + 1]; ++q)
      if (k >= ranges[2 * static_cast<std::size_t>(q)] && k < ranges[2 * static_cast<std::size_t>(q) + 1]) return true;
    return false;
  }
};

AttnTile partial_tile(int q_len, int kv_len) {
  AttnTile t;
  t.q_len = q_len;
  t.kv_len = kv_len;
  t.kind = TileKind::Partial;
  t.kv_head_end = 1;
  return t;
}

// Rows of every flavour the masks of a plan produce: empty, whole, bands, a few ranges, ranges
// reaching past the tile on either side, single keys; some rows are one cell's worth of keys.
List random_list(uint64_t seed) {
  Rand rng(seed);
  List l;
  const int num_tiles = rng.uniform_int(1, 6);
  int q = 0;
  for (int i = 0; i < num_tiles; ++i) {
    AttnTile t;
    t.q_begin = q;
    t.q_len = rng.uniform_int(1, 300);
    q += t.q_len;
    t.kv_len = rng.uniform_int(1, 400);
    t.kv_head_end = 1;
    const int kind = rng.uniform_int(0, 4);
    t.kind = kind == 0 ? TileKind::Full : kind == 1 ? TileKind::CausalDiagonal : TileKind::Partial;
    if (t.kind == TileKind::CausalDiagonal) t.kv_len = t.q_len;
    if (t.kind == TileKind::Partial) {
      t.range_row_begin = static_cast<int32_t>(l.row_offsets.size());
      const int style = rng.uniform_int(0, 3);
      for (int r = 0; r < t.q_len; ++r) {
        l.row_offsets.push_back(static_cast<int32_t>(l.ranges.size() / 2));
        auto add = [&](int b, int e) {
          l.ranges.push_back(b);
          l.ranges.push_back(e);
        };
        const int pick = rng.uniform_int(0, 9);
        if (pick == 0) continue;  // no key
        if (pick == 1) {
          add(-5, t.kv_len + 7);  // everything, clipped
        } else if (style == 0) {
          if (r - 70 < t.kv_len) add(std::max(0, r - 70), std::min(t.kv_len, r + 1));  // a band
        } else if (style == 1) {
          add(64 * (r / 64), 64 * (r / 64) + 64);  // whole cells
        } else {
          int k = rng.uniform_int(-3, 20);
          while (k < t.kv_len) {
            const int e = k + rng.uniform_int(1, 90);
            add(k, e);
            k = e + rng.uniform_int(1, 80);
          }
        }
      }
      l.row_offsets.push_back(static_cast<int32_t>(l.ranges.size() / 2));
    }
    l.tiles.push_back(t);
  }
  if (l.row_offsets.empty()) l.row_offsets.push_back(0);
  return l;
}

TEST(PartialCells, MatchBruteForce) {
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    List l = random_list(seed);
    const std::vector<uint8_t> cells = dcp::cuda::make_partial_cells(l.tiles, l.row_offsets, l.ranges);
    std::size_t expected_size = 0;
    for (std::size_t ti = 0; ti < l.tiles.size(); ++ti) {
      const AttnTile& t = l.tiles[ti];
      if (t.kind != TileKind::Partial) {
        EXPECT_EQ(t.cells_begin, -1) << "seed " << seed << " tile " << ti;
        continue;
      }
      const int cols = (t.kv_len + kAttnCellKeys - 1) / kAttnCellKeys;
      const int cell_rows = (t.q_len + kAttnCellRows - 1) / kAttnCellRows;
      ASSERT_EQ(t.cells_begin, static_cast<int32_t>(expected_size)) << "seed " << seed << " tile " << ti;
      expected_size += static_cast<std::size_t>(cols) * cell_rows;
      ASSERT_LE(expected_size, cells.size());
      for (int u = 0; u < cell_rows; ++u)
        for (int c = 0; c < cols; ++c) {
          bool any = false, not_full = false;
          for (int r = u * kAttnCellRows; r < std::min(t.q_len, (u + 1) * kAttnCellRows); ++r)
            for (int k = c * kAttnCellKeys; k < std::min(t.kv_len, (c + 1) * kAttnCellKeys); ++k) {
              const bool a = l.allowed(t, r, k);
              any = any || a;
              not_full = not_full || !a;
            }
          const uint8_t want = static_cast<uint8_t>((any ? kAttnCellAny : 0) | (not_full ? kAttnCellNotFull : 0));
          EXPECT_EQ(cells[static_cast<std::size_t>(t.cells_begin) + static_cast<std::size_t>(u) * cols + c], want)
              << "seed " << seed << " tile " << ti << " cell (" << u << ", " << c << ")";
        }
    }
    // Then, 4-byte aligned, the spans of every tile (tiles with the same cells share them): first
    // the key spans of its 128-row chunks, the first and one past the last 128-key sub-tile with
    // an allowed pair.
    for (std::size_t ti = 0; ti < l.tiles.size(); ++ti) {
      const AttnTile& t = l.tiles[ti];
      if (t.kind != TileKind::Partial) {
        EXPECT_EQ(t.spans_begin, -1) << "seed " << seed << " tile " << ti;
        continue;
      }
      ASSERT_GE(t.spans_begin, static_cast<int32_t>(expected_size)) << "seed " << seed << " tile " << ti;
      ASSERT_EQ(t.spans_begin % 4, 0);
      const int chunks = (t.q_len + 127) / 128;
      ASSERT_LE(static_cast<std::size_t>(t.spans_begin) + 8u * static_cast<std::size_t>(chunks), cells.size());
      for (int k = 0; k < chunks; ++k) {
        int first = -1, last = -1;
        for (int r = 128 * k; r < std::min(t.q_len, 128 * (k + 1)); ++r)
          for (int key = 0; key < t.kv_len; ++key)
            if (l.allowed(t, r, key)) {
              if (first < 0 || key / 128 < first) first = key / 128;
              last = std::max(last, key / 128);
            }
        int32_t span[2];
        std::memcpy(span, cells.data() + t.spans_begin + 8 * k, 8);
        EXPECT_EQ(span[0], first < 0 ? 0 : first) << "seed " << seed << " tile " << ti << " chunk " << k;
        EXPECT_EQ(span[1], first < 0 ? 0 : last + 1) << "seed " << seed << " tile " << ti << " chunk " << k;
      }
      // Then the row spans of its 128-key chunks: the first and one past the last 64-row q
      // sub-tile with an allowed pair among the chunk's keys.
      const int key_chunks = (t.kv_len + 127) / 128;
      ASSERT_LE(static_cast<std::size_t>(t.spans_begin) + 8u * static_cast<std::size_t>(chunks + key_chunks), cells.size());
      for (int k = 0; k < key_chunks; ++k) {
        int first = -1, last = -1;
        for (int r = 0; r < t.q_len; ++r)
          for (int key = 128 * k; key < std::min(t.kv_len, 128 * (k + 1)); ++key)
            if (l.allowed(t, r, key)) {
              if (first < 0) first = r / 64;
              last = r / 64;
            }
        int32_t span[2];
        std::memcpy(span, cells.data() + t.spans_begin + 8 * (chunks + k), 8);
        EXPECT_EQ(span[0], first < 0 ? 0 : first) << "seed " << seed << " tile " << ti << " key chunk " << k;
        EXPECT_EQ(span[1], first < 0 ? 0 : last + 1) << "seed " << seed << " tile " << ti << " key chunk " << k;
      }
    }
  }
}

// Tiles with the same mask rows and extent (one per head group in a backend's list) share one
// set of cells; a row covering a cell with two adjacent ranges may mark it NotFull (the kernels
// then build its masks: exact, only slower), never the other way round.
TEST(PartialCells, SharedRowsShareCellsAndAdjacentRangesStayExact) {
  List l;
  const AttnTile t = partial_tile(100, 200);
  for (int r = 0; r < t.q_len; ++r) {
    l.row_offsets.push_back(static_cast<int32_t>(l.ranges.size() / 2));
    l.ranges.insert(l.ranges.end(), {0, 30, 30, 64});  // together cell column 0, whole
    if (r % 2 == 0) l.ranges.insert(l.ranges.end(), {64, 128});
  }
  l.row_offsets.push_back(static_cast<int32_t>(l.ranges.size() / 2));
  l.tiles = {t, t, t};
  l.tiles[2].kv_len = 150;  // another extent: its own cells
  const std::vector<uint8_t> cells = dcp::cuda::make_partial_cells(l.tiles, l.row_offsets, l.ranges);
  EXPECT_EQ(l.tiles[0].cells_begin, 0);
  EXPECT_EQ(l.tiles[1].cells_begin, 0);
  EXPECT_EQ(l.tiles[2].cells_begin, 2 * 4);
  // After the 14 bytes of cells, aligned: one q chunk and two key chunks each.
  EXPECT_EQ(l.tiles[0].spans_begin, 16);
  EXPECT_EQ(l.tiles[1].spans_begin, 16);
  EXPECT_EQ(l.tiles[2].spans_begin, 16 + 24);
  EXPECT_EQ(cells.size(), 16u + 24 + 24);
  for (int u = 0; u < 2; ++u) {
    EXPECT_EQ(cells[static_cast<std::size_t>(u) * 4 + 0] & kAttnCellAny, kAttnCellAny);  // any: exact
    EXPECT_EQ(cells[static_cast<std::size_t>(u) * 4 + 1], kAttnCellAny | kAttnCellNotFull);  // odd rows miss it
    EXPECT_EQ(cells[static_cast<std::size_t>(u) * 4 + 2], kAttnCellNotFull);              // no key
  }
}

TEST(PartialCells, BackwardWorkDropsExactlyTheEmptyChunks) {
  const AttnShape shape{4, 2, 64, 0.125F};
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    List l = random_list(seed);
    const std::vector<AttnWorkItem> all = dcp::cuda::make_backward_work(l.tiles, shape);
    const std::vector<uint8_t> cells = dcp::cuda::make_partial_cells(l.tiles, l.row_offsets, l.ranges);
    const std::vector<AttnWorkItem> kept = dcp::cuda::make_backward_work(l.tiles, shape, cells);
    std::size_t k = 0;
    for (const AttnWorkItem& w : all) {
      const AttnTile& t = l.tiles[static_cast<std::size_t>(w.tile)];
      bool any = t.kind != TileKind::Partial;
      for (int r = 0; !any && r < t.q_len; ++r)
        for (int key = w.chunk * 128; !any && key < std::min(t.kv_len, (w.chunk + 1) * 128); ++key) any = l.allowed(t, r, key);
      const bool is_kept = k < kept.size() && kept[k].tile == w.tile && kept[k].chunk == w.chunk && kept[k].head == w.head;
      EXPECT_EQ(is_kept, any) << "seed " << seed << " tile " << w.tile << " chunk " << w.chunk << " head " << w.head;
      if (is_kept) ++k;
    }
    EXPECT_EQ(k, kept.size()) << "seed " << seed;
    // Without cells nothing is dropped.
    EXPECT_EQ(dcp::cuda::make_backward_work(l.tiles, shape, {}).size(), all.size());
  }
}

// The backward work's order: tiles of kAttnHeadMajorRows rows or more whose every key chunk
// walks from the tile's first row (Full tiles, a window's lower edge by its cells) list their
// items kv head by kv head; diagonal tiles, Partial tiles whose chunks start lower, Partial tiles
// without cells and shorter tiles key chunk by key chunk. Either way the items are the same set.
TEST(PartialCells, BackwardWorkOrderFollowsWhereTheChunksStart) {
  using dcp::cuda::kAttnHeadMajorRows;
  const AttnShape shape{8, 2, 128, 0.088F};
  const int n = kAttnHeadMajorRows, keys = 512;  // 4 key chunks
  List l;
  auto add_tile = [&](TileKind kind, int q_len, int kv_len, auto keys_of_row) {
    AttnTile t;
    t.q_len = q_len;
    t.kv_len = kv_len;
    t.kind = kind;
    t.kv_head_end = 2;
    if (kind == TileKind::Partial) {
      t.range_row_begin = static_cast<int32_t>(l.row_offsets.size());
      for (int r = 0; r < q_len; ++r) {
        l.row_offsets.push_back(static_cast<int32_t>(l.ranges.size() / 2));
        const auto [b, e] = keys_of_row(r);
        l.ranges.push_back(b);
        l.ranges.push_back(e);
      }
    }
    l.tiles.push_back(t);
  };
  auto none = [](int) { return std::pair{0, 0}; };
  add_tile(TileKind::Full, n, keys, none);                                             // 0: head-major
  add_tile(TileKind::CausalDiagonal, n, n, none);                                      // 1: chunk-major
  add_tile(TileKind::Full, n / 2, keys, none);                                         // 2: short, chunk-major
  add_tile(TileKind::Partial, n, keys, [&](int r) { return std::pair{r % keys, keys}; });  // 3: lower edge, head-major
  add_tile(TileKind::Partial, n, keys, [&](int r) { return std::pair{0, std::min(keys, r + 1)}; });  // 4: diagonal, chunk-major
  l.row_offsets.push_back(static_cast<int32_t>(l.ranges.size() / 2));
  const std::vector<AttnWorkItem> bare = dcp::cuda::make_backward_work(l.tiles, shape);
  const std::vector<uint8_t> cells = dcp::cuda::make_partial_cells(l.tiles, l.row_offsets, l.ranges);
  const std::vector<AttnWorkItem> work = dcp::cuda::make_backward_work(l.tiles, shape, cells);
  auto key = [](const AttnWorkItem& w) { return std::tuple(w.tile, w.chunk, w.head); };
  auto sorted = [&](std::vector<AttnWorkItem> v) {
    std::vector<std::tuple<int, int, int>> k;
    for (const AttnWorkItem& w : v) k.push_back(key(w));
    std::sort(k.begin(), k.end());
    return k;
  };
  EXPECT_EQ(sorted(work), sorted(bare)) << "every chunk of these tiles has an allowed pair";
  const int chunks[] = {4, n / 128, 4, 4, 4};
  const bool head_major[] = {true, false, false, true, false};
  for (int tile = 0; tile < 5; ++tile)
    for (const auto* list : {&work, &bare}) {
      // Tile 3 is head-major only when its cells show where its chunks start.
      const bool expect_head_major = head_major[tile] && !(tile == 3 && list == &bare);
      std::vector<AttnWorkItem> items;
      for (const AttnWorkItem& w : *list)
        if (w.tile == tile) items.push_back(w);
      ASSERT_EQ(items.size(), static_cast<std::size_t>(2 * chunks[tile])) << "tile " << tile;
      for (std::size_t i = 0; i < items.size(); ++i) {
        const int c = expect_head_major ? static_cast<int>(i) % chunks[tile] : static_cast<int>(i) / 2;
        const int h = expect_head_major ? static_cast<int>(i) / chunks[tile] : static_cast<int>(i) % 2;
        EXPECT_EQ(items[i].chunk, c) << "tile " << tile << " item " << i << (list == &bare ? " without cells" : "");
        EXPECT_EQ(items[i].head, h) << "tile " << tile << " item " << i << (list == &bare ? " without cells" : "");
      }
    }
}

TEST(PartialCells, RefusesRowsOutsideTheMaskLists) {
  List l;
  l.tiles.push_back(partial_tile(10, 64));
  l.row_offsets = {0, 1, 1};  // 2 rows where the tile has 10
  l.ranges = {0, 5};
  auto refused = [&](const std::string& what) {
    try {
      (void)dcp::cuda::make_partial_cells(l.tiles, l.row_offsets, l.ranges);
    } catch (const dcp::Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "no error, expected one naming: " << what;
  };
  refused("tile 0 has rows past the end of row_offsets");
  l.row_offsets = std::vector<int32_t>(11, 0);
  l.row_offsets.back() = 3;  // the last row names ranges 0..2, the list holds one
  refused("tile 0 has ranges past the end of the range list");
}

}  // namespace
