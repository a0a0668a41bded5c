// Block table: tiles, areas and kinds against brute-force counts over dense masks.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "blocks/brute.h"
#include "dcp/blocks.h"
#include "dcp/error.h"

namespace dcp {
namespace {

using test::Rng;

Batch random_batch(Rng& rng) {
  Batch b;
  b.shape.kv_heads = static_cast<int>(rng.uniform(1, 3));
  b.shape.q_heads = b.shape.kv_heads * static_cast<int>(rng.uniform(1, 4));
  b.shape.head_dim = 64;
  const int64_t n = rng.uniform(1, 4);
  for (int64_t s = 0; s < n; ++s) {
    const int64_t L = rng.uniform(1, 300);
    b.sequences.push_back({L, test::random_mask(rng, L), "s" + std::to_string(s)});
  }
  return b;
}

// Every q_heads_per_group value that the shape admits, plus the default.
std::vector<int> valid_group_options(const AttentionShape& shape) {
  std::vector<int> out{0};
  for (int h = 1; h <= shape.q_heads; ++h) {
    const int ratio = shape.group_ratio();
    if ((h <= ratio && ratio % h == 0) || (h > ratio && h % ratio == 0 && shape.q_heads % h == 0)) out.push_back(h);
  }
  return out;
}

// Checks the table against per-token counts of each sequence's mask.
void check_against_brute_force(const Batch& batch, const BlockTable& t) {
  ASSERT_NO_THROW(t.validate());
  ASSERT_EQ(t.num_sequences(), static_cast<int>(batch.sequences.size()));
  // Expected tiles: (seq, group, q, kv) -> area, from dense grids.
  using Key = std::tuple<int32_t, int32_t, int32_t, int32_t>;
  std::map<Key, size_t> index;
  for (size_t i = 0; i < t.tiles.size(); ++i) {
    const Tile& x = t.tiles[i];
    ASSERT_TRUE(index.emplace(Key{x.seq, x.head_group, x.q_block, x.kv_block}, i).second) << "duplicate tile";
  }
  size_t expected_tiles = 0;
  int64_t expected_area = 0;
  std::vector<Range> got;
  for (int s = 0; s < t.num_sequences(); ++s) {
    const Sequence& seq = batch.sequences[static_cast<size_t>(s)];
    const int64_t L = seq.length;
    const std::vector<uint8_t> grid = test::allowed_grid(seq.mask, L);
    const int32_t first = t.seq_first_block[static_cast<size_t>(s)];
    const int32_t last = t.seq_first_block[static_cast<size_t>(s) + 1];
    for (int32_t qb = first; qb < last; ++qb) {
      const TokenBlock& Q = t.token_blocks[static_cast<size_t>(qb)];
      for (int32_t kb = first; kb < last; ++kb) {
        const TokenBlock& K = t.token_blocks[static_cast<size_t>(kb)];
        int64_t area = 0;
        int64_t tri = 0;
        for (int64_t i = Q.begin; i < Q.begin + Q.length; ++i) {
          for (int64_t k = K.begin; k < K.begin + K.length; ++k) {
            const bool a = grid[static_cast<size_t>(i * L + k)] != 0;
            area += a ? 1 : 0;
            tri += (a && k <= i) ? 1 : 0;
          }
        }
        TileKind kind = TileKind::Partial;
        if (area == Q.length * K.length) {
          kind = TileKind::Full;
        } else if (qb == kb && area == Q.length * (Q.length + 1) / 2 && tri == area) {
          kind = TileKind::CausalDiagonal;
        }
        for (int32_t g = 0; g < t.groups.num_groups; ++g) {
          const auto it = index.find(Key{s, g, qb, kb});
          if (area == 0) {
            ASSERT_TRUE(it == index.end()) << "empty tile present: seq " << s << " q " << qb << " kv " << kb;
            continue;
          }
          ASSERT_TRUE(it != index.end()) << "missing tile: seq " << s << " group " << g << " q " << qb << " kv " << kb;
          const Tile& x = t.tiles[it->second];
          ASSERT_EQ(x.area, area) << "seq " << s << " q " << qb << " kv " << kb;
          ASSERT_EQ(x.kind, kind) << "seq " << s << " q " << qb << " kv " << kb << " got " << to_string(x.kind);
          ++expected_tiles;
          expected_area += area;
          if (g != 0) continue;  // row ranges do not depend on the head group
          for (int64_t i = Q.begin; i < Q.begin + Q.length; ++i) {
            t.tile_row_ranges(x, i, got);
            ASSERT_EQ(got, test::grid_row_ranges(grid, L, i, K.begin, K.begin + K.length)) << "row " << i;
          }
        }
      }
    }
  }
  ASSERT_EQ(t.tiles.size(), expected_tiles);
  ASSERT_EQ(t.total_area(), expected_area);
}

TEST(BlockTable, TilesMatchBruteForce) {
  Rng rng(0xb10c0004);
  std::map<TileKind, int> kinds_seen;
  for (int rep = 0; rep < 200; ++rep) {
    const Batch batch = random_batch(rng);
    const std::vector<int> options = valid_group_options(batch.shape);
    BlockOptions opts;
    opts.block_size = 16 * rng.uniform(1, 8);
    opts.q_heads_per_group = options[static_cast<size_t>(rng.uniform(0, static_cast<int64_t>(options.size()) - 1))];
    SCOPED_TRACE("rep " + std::to_string(rep) + " B=" + std::to_string(opts.block_size) +
                 " h=" + std::to_string(opts.q_heads_per_group));
    const BlockTable t = build_block_table(batch, opts);
    EXPECT_EQ(t.block_size, opts.block_size);
    int64_t tokens = 0;
    for (const Sequence& s : batch.sequences) tokens += s.length;
    EXPECT_EQ(t.total_tokens(), tokens);
    for (const TokenBlock& tb : t.token_blocks) EXPECT_LE(tb.length, opts.block_size);
    check_against_brute_force(batch, t);
    for (const Tile& x : t.tiles) ++kinds_seen[x.kind];
  }
  // The random cases reach every kind of tile.
  EXPECT_GT(kinds_seen[TileKind::Full], 0);
  EXPECT_GT(kinds_seen[TileKind::CausalDiagonal], 0);
  EXPECT_GT(kinds_seen[TileKind::Partial], 0);
}

TEST(BlockTable, CustomCutsMatchBruteForce) {
  Rng rng(0xb10c0005);
  for (int rep = 0; rep < 100; ++rep) {
    const Batch batch = random_batch(rng);
    std::vector<std::vector<int64_t>> cuts;
    for (const Sequence& s : batch.sequences) {
      std::vector<int64_t> c{0};
      while (c.back() < s.length) c.push_back(std::min(s.length, c.back() + rng.uniform(1, 70)));
      cuts.push_back(c);
    }
    SCOPED_TRACE("rep " + std::to_string(rep));
    const BlockTable t = build_block_table_with_cuts(batch, BlockOptions{}, cuts);
    EXPECT_EQ(t.block_size, 0);
    check_against_brute_force(batch, t);
  }
}

// split_sink: a sink shorter than B gets a block of its own, the next block ends at B, the
// tiles stay exact; masks without a sink (or a sink of B or more) keep the uniform cut.
TEST(BlockTable, SplitSinkCutsTheSinkAndStaysExact) {
  Rng rng(0xb10c0006);
  int split_seen = 0;
  for (int rep = 0; rep < 200; ++rep) {
    const Batch batch = random_batch(rng);
    BlockOptions opts;
    opts.block_size = 16 * rng.uniform(1, 8);
    opts.split_sink = true;
    SCOPED_TRACE("rep " + std::to_string(rep) + " B=" + std::to_string(opts.block_size));
    const BlockTable t = build_block_table(batch, opts);
    bool any_cut = false;
    for (size_t s = 0; s < batch.sequences.size(); ++s) {
      const Sequence& seq = batch.sequences[s];
      const int64_t sink = seq.mask.kind == MaskKind::Lambda            ? seq.mask.sink
                           : seq.mask.kind == MaskKind::CausalBlockwise ? seq.mask.block * seq.mask.sink_blocks
                                                                        : 0;
      const bool cut = sink > 0 && sink < std::min(opts.block_size, seq.length);
      any_cut = any_cut || cut;
      const TokenBlock& first = t.token_blocks[static_cast<size_t>(t.seq_first_block[s])];
      EXPECT_EQ(first.length, cut ? sink : std::min(opts.block_size, seq.length));
      if (cut) {
        const TokenBlock& second = t.token_blocks[static_cast<size_t>(t.seq_first_block[s]) + 1];
        EXPECT_EQ(second.begin, sink);
        EXPECT_EQ(second.begin + second.length, std::min(opts.block_size, seq.length));
      }
    }
    split_seen += any_cut ? 1 : 0;
    EXPECT_EQ(t.block_size, any_cut ? 0 : opts.block_size);
    check_against_brute_force(batch, t);
    EXPECT_NO_THROW(check_tiles_against_masks(t));
  }
  EXPECT_GT(split_seen, 20);
}

TEST(BlockTable, LongSequencesAddUp) {
  // Without a brute force at this size: tiles per group partition the mask area, and causal
  // counts are known in closed form.
  const int64_t L = 131072;
  Batch b;
  b.shape = {.q_heads = 32, .kv_heads = 8, .head_dim = 128, .dtype = DType::BF16};
  b.sequences.push_back({L, Mask::causal(), ""});
  const BlockTable causal = build_block_table(b, {.block_size = 512});
  EXPECT_EQ(causal.tiles.size(), 8u * 256 * 257 / 2);
  EXPECT_EQ(causal.total_area(), 8 * L * (L + 1) / 2);
  ASSERT_NO_THROW(causal.validate());
  for (const Tile& t : causal.tiles) {
    EXPECT_EQ(t.kind, t.q_block == t.kv_block ? TileKind::CausalDiagonal : TileKind::Full);
  }
  for (const Mask& m : {Mask::lambda(), Mask::causal_blockwise(), Mask::shared_question_for(L - 1000)}) {
    Batch x = b;
    x.sequences = {{L - 1000, m, ""}, {1000, Mask::full(), ""}};
    const BlockTable t = build_block_table(x, {.block_size = 1024});
    ASSERT_NO_THROW(t.validate());
    EXPECT_EQ(t.total_area(), 8 * (m.area(L - 1000) + 1000 * 1000)) << to_string(m.kind);
  }
}

TEST(BlockTable, HeadGroups) {
  Batch b;
  b.shape = {.q_heads = 32, .kv_heads = 8, .head_dim = 128, .dtype = DType::BF16};
  b.sequences.push_back({100, Mask::causal(), ""});
  const auto groups = [&](int h) { return build_block_table(b, {.block_size = 64, .q_heads_per_group = h}).groups; };
  HeadGroups g = groups(0);
  EXPECT_EQ(g.num_groups, 8);
  EXPECT_EQ(g.q_heads_per_group, 4);
  EXPECT_EQ(g.kv_heads_per_group, 1);
  EXPECT_EQ(g.groups_per_kv_set, 1);
  g = groups(2);
  EXPECT_EQ(g.num_groups, 16);
  EXPECT_EQ(g.groups_per_kv_set, 2);
  EXPECT_EQ(g.num_kv_sets(), 8);
  EXPECT_EQ(g.kv_set(5), 2);
  g = groups(16);
  EXPECT_EQ(g.num_groups, 2);
  EXPECT_EQ(g.kv_heads_per_group, 4);
  for (int bad : {3, 12, 64, -1}) {
    try {
      (void)groups(bad);
      ADD_FAILURE() << "no error for q_heads_per_group " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
      EXPECT_NE(std::string(e.what()).find("q_heads_per_group"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(std::to_string(bad)), std::string::npos) << e.what();
    }
  }
}

TEST(BlockTable, FlopsAndBytes) {
  Batch b;
  b.shape = {.q_heads = 32, .kv_heads = 8, .head_dim = 128, .dtype = DType::BF16};
  b.sequences.push_back({1000, Mask::causal(), ""});
  const BlockTable t = build_block_table(b, {.block_size = 256, .q_heads_per_group = 0});
  ASSERT_FALSE(t.tiles.empty());
  const Tile& x = t.tiles.front();
  EXPECT_DOUBLE_EQ(t.tile_flops_fwd(x), 4.0 * static_cast<double>(x.area) * 128 * 4);
  EXPECT_DOUBLE_EQ(t.tile_flops_bwd(x), 2.5 * t.tile_flops_fwd(x));
  EXPECT_EQ(t.total_area(), 8 * 1000 * 1001 / 2);
  EXPECT_EQ(t.data_bytes(DataKind::Q, 256), 256 * 4 * 128 * 2);
  EXPECT_EQ(t.data_bytes(DataKind::dQ, 256), 256 * 4 * 128 * 2);
  EXPECT_EQ(t.data_bytes(DataKind::KV, 256), 2 * 256 * 1 * 128 * 2);
  EXPECT_EQ(t.data_bytes(DataKind::LSE, 256), 256 * 4 * 4);
  EXPECT_EQ(t.data_bytes(DataKind::Delta, 256), 256 * 4 * 4);
  EXPECT_EQ(t.partial_bytes(DataKind::O, 256), 256 * 4 * 128 * 4);
  EXPECT_EQ(t.partial_bytes(DataKind::dKV, 256), 2 * 256 * 1 * 128 * 4);
  EXPECT_EQ(t.partial_bytes(DataKind::LSE, 256), 256 * 4 * 4);
  EXPECT_STREQ(to_string(TileKind::CausalDiagonal), "causal_diagonal");
  EXPECT_STREQ(to_string(DataKind::dKV), "dKV");
}

void expect_invalid_input(const std::function<void()>& f, const std::vector<std::string>& fragments) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
    for (const std::string& s : fragments) EXPECT_NE(std::string(e.what()).find(s), std::string::npos) << e.what();
  }
}

TEST(BlockTable, BadInputNamesTheField) {
  Batch b;
  b.sequences.push_back({100, Mask::causal(), ""});
  for (int64_t bad : {0, -16, 8, 100, 1000}) {
    expect_invalid_input([&] { (void)build_block_table(b, {.block_size = bad}); },
                         {"--block", "block_size", std::to_string(bad)});
  }
  Batch m = b;
  m.sequences.push_back({50, Mask::lambda(4, 0), ""});
  expect_invalid_input([&] { (void)build_block_table(m, {.block_size = 16}); }, {"sequences[1].mask", "window"});
  Batch z = b;
  z.sequences.push_back({0, Mask::causal(), ""});
  expect_invalid_input([&] { (void)build_block_table(z, {.block_size = 16}); }, {"sequences[1].length"});
  expect_invalid_input([&] { (void)build_block_table_with_cuts(b, {}, {{0, 50, 50, 100}}); }, {"cuts[0]", "increasing"});
  expect_invalid_input([&] { (void)build_block_table_with_cuts(b, {}, {{0, 99}}); }, {"cuts[0]", "100"});
  expect_invalid_input([&] { (void)build_block_table_with_cuts(b, {}, {}); }, {"cut"});
}

TEST(BlockTable, ValidateRejectsBrokenTables) {
  Batch b;
  b.sequences.push_back({300, Mask::causal(), ""});
  const BlockTable good = build_block_table(b, {.block_size = 64});
  ASSERT_NO_THROW(good.validate());
  const auto expect_plan_error = [](const BlockTable& t) {
    try {
      t.validate();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::InvalidPlan);
    }
  };
  BlockTable t = good;
  std::swap(t.tiles[0], t.tiles[1]);
  expect_plan_error(t);
  t = good;
  t.tiles[3].area = 0;
  expect_plan_error(t);
  t = good;
  t.token_blocks[2].length -= 1;
  expect_plan_error(t);
  t = good;
  t.groups.num_groups = 3;
  expect_plan_error(t);
}

}  // namespace
}  // namespace dcp
