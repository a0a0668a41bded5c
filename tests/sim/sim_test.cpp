// Simulator sanity: one device = sum of kernel times; more bandwidth never slows a plan;
// trace and calibration parsing.
#include <gtest/gtest.h>

#include <tuple>
#include <variant>

#include <nlohmann/json.hpp>

#include "dcp/detail/rng.h"
#include "dcp/error.h"
#include "dcp/plan_svg.h"
#include "dcp/sim.h"
#include "common/batches.h"
#include "plan/plan_fixtures.h"
#include "sim/kernel_cost.h"

namespace dcp {
namespace {

using testing::cluster_for;
using testing::placed;
using testing::plan_for;
using testing::skewed_batch;

TEST(Sim, OneDeviceTimeIsTheSumOfKernelTimes) {
  for (const std::string& mask : testing::mask_names()) {
    auto pb = placed(BaselineKind::Packing, skewed_batch(mask), 1);
    Plan p = plan_for(pb, 1);
    SimOptions o;
    o.calibration = calibration_from_cluster(cluster_for(1));
    SimResult r = simulate(p, cluster_for(1), o);
    // Consecutive merges run as one batch: one launch overhead for the batch.
    auto sum = [&](const Program& prog, Pass pass) {
      double t = 0;
      for (size_t pc = 0; pc < prog.code.size(); ++pc) {
        t += instruction_time_s(p, prog.code[pc], pass, o.calibration);
        if (pc > 0 && std::holds_alternative<Merge>(prog.code[pc]) && std::holds_alternative<Merge>(prog.code[pc - 1]))
          t -= o.calibration.launch_overhead_s;
      }
      return t;
    };
    const double fwd = sum(p.devices[0].fwd, Pass::Forward), bwd = sum(p.devices[0].bwd, Pass::Backward);
    EXPECT_NEAR(r.fwd_s, fwd, 1e-12 * fwd) << mask;
    EXPECT_NEAR(r.bwd_s, bwd, 1e-12 * bwd) << mask;
    EXPECT_EQ(r.comm_s, 0.0);
    EXPECT_EQ(r.hidden_fraction, 1.0);
    // And the attention part is at least the FLOPs at the calibrated rate.
    EXPECT_GE(fwd, static_cast<double>(pb.table.total_area()) * 4.0 * 64 * 4 / o.calibration.attn_fwd_flops);
  }
}

TEST(Sim, DoublingBandwidthNeverSlowsAPlan) {
  for (BaselineKind kind : all_baselines()) {
    for (int P : {4, 8}) {
      auto pb = testing::scattered(placed(kind, skewed_batch("causal", 8192), P), 5);
      for (const PlacedBatch* b : {&pb}) {
        Plan p = plan_for(*b, P, 3);
        Cluster c = cluster_for(P);
        SimOptions o;
        o.calibration = calibration_from_cluster(c);
        SimResult slow = simulate(p, c, o);
        Cluster fast = c;
        fast.intra_bw *= 2;
        fast.inter_bw_device *= 2;
        fast.nic_bw_node *= 2;
        SimResult quick = simulate(p, fast, o);
        EXPECT_LE(quick.total_s(), slow.total_s() * (1 + 1e-12)) << to_string(kind) << " P=" << P;
        EXPECT_GE(slow.hidden_fraction, 0.0);
        EXPECT_LE(slow.hidden_fraction, 1.0);
        for (const DeviceSim& d : slow.devices) EXPECT_LE(d.compute_s[0], slow.fwd_s * (1 + 1e-12));
      }
    }
  }
}

TEST(Sim, TraceIsChromeJsonWithComputeAndCommunication) {
  Plan p = plan_for(testing::scattered(placed(BaselineKind::Zigzag, skewed_batch("lambda"), 4), 2), 4);
  SimOptions o;
  o.trace = true;
  SimResult r = simulate(p, cluster_for(4), o);
  auto j = nlohmann::json::parse(r.trace_json);
  int compute = 0, comm = 0;
  for (const auto& e : j["traceEvents"])
    if (e["ph"] == "X") (e["tid"] == 0 ? compute : comm) += 1;
  EXPECT_GT(compute, 0);
  EXPECT_GT(comm, 0);
  EXPECT_FALSE(r.critical_path.empty());
}

TEST(Sim, CalibrationFiles) {
  Calibration c = parse_calibration(R"({"name":"h200","attn_fwd_tflops":390,"attn_bwd_tflops":364,
      "tile_overhead_us":0.5,"launch_overhead_us":4,"memory_bw_GBps":4200})", "h200.json");
  EXPECT_DOUBLE_EQ(c.attn_fwd_flops, 390e12);
  EXPECT_DOUBLE_EQ(c.tile_overhead_s, 0.5e-6);
  EXPECT_THROW(parse_calibration(R"({"attn_fwd_tflop":390})", "x.json"), Error);
  EXPECT_THROW(parse_calibration(R"({"attn_fwd_tflops":-1})", "x.json"), Error);
  EXPECT_THROW(parse_calibration("{", "x.json"), Error);
  EXPECT_THROW(parse_calibration(R"({"fwd_partial_efficiency":0})", "x.json"), Error);
  EXPECT_THROW(parse_calibration(R"({"bwd_diagonal_efficiency":1.5})", "x.json"), Error);
  EXPECT_THROW(simulate(plan_for(placed(BaselineKind::Ring, skewed_batch("causal"), 4), 4), cluster_for(8), SimOptions{}),
               Error);
}

// A tile kind at efficiency e costs 1/e of its mask-area FLOPs at the full-tile rate: on one
// device, halving the partial efficiency adds exactly the partial tiles' time once more.
TEST(Sim, TileKindEfficienciesScaleOnlyTheirTiles) {
  Plan p = plan_for(placed(BaselineKind::Ring, skewed_batch("lambda"), 1), 1);
  Calibration full;
  full.tile_overhead_s = 0;
  full.launch_overhead_s = 0;
  Calibration half = full;
  half.fwd_partial_efficiency = 0.5;
  double partial_flops = 0;
  for (const Tile& t : p.table.tiles)
    if (t.kind == TileKind::Partial) partial_flops += p.table.tile_flops_fwd(t);
  ASSERT_GT(partial_flops, 0);
  SimOptions a, b;
  a.calibration = full;
  b.calibration = half;
  const double t_full = simulate(p, cluster_for(1), a).fwd_s;
  const double t_half = simulate(p, cluster_for(1), b).fwd_s;
  EXPECT_NEAR(t_half - t_full, partial_flops / full.attn_fwd_flops, 1e-9 + 1e-9 * t_full);
  Calibration diag = full;
  diag.bwd_diagonal_efficiency = 0.25;  // the other pass: the forward must not change
  SimOptions c;
  c.calibration = diag;
  EXPECT_DOUBLE_EQ(simulate(p, cluster_for(1), c).fwd_s, t_full);
}

TEST(Svg, DrawsEveryTileOfTheShownGroupAndEveryDevice) {
  auto pb = testing::dcp_placed(skewed_batch("shared_question"), 4);
  Plan p = plan_for(pb, 4);
  SimResult r = simulate(p, cluster_for(4), SimOptions{});
  SvgOptions o;
  o.max_sequences = 100;
  const std::string svg = plan_to_svg(p, o, &r);
  ASSERT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  size_t shapes = 0;
  for (size_t at = 0; (at = svg.find("<rect", at)) != std::string::npos; ++at) ++shapes;
  for (size_t at = 0; (at = svg.find("<polygon", at)) != std::string::npos; ++at) ++shapes;
  size_t tiles_g0 = 0;
  for (const Tile& t : pb.table.tiles) tiles_g0 += t.head_group == 0;
  // Tiles + 2 home strips per token block + 1 frame per sequence + background + 5 bars per device.
  EXPECT_EQ(shapes, tiles_g0 + 2 * pb.table.token_blocks.size() + pb.table.seq_length.size() + 1 + 5 * 4);
}

}  // namespace
}  // namespace dcp

namespace dcp {
namespace {

// Sub-tile counts against a per-pair brute force (every mask kind, both sub-tile shapes, block
// sizes that do not divide the sub-tile grid), and the closed forms of full and diagonal tiles. A
// sub-tile is full only with every one of its rows x keys_per pairs allowed: the kernels mask the
// keys past a short kv block.
TEST(SimKernelCost, SubtileCountsMatchPerPairBruteForce) {
  // Explicit ranges: one set per row (pieces as many as rows: counted by rows), and a set per
  // band of 325 rows (a few pieces: counted by closed forms where a tile meets few).
  SplitMix64 rng(7);
  auto random_ranges = [&](int64_t length, int64_t band) {
    std::vector<std::vector<Range>> rows(static_cast<size_t>(length));
    for (int64_t i = 0; i < length; ++i) {
      if (i % band != 0) {
        rows[static_cast<size_t>(i)] = rows[static_cast<size_t>(i - 1)];
        continue;
      }
      int64_t at = rng.below(length / 4);
      for (int r = 0; r < 3 && at < length; ++r) {
        const int64_t end = std::min(length, at + 1 + rng.below(length / 3));
        rows[static_cast<size_t>(i)].push_back({at, end});
        at = end + 1 + rng.below(length / 4);
      }
    }
    return Mask::ranges(std::move(rows));
  };
  const Batch batch = test::batch_of(AttentionShape{4, 2, 64, DType::BF16},
                                     {{700, Mask::causal()}, {333, Mask::lambda(16, 200)},
                                      {900, Mask::causal_blockwise(96, 2, 1)}, {257, Mask::shared_question_for(257, 0.3, 3)},
                                      {600, random_ranges(600, 1)}, {650, random_ranges(650, 325)}});
  for (int64_t block : {256, 320}) {
    BlockOptions bo;
    bo.block_size = block;
    const BlockTable t = build_block_table(batch, bo);
    std::vector<Range> ranges;
    for (const Tile& tile : t.tiles) {
      if (tile.head_group != 0) continue;
      const TokenBlock& qb = t.token_blocks[static_cast<size_t>(tile.q_block)];
      const TokenBlock& kb = t.token_blocks[static_cast<size_t>(tile.kv_block)];
      for (int64_t rows_per : {sim_detail::kFwdSubRows, sim_detail::kBwdSubRows}) {
        const int64_t keys_per = sim_detail::kSubKeys;
        sim_detail::SubtileCount want;
        const int64_t nq = (qb.length + rows_per - 1) / rows_per;
        const auto nk = static_cast<size_t>((kb.length + keys_per - 1) / keys_per);
        std::vector<int64_t> column_allowed(nk, 0), first_live(nk, -1), last_live(nk, -1), live_rows(nk, 0);
        for (int64_t r0 = 0; r0 < qb.length; r0 += rows_per) {
          int64_t row_first = -1, row_last = -1, row_live = 0, row_empty = 0;
          for (int64_t k0 = 0; k0 < kb.length; k0 += keys_per) {
            int64_t allowed = 0, pairs = 0;
            for (int64_t r = r0; r < std::min(qb.length, r0 + rows_per); ++r) {
              t.tile_row_ranges(tile, qb.begin + r, ranges);
              pairs += keys_per;
              for (int64_t k = k0; k < std::min(kb.length, k0 + keys_per); ++k)
                for (const Range& g : ranges) allowed += (kb.begin + k >= g.begin && kb.begin + k < g.end) ? 1 : 0;
            }
            if (allowed == pairs) ++want.full;
            else if (allowed > 0) ++want.masked;
            else if (tile.kind == TileKind::Partial) ++want.empty;
            const auto col = static_cast<size_t>(k0 / keys_per);
            column_allowed[col] += allowed;
            if (allowed > 0) {
              if (first_live[col] < 0) first_live[col] = r0 / rows_per;
              last_live[col] = r0 / rows_per;
              ++live_rows[col];
              if (row_first < 0) row_first = k0 / keys_per;
              row_last = k0 / keys_per;
              ++row_live;
            } else if (tile.kind == TileKind::Partial) {
              ++row_empty;
            }
          }
          // A Partial row of sub-tiles is walked (forward) from its first to its last live one.
          if (tile.kind == TileKind::Partial)
            want.row_dead_empty += row_first < 0 ? row_empty : row_empty - (row_last - row_first + 1 - row_live);
        }
        for (size_t col = 0; col < nk; ++col) {
          // Dense tiles: every column is launched (a causal diagonal's columns all reach the diagonal).
          if (tile.kind != TileKind::Partial) {
            ++want.live_key_subtiles;
          } else if (column_allowed[col] == 0) {
            want.dead_empty += nq;
          } else {
            // A Partial column's item walks its first to its last live sub-tile.
            ++want.live_key_subtiles;
            want.dead_empty += nq - (last_live[col] - first_live[col] + 1);
          }
        }
        const sim_detail::SubtileCount got = sim_detail::count_subtiles(t, tile, rows_per, keys_per);
        // Both passes from one walk (the forward's sub-tile rows are pairs of the backward's).
        // And with the allowed pairs from the mask's pieces (closed-form areas) instead of rows.
        const sim_detail::SeqPieces pieces = sim_detail::SeqPieces::of(t.seq_mask[static_cast<size_t>(tile.seq)],
                                                                       t.seq_length[static_cast<size_t>(tile.seq)]);
        for (const sim_detail::TileSubtiles& both :
             {sim_detail::count_tile_subtiles(t, tile), sim_detail::count_tile_subtiles(t, tile, &pieces)}) {
          const sim_detail::SubtileCount& pass = rows_per == sim_detail::kFwdSubRows ? both.fwd : both.bwd;
          EXPECT_EQ(std::make_tuple(pass.full, pass.masked, pass.empty, pass.live_key_subtiles, pass.dead_empty, pass.row_dead_empty),
                    std::make_tuple(got.full, got.masked, got.empty, got.live_key_subtiles, got.dead_empty, got.row_dead_empty))
              << "tile q" << tile.q_block << " kv" << tile.kv_block << " rows " << rows_per << " seq " << tile.seq;
        }
        EXPECT_EQ(got.full, want.full) << "tile q" << tile.q_block << " kv" << tile.kv_block << " rows " << rows_per;
        EXPECT_EQ(got.masked, want.masked) << "tile q" << tile.q_block << " kv" << tile.kv_block << " rows " << rows_per;
        EXPECT_EQ(got.empty, want.empty) << "tile q" << tile.q_block << " kv" << tile.kv_block << " rows " << rows_per;
        EXPECT_EQ(got.live_key_subtiles, want.live_key_subtiles) << "tile q" << tile.q_block << " kv" << tile.kv_block;
        EXPECT_EQ(got.dead_empty, want.dead_empty) << "tile q" << tile.q_block << " kv" << tile.kv_block;
        EXPECT_EQ(got.row_dead_empty, want.row_dead_empty) << "tile q" << tile.q_block << " kv" << tile.kv_block;
      }
    }
  }
}

// A cache of sub-tile counts shared by the simulations of several plans over one table (other
// placements, stage counts) gives each the result of a simulation of its own, bit for bit; a plan
// over another table is refused.
TEST(SimKernelCost, TableCacheSharedAcrossPlansGivesTheirOwnResults) {
  const PlacedBatch base = placed(BaselineKind::Packing, skewed_batch("lambda"), 4);
  Calibration cal = calibration_from_cluster(cluster_for(4));
  cal.subtile_model = true;
  SimTableCache cache;
  int plans = 0;
  for (uint64_t seed : {0, 1, 2}) {
    const PlacedBatch pb = seed == 0 ? base : testing::scattered(base, seed);
    for (int stages : {1, 3}) {
      const Plan p = plan_for(pb, 4, stages);
      SimOptions own;
      own.calibration = cal;
      SimOptions shared = own;
      shared.table_cache = &cache;
      const SimResult a = simulate(p, cluster_for(4), own), b = simulate(p, cluster_for(4), shared);
      EXPECT_EQ(a.fwd_s, b.fwd_s) << "seed " << seed << " stages " << stages;
      EXPECT_EQ(a.bwd_s, b.bwd_s) << "seed " << seed << " stages " << stages;
      ASSERT_EQ(a.devices.size(), b.devices.size());
      for (size_t d = 0; d < a.devices.size(); ++d)
        for (int pass : {0, 1}) EXPECT_EQ(a.devices[d].compute_s[pass], b.devices[d].compute_s[pass]) << "device " << d;
      ++plans;
    }
  }
  EXPECT_EQ(plans, 6);
  SimOptions other;
  other.calibration = cal;
  other.table_cache = &cache;
  const Plan p = plan_for(placed(BaselineKind::Packing, skewed_batch("causal", 8192), 4), 4);
  try {
    (void)simulate(p, cluster_for(4), other);
    ADD_FAILURE() << "a plan over another table was simulated with the cache";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
    EXPECT_NE(std::string(e.what()).find("another block table"), std::string::npos) << e.what();
  }
}

// With masked cost 1 and only full tiles, the sub-tile model equals the area model; a masked
// cost of m adds exactly (m - 1) x the masked sub-tiles' dense time.
TEST(SimKernelCost, SubtileModelMatchesAreaOnFullTilesAndScalesMaskedOnes) {
  Plan p = plan_for(placed(BaselineKind::Ring, skewed_batch("causal"), 1), 1);
  Calibration area;
  area.tile_overhead_s = 0;
  area.launch_overhead_s = 0;
  Calibration sub = area;
  sub.subtile_model = true;
  Calibration sub2 = sub;
  sub2.fwd_diagonal_masked_cost = 3;
  double extra = 0;
  for (const Tile& t : p.table.tiles) {
    if (t.kind != TileKind::CausalDiagonal) continue;
    const auto c = sim_detail::count_subtiles(p.table, t, sim_detail::kFwdSubRows, sim_detail::kSubKeys);
    extra += 2.0 * static_cast<double>(c.masked) * 4.0 * 128 * 128 * p.table.shape.head_dim *
             p.table.groups.q_heads_per_group / sub.attn_fwd_flops;
  }
  ASSERT_GT(extra, 0);
  double t1 = 0, t2 = 0;
  for (const Instruction& ins : p.devices[0].fwd.code) {
    t1 += instruction_time_s(p, ins, Pass::Forward, sub);
    t2 += instruction_time_s(p, ins, Pass::Forward, sub2);
  }
  EXPECT_NEAR(t2 - t1, extra, 1e-9 * t2);
  EXPECT_THROW(parse_calibration(R"({"attention_cost_model":"dense"})", "x.json"), Error);
  EXPECT_THROW(parse_calibration(R"({"fwd_partial_masked_cost":0.5})", "x.json"), Error);
  EXPECT_TRUE(parse_calibration(R"({"attention_cost_model":"subtiles"})", "x.json").subtile_model);
}

// Work items: forward, one per 128 query rows of each output (the tiles of a q block in one
// Attend share an output, so a row of tiles is one run); backward, one per 128 keys of each tile.
TEST(SimKernelCost, WorkItemsFollowTheKernelsWorkLists) {
  const Batch batch = test::batch_of(AttentionShape{4, 2, 64, DType::BF16}, {{1024, Mask::causal()}});
  Plan p = plan_for(placed(BaselineKind::Packing, batch, 1), 1);  // B = 256: 4 blocks, 10 tiles per group
  const int groups = p.table.groups.num_groups;
  Calibration cal;
  cal.subtile_model = true;
  sim_detail::AttendCost cost(p.table, cal);
  sim_detail::AttendWork fwd, bwd;
  for (const Instruction& ins : p.devices[0].fwd.code)
    if (const auto* a = std::get_if<Attend>(&ins)) fwd += cost.work(*a, Pass::Forward);
  for (const Instruction& ins : p.devices[0].bwd.code)
    if (const auto* a = std::get_if<Attend>(&ins)) bwd += cost.work(*a, Pass::Backward);
  EXPECT_EQ(fwd.items, 4.0 * 2 * groups);
  EXPECT_EQ(bwd.items, 10.0 * 2 * groups);
  // Forward sub-tiles (128 x 128): 6 off-diagonal tiles of 2 x 2 full ones; a diagonal tile has
  // one full (lower left) and two masked (on the diagonal), the upper right one skipped.
  EXPECT_EQ(fwd.full, (6.0 * 4 + 4.0 * 1) * groups);
  EXPECT_EQ(fwd.diagonal_masked, 4.0 * 2 * groups);
  EXPECT_EQ(fwd.partial_masked + fwd.empty, 0.0);
  // The work-item cost adds exactly items x cost full sub-tiles.
  Calibration with_items = cal;
  with_items.fwd_work_item_cost = 2;
  EXPECT_DOUBLE_EQ(sim_detail::work_units(fwd, with_items, Pass::Forward) - sim_detail::work_units(fwd, cal, Pass::Forward),
                   2 * fwd.items);
}

// Backward items at head dim 128: the whole key chunks of Full tiles of 1024 rows or more are
// walked in runs of the tiles that share a key block, about 4096 q rows a run
// (cuda::make_backward_runs); at head dim 64 (no wide kernel) one item per chunk of each tile.
TEST(SimKernelCost, BackwardRunsOfLongFullTiles) {
  auto backward_items = [](int head_dim) {
    const Batch batch = test::batch_of(AttentionShape{4, 2, head_dim, DType::BF16}, {{16384, Mask::causal()}});
    Plan p = plan_for(placed(BaselineKind::Packing, batch, 1, 1024), 1);  // 16 blocks: 120 Full tiles, 16 diagonal
    Calibration cal;
    cal.subtile_model = true;
    sim_detail::AttendCost cost(p.table, cal);
    sim_detail::AttendWork bwd;
    for (const Instruction& ins : p.devices[0].bwd.code)
      if (const auto* a = std::get_if<Attend>(&ins)) bwd += cost.work(*a, Pass::Backward);
    return bwd.items / p.table.groups.num_groups;
  };
  // Key block j has 15 - j Full tiles: ceil((15 - j) / 4) runs of 8 chunks; diagonals 8 each.
  EXPECT_EQ(backward_items(128), 8.0 * 36 + 8.0 * 16);
  EXPECT_EQ(backward_items(64), 8.0 * (120 + 16));
}

}  // namespace
}  // namespace dcp
