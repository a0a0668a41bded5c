// plan_step_kinds: one plan per layer kind over one token placement. Every kind's plan is valid
// for its own mask, every device holds the same tokens in the same order in every kind, and the
// lead kind's plan is the one plan_step makes for it alone.
#include <gtest/gtest.h>

#include <string>

#include "dcp/dispatch.h"
#include "dcp/error.h"
#include "dcp/planner.h"
#include "dcp/profiles.h"
#include "dcp/sim.h"
#include "dcp/validate.h"

namespace dcp {
namespace {

Batch with_mask(Batch b, const Mask& mask) {
  for (Sequence& s : b.sequences) s.mask = mask;
  return b;
}

// A step of sliding-window layers (listed first) and global causal ones.
std::vector<Batch> window_and_global(uint64_t seed, int64_t tokens) {
  ProfileOptions po;
  po.profile = Profile::Ldc;
  po.seed = seed;
  po.token_budget = tokens;
  po.mask = "causal";
  po.shape = AttentionShape{8, 2, 64, DType::BF16};
  const Batch global = generate_batches(po, 1).front();
  return {with_mask(global, Mask::lambda(32, 512)), global};
}

// Every kind's plan holds the same tokens on every device, in the same order (a kind may cut them
// into finer blocks than another).
void expect_same_tokens(const std::vector<Plan>& plans) {
  for (size_t k = 1; k < plans.size(); ++k)
    for (size_t d = 0; d < plans[0].devices.size(); ++d)
      EXPECT_EQ(local_tokens(plans[k].table, plans[k].devices[d].owned_blocks).global_row,
                local_tokens(plans[0].table, plans[0].devices[d].owned_blocks).global_row)
          << "kind " << k << " device " << d;
}

TEST(LayerKinds, EveryKindsPlanIsValidOnOneTokenPlacement) {
  for (const auto& [preset, nodes] : {std::pair{"h200-nvl", 1}, std::pair{"a100-p4d", 2}}) {
    const Cluster cluster = cluster_preset(preset, nodes);
    for (const bool search : {false, true}) {
      SCOPED_TRACE(std::string(preset) + (search ? " search" : " fixed"));
      StepPlanOptions o;
      o.blocks.block_size = 512;
      o.search_candidates = search;
      o.search.block_sizes = {512, 1024};
      const std::vector<Batch> kinds = window_and_global(3, 24576);
      const std::vector<Plan> plans = plan_step_kinds(kinds, cluster, o);
      ASSERT_EQ(plans.size(), 2u);
      for (size_t k = 0; k < plans.size(); ++k) {
        EXPECT_TRUE(validate_plan(plans[k]).empty()) << "kind " << k;
        check_tiles_against_masks(plans[k].table);  // the kind's own masks
        EXPECT_EQ(plans[k].table.seq_mask.front().kind, kinds[k].sequences.front().mask.kind);
        EXPECT_EQ(plans[k].header.options.schedule.num_comm_stages, plans[1].header.options.schedule.num_comm_stages);
      }
      expect_same_tokens(plans);
      // Deterministic.
      EXPECT_EQ(plan_hash(plan_step_kinds(kinds, cluster, o)[0]), plan_hash(plans[0]));
    }
  }
}

// The search keeps the block size whose plans are predicted fastest over all layers: never slower
// than planning with any one of its sizes alone. Layer counts weigh the kinds.
TEST(LayerKinds, TheSearchChoosesTheBlockSizeForEveryLayer) {
  const Cluster cluster = cluster_preset("a100-p4d", 1);
  const std::vector<Batch> kinds = window_and_global(17, 24576);
  const std::vector<double> layers = {9, 3};
  StepPlanOptions o;
  o.search_candidates = true;
  o.search.block_sizes = {256, 512, 1024};
  o.search.calibration = calibration_from_cluster(cluster);
  SimOptions sim;
  sim.calibration = *o.search.calibration;
  const auto total = [&](const std::vector<Plan>& plans) {
    double t = 0;
    for (size_t k = 0; k < plans.size(); ++k) t += layers[k] * simulate(plans[k], cluster, sim).total_s();
    return t;
  };
  const double chosen = total(plan_step_kinds(kinds, cluster, o, layers));
  for (const int64_t b : o.search.block_sizes) {
    StepPlanOptions one = o;
    one.search.block_sizes = {b};
    EXPECT_LE(chosen, total(plan_step_kinds(kinds, cluster, one, layers)) * (1 + 1e-12)) << "B " << b;
  }
}

// The plans chosen are the fastest predicted over every layer among the candidates: each kind as
// the lead, and (kinds_joint_homes) the homes refined for every kind at once. So the default is
// never predicted slower than without the joint homes; and without them (and without finer
// blocks for the other kinds) the candidates do not depend on the layer counts, so the plans
// chosen for some counts are never slower, under those counts, than the plans chosen for others.
TEST(LayerKinds, TheFastestCandidateOverEveryLayerIsKept) {
  const Cluster cluster = cluster_preset("a100-p4d", 2);
  StepPlanOptions o;
  o.blocks.block_size = 512;
  StepPlanOptions own = o;
  own.kinds_joint_homes = false;
  own.kinds_finer_blocks = false;
  const std::vector<Batch> kinds = window_and_global(19, 16384);
  SimOptions sim;
  sim.calibration = calibration_from_cluster(cluster);
  const auto total = [&](const std::vector<Plan>& plans, const std::vector<double>& layers) {
    double t = 0;
    for (size_t k = 0; k < plans.size(); ++k) t += layers[k] * simulate(plans[k], cluster, sim).total_s();
    return t;
  };
  const std::vector<std::vector<double>> counts = {{100, 1}, {1, 1}, {1, 100}};
  std::vector<std::vector<Plan>> chosen;
  for (const auto& c : counts) chosen.push_back(plan_step_kinds(kinds, cluster, own, c));
  for (size_t i = 0; i < counts.size(); ++i) {
    expect_same_tokens(chosen[i]);
    for (size_t j = 0; j < counts.size(); ++j)
      EXPECT_LE(total(chosen[i], counts[i]), total(chosen[j], counts[i]) * (1 + 1e-12)) << i << " vs " << j;
    const std::vector<Plan> joint = plan_step_kinds(kinds, cluster, o, counts[i]);
    expect_same_tokens(joint);
    EXPECT_LE(total(joint, counts[i]), total(chosen[i], counts[i]) * (1 + 1e-12)) << i;
  }
  // Finer token blocks for the kinds that do not lead are candidates too: never predicted slower
  // than the lead's blocks alone, and taken on this batch by some kind.
  StepPlanOptions same_blocks = o;
  same_blocks.kinds_finer_blocks = false;
  bool finer_taken = false;
  for (const auto& c : counts) {
    const std::vector<Plan> with = plan_step_kinds(kinds, cluster, o, c);
    const std::vector<Plan> without = plan_step_kinds(kinds, cluster, same_blocks, c);
    EXPECT_LE(total(with, c), total(without, c) * (1 + 1e-12));
    for (const Plan& p : with) {
      EXPECT_TRUE(validate_plan(p).empty());
      finer_taken |= p.table.num_token_blocks() > with[0].table.num_token_blocks() ||
                     p.table.num_token_blocks() < with[0].table.num_token_blocks();
    }
  }
  EXPECT_TRUE(finer_taken) << "no kind took finer blocks on this batch";
  // On this batch the counts change the lead: each extreme keeps its heavy kind's own plan.
  EXPECT_EQ(plan_hash(chosen[0][0]), plan_hash(plan_step(kinds[0], cluster, o)));
  EXPECT_EQ(plan_hash(chosen[2][1]), plan_hash(plan_step(kinds[1], cluster, o)));
  EXPECT_THROW(plan_step_kinds(kinds, cluster, o, {1}), Error);
  EXPECT_THROW(plan_step_kinds(kinds, cluster, o, {1, 0}), Error);
}

TEST(LayerKinds, ASinkSplitOrAStaticLayoutOfTheLeadCutsEveryKind) {
  // Lead with custom cuts: lambda's sink in a block of its own (split_sink), then a static layout.
  const Cluster cluster = cluster_preset("a100-p4d", 1);
  for (const std::string method : {"dcp", "zigzag"}) {
    StepPlanOptions o;
    o.method = method;
    o.blocks.block_size = 512;
    o.blocks.split_sink = true;
    std::vector<Batch> kinds = window_and_global(5, 16384);
    kinds[1] = with_mask(kinds[1], Mask::lambda(32, 4096));  // the lead: wider window, same sink
    const std::vector<Plan> plans = plan_step_kinds(kinds, cluster, o);
    EXPECT_EQ(plans[0].table.block_size, 0) << method;  // custom cuts, the lead's
    for (const Plan& p : plans) EXPECT_TRUE(validate_plan(p).empty()) << method;
    expect_same_tokens(plans);
  }
}

TEST(LayerKinds, AStaticLayoutPlacesEveryKindByItsOwnRule) {
  // zigzag cuts and homes depend on the lengths alone: the window kind's plan is the layout's own.
  const Cluster cluster = cluster_preset("a100-p4d", 1);
  StepPlanOptions o;
  o.method = "zigzag";
  o.blocks.block_size = 512;
  const std::vector<Batch> kinds = window_and_global(13, 16384);
  const std::vector<Plan> plans = plan_step_kinds(kinds, cluster, o);
  EXPECT_EQ(plans[0].header.method, "zigzag");
  EXPECT_EQ(plan_hash(plans[0]), plan_hash(plan_step(kinds[0], cluster, o)));
  expect_same_tokens(plans);
}

TEST(LayerKinds, TheSearchMayChooseAStaticLayoutForTheLead) {
  // On two devices the static layouts are search candidates; whichever wins the lead, every kind
  // gets a valid plan on its token placement.
  const Cluster cluster = cluster_preset("h200-nvl", 1);
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    StepPlanOptions o;
    o.search_candidates = true;
    o.search.block_sizes = {256, 512};
    Cluster two = cluster;
    two.devices_per_node = 2;
    const std::vector<Batch> kinds = window_and_global(seed, 4096);
    const std::vector<Plan> plans = plan_step_kinds(kinds, two, o);
    for (const Plan& p : plans) EXPECT_TRUE(validate_plan(p).empty()) << "seed " << seed << " " << p.header.method;
    expect_same_tokens(plans);
  }
}

TEST(LayerKinds, OneKindIsPlanStep) {
  const Cluster cluster = cluster_preset("h200-nvl", 1);
  StepPlanOptions o;
  const std::vector<Batch> kinds = window_and_global(7, 8192);
  EXPECT_EQ(plan_hash(plan_step_kinds({kinds[0]}, cluster, o).front()), plan_hash(plan_step(kinds[0], cluster, o)));
}

void expect_invalid(const std::vector<Batch>& kinds, const std::string& what) {
  try {
    plan_step_kinds(kinds, cluster_preset("h200-nvl", 1), {});
    FAIL() << "expected InvalidInput: " << what;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(LayerKinds, KindsThatDoNotShareTheirSequencesAreRefused) {
  Batch global;
  global.shape = AttentionShape{8, 2, 64, DType::BF16};
  for (const int64_t n : {3000, 1200, 700}) global.sequences.push_back(Sequence{n, Mask::causal(), ""});
  const std::vector<Batch> kinds = {with_mask(global, Mask::lambda(32, 512)), global};
  expect_invalid({}, "no layer kinds");
  std::vector<Batch> longer = kinds;
  longer[1].sequences[0].length += 16;
  expect_invalid(longer, "layer kind 1: sequence 0 has");
  std::vector<Batch> fewer = kinds;
  fewer[1].sequences.pop_back();
  expect_invalid(fewer, "layer kind 1: 2 sequences, layer kind 0 3");
  std::vector<Batch> heads = kinds;
  heads[1].shape.q_heads = 16;
  expect_invalid(heads, "layer kind 1: attention shape differs");
  std::vector<Batch> empty = kinds;
  empty[1].sequences[0].length = 0;
  expect_invalid(empty, "layer kind 1: sequences[0].length");
}

TEST(LayerKinds, PlanQueueHandsBackEveryKind) {
  const Cluster cluster = cluster_preset("a100-p4d", 1);
  StepPlanOptions o;
  o.blocks.block_size = 512;
  PlanQueue queue(cluster, o, 2);
  for (int64_t step = 0; step < 3; ++step) queue.submit_kinds(step, window_and_global(static_cast<uint64_t>(step + 11), 8192));
  queue.submit(3, window_and_global(20, 8192)[1]);
  try {
    queue.get(0);
    FAIL() << "expected InvalidInput";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("take it with get_kinds"), std::string::npos) << e.what();
  }
  for (int64_t step = 0; step < 3; ++step) {
    const auto plans = queue.get_kinds(step);
    const std::vector<Plan> want = plan_step_kinds(window_and_global(static_cast<uint64_t>(step + 11), 8192), cluster, o);
    ASSERT_EQ(plans.size(), want.size());
    for (size_t k = 0; k < want.size(); ++k) EXPECT_EQ(plan_hash(*plans[k]), plan_hash(want[k])) << "step " << step;
  }
  EXPECT_EQ(queue.get_kinds(3).size(), 1u);  // a step of submit(): its one plan
  try {
    queue.submit_kinds(4, {});
    FAIL() << "expected InvalidInput";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no layer kinds"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dcp
