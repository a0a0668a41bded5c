// The planner's search: it returns the fastest predicted candidate, a valid plan for it, and the
// same answer for the same input.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "dcp/error.h"
#include "dcp/metrics.h"
#include "dcp/planner.h"
#include "dcp/profiles.h"
#include "dcp/validate.h"

namespace dcp {
namespace {

Batch small_batch(const std::string& mask) {
  ProfileOptions po;
  po.profile = Profile::Ldc;
  po.seed = 4;
  po.token_budget = 16384;
  po.mask = mask;
  po.shape = AttentionShape{8, 2, 64, DType::BF16};
  return generate_batches(po, 1).front();
}

// Two H200s on one node, and a search over B 512 / 1024 at eps 0.1 ranked by their calibration.
Cluster two_h200() {
  Cluster cluster = cluster_preset("h200-nvl", 1);
  cluster.devices_per_node = 2;
  return cluster;
}
PlannerOptions small_search(const Cluster& cluster) {
  PlannerOptions opts;
  opts.block_sizes = {512, 1024};
  opts.eps_compute = {0.1};
  opts.calibration = calibration_from_cluster(cluster);
  return opts;
}

// A DCP candidate's plan made again from its options alone (block table, placement, schedule)
// and simulated with the search's calibration.
double own_prediction(const Batch& batch, const Cluster& cluster, const PlannerOptions& opts, const PlanCandidate& c) {
  BlockOptions bo;
  bo.block_size = c.block_size;
  bo.split_sink = c.split_sink;
  const BlockTable table = build_block_table(batch, bo);
  PlacementOptions po = opts.placement;
  po.eps_compute = c.eps_compute;
  po.seed = c.placement_seed;
  po.tile_cost = tile_cost_from(*opts.calibration);
  PlanOptions plan_opts = opts.plan;
  plan_opts.schedule.set_choices(c.choices);
  plan_opts.schedule.num_comm_stages = c.num_comm_stages;
  plan_opts.schedule.backward = c.backward;
  const Plan plan = build_plan(table, place_dcp(table, cluster, po).placement, cluster, plan_opts);
  SimOptions so;
  so.calibration = *opts.calibration;
  return simulate(plan, cluster, so).total_s();
}

TEST(Planner, ChoosesTheFastestBalancedCandidateAndItsPlanIsValid) {
  const Cluster cluster = cluster_preset("a100-p4d", 2);
  PlannerOptions opts;
  opts.static_layouts.clear();  // DCP's candidates alone: the counts below are theirs
  opts.mix_passes = false;      // and the schedule variants' alone (mixed passes: their own test)
  opts.rounds_per_link_class = {false};
  opts.retry_proxies = false;
  opts.block_sizes = {256, 512, 1024};
  opts.eps_compute = {0.02, 0.1};
  opts.calibration = calibration_from_cluster(cluster);
  for (const char* mask : {"causal", "lambda", "shared_question"}) {
    SCOPED_TRACE(mask);
    const PlannedBatch p = plan_batch(small_batch(mask), cluster, opts);
    // B x eps x (leveling x share x order) schedules, all schedules tried on the same placement;
    // lambda's sink (64 tokens, below every B) is also tried in a block of its own.
    const bool has_sink = std::string(mask) == "lambda";
    ASSERT_EQ(p.candidates.size(), has_sink ? 96u : 48u);
    for (const auto& c : p.candidates) EXPECT_TRUE(!c.split_sink || has_sink);
    if (has_sink) {
      EXPECT_TRUE(std::any_of(p.candidates.begin(), p.candidates.end(), [](const auto& c) { return c.split_sink; }));
    }
    for (size_t i = 0; i < p.candidates.size(); i += 8) {
      for (size_t k = 0; k < 8; ++k) {
        EXPECT_EQ(p.candidates[i + k].choices.far_outputs_first, k % 2 == 1);
        EXPECT_DOUBLE_EQ(p.candidates[i + k].choices.last_round_share, k % 4 < 2 ? 1.0 : 0.5);
        EXPECT_EQ(p.candidates[i + k].choices.level_stage_compute, k >= 4);
        EXPECT_EQ(p.candidates[i + k].balanced, p.candidates[i].balanced);
      }
    }
    EXPECT_EQ(p.plan.header.options.schedule.far_outputs_first, p.chosen.choices.far_outputs_first);
    EXPECT_DOUBLE_EQ(p.plan.header.options.schedule.last_round_share, p.chosen.choices.last_round_share);
    EXPECT_EQ(p.plan.header.options.schedule.level_stage_compute, p.chosen.choices.level_stage_compute);
    bool any_balanced = false;
    for (const auto& c : p.candidates) any_balanced = any_balanced || c.balanced;
    for (const auto& c : p.candidates) {
      if (c.balanced || !any_balanced) {
        EXPECT_LE(p.chosen.predicted_s, c.predicted_s) << "B=" << c.block_size << " eps=" << c.eps_compute;
      }
    }
    EXPECT_EQ(p.table.block_size, p.chosen.split_sink ? 0 : p.chosen.block_size);
    EXPECT_DOUBLE_EQ(p.predicted.total_s(), p.chosen.predicted_s);
    EXPECT_TRUE(validate_plan(p.plan).empty());
    // The kept plan is the one the simulator measured.
    SimOptions so;
    so.calibration = *opts.calibration;
    EXPECT_DOUBLE_EQ(simulate(p.plan, cluster, so).total_s(), p.chosen.predicted_s);
  }
}

// With balance_time the placement weighs each tile by its predicted kernel time: the busiest
// device's predicted Attend time (the weights) stays within the compute tolerance even when
// diagonal and partial tiles run far below the full-tile rate.
// Without a calibration the search ranks candidates by the cluster's own (on h200-nvl the
// measured kernels), exactly as if that calibration had been passed.
TEST(Planner, RanksByTheClustersCalibrationWhenNoneIsGiven) {
  const Cluster cluster = cluster_preset("h200-nvl", 1);
  PlannerOptions implicit;
  implicit.block_sizes = {512, 1024, 2048};
  PlannerOptions explicit_ = implicit;
  explicit_.calibration = calibration_from_cluster(cluster);
  ASSERT_EQ(explicit_.calibration->name, measured_h200_calibration().name);
  const Batch batch = small_batch("lambda");
  const PlannedBatch a = plan_batch(batch, cluster, implicit);
  const PlannedBatch b = plan_batch(batch, cluster, explicit_);
  ASSERT_EQ(a.candidates.size(), b.candidates.size());
  for (size_t i = 0; i < a.candidates.size(); ++i)
    EXPECT_DOUBLE_EQ(a.candidates[i].predicted_s, b.candidates[i].predicted_s) << i;
  EXPECT_EQ(a.chosen.block_size, b.chosen.block_size);
  SimOptions so;
  so.calibration = measured_h200_calibration();
  EXPECT_DOUBLE_EQ(simulate(a.plan, cluster, so).total_s(), a.chosen.predicted_s);
}

TEST(Planner, BalancesPredictedKernelTimeNotFlops) {
  Calibration cal;
  cal.attn_fwd_flops = 400e12;
  cal.attn_bwd_flops = 200e12;
  cal.fwd_diagonal_efficiency = 0.5;
  cal.fwd_partial_efficiency = 0.25;
  cal.bwd_diagonal_efficiency = 0.8;
  cal.bwd_partial_efficiency = 0.4;
  const TileCost cost = tile_cost_from(cal);
  EXPECT_DOUBLE_EQ(cost.fwd[0], 1.0);
  EXPECT_DOUBLE_EQ(cost.fwd[1], 2.0);
  EXPECT_DOUBLE_EQ(cost.fwd[2], 4.0);
  EXPECT_DOUBLE_EQ(cost.bwd[0], 2.0);   // half the forward rate
  EXPECT_DOUBLE_EQ(cost.bwd[2], 5.0);   // 2 / 0.4
  const Cluster cluster = cluster_preset("a100-p4d", 1);
  PlannerOptions opts;
  opts.block_sizes = {256};
  opts.eps_compute = {0.1};
  opts.calibration = cal;
  for (const char* mask : {"causal", "lambda"}) {
    SCOPED_TRACE(mask);
    const PlannedBatch p = plan_batch(small_batch(mask), cluster, opts);
    if (!p.placement.report.balanced()) continue;  // reported, not silently returned
    std::vector<double> busy(static_cast<size_t>(cluster.num_devices()), 0.0);
    double total = 0;
    for (size_t i = 0; i < p.table.tiles.size(); ++i) {
      const double w = cost.weight(p.table, p.table.tiles[i]);
      busy[static_cast<size_t>(p.placement.placement.tile_device[i])] += w;
      total += w;
    }
    const double mean = total / static_cast<double>(busy.size());
    for (double b : busy) EXPECT_LE(b, (1.0 + 0.1) * mean * (1 + 1e-9));
  }
  PlannerOptions bad = opts;
  bad.placement.tile_cost.fwd[1] = 0;
  EXPECT_THROW(plan_batch(small_batch("causal"), cluster, bad), Error);
}

TEST(Planner, Deterministic) {
  const Cluster cluster = cluster_preset("h200-nvl", 1);
  PlannerOptions opts;
  opts.block_sizes = {512, 1024};
  opts.eps_compute = {0.05, 0.1};
  const Batch batch = small_batch("causal");
  const PlannedBatch a = plan_batch(batch, cluster, opts);
  const PlannedBatch b = plan_batch(batch, cluster, opts);
  EXPECT_EQ(serialize_plan(a.plan), serialize_plan(b.plan));
  EXPECT_EQ(a.chosen.block_size, b.chosen.block_size);
  EXPECT_EQ(a.chosen.eps_compute, b.chosen.eps_compute);
}

// The search on a pool of threads tries the same candidates, predicts each the same and chooses
// the same plan, bit for bit, as on one thread: every phase (fresh placements, reseeds,
// tightening, static layouts, the proxy retry) and a sink split on two nodes.
TEST(Planner, SameSearchOnAnyThreadCount) {
  const Cluster cluster = cluster_preset("a100-p4d", 2);
  PlannerOptions opts;
  opts.block_sizes = {512, 1024};
  opts.eps_compute = {0.05, 0.1};
  opts.num_comm_stages = {4, 3};
  opts.reseed_best = 1;
  opts.tighten_best = 2;
  opts.calibration = calibration_from_cluster(cluster);
  for (const char* mask : {"lambda", "shared_question"}) {
    SCOPED_TRACE(mask);
    const Batch batch = small_batch(mask);
    opts.threads = 1;
    const PlannedBatch one = plan_batch(batch, cluster, opts);
    for (int threads : {2, 3}) {
      SCOPED_TRACE(threads);
      opts.threads = threads;
      const PlannedBatch many = plan_batch(batch, cluster, opts);
      ASSERT_EQ(many.candidates.size(), one.candidates.size());
      for (size_t i = 0; i < one.candidates.size(); ++i) {
        EXPECT_EQ(describe(many.candidates[i]), describe(one.candidates[i])) << i;
        EXPECT_EQ(many.candidates[i].method, one.candidates[i].method) << i;
        EXPECT_EQ(many.candidates[i].placement_seed, one.candidates[i].placement_seed) << i;
        EXPECT_EQ(many.candidates[i].predicted_s, one.candidates[i].predicted_s) << i;
        EXPECT_EQ(many.candidates[i].balanced, one.candidates[i].balanced) << i;
      }
      EXPECT_EQ(describe(many.chosen), describe(one.chosen));
      EXPECT_EQ(serialize_plan(many.plan), serialize_plan(one.plan));
      EXPECT_EQ(many.predicted.total_s(), one.predicted.total_s());
      EXPECT_EQ(many.predicted.total_s(), many.chosen.predicted_s);
      EXPECT_EQ(many.skipped_block_sizes, one.skipped_block_sizes);
      EXPECT_EQ(many.skipped_static_layouts, one.skipped_static_layouts);
    }
    // The search covered every phase.
    EXPECT_TRUE(std::any_of(one.candidates.begin(), one.candidates.end(),
                            [](const PlanCandidate& c) { return c.tightened_from > 0; }));
    EXPECT_TRUE(std::any_of(one.candidates.begin(), one.candidates.end(),
                            [](const PlanCandidate& c) { return c.method != "dcp"; }));
    EXPECT_TRUE(std::any_of(one.candidates.begin(), one.candidates.end(),
                            [&](const PlanCandidate& c) { return c.placement_seed != opts.placement.seed; }));
  }
}

// Schedule options that make the same schedule share one plan and simulation: on one node
// far_outputs_first changes nothing (no tile has an output on another node), so each pair of
// candidates differing only in it is predicted the same, and each prediction equals that of its
// plan built and simulated on its own.
TEST(Planner, EqualSchedulesOfAPlacementShareTheirPrediction) {
  const Cluster cluster = two_h200();
  PlannerOptions opts = small_search(cluster);
  opts.static_layouts.clear();
  opts.mix_passes = false;
  opts.rounds_per_link_class = {false};
  const Batch batch = small_batch("shared_question");
  const PlannedBatch p = plan_batch(batch, cluster, opts);
  ASSERT_EQ(p.candidates.size() % 2, 0u);
  for (size_t i = 0; i < p.candidates.size(); i += 2) {
    const PlanCandidate& off = p.candidates[i];
    const PlanCandidate& on = p.candidates[i + 1];
    ASSERT_FALSE(off.choices.far_outputs_first);
    ASSERT_TRUE(on.choices.far_outputs_first);
    EXPECT_EQ(on.predicted_s, off.predicted_s) << describe(on);
  }
  // Each candidate's prediction is its own plan's (every option as the candidate says).
  for (const PlanCandidate& c : p.candidates) EXPECT_EQ(own_prediction(batch, cluster, opts, c), c.predicted_s) << describe(c);
}

// mix_passes: where a placement's fastest forward schedule and fastest backward schedule (of one
// stage count) differ, their mix is a candidate too, right after the placement's schedules; it is
// predicted at its own plan's time, which is the sum of those two passes and below every schedule
// of that placement and stage count; the other candidates are those of a search without it, and a
// mixed winner's plan carries the backward's choices.
TEST(Planner, MixesThePassesFastestSchedules) {
  const Cluster cluster = cluster_preset("a100-p4d", 2);
  PlannerOptions opts;
  opts.static_layouts.clear();
  opts.retry_proxies = false;
  opts.block_sizes = {512, 1024};
  opts.eps_compute = {0.05, 0.1};
  opts.num_comm_stages = {4, 3};
  opts.rounds_per_link_class = {false, true};
  opts.calibration = calibration_from_cluster(cluster);
  int mixes = 0;
  for (const char* mask : {"causal", "shared_question", "lambda"}) {
    SCOPED_TRACE(mask);
    const Batch batch = small_batch(mask);
    opts.mix_passes = false;
    const PlannedBatch plain = plan_batch(batch, cluster, opts);
    opts.mix_passes = true;
    const PlannedBatch p = plan_batch(batch, cluster, opts);
    std::vector<PlanCandidate> regular;
    for (size_t i = 0; i < p.candidates.size(); ++i) {
      const PlanCandidate& c = p.candidates[i];
      if (!c.backward) {
        regular.push_back(c);
        continue;
      }
      ++mixes;
      // Its placement's schedules of its stage count come before it.
      double best = 1e300;
      for (size_t k = 0; k < i; ++k) {
        const PlanCandidate& o = p.candidates[k];
        if (!o.backward && o.block_size == c.block_size && o.split_sink == c.split_sink && o.eps_compute == c.eps_compute &&
            o.placement_seed == c.placement_seed && o.num_comm_stages == c.num_comm_stages && o.proxies == c.proxies)
          best = std::min(best, o.predicted_s);
      }
      EXPECT_LT(c.predicted_s, best) << describe(c);
      EXPECT_EQ(own_prediction(batch, cluster, opts, c), c.predicted_s) << describe(c);
    }
    ASSERT_EQ(regular.size(), plain.candidates.size());
    for (size_t i = 0; i < regular.size(); ++i) EXPECT_EQ(describe(regular[i]), describe(plain.candidates[i])) << i;
    EXPECT_LE(p.chosen.predicted_s, plain.chosen.predicted_s);
    EXPECT_EQ(p.plan.header.options.schedule.backward, p.chosen.backward);
    EXPECT_TRUE(validate_plan(p.plan).empty());
  }
  EXPECT_GT(mixes, 0) << "no placement had different fastest schedules per pass: the test checks nothing";
}

// Rounds per link class are tried across nodes with far outputs first alone; on one node (one
// class) not at all, unless they are the only rounds asked for.
TEST(Planner, RoundsPerLinkClassAcrossNodesWithFarOutputsFirst) {
  for (const bool across : {true, false}) {
    const Cluster cluster = across ? cluster_preset("a100-p4d", 2) : two_h200();
    PlannerOptions opts = small_search(cluster);
    opts.static_layouts.clear();
    opts.retry_proxies = false;
    opts.mix_passes = false;
    const PlannedBatch p = plan_batch(small_batch("causal"), cluster, opts);
    int per_class = 0;
    for (const PlanCandidate& c : p.candidates) {
      if (!c.choices.rounds_per_link_class) continue;
      ++per_class;
      EXPECT_TRUE(c.choices.far_outputs_first) << describe(c);
    }
    EXPECT_EQ(per_class > 0, across);
    opts.rounds_per_link_class = {true};
    const PlannedBatch only = plan_batch(small_batch("causal"), cluster, opts);
    ASSERT_FALSE(only.candidates.empty());
    for (const PlanCandidate& c : only.candidates) EXPECT_TRUE(c.choices.rounds_per_link_class) << describe(c);
  }
}

// Block sizes over the tile budget are skipped, except the largest, so a search always has a
// candidate; without a budget every block size is tried.
TEST(Planner, SkipsBlockSizesOverTheTileBudgetButNeverTheLargest) {
  const Cluster cluster = cluster_preset("a100-p4d", 2);
  PlannerOptions opts;
  opts.static_layouts.clear();  // DCP's candidates alone: the counts below are theirs
  opts.mix_passes = false;      // and the schedule variants' alone (mixed passes: their own test)
  opts.rounds_per_link_class = {false};
  opts.retry_proxies = false;
  opts.block_sizes = {256, 1024, 512};
  opts.calibration = calibration_from_cluster(cluster);
  opts.far_outputs_first = {false};
  opts.last_round_share = {1.0};
  opts.level_stage_compute = {false};
  opts.min_tile_budget = 0;
  const Batch batch = small_batch("causal");
  opts.max_tiles_per_device = 1;  // every table is over it
  const PlannedBatch tight = plan_batch(batch, cluster, opts);
  ASSERT_EQ(tight.candidates.size(), 1u);
  EXPECT_EQ(tight.chosen.block_size, 1024);
  EXPECT_EQ(tight.skipped_block_sizes, (std::vector<int64_t>{256, 512}));
  EXPECT_TRUE(validate_plan(tight.plan).empty());
  opts.max_tiles_per_device = 0;  // no limit
  const PlannedBatch all = plan_batch(batch, cluster, opts);
  EXPECT_EQ(all.candidates.size(), 3u);
  EXPECT_TRUE(all.skipped_block_sizes.empty());
  // A budget between the tables' sizes keeps exactly the tables within it.
  const int64_t devices = cluster.num_devices();
  for (int64_t per_device : {int64_t{4}, int64_t{16}, int64_t{64}}) {
    opts.max_tiles_per_device = per_device;
    const PlannedBatch p = plan_batch(batch, cluster, opts);
    for (int64_t b : opts.block_sizes) {
      BlockOptions bo;
      bo.block_size = b;
      const auto tiles = static_cast<int64_t>(build_block_table(batch, bo).tiles.size());
      const bool tried = std::any_of(p.candidates.begin(), p.candidates.end(),
                                     [&](const PlanCandidate& c) { return c.block_size == b; });
      EXPECT_EQ(tried, b == 1024 || tiles <= per_device * devices) << "B=" << b << " per device " << per_device;
    }
  }
  // The floor of the budget in all: every table of this small batch fits under it.
  opts.max_tiles_per_device = 1;
  opts.min_tile_budget = 8192;
  EXPECT_EQ(plan_batch(batch, cluster, opts).candidates.size(), 3u);
}

// Stage counts cross the other schedule candidates; without a list, plan.schedule's count alone.
TEST(Planner, TriesEveryStageCount) {
  const Cluster cluster = cluster_preset("a100-p4d", 2);
  PlannerOptions opts;
  opts.static_layouts.clear();  // DCP's candidates alone: the counts below are theirs
  opts.mix_passes = false;      // and the schedule variants' alone (mixed passes: their own test)
  opts.rounds_per_link_class = {false};
  opts.retry_proxies = false;
  opts.block_sizes = {512};
  opts.calibration = calibration_from_cluster(cluster);
  opts.far_outputs_first = {false};
  opts.last_round_share = {1.0};
  opts.level_stage_compute = {false, true};
  opts.num_comm_stages = {4, 3};
  const PlannedBatch p = plan_batch(small_batch("causal"), cluster, opts);
  ASSERT_EQ(p.candidates.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(p.candidates[i].num_comm_stages, i < 2 ? 4 : 3);
    EXPECT_EQ(p.candidates[i].choices.level_stage_compute, i % 2 == 1);
  }
  EXPECT_EQ(p.plan.header.options.schedule.num_comm_stages, p.chosen.num_comm_stages);
  EXPECT_TRUE(validate_plan(p.plan).empty());
  opts.num_comm_stages = {};
  opts.plan.schedule.num_comm_stages = 2;
  const PlannedBatch q = plan_batch(small_batch("causal"), cluster, opts);
  ASSERT_EQ(q.candidates.size(), 2u);
  for (const auto& c : q.candidates) EXPECT_EQ(c.num_comm_stages, 2);
  opts.num_comm_stages = {0};
  EXPECT_THROW(plan_batch(small_batch("causal"), cluster, opts), Error);
}

// reseed_best places the best first-pass candidate's table and eps again with the next seeds,
// each with every schedule, and keeps the fastest of all; deterministic.
TEST(Planner, PlacesTheBestCandidateAgainWithFurtherSeeds) {
  const Cluster cluster = cluster_preset("a100-p4d", 2);
  PlannerOptions opts;
  opts.static_layouts.clear();  // DCP's candidates alone: the counts below are theirs
  opts.mix_passes = false;      // and the schedule variants' alone (mixed passes: their own test)
  opts.rounds_per_link_class = {false};
  opts.retry_proxies = false;
  opts.block_sizes = {512, 1024};
  opts.eps_compute = {0.05, 0.1};
  opts.calibration = calibration_from_cluster(cluster);
  opts.last_round_share = {1.0};
  opts.level_stage_compute = {false};
  const Batch batch = small_batch("shared_question");
  const PlannedBatch first = plan_batch(batch, cluster, opts);
  opts.reseed_best = 2;
  const PlannedBatch p = plan_batch(batch, cluster, opts);
  const size_t n = first.candidates.size();
  ASSERT_EQ(p.candidates.size(), n + 4);  // 2 seeds x 2 schedules
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(p.candidates[i].placement_seed, opts.placement.seed);
    EXPECT_EQ(p.candidates[i].predicted_s, first.candidates[i].predicted_s);
  }
  for (size_t i = n; i < n + 4; ++i) {
    const PlanCandidate& c = p.candidates[i];
    EXPECT_EQ(c.placement_seed, opts.placement.seed + 1 + (i - n) / 2);
    EXPECT_EQ(c.block_size, first.chosen.block_size);
    EXPECT_EQ(c.eps_compute, first.chosen.eps_compute);
    EXPECT_EQ(c.split_sink, first.chosen.split_sink);
  }
  for (const PlanCandidate& c : p.candidates) EXPECT_LE(p.chosen.predicted_s, c.predicted_s);
  EXPECT_TRUE(validate_plan(p.plan).empty());
  EXPECT_EQ(serialize_plan(plan_batch(batch, cluster, opts).plan), serialize_plan(p.plan));
  opts.reseed_best = -1;
  EXPECT_THROW(plan_batch(batch, cluster, opts), Error);
}

// tighten_best: the placements of the best candidates (by their fastest schedule) are walked
// down to each tighter tolerance of tighten_eps with their homes kept, every schedule each; the
// candidates before them are untouched, and the chosen plan is valid and meets its tighter bound.
TEST(Planner, TightensTheBestPlacementsToTighterBounds) {
  const Cluster cluster = cluster_preset("a100-p4d", 2);
  PlannerOptions opts;
  opts.static_layouts.clear();
  opts.mix_passes = false;
  opts.rounds_per_link_class = {false};
  opts.retry_proxies = false;
  opts.block_sizes = {512, 1024};
  opts.eps_compute = {0.05, 0.1};
  opts.calibration = calibration_from_cluster(cluster);
  opts.last_round_share = {1.0};
  opts.level_stage_compute = {false};
  opts.tighten_eps = {0.07, 0.03};
  for (const char* mask : {"causal", "shared_question"}) {
    SCOPED_TRACE(mask);
    const Batch batch = small_batch(mask);
    opts.tighten_best = 0;
    const PlannedBatch first = plan_batch(batch, cluster, opts);
    // The two placements the search should tighten: the fastest balanced ones, in order.
    struct Seen {
      double fastest;
      PlanCandidate c;
    };
    std::vector<Seen> placements;
    for (const PlanCandidate& c : first.candidates) {
      auto same = std::find_if(placements.begin(), placements.end(), [&](const Seen& s) {
        return s.c.block_size == c.block_size && s.c.split_sink == c.split_sink && s.c.eps_compute == c.eps_compute;
      });
      if (same == placements.end()) placements.push_back({c.predicted_s, c});
      else same->fastest = std::min(same->fastest, c.predicted_s);
    }
    std::erase_if(placements, [](const Seen& s) { return !s.c.balanced; });
    std::stable_sort(placements.begin(), placements.end(),
                     [](const Seen& a, const Seen& b) { return a.fastest < b.fastest; });
    ASSERT_GE(placements.size(), 2u);
    placements.resize(2);
    opts.tighten_best = 2;
    const PlannedBatch p = plan_batch(batch, cluster, opts);
    const size_t n = first.candidates.size();
    size_t expected = n;
    for (const Seen& s : placements)
      for (double e : opts.tighten_eps) expected += e < s.c.eps_compute ? 2 : 0;  // 2 schedules each
    ASSERT_EQ(p.candidates.size(), expected);
    for (size_t i = 0; i < n; ++i) {
      EXPECT_EQ(p.candidates[i].predicted_s, first.candidates[i].predicted_s);
      EXPECT_EQ(p.candidates[i].tightened_from, 0.0);
    }
    size_t i = n;
    for (const Seen& s : placements)
      for (double e : opts.tighten_eps) {
        if (!(e < s.c.eps_compute)) continue;
        for (int k = 0; k < 2; ++k, ++i) {
          const PlanCandidate& c = p.candidates[i];
          EXPECT_EQ(c.block_size, s.c.block_size);
          EXPECT_EQ(c.split_sink, s.c.split_sink);
          EXPECT_EQ(c.placement_seed, s.c.placement_seed);
          EXPECT_EQ(c.tightened_from, s.c.eps_compute);
          EXPECT_EQ(c.eps_compute, e);
          EXPECT_NE(describe(c).find("tightened from"), std::string::npos);
        }
      }
    for (const PlanCandidate& c : p.candidates) EXPECT_LE(p.chosen.predicted_s, c.predicted_s);
    EXPECT_LE(p.chosen.predicted_s, first.chosen.predicted_s);
    EXPECT_TRUE(validate_plan(p.plan).empty());
    if (p.chosen.balanced) {
      EXPECT_LE(p.placement.report.compute_imbalance, 1 + p.chosen.eps_compute + 1e-9);
    }
    EXPECT_EQ(serialize_plan(plan_batch(batch, cluster, opts).plan), serialize_plan(p.plan));
  }
  // One device has nothing to balance: no tightened candidate.
  Cluster single = cluster_preset("a100-p4d", 1);
  single.devices_per_node = 1;
  const PlannedBatch one = plan_batch(small_batch("causal"), single, opts);
  for (const PlanCandidate& c : one.candidates) EXPECT_EQ(c.tightened_from, 0.0);
  opts.tighten_best = -1;
  EXPECT_THROW(plan_batch(small_batch("causal"), cluster, opts), Error);
  opts.tighten_best = 1;
  opts.tighten_eps = {-0.1};
  EXPECT_THROW(plan_batch(small_batch("causal"), cluster, opts), Error);
}

// retry_proxies: across nodes the chosen placement is planned again with every schedule and the
// other proxy setting; the fastest plan of all is kept. Proxied plans are exact (validator).
TEST(Planner, RetriesTheChosenPlacementWithTheOtherProxySetting) {
  const Cluster cluster = cluster_preset("a100-p4d", 2);
  PlannerOptions opts;
  opts.static_layouts.clear();
  opts.mix_passes = false;
  opts.rounds_per_link_class = {false};
  opts.block_sizes = {512, 1024};
  opts.calibration = calibration_from_cluster(cluster);
  for (const bool proxies : {true, false}) {
    opts.plan.schedule.proxies = proxies;
    for (const char* mask : {"causal", "lambda", "shared_question", "causal_blockwise"}) {
      SCOPED_TRACE(std::string(mask) + (proxies ? " proxies" : " no proxies"));
      opts.retry_proxies = false;
      const PlannedBatch direct = plan_batch(small_batch(mask), cluster, opts);
      EXPECT_TRUE(validate_plan(direct.plan).empty());
      opts.retry_proxies = true;
      const PlannedBatch p = plan_batch(small_batch(mask), cluster, opts);
      ASSERT_EQ(p.candidates.size(), direct.candidates.size() + 8);  // the 8 default schedules
      const PlanCandidate& was = direct.chosen;
      EXPECT_EQ(was.proxies, proxies);
      double fastest = was.predicted_s;
      for (size_t i = direct.candidates.size(); i < p.candidates.size(); ++i) {
        const PlanCandidate& c = p.candidates[i];
        EXPECT_EQ(c.proxies, !proxies);
        EXPECT_EQ(c.block_size, was.block_size);
        EXPECT_EQ(c.eps_compute, was.eps_compute);
        EXPECT_EQ(c.placement_seed, was.placement_seed);
        fastest = std::min(fastest, c.predicted_s);
      }
      EXPECT_DOUBLE_EQ(p.chosen.predicted_s, fastest);
      EXPECT_EQ(p.plan.header.options.schedule.proxies, p.chosen.proxies);
      EXPECT_TRUE(validate_plan(p.plan).empty());
    }
  }
  // On one node nothing crosses: no retry, and no candidate counts as proxied.
  const PlannedBatch one = plan_batch(small_batch("causal"), cluster_preset("a100-p4d", 1), opts);
  for (const PlanCandidate& c : one.candidates) EXPECT_FALSE(c.proxies);
}

// The static layouts are candidates beside DCP's own: the chosen plan is never predicted slower
// than any of them (each simulated here on its own, with the default schedule), and where one of
// them is the fastest it is the plan that comes back, whole and valid.
TEST(Planner, StaticLayoutsAreCandidatesAndNoneIsPredictedFaster) {
  const Cluster cluster = two_h200();
  PlannerOptions opts = small_search(cluster);
  ASSERT_EQ(opts.static_layouts, PlannerOptions::default_static_layouts());
  ASSERT_EQ(opts.static_layouts.size(), all_baselines().size());
  for (const char* mask : {"causal", "lambda", "shared_question"}) {
    SCOPED_TRACE(mask);
    const Batch batch = small_batch(mask);
    const PlannedBatch p = plan_batch(batch, cluster, opts);
    for (const std::string& name : opts.static_layouts) {
      const auto n = std::count_if(p.candidates.begin(), p.candidates.end(),
                                   [&](const PlanCandidate& c) { return c.method == name; });
      EXPECT_EQ(n, name == "packing" ? 2 : 1) << name;  // packing at each block size
      BlockOptions bo;
      bo.block_size = 512;
      const PlacedMethod pm = place_by_method(name, batch, bo, cluster, opts.placement);
      const Plan plan = build_plan(pm.placed.table, pm.placed.placement, cluster, opts.plan);
      SimOptions so;
      so.calibration = *opts.calibration;
      const PlacementMetrics m = compute_metrics(pm.placed.table, pm.placed.placement, cluster);
      if (m.memory_imbalance <= 1 + opts.placement.eps_memory && p.chosen.balanced) {
        EXPECT_LE(p.chosen.predicted_s, simulate(plan, cluster, so).total_s()) << name;
      }
    }
    EXPECT_EQ(p.plan.header.method, p.chosen.method);
    EXPECT_EQ(describe(p.chosen).rfind(p.chosen.method == "dcp" ? "B " : "static layout " + p.chosen.method, 0), 0u)
        << describe(p.chosen);
    EXPECT_TRUE(validate_plan(p.plan).empty());
  }
  // DCP held to tiny blocks (16 tokens: thousands of tiles, each with its overhead) loses to
  // every static layout that cuts whole chunks; the search then returns the fastest of those.
  opts.block_sizes = {16};
  opts.max_tiles_per_device = 0;
  ProfileOptions po;
  po.profile = Profile::Ldc;
  po.seed = 4;
  po.token_budget = 2048;
  po.mask = "causal";
  po.shape = AttentionShape{8, 2, 64, DType::BF16};
  const Batch batch = generate_batches(po, 1).front();
  const PlannedBatch p = plan_batch(batch, cluster, opts);
  EXPECT_NE(p.chosen.method, "dcp");
  EXPECT_EQ(p.plan.header.method, p.chosen.method);
  EXPECT_TRUE(validate_plan(p.plan).empty());
  for (const PlanCandidate& c : p.candidates) {
    if (c.balanced) {
      EXPECT_LE(p.chosen.predicted_s, c.predicted_s) << describe(c);
    }
  }
  opts.static_layouts.clear();
  const PlannedBatch dcp_only = plan_batch(batch, cluster, opts);
  EXPECT_EQ(dcp_only.chosen.method, "dcp");
  EXPECT_LT(p.chosen.predicted_s, dcp_only.chosen.predicted_s);
  // Deterministic with the static layouts too.
  opts.static_layouts = PlannerOptions::default_static_layouts();
  EXPECT_EQ(serialize_plan(plan_batch(batch, cluster, opts).plan), serialize_plan(p.plan));
}

TEST(Planner, RejectsBadStaticLayouts) {
  const Cluster cluster = cluster_preset("a100-p4d", 1);
  const Batch batch = small_batch("causal");
  PlannerOptions opts;
  opts.static_layouts = {"zigzag", "nope"};
  try {
    plan_batch(batch, cluster, opts);
    ADD_FAILURE() << "an unknown static layout was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'nope'"), std::string::npos) << e.what();
  }
  opts.static_layouts = {"dcp"};
  EXPECT_THROW(plan_batch(batch, cluster, opts), Error);
  opts.static_layouts = {"ring", "ring"};
  EXPECT_THROW(plan_batch(batch, cluster, opts), Error);
}

TEST(Planner, RejectsEmptyOrBadCandidates) {
  const Cluster cluster = cluster_preset("a100-p4d", 1);
  const Batch batch = small_batch("causal");
  PlannerOptions opts;
  opts.block_sizes = {};
  EXPECT_THROW(plan_batch(batch, cluster, opts), Error);
  opts.block_sizes = {100};
  EXPECT_THROW(plan_batch(batch, cluster, opts), Error);
  opts.block_sizes = {512};
  opts.eps_compute = {-0.1};
  EXPECT_THROW(plan_batch(batch, cluster, opts), Error);
  opts.eps_compute = {0.1};
  opts.far_outputs_first = {};
  EXPECT_THROW(plan_batch(batch, cluster, opts), Error);
  opts.far_outputs_first = {false};
  opts.level_stage_compute = {};
  EXPECT_THROW(plan_batch(batch, cluster, opts), Error);
  opts.level_stage_compute = {false};
  opts.rounds_per_link_class = {};
  EXPECT_THROW(plan_batch(batch, cluster, opts), Error);
  opts.rounds_per_link_class = {false};
  opts.split_sink = {};
  EXPECT_THROW(plan_batch(batch, cluster, opts), Error);
  opts.split_sink = {false};
  opts.level_stage_compute = {false};
  for (double share : {0.0, -0.5, 1.5}) {
    opts.last_round_share = {share};
    EXPECT_THROW(plan_batch(batch, cluster, opts), Error) << share;
  }
  opts.last_round_share = {1.0};
  opts.max_tiles_per_device = -1;
  EXPECT_THROW(plan_batch(batch, cluster, opts), Error);
  opts.max_tiles_per_device = 768;
  for (int threads : {0, -1, 257}) {
    opts.threads = threads;
    try {
      plan_batch(batch, cluster, opts);
      ADD_FAILURE() << "threads " << threads << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
      EXPECT_NE(std::string(e.what()).find("threads"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace dcp
