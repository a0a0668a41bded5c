// Host tests of the deterministic backward's two work lists (no GPU needed), from random lists of
// every tile kind against a walk of every item as the kernels do it: each (tile, head, chunk) is
// walked once; each dK / dV and dQ element has one writer (or dK / dV units taking turns in work
// order); items run heaviest first (dK / dV: by groups of a key block and head); lists that break the preconditions are refused with a message.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "check_util.h"
#include "dcp/detail/attention_cuda.h"
#include "dcp/detail/rng.h"
#include "dcp/error.h"

namespace {

using dcp::cuda::AttnShape;
using dcp::cuda::AttnTile;
using dcp::cuda::TileKind;
using dcp::cuda::check::tile_of;
constexpr int kChunk = dcp::cuda::kAttnBackwardChunkRows;  // keys per work item
constexpr int kSub = 64;                                    // q rows per step

using Rand = dcp::cuda::check::Rng;

struct List {
  std::vector<AttnTile> tiles;
  std::vector<int32_t> row_offsets, ranges;
};

// Tiles of a few causal sequences cut into blocks as a DCP stage list has them: (i, j <= i) of
// each sequence, some dropped, diagonal tiles causal or partial, off-diagonal full or partial
// (partial rows: up to three random ranges, some rows and whole 64-row bands empty, so that many
// (chunk, sub-tile) steps have no allowed pair), some split into two head groups, operand rows
// optionally moved to other buffers, in shuffled order.
List random_list(Rand& rng, int hkv) {
  List l;
  int row = 0;
  const int seqs = rng.uniform_int(1, 3);
  const bool moved = rng.uniform() < 0.5;
  for (int s = 0; s < seqs; ++s) {
    std::vector<int> begin{row};
    const int blocks = rng.uniform_int(1, 6);
    for (int b = 0; b < blocks; ++b) begin.push_back(begin.back() + rng.uniform_int(1, 700));
    row = begin.back();
    for (int i = 0; i < blocks; ++i) {
      for (int j = 0; j <= i; ++j) {
        if (rng.uniform() < 0.15) continue;
        AttnTile t;
        t.q_begin = begin[static_cast<size_t>(i)];
        t.q_len = begin[static_cast<size_t>(i) + 1] - t.q_begin;
        t.kv_begin = begin[static_cast<size_t>(j)];
        t.kv_len = begin[static_cast<size_t>(j) + 1] - t.kv_begin;
        t.kind = i == j ? (rng.uniform() < 0.6 ? TileKind::CausalDiagonal : TileKind::Partial)
                        : (rng.uniform() < 0.6 ? TileKind::Full : TileKind::Partial);
        if (t.kind == TileKind::Partial) {
          t.range_row_begin = static_cast<int32_t>(l.row_offsets.size());
          const int quiet_band = rng.uniform_int(0, 10);  // a 64-row band with no keys at all
          for (int r = 0; r < t.q_len; ++r) {
            l.row_offsets.push_back(static_cast<int32_t>(l.ranges.size() / 2));
            if (r / 64 == quiet_band || rng.uniform() < 0.2) continue;
            int pos = 0;
            for (int q = rng.uniform_int(1, 3); q > 0 && pos < t.kv_len; --q) {
              const int b = rng.uniform_int(pos, t.kv_len - 1);
              const int e = rng.uniform_int(b + 1, std::min(t.kv_len, b + 200));
              l.ranges.push_back(b);
              l.ranges.push_back(e);
              pos = e + 1;
            }
          }
          l.row_offsets.push_back(static_cast<int32_t>(l.ranges.size() / 2));
        }
        if (moved) {
          t.dq_begin = 3 * t.q_begin + 7;
          t.dkv_begin = 2 * t.kv_begin + 5;
        }
        const int cut = hkv >= 2 && rng.uniform() < 0.3 ? rng.uniform_int(1, hkv - 1) : hkv;
        t.kv_head_begin = 0;
        t.kv_head_end = cut;
        l.tiles.push_back(t);
        if (cut < hkv) {
          t.kv_head_begin = cut;
          t.kv_head_end = hkv;
          l.tiles.push_back(t);
        }
      }
    }
  }
  for (size_t i = l.tiles.size(); i > 1; --i)
    std::swap(l.tiles[i - 1], l.tiles[static_cast<size_t>(rng.uniform_int(0, static_cast<int>(i) - 1))]);
  if (l.row_offsets.empty()) l.row_offsets.push_back(0);
  return l;
}

int dq_row(const AttnTile& t) { return t.dq_begin >= 0 ? t.dq_begin : t.q_begin; }
int dkv_row(const AttnTile& t) { return t.dkv_begin >= 0 ? t.dkv_begin : t.kv_begin; }

// Where a tile belongs in a key block's walk, from its rows' ranges by brute force: 0 when every
// 128-key chunk has an allowed pair in the tile's first and last 64-row sub-tiles (a Full tile),
// 1 when every chunk has one in the first, 2 otherwise (a causal diagonal; a Partial tile without
// cells, whose chunks' spans the walk does not know).
int walk_order(const List& l, const AttnTile& t, bool cells) {
  if (t.kind == TileKind::Full) return 0;
  if (t.kind != TileKind::Partial || !cells) return 2;
  const int subs = (t.q_len + kSub - 1) / kSub;
  int order = 0;
  for (int lo = 0; lo < t.kv_len; lo += kChunk) {
    const int hi = std::min(t.kv_len, lo + kChunk);
    int first = -1, last = -1;
    for (int r = 0; r < t.q_len; ++r) {
      const auto ri = static_cast<size_t>(t.range_row_begin + r);
      for (int32_t q = l.row_offsets[ri]; q < l.row_offsets[ri + 1]; ++q) {
        const int b = std::max(l.ranges[2 * static_cast<size_t>(q)], 0);
        const int e = std::min(l.ranges[2 * static_cast<size_t>(q) + 1], t.kv_len);
        if (std::max(b, lo) < std::min(e, hi)) {
          if (first < 0) first = r;
          last = r;
        }
      }
    }
    if (first < 0 || first >= kSub) return 2;
    if (last / kSub != subs - 1) order = 1;
  }
  return order;
}

// The deterministic backward's two lists. dK / dV pass: every (tile, kv head, key chunk)
// walked once, by items whose tiles share keys, dK / dV rows and the head; each dK / dV element
// has one writer, or several taking turns 0, 1, ... in work order; the items of a (key block,
// head) together, these groups heaviest first. dQ pass:
// every (tile, q head, 128-row chunk) walked once, by the one item that owns those dQ rows and
// head (one writer per dQ element); heaviest first.
// With `cells`, the list's Partial tiles get make_partial_cells' classes and spans first, and a unit
// walks its tiles in walk_order.
void check_work(const List& input, const AttnShape& shape, int unit_rows, uint64_t seed, bool cells = false) {
  const int group = shape.num_q_heads / shape.num_kv_heads;
  List l = input;
  std::vector<uint8_t> cell_bytes;
  if (cells) cell_bytes = dcp::cuda::make_partial_cells(l.tiles, l.row_offsets, l.ranges);
  const dcp::cuda::DeterministicBackwardWork det = dcp::cuda::make_deterministic_backward_work(l.tiles, shape, unit_rows, cell_bytes);
  auto area = [](const AttnTile& t, int keys) {
    return static_cast<double>(keys) * t.q_len * (t.kind == TileKind::CausalDiagonal ? 0.5 : 1.0);
  };
  std::set<std::tuple<int, int, int, int, int>> walked;          // (q row, kv row, head, kind, chunk)
  std::map<std::tuple<int, int>, std::vector<int>> dkv_writers;  // (dK/dV row, kv head) -> items, in order
  // Each group's cost, then its items in one run, groups heaviest first.
  auto item_cost = [&](const dcp::cuda::AttnWorkItem& w) {
    const AttnTile& g = det.dkv_tiles[static_cast<size_t>(w.tile)];
    const int keys = std::min(kChunk, g.kv_len - w.chunk * kChunk);
    double cost = 0;
    for (int ti = w.tile; ti < w.tile + w.num_tiles; ++ti) cost += area(det.dkv_tiles[static_cast<size_t>(ti)], keys);
    return cost;
  };
  // A key block whose every tile has walk order 2 runs chunk-major: one group of every head's items,
  // ordered by (chunk, head); the others one group per head.
  std::map<int, bool> chunk_major;  // dK / dV row of a key block ->
  for (const AttnTile& t : l.tiles) {
    auto [it, fresh] = chunk_major.try_emplace(dkv_row(t), true);
    it->second = it->second && walk_order(l, t, cells) == 2;
  }
  auto group_of = [&](const dcp::cuda::AttnWorkItem& w) {
    const int row = dkv_row(det.dkv_tiles[static_cast<size_t>(w.tile)]);
    return std::make_tuple(row, chunk_major.at(row) ? -1 : w.head);
  };
  std::map<std::tuple<int, int>, double> group_cost;
  for (const dcp::cuda::AttnWorkItem& w : det.dkv_work) group_cost[group_of(w)] += item_cost(w);
  std::set<std::tuple<int, int>> groups_done;
  double prev_cost = 1e300;
  for (size_t k = 0; k < det.dkv_work.size(); ++k) {
    if (k == 0 || group_of(det.dkv_work[k]) != group_of(det.dkv_work[k - 1])) {
      const auto gk = group_of(det.dkv_work[k]);
      EXPECT_TRUE(groups_done.insert(gk).second) << "a (key block, head) group's items not together, seed " << seed;
      EXPECT_LE(group_cost[gk], prev_cost) << "dK / dV groups not heaviest first, seed " << seed;
      prev_cost = group_cost[gk];
    } else if (std::get<1>(group_of(det.dkv_work[k])) < 0) {
      const dcp::cuda::AttnWorkItem& a = det.dkv_work[k - 1];
      const dcp::cuda::AttnWorkItem& b = det.dkv_work[k];
      EXPECT_LE(std::make_tuple(a.chunk, a.head), std::make_tuple(b.chunk, b.head))
          << "a chunk-major key block's items not by (chunk, head), seed " << seed;
    }
    const dcp::cuda::AttnWorkItem& w = det.dkv_work[k];
    const AttnTile& g = det.dkv_tiles[static_cast<size_t>(w.tile)];
    const int keys = std::min(kChunk, g.kv_len - w.chunk * kChunk);
    ASSERT_GT(keys, 0) << "seed " << seed;
    for (int key = 0; key < keys; ++key) dkv_writers[{dkv_row(g) + w.chunk * kChunk + key, w.head}].push_back(static_cast<int>(k));
    int prev_order = 0;  // a unit walks its tiles in walk_order (its chunks' items stay in step)
    for (int ti = w.tile; ti < w.tile + w.num_tiles; ++ti) {
      const AttnTile& t = det.dkv_tiles[static_cast<size_t>(ti)];
      ASSERT_TRUE(t.kv_begin == g.kv_begin && t.kv_len == g.kv_len && dkv_row(t) == dkv_row(g)) << "seed " << seed;
      const int order = walk_order(l, t, cells);
      EXPECT_GE(order, prev_order) << "a unit walks a tile of walk order " << order << " after one of " << prev_order
                                   << ", seed " << seed;
      prev_order = order;
      ASSERT_TRUE(t.kv_head_begin == w.head && t.kv_head_end == w.head + 1) << "seed " << seed;
      ASSERT_TRUE(walked.insert({t.q_begin, t.kv_begin, w.head, static_cast<int>(t.kind), w.chunk}).second)
          << "a (tile, head, chunk) walked twice, seed " << seed;
    }
  }
  size_t expected_walks = 0;
  for (const AttnTile& t : l.tiles)
    expected_walks += static_cast<size_t>((t.kv_len + kChunk - 1) / kChunk) * static_cast<size_t>(t.kv_head_end - t.kv_head_begin);
  EXPECT_EQ(walked.size(), expected_walks) << "seed " << seed;
  for (const auto& [at, items] : dkv_writers) {
    if (items.size() == 1) {
      EXPECT_LT(det.dkv_work[static_cast<size_t>(items[0])].dkv_sem, 0) << "seed " << seed;
      continue;
    }
    const int sem = det.dkv_work[static_cast<size_t>(items[0])].dkv_sem;
    EXPECT_TRUE(sem >= 0 && sem < det.num_semaphores) << "seed " << seed;
    for (size_t r = 0; r < items.size(); ++r) {
      EXPECT_EQ(det.dkv_work[static_cast<size_t>(items[r])].dkv_sem, sem) << "seed " << seed;
      EXPECT_EQ(det.dkv_work[static_cast<size_t>(items[r])].dkv_rank, static_cast<int>(r)) << "seed " << seed;
    }
  }
  if (unit_rows == 0) {
    EXPECT_EQ(det.num_semaphores, 0) << "whole key blocks take no turns, seed " << seed;
  }

  // dQ pass.
  constexpr int kQChunk = dcp::cuda::kAttnForwardChunkRows;
  std::map<std::tuple<int, int, int, int>, int> dq_walks;  // (q row, kv row, q head, chunk) -> times
  std::set<std::tuple<int, int>> dq_owner;                 // (first dQ row of the chunk, q head)
  prev_cost = 1e300;
  for (const dcp::cuda::AttnWorkItem& w : det.dq_work) {
    const AttnTile& f = det.dq_tiles[static_cast<size_t>(w.tile)];
    ASSERT_LT(w.chunk * kQChunk, f.q_len) << "seed " << seed;
    ASSERT_TRUE(dq_owner.insert({dq_row(f) + w.chunk * kQChunk, w.head}).second) << "two writers of dQ rows, seed " << seed;
    double cost = 0;
    for (int ti = w.tile; ti < w.tile + w.num_tiles; ++ti) {
      const AttnTile& t = det.dq_tiles[static_cast<size_t>(ti)];
      ASSERT_TRUE(t.q_begin == f.q_begin && t.q_len == f.q_len && dq_row(t) == dq_row(f)) << "seed " << seed;
      if (w.head / group < t.kv_head_begin || w.head / group >= t.kv_head_end) continue;  // the kernel skips it
      ++dq_walks[{t.q_begin, t.kv_begin, w.head, w.chunk}];
      cost += area(t, t.kv_len);
    }
    EXPECT_GT(cost, 0.0) << "an item with nothing to walk, seed " << seed;
    EXPECT_LE(cost, prev_cost) << "dQ items not heaviest first, seed " << seed;
    prev_cost = cost;
  }
  size_t expected_dq = 0;
  for (const AttnTile& t : l.tiles) {
    expected_dq += static_cast<size_t>((t.q_len + kQChunk - 1) / kQChunk) * static_cast<size_t>((t.kv_head_end - t.kv_head_begin) * group);
    for (int qh = t.kv_head_begin * group; qh < t.kv_head_end * group; ++qh)
      for (int c = 0; c * kQChunk < t.q_len; ++c) EXPECT_EQ((dq_walks[{t.q_begin, t.kv_begin, qh, c}]), 1) << "seed " << seed;
  }
  size_t total = 0;
  for (const auto& [key, n] : dq_walks) total += static_cast<size_t>(n);
  EXPECT_EQ(total, expected_dq) << "seed " << seed;
}

TEST(DeterministicBackwardWork, EveryPairOnceOneWriterPerElement) {
  const int shapes[][2] = {{8, 8}, {8, 2}, {8, 1}, {32, 8}};
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    Rand rng(seed);
    const auto& sh = shapes[seed % 4];
    const AttnShape shape{sh[0], sh[1], 128, 0.1F};
    const List l = random_list(rng, shape.num_kv_heads);
    check_work(l, shape, seed % 3 == 0 ? 1 : seed % 3 == 1 ? 1000 : 0, seed, seed % 2 == 0);
    if (HasFatalFailure()) return;
  }
}

// Key blocks of more than 64 chunks (8192 keys): full and causal diagonal tiles sharing dQ rows
// with short ones, whole and cut into units.
TEST(DeterministicBackwardWork, LongKeyBlocks) {
  const AttnShape shape{8, 2, 128, 0.1F};
  List l;
  auto add = [&](int q, int nq, int kv, int nkv, TileKind kind) { l.tiles.push_back(tile_of(q, nq, kv, nkv, kind, 0, 2)); };
  add(0, 9000, 0, 9000, TileKind::CausalDiagonal);
  add(9000, 300, 0, 9000, TileKind::Full);
  add(9000, 300, 9000, 300, TileKind::CausalDiagonal);
  add(0, 9000, 20000, 200, TileKind::Full);
  l.row_offsets = {0};
  for (const int unit_rows : {0, 1}) {
    check_work(l, shape, unit_rows, 1);
    if (HasFatalFailure()) return;
  }
}

// One key block of a sliding window's tiles, listed diagonal first: the unit walks the tiles whose
// chunks see every row (the Full tile, the Partial tile inside the band) first, the band's lower
// edge (every chunk from the first row, ending on different rows) next, the diagonal last.
TEST(DeterministicBackwardWork, UnitsWalkTheTilesOfEveryRowFirst) {
  const AttnShape shape{8, 2, 128, 0.1F};
  List l;
  constexpr int kB = 512, kWindow = 1024;
  auto add_partial = [&](int i) {  // q block i against key block 0 under the window
    AttnTile t = tile_of(i * kB, kB, 0, kB, TileKind::Partial, 0, 2);
    t.range_row_begin = static_cast<int32_t>(l.row_offsets.size());
    for (int r = 0; r < kB; ++r) {
      l.row_offsets.push_back(static_cast<int32_t>(l.ranges.size() / 2));
      const int pos = i * kB + r;
      const int b = std::max(pos - kWindow + 1, 0), e = std::min(pos + 1, kB);
      if (b < e) {
        l.ranges.push_back(b);
        l.ranges.push_back(e);
      }
    }
    l.row_offsets.push_back(static_cast<int32_t>(l.ranges.size() / 2));
    l.tiles.push_back(t);
  };
  add_partial(0);  // the diagonal
  add_partial(2);  // the lower edge: key chunk c sees rows 0 .. 128 c + 127
  add_partial(1);  // inside the band: every pair
  l.tiles.push_back(tile_of(3 * kB, kB, 0, kB, TileKind::Full, 0, 2));
  std::vector<uint8_t> cells = dcp::cuda::make_partial_cells(l.tiles, l.row_offsets, l.ranges);
  const dcp::cuda::DeterministicBackwardWork det = dcp::cuda::make_deterministic_backward_work(l.tiles, shape, 0, cells);
  ASSERT_EQ(det.dkv_tiles.size(), 8U);  // four tiles, each kv head's unit
  for (int h = 0; h < 2; ++h) {
    std::vector<int> walked;
    for (int k = 0; k < 4; ++k) walked.push_back(det.dkv_tiles[static_cast<size_t>(4 * h + k)].q_begin / kB);
    EXPECT_EQ(walked, (std::vector<int>{1, 3, 2, 0})) << "kv head " << h;
  }
  check_work(l, shape, 0, 1, true);
}

TEST(DeterministicBackwardWork, RefusesListsWithSharedRowsThatDisagree) {
  const AttnShape shape{8, 2, 128, 0.1F};
  auto tile = [](int q, int nq, int kv, int nkv, TileKind kind) { return tile_of(q, nq, kv, nkv, kind, 0, 2); };
  auto refused = [&](const std::vector<AttnTile>& tiles, const std::string& words) {
    try {
      (void)dcp::cuda::make_deterministic_backward_work(tiles, shape);
    } catch (const dcp::Error& e) {
      EXPECT_EQ(e.kind(), dcp::ErrorKind::InvalidInput);
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "accepted a list that should be refused (" << words << ")";
  };
  refused({tile(0, 100, 0, 100, TileKind::Full), tile(0, 90, 100, 100, TileKind::Full)}, "another number of them");
  refused({tile(0, 100, 0, 100, TileKind::Full), tile(50, 100, 100, 100, TileKind::Full)}, "overlap");
  refused({tile(0, 100, 0, 150, TileKind::Full), tile(100, 100, 100, 100, TileKind::Full)}, "share dK/dV rows");
  AttnTile moved = tile(0, 100, 0, 100, TileKind::Full);
  moved.q_begin = 300;
  moved.dq_begin = 0;
  refused({tile(0, 100, 100, 100, TileKind::Full), moved}, "reads other q");
}

// A Partial tile whose spans lie past the end of the cells given (a cell list cut short, or made for
// another list) is refused, not read out of bounds.
TEST(DeterministicBackwardWork, RefusesCellsThatEndBeforeATilesSpans) {
  const AttnShape shape{8, 2, 128, 0.1F};
  AttnTile t = tile_of(0, 256, 0, 256, TileKind::Partial, 0, 2);
  t.spans_begin = 0;
  const std::vector<uint8_t> short_cells(8 * 2 + 8, 0);  // two q chunks' classes, one key chunk's span of two
  try {
    (void)dcp::cuda::make_deterministic_backward_work(std::vector<AttnTile>{t}, shape, 0, short_cells);
    ADD_FAILURE() << "accepted spans past the end of the cells";
  } catch (const dcp::Error& e) {
    EXPECT_EQ(e.kind(), dcp::ErrorKind::InvalidInput);
    EXPECT_NE(std::string(e.what()).find("past the end of the cell list"), std::string::npos) << e.what();
  }
}

// The ordered method's turns over the default work (make_backward_work, the wide items moved to
// the front): the items adding to the same dK / dV element share one semaphore and hold ranks 0,
// 1, ... in list order (so that, launched in list order, each waits only for items before it);
// an element with one adder takes no turn; the semaphores are numbered 0 .. n - 1.
TEST(DeterministicBackwardWork, OrderedTurnsFollowTheList) {
  const int shapes[][2] = {{8, 8}, {8, 2}, {8, 1}, {32, 8}};
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    Rand rng(seed + 100);
    const auto& sh = shapes[seed % 4];
    const AttnShape shape{sh[0], sh[1], 128, 0.1F};
    const List l = random_list(rng, shape.num_kv_heads);
    std::vector<dcp::cuda::AttnWorkItem> work = dcp::cuda::make_backward_work(l.tiles, shape);
    (void)dcp::cuda::partition_backward_work(work, l.tiles, shape, seed % 2 == 0 ? 0 : 256);
    const std::vector<dcp::cuda::AttnWorkItem> before = work;
    const int32_t sems = dcp::cuda::order_backward_turns(work, l.tiles, shape);
    std::map<std::tuple<int, int>, std::vector<size_t>> adders;  // (dK/dV row, kv head) -> items, in order
    for (size_t k = 0; k < work.size(); ++k) {
      const dcp::cuda::AttnWorkItem& w = work[k];
      const AttnTile& t = l.tiles[static_cast<size_t>(w.tile)];
      const int keys = std::min(kChunk, t.kv_len - w.chunk * kChunk);
      for (int key = 0; key < keys; ++key) adders[{dkv_row(t) + w.chunk * kChunk + key, w.head}].push_back(k);
    }
    std::set<int32_t> used;
    for (const auto& [at, items] : adders) {
      if (items.size() == 1) {
        EXPECT_LT(work[items[0]].dkv_sem, 0) << "seed " << seed;
        continue;
      }
      const int32_t sem = work[items[0]].dkv_sem;
      ASSERT_TRUE(sem >= 0 && sem < sems) << "seed " << seed;
      used.insert(sem);
      for (size_t r = 0; r < items.size(); ++r) {
        EXPECT_EQ(work[items[r]].dkv_sem, sem) << "seed " << seed;
        EXPECT_EQ(work[items[r]].dkv_rank, static_cast<int32_t>(r)) << "seed " << seed;
      }
    }
    EXPECT_EQ(static_cast<int32_t>(used.size()), sems) << "semaphores numbered without gaps, seed " << seed;
    // The turns change nothing else: the same items in the same order.
    ASSERT_EQ(work.size(), before.size());
    for (size_t k = 0; k < work.size(); ++k) {
      EXPECT_TRUE(work[k].tile == before[k].tile && work[k].chunk == before[k].chunk && work[k].head == before[k].head)
          << "item " << k << " moved, seed " << seed;
    }
    if (HasFatalFailure()) return;
  }
  // Tiles that share dK / dV rows but not their keys cannot take turns.
  const AttnShape shape{8, 2, 128, 0.1F};
  std::vector<AttnTile> bad{tile_of(0, 100, 0, 150, TileKind::Full, 0, 2), tile_of(100, 100, 100, 100, TileKind::Full, 0, 2)};
  std::vector<dcp::cuda::AttnWorkItem> work = dcp::cuda::make_backward_work(bad, shape);
  EXPECT_THROW((void)dcp::cuda::order_backward_turns(work, bad, shape), dcp::Error);
}

// Only the warp-specialised Hopper kernels have the deterministic passes: other routes refuse
// before launching anything (no GPU needed to see it).
TEST(DeterministicBackwardWork, OtherRoutesRefuse) {
  dcp::cuda::AttnBackwardParams p;
  p.shape = AttnShape{8, 2, 128, 0.1F};
  p.list.num_work = 1;
  p.deterministic = true;
  for (const auto route : {dcp::cuda::AttnKernelRoute::Mma, dcp::cuda::AttnKernelRoute::WgmmaBasic}) {
    p.route = route;
    try {
      dcp::cuda::attention_backward(p, nullptr);
      ADD_FAILURE() << "a deterministic backward ran on another route";
    } catch (const dcp::Error& e) {
      EXPECT_EQ(e.kind(), dcp::ErrorKind::Unsupported);
      // Off Hopper the wgmma-basic route is refused for the device first.
      if (route == dcp::cuda::AttnKernelRoute::Mma) {
        EXPECT_NE(std::string(e.what()).find("deterministic"), std::string::npos) << e.what();
      }
    }
  }
}

}  // namespace
