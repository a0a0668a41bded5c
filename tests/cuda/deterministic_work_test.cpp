// Host tests of the deterministic backward's work lists (no GPU needed): the dQ rank that the
// kernel computes per walker step must equal the number of walkers of the same dQ block in
// earlier work items, found here by walking every item as the kernel does and deciding, key by
// key, which steps have an allowed pair (the others are skipped and are no walkers); every (tile,
// kv head, key chunk) is walked exactly once; no two items add to the same dK / dV element; lists
// that break the preconditions are refused with a message.
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

// Brute force, key by key: does any row of sub-tile u see a key of chunk c?
bool step_has_pair(const List& l, const AttnTile& t, int c, int u) {
  for (int r = u * kSub; r < std::min(t.q_len, (u + 1) * kSub); ++r) {
    for (int k = c * kChunk; k < std::min(t.kv_len, (c + 1) * kChunk); ++k) {
      if (t.kind == TileKind::Full) return true;
      if (t.kind == TileKind::CausalDiagonal) {
        if (k <= r) return true;
        continue;
      }
      const auto ri = static_cast<size_t>(t.range_row_begin + r);
      for (int32_t x = l.row_offsets[ri]; x < l.row_offsets[ri + 1]; ++x)
        if (l.ranges[2 * static_cast<size_t>(x)] <= k && k < l.ranges[2 * static_cast<size_t>(x) + 1]) return true;
    }
  }
  return false;
}

// A Partial tile's non-empty chunks at sub-tile u, from the order table (low word first).
uint64_t partial_bits(const int32_t* ord, int nsub, int u) {
  return static_cast<uint32_t>(ord[nsub + 2 * u]) | (static_cast<uint64_t>(static_cast<uint32_t>(ord[nsub + 2 * u + 1])) << 32);
}

// Walks every item of the deterministic work for list l as the kernel does and checks: each
// walker's rank equals the number of walkers of its dQ block in earlier items; the table's empty
// chunks are the steps without an allowed pair; every (tile, head, chunk) is walked once; dK / dV
// rows have one writer, or several taking turns 0, 1, ... at a semaphore no dQ block uses.
void check_work(const List& l, const AttnShape& shape, int unit_rows, uint64_t seed, int& checked, int& skipped) {
  const int group = shape.num_q_heads / shape.num_kv_heads;
  const dcp::cuda::DeterministicBackwardWork det =
      dcp::cuda::make_deterministic_backward_work(l.tiles, shape, l.row_offsets, l.ranges, unit_rows);
  size_t tile_heads = 0;
  for (const AttnTile& t : l.tiles) tile_heads += static_cast<size_t>(t.kv_head_end - t.kv_head_begin);
  ASSERT_EQ(det.tiles.size(), tile_heads) << "one tile per kv head, seed " << seed;

  std::map<int, int> walkers;  // semaphore -> walkers seen so far (in work order)
  std::set<std::tuple<int, int, int, int, int>> walked;     // (q row, kv row, head, kind, chunk)
  std::map<std::tuple<int, int>, std::vector<int>> dkv_writers;  // (dK/dV row, kv head) -> items, in order
  int max_sem = -1;
  for (size_t k = 0; k < det.work.size(); ++k) {
    const dcp::cuda::AttnWorkItem& w = det.work[k];
    const AttnTile& g = det.tiles[static_cast<size_t>(w.tile)];
    const int chunks = (g.kv_len + kChunk - 1) / kChunk;
    for (int key = 0; key < std::min(kChunk, g.kv_len - w.chunk * kChunk); ++key)
      dkv_writers[{dkv_row(g) + w.chunk * kChunk + key, w.head}].push_back(static_cast<int>(k));
    for (int ti = w.tile; ti < w.tile + w.num_tiles; ++ti) {
      const AttnTile& t = det.tiles[static_cast<size_t>(ti)];
      ASSERT_EQ(t.kv_begin, g.kv_begin);
      ASSERT_EQ(dkv_row(t), dkv_row(g));
      ASSERT_TRUE(t.kv_head_begin == w.head && t.kv_head_end == w.head + 1);
      ASSERT_TRUE(walked.insert({t.q_begin, t.kv_begin, w.head, static_cast<int>(t.kind), w.chunk}).second)
          << "a (tile, head, chunk) walked twice, seed " << seed;
      // The kernel's walk: q head by q head, 64-row sub-tiles from the causal diagonal's first.
      const int nsub = (t.q_len + kSub - 1) / kSub;
      const int first_sub = t.kind == TileKind::CausalDiagonal ? w.chunk * kChunk / kSub : 0;
      for (int qh = w.head * group; qh < (w.head + 1) * group; ++qh) {
        for (int u = first_sub; u < nsub; ++u) {
          if (!step_has_pair(l, t, w.chunk, u)) {  // the kernel skips it: not a walker
            ++skipped;
            continue;
          }
          const int sem = t.dq_sem + u * shape.num_q_heads + qh;
          max_sem = std::max(max_sem, sem);
          const int expected = walkers[sem]++;
          const int32_t* ord = det.order.data() + t.order;
          const uint64_t bits = t.kind == TileKind::Partial ? partial_bits(ord, nsub, u) : 0;
          if (t.kind == TileKind::Partial) {
            ASSERT_TRUE((bits >> w.chunk) & 1) << "seed " << seed;
          }
          ASSERT_EQ(dcp::cuda::deterministic_dq_rank(ord[u], t.kind, chunks, w.chunk, u, bits), expected)
              << "seed " << seed << " item " << k << " tile " << ti << " q head " << qh << " sub-tile " << u;
          ++checked;
        }
      }
      if (t.kind == TileKind::Partial) {  // the table's empty chunks are exactly the skipped steps
        for (int u = 0; u < nsub; ++u) {
          const uint64_t bits = partial_bits(det.order.data() + t.order, nsub, u);
          EXPECT_EQ(((bits >> w.chunk) & 1) != 0, step_has_pair(l, t, w.chunk, u)) << "seed " << seed;
        }
      }
    }
  }
  EXPECT_LT(max_sem, det.num_semaphores);
  size_t expected_walks = 0;
  for (const AttnTile& t : l.tiles)
    expected_walks += static_cast<size_t>((t.kv_len + kChunk - 1) / kChunk) * static_cast<size_t>(t.kv_head_end - t.kv_head_begin);
  EXPECT_EQ(walked.size(), expected_walks) << "seed " << seed;
  // dK / dV: one writer, or several taking turns 0, 1, ... in work order at one semaphore that
  // no dQ block uses.
  for (const auto& [at, items] : dkv_writers) {
    if (items.size() == 1) {
      EXPECT_LT(det.work[static_cast<size_t>(items[0])].dkv_sem, 0) << "seed " << seed;
      continue;
    }
    const int sem = det.work[static_cast<size_t>(items[0])].dkv_sem;
    EXPECT_GT(sem, max_sem) << "a dK/dV semaphore among the dQ ones, seed " << seed;
    EXPECT_LT(sem, det.num_semaphores);
    for (size_t r = 0; r < items.size(); ++r) {
      EXPECT_EQ(det.work[static_cast<size_t>(items[r])].dkv_sem, sem) << "seed " << seed;
      EXPECT_EQ(det.work[static_cast<size_t>(items[r])].dkv_rank, static_cast<int>(r))
          << "dK/dV row " << std::get<0>(at) << " seed " << seed;
    }
  }
  std::map<int, int> row_of_sem;  // one block's walkers all write the same rows
  for (const AttnTile& t : det.tiles)
    for (int u = 0; u < (t.q_len + kSub - 1) / kSub; ++u) {
      const auto [it, added] = row_of_sem.emplace(t.dq_sem + u * shape.num_q_heads, dq_row(t) + u * kSub);
      EXPECT_EQ(it->second, dq_row(t) + u * kSub) << "seed " << seed;
    }
}

TEST(DeterministicBackwardWork, ClosedFormRanksMatchTheWalkOrder) {
  const int shapes[][2] = {{8, 8}, {8, 2}, {8, 1}, {32, 8}};
  int checked_steps = 0, skipped_steps = 0;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    Rand rng(seed);
    const auto& sh = shapes[seed % 4];
    const AttnShape shape{sh[0], sh[1], 128, 0.1F};
    const List l = random_list(rng, shape.num_kv_heads);
    // Units of every size: one tile each, a few, and whole key blocks.
    const int unit_rows = seed % 3 == 0 ? 1 : seed % 3 == 1 ? 1000 : 0;
    check_work(l, shape, unit_rows, seed, checked_steps, skipped_steps);
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(checked_steps, 10000);
  EXPECT_GT(skipped_steps, 500) << "the partial tiles are meant to have empty steps";
}

// Key blocks of more than 64 chunks (8192 keys): full and causal diagonal tiles sharing dQ rows
// with short ones.
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
    int checked = 0, skipped = 0;
    check_work(l, shape, unit_rows, 1, checked, skipped);
    EXPECT_GT(checked, 1000);
  }
}

TEST(DeterministicBackwardWork, RefusesListsItCannotOrder) {
  const AttnShape shape{8, 2, 128, 0.1F};
  auto tile = [](int q, int nq, int kv, int nkv, TileKind kind) { return tile_of(q, nq, kv, nkv, kind, 0, 2); };
  auto refused = [&](const std::vector<AttnTile>& tiles, const std::string& words) {
    try {
      (void)dcp::cuda::make_deterministic_backward_work(tiles, shape, std::vector<int32_t>{0}, std::vector<int32_t>{});
    } catch (const dcp::Error& e) {
      EXPECT_EQ(e.kind(), dcp::ErrorKind::InvalidInput);
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "accepted a list that should be refused (" << words << ")";
  };
  // dQ rows shared with different lengths.
  refused({tile(0, 100, 0, 100, TileKind::Full), tile(0, 90, 100, 100, TileKind::Full)}, "share them exactly");
  // dQ rows overlapping without sharing the first row.
  refused({tile(0, 100, 0, 100, TileKind::Full), tile(50, 100, 100, 100, TileKind::Full)}, "overlap");
  // dK / dV rows shared by tiles over different keys.
  refused({tile(0, 100, 0, 150, TileKind::Full), tile(100, 100, 100, 100, TileKind::Full)}, "share dK/dV rows");
  // The same dQ rows twice in one kv group.
  AttnTile moved = tile(0, 100, 0, 100, TileKind::Full);
  moved.q_begin = 300;
  moved.dq_begin = 0;
  refused({tile(0, 100, 0, 100, TileKind::Full), moved}, "repeats the dQ rows");
  // A list it can order: two head groups over the same rows.
  std::vector<AttnTile> ok{tile(0, 100, 0, 100, TileKind::Full), tile(0, 100, 0, 100, TileKind::Full)};
  ok[0].kv_head_end = 1;
  ok[1].kv_head_begin = 1;
  EXPECT_NO_THROW((void)dcp::cuda::make_deterministic_backward_work(ok, shape, std::vector<int32_t>{0}, std::vector<int32_t>{}));
}

// The split deterministic backward's two lists. dK / dV pass: every (tile, kv head, key chunk)
// walked once, by items whose tiles share keys, dK / dV rows and the head; each dK / dV element
// has one writer, or several taking turns 0, 1, ... in work order; heaviest items first. dQ pass:
// every (tile, q head, 128-row chunk) walked once, by the one item that owns those dQ rows and
// head (one writer per dQ element); heaviest first.
void check_split(const List& l, const AttnShape& shape, int unit_rows, uint64_t seed) {
  const int group = shape.num_q_heads / shape.num_kv_heads;
  const dcp::cuda::SplitBackwardWork split = dcp::cuda::make_split_backward_work(l.tiles, shape, unit_rows);
  auto area = [](const AttnTile& t, int keys) {
    return static_cast<double>(keys) * t.q_len * (t.kind == TileKind::CausalDiagonal ? 0.5 : 1.0);
  };
  std::set<std::tuple<int, int, int, int, int>> walked;          // (q row, kv row, head, kind, chunk)
  std::map<std::tuple<int, int>, std::vector<int>> dkv_writers;  // (dK/dV row, kv head) -> items, in order
  double prev_cost = 1e300;
  for (size_t k = 0; k < split.dkv_work.size(); ++k) {
    const dcp::cuda::AttnWorkItem& w = split.dkv_work[k];
    const AttnTile& g = split.dkv_tiles[static_cast<size_t>(w.tile)];
    const int keys = std::min(kChunk, g.kv_len - w.chunk * kChunk);
    ASSERT_GT(keys, 0) << "seed " << seed;
    for (int key = 0; key < keys; ++key) dkv_writers[{dkv_row(g) + w.chunk * kChunk + key, w.head}].push_back(static_cast<int>(k));
    double cost = 0;
    for (int ti = w.tile; ti < w.tile + w.num_tiles; ++ti) {
      const AttnTile& t = split.dkv_tiles[static_cast<size_t>(ti)];
      ASSERT_TRUE(t.kv_begin == g.kv_begin && t.kv_len == g.kv_len && dkv_row(t) == dkv_row(g)) << "seed " << seed;
      ASSERT_TRUE(t.kv_head_begin == w.head && t.kv_head_end == w.head + 1) << "seed " << seed;
      ASSERT_TRUE(walked.insert({t.q_begin, t.kv_begin, w.head, static_cast<int>(t.kind), w.chunk}).second)
          << "a (tile, head, chunk) walked twice, seed " << seed;
      cost += area(t, keys);
    }
    EXPECT_LE(cost, prev_cost) << "dK / dV items not heaviest first, seed " << seed;
    prev_cost = cost;
  }
  size_t expected_walks = 0;
  for (const AttnTile& t : l.tiles)
    expected_walks += static_cast<size_t>((t.kv_len + kChunk - 1) / kChunk) * static_cast<size_t>(t.kv_head_end - t.kv_head_begin);
  EXPECT_EQ(walked.size(), expected_walks) << "seed " << seed;
  for (const auto& [at, items] : dkv_writers) {
    if (items.size() == 1) {
      EXPECT_LT(split.dkv_work[static_cast<size_t>(items[0])].dkv_sem, 0) << "seed " << seed;
      continue;
    }
    const int sem = split.dkv_work[static_cast<size_t>(items[0])].dkv_sem;
    EXPECT_TRUE(sem >= 0 && sem < split.num_semaphores) << "seed " << seed;
    for (size_t r = 0; r < items.size(); ++r) {
      EXPECT_EQ(split.dkv_work[static_cast<size_t>(items[r])].dkv_sem, sem) << "seed " << seed;
      EXPECT_EQ(split.dkv_work[static_cast<size_t>(items[r])].dkv_rank, static_cast<int>(r)) << "seed " << seed;
    }
  }
  if (unit_rows == 0) {
    EXPECT_EQ(split.num_semaphores, 0) << "whole key blocks take no turns, seed " << seed;
  }

  // dQ pass.
  constexpr int kQChunk = dcp::cuda::kAttnForwardChunkRows;
  std::map<std::tuple<int, int, int, int>, int> dq_walks;  // (q row, kv row, q head, chunk) -> times
  std::set<std::tuple<int, int>> dq_owner;                 // (first dQ row of the chunk, q head)
  prev_cost = 1e300;
  for (const dcp::cuda::AttnWorkItem& w : split.dq_work) {
    const AttnTile& f = split.dq_tiles[static_cast<size_t>(w.tile)];
    ASSERT_LT(w.chunk * kQChunk, f.q_len) << "seed " << seed;
    ASSERT_TRUE(dq_owner.insert({dq_row(f) + w.chunk * kQChunk, w.head}).second) << "two writers of dQ rows, seed " << seed;
    double cost = 0;
    for (int ti = w.tile; ti < w.tile + w.num_tiles; ++ti) {
      const AttnTile& t = split.dq_tiles[static_cast<size_t>(ti)];
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

TEST(SplitBackwardWork, EveryPairOnceOneWriterPerElement) {
  const int shapes[][2] = {{8, 8}, {8, 2}, {8, 1}, {32, 8}};
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    Rand rng(seed);
    const auto& sh = shapes[seed % 4];
    const AttnShape shape{sh[0], sh[1], 128, 0.1F};
    const List l = random_list(rng, shape.num_kv_heads);
    check_split(l, shape, seed % 3 == 0 ? 1 : seed % 3 == 1 ? 1000 : 0, seed);
    if (HasFatalFailure()) return;
  }
}

TEST(SplitBackwardWork, RefusesListsWithSharedRowsThatDisagree) {
  const AttnShape shape{8, 2, 128, 0.1F};
  auto tile = [](int q, int nq, int kv, int nkv, TileKind kind) { return tile_of(q, nq, kv, nkv, kind, 0, 2); };
  auto refused = [&](const std::vector<AttnTile>& tiles, const std::string& words) {
    try {
      (void)dcp::cuda::make_split_backward_work(tiles, shape);
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

// Only the warp-specialised Hopper kernel has the deterministic order: other routes refuse
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
