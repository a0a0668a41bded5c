// Property tests of the static baselines against per-token brute force.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <tuple>

#include "baselines/random_cases.h"
#include "dcp/baselines.h"
#include "dcp/error.h"

namespace dcp {
namespace {

using test::Case;
using test::Rng;

// Largest divisor of n that divides m, by search (the library uses gcd).
int largest_divisor_dividing(int n, int m) {
  for (int u = n; u >= 1; --u) {
    if (n % u == 0 && m % u == 0) return u;
  }
  return 1;
}

int num_groups_of(const Batch& batch, const BlockOptions& opts) {
  const int per = opts.q_heads_per_group > 0 ? opts.q_heads_per_group : batch.shape.group_ratio();
  return batch.shape.q_heads / per;
}

// Per token: the brute-force set of (q block, kv block) pairs that hold an allowed (row, key)
// pair, with their areas, at the table's cuts.
std::map<std::pair<int, int>, int64_t> brute_force_pairs(const Batch& batch,
                                                         const BlockTable& table, int s) {
  const int first = table.seq_first_block[s];
  const int last = table.seq_first_block[s + 1];
  const int64_t length = batch.sequences[s].length;
  std::vector<int> block_of(static_cast<size_t>(length));
  for (int b = first; b < last; ++b) {
    const TokenBlock& tb = table.token_blocks[b];
    for (int64_t i = tb.begin; i < tb.begin + tb.length; ++i) block_of[i] = b;
  }
  std::map<std::pair<int, int>, int64_t> pairs;
  std::vector<Range> ranges;
  for (int64_t row = 0; row < length; ++row) {
    batch.sequences[s].mask.row_ranges(row, length, ranges);
    for (const Range& r : ranges) {
      for (int64_t k = r.begin; k < r.end; ++k) ++pairs[{block_of[row], block_of[k]}];
    }
  }
  return pairs;
}

// Checks shared by every baseline; returns nothing, records failures.
void check_common(const Case& c, const PlacedBatch& pb, BaselineKind kind) {
  const BlockTable& table = pb.table;
  const Placement& pl = pb.placement;
  SCOPED_TRACE(std::string(to_string(kind)) + " P=" + std::to_string(c.cluster.num_devices()) +
               " note: " + pl.note);
  EXPECT_NO_THROW(pl.validate(table));
  EXPECT_EQ(pl.method, to_string(kind));
  EXPECT_EQ(pl.num_devices, c.cluster.num_devices());
  EXPECT_FALSE(pl.note.empty());

  // Token conservation: the blocks of each sequence tile [0, L) without gaps or overlaps.
  ASSERT_EQ(table.num_sequences(), static_cast<int>(c.batch.sequences.size()));
  std::vector<int64_t> owned(pl.num_devices, 0);
  for (int s = 0; s < table.num_sequences(); ++s) {
    int64_t at = 0;
    for (int b = table.seq_first_block[s]; b < table.seq_first_block[s + 1]; ++b) {
      const TokenBlock& tb = table.token_blocks[b];
      EXPECT_EQ(tb.seq, s);
      EXPECT_EQ(tb.begin, at);
      EXPECT_GT(tb.length, 0);
      at += tb.length;
      owned[pl.block_home[b]] += tb.length;
    }
    EXPECT_EQ(at, c.batch.sequences[s].length);
  }
  EXPECT_EQ(std::accumulate(owned.begin(), owned.end(), int64_t{0}), c.batch.total_tokens());

  // Every tile exactly once: the tiles are the brute-force non-empty pairs x head groups.
  const int num_groups = num_groups_of(c.batch, c.opts);
  ASSERT_EQ(table.groups.num_groups, num_groups);
  std::set<std::tuple<int, int, int, int>> seen;
  for (const Tile& t : table.tiles) {
    EXPECT_TRUE(seen.insert({t.seq, t.head_group, t.q_block, t.kv_block}).second);
  }
  size_t expected_tiles = 0;
  for (int s = 0; s < table.num_sequences(); ++s) {
    const auto pairs = brute_force_pairs(c.batch, table, s);
    expected_tiles += pairs.size() * static_cast<size_t>(num_groups);
    for (const auto& [key, area] : pairs) {
      for (int g = 0; g < num_groups; ++g) {
        EXPECT_TRUE(seen.count({s, g, key.first, key.second}))
            << "missing tile seq " << s << " group " << g << " q " << key.first << " kv "
            << key.second;
      }
    }
  }
  EXPECT_EQ(table.tiles.size(), expected_tiles);
  EXPECT_EQ(pl.tile_device.size(), table.tiles.size());
}

// Per sequence: block lengths (all > 0) are the non-empty ones of `n` even chunks.
void check_even_chunks(const BlockTable& table, int s, int n) {
  const int first = table.seq_first_block[s];
  const int num_blocks = table.seq_first_block[s + 1] - first;
  const int64_t length = table.seq_length[s];
  EXPECT_EQ(num_blocks, static_cast<int>(std::min<int64_t>(length, n)));
  for (int k = 0; k < num_blocks; ++k) {
    const int64_t expected = length / n + (k < length % n ? 1 : 0);
    EXPECT_EQ(table.token_blocks[first + k].length, expected) << "seq " << s << " chunk " << k;
  }
}

TEST(Baselines, Names) {
  const auto kinds = all_baselines();
  ASSERT_EQ(kinds.size(), 5u);
  std::vector<std::string> names;
  for (BaselineKind k : kinds) names.push_back(to_string(k));
  EXPECT_EQ(names, (std::vector<std::string>{"ring", "zigzag", "ulysses", "a2a_p2p", "packing"}));
}

TEST(Baselines, RandomCasesAllKinds) {
  Rng rng(20250601);
  for (int iter = 0; iter < 200; ++iter) {
    const Case c = test::random_case(rng);
    const int P = c.cluster.num_devices();
    const int G = num_groups_of(c.batch, c.opts);
    for (BaselineKind kind : all_baselines()) {
      const PlacedBatch pb = make_baseline(kind, c.batch, c.opts, c.cluster);
      check_common(c, pb, kind);
      const BlockTable& table = pb.table;
      const Placement& pl = pb.placement;
      for (int s = 0; s < table.num_sequences(); ++s) {
        const int first = table.seq_first_block[s];
        const int last = table.seq_first_block[s + 1];
        switch (kind) {
          case BaselineKind::Ring:
            check_even_chunks(table, s, P);
            for (int b = first; b < last; ++b) EXPECT_EQ(pl.block_home[b], b - first);
            break;
          case BaselineKind::Zigzag:
            check_even_chunks(table, s, 2 * P);
            for (int b = first; b < last; ++b) {
              const int chunk = b - first;
              EXPECT_EQ(pl.block_home[b], chunk < P ? chunk : 2 * P - 1 - chunk);
            }
            break;
          case BaselineKind::Ulysses:
            check_even_chunks(table, s, P);
            for (int b = first; b < last; ++b) EXPECT_EQ(pl.block_home[b], b - first);
            break;
          case BaselineKind::A2AP2P: {
            // Rebuild the expected pieces: 2r zigzag chunks, each in u pieces.
            const int u = largest_divisor_dividing(c.cluster.devices_per_node, G);
            const int r = P / u;
            std::vector<std::pair<int64_t, int>> pieces;  // (length, home), non-empty only
            const int64_t length = table.seq_length[s];
            for (int ch = 0; ch < 2 * r; ++ch) {
              const int64_t chunk_len = length / (2 * r) + (ch < length % (2 * r) ? 1 : 0);
              const int slot = ch < r ? ch : 2 * r - 1 - ch;
              for (int j = 0; j < u; ++j) {
                const int64_t len = chunk_len / u + (j < chunk_len % u ? 1 : 0);
                if (len > 0) pieces.push_back({len, slot * u + j});
              }
            }
            ASSERT_EQ(last - first, static_cast<int>(pieces.size()));
            for (int b = first; b < last; ++b) {
              EXPECT_EQ(table.token_blocks[b].length, pieces[b - first].first);
              EXPECT_EQ(pl.block_home[b], pieces[b - first].second);
            }
            break;
          }
          case BaselineKind::Packing:
            for (int b = first; b < last; ++b) {
              EXPECT_EQ(pl.block_home[b], pl.block_home[first]);
              EXPECT_EQ(table.token_blocks[b].length,
                        std::min<int64_t>(c.opts.block_size,
                                          table.seq_length[s] - table.token_blocks[b].begin));
            }
            break;
        }
      }
      // Where tiles run.
      const int u_ulysses = largest_divisor_dividing(P, G);
      const int u_a2a = largest_divisor_dividing(c.cluster.devices_per_node, G);
      for (size_t i = 0; i < table.tiles.size(); ++i) {
        const Tile& t = table.tiles[i];
        const int q_home = pl.block_home[t.q_block];
        const int dev = pl.tile_device[i];
        switch (kind) {
          case BaselineKind::Ring:
          case BaselineKind::Zigzag:
            EXPECT_EQ(dev, q_home);
            break;
          case BaselineKind::Ulysses: {
            const int p = t.q_block - table.seq_first_block[t.seq];
            EXPECT_EQ(dev, (p / u_ulysses) * u_ulysses + t.head_group % u_ulysses);
            break;
          }
          case BaselineKind::A2AP2P:
            // Same slot as the Q piece's home (so inside its node), head group picks the device.
            EXPECT_EQ(dev / u_a2a, q_home / u_a2a);
            EXPECT_EQ(dev % u_a2a, t.head_group % u_a2a);
            EXPECT_EQ(c.cluster.node_of(dev), c.cluster.node_of(q_home));
            break;
          case BaselineKind::Packing:
            EXPECT_EQ(dev, pl.block_home[table.seq_first_block[t.seq]]);
            break;
        }
      }
    }
  }
}

TEST(Baselines, UlyssesNoteAndDegree) {
  Batch batch;
  batch.shape = {.q_heads = 8, .kv_heads = 8, .head_dim = 16, .dtype = DType::BF16};
  batch.sequences.push_back({.length = 100, .mask = Mask::causal(), .id = ""});
  BlockOptions opts;
  opts.block_size = 16;
  Cluster cluster;
  cluster.nodes = 3;
  cluster.devices_per_node = 4;  // P = 12, 8 head groups: degree 4 x ring 3
  const PlacedBatch pb = make_baseline(BaselineKind::Ulysses, batch, opts, cluster);
  EXPECT_NE(pb.placement.note.find("ulysses degree 4 x ring 3"), std::string::npos)
      << pb.placement.note;
  const PlacedBatch a2a = make_baseline(BaselineKind::A2AP2P, batch, opts, cluster);
  EXPECT_NE(a2a.placement.note.find("a2a degree 4 x zigzag ring 3"), std::string::npos)
      << a2a.placement.note;
}

TEST(Baselines, ShortSequenceKeepsEveryToken) {
  Batch batch;
  batch.shape = {.q_heads = 4, .kv_heads = 2, .head_dim = 16, .dtype = DType::BF16};
  batch.sequences.push_back({.length = 5, .mask = Mask::causal(), .id = ""});
  batch.sequences.push_back({.length = 1, .mask = Mask::full(), .id = ""});
  BlockOptions opts;
  opts.block_size = 16;
  Cluster cluster;
  cluster.nodes = 1;
  cluster.devices_per_node = 8;
  for (BaselineKind kind : all_baselines()) {
    const PlacedBatch pb = make_baseline(kind, batch, opts, cluster);
    EXPECT_EQ(pb.table.total_tokens(), 6) << to_string(kind);
    if (kind == BaselineKind::Ring || kind == BaselineKind::Zigzag) {
      EXPECT_EQ(pb.table.num_token_blocks(), 6) << to_string(kind);  // one token per chunk
      EXPECT_NE(pb.placement.note.find("empty chunks skipped"), std::string::npos);
    }
  }
}

TEST(Baselines, PackingLongestFirstOntoLeastLoaded) {
  Batch batch;
  batch.shape = {.q_heads = 4, .kv_heads = 4, .head_dim = 16, .dtype = DType::BF16};
  for (int64_t len : {64, 256, 128, 32, 128}) {
    batch.sequences.push_back({.length = len, .mask = Mask::causal(), .id = ""});
  }
  BlockOptions opts;
  opts.block_size = 32;
  Cluster cluster;
  cluster.nodes = 1;
  cluster.devices_per_node = 3;
  const PlacedBatch pb = make_baseline(BaselineKind::Packing, batch, opts, cluster);
  std::vector<int> dev;
  for (int s = 0; s < 5; ++s) dev.push_back(pb.placement.block_home[pb.table.seq_first_block[s]]);
  // Causal areas: 256 -> 32896, 128 -> 8256 (x2, tie broken by index), 64 -> 2080, 32 -> 528.
  // Order 1, 2, 4, 0, 3: 1->d0, 2->d1, 4->d2, 0->d1 (8256 vs 8256: first), 3->d2.
  EXPECT_EQ(dev, (std::vector<int>{1, 0, 1, 2, 2}));
}

TEST(Placement, ValidateRejects) {
  const test::Case c = test::one_causal_case(2);
  const Cluster& cluster = c.cluster;
  PlacedBatch pb = make_baseline(BaselineKind::Ring, c.batch, c.opts, cluster);
  Placement bad = pb.placement;
  bad.block_home.pop_back();
  EXPECT_THROW(bad.validate(pb.table), Error);
  bad = pb.placement;
  bad.tile_device.push_back(0);
  EXPECT_THROW(bad.validate(pb.table), Error);
  bad = pb.placement;
  bad.tile_device[0] = 2;
  try {
    bad.validate(pb.table);
    FAIL() << "expected InvalidPlan";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidPlan);
    EXPECT_NE(std::string(e.what()).find("tile_device[0] = 2"), std::string::npos) << e.what();
  }
  bad = pb.placement;
  bad.block_home[0] = -1;
  EXPECT_THROW(bad.validate(pb.table), Error);
}

}  // namespace
}  // namespace dcp
