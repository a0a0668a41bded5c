// PlanQueue: plans steps on worker threads and hands each back by step, whatever order they
// finish in; errors reach get() naming their step; every queue makes the same plans.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "dcp/error.h"
#include "dcp/planner.h"
#include "dcp/profiles.h"
#include "dcp/validate.h"

namespace dcp {
namespace {

Batch step_batch(uint64_t seed, const std::string& mask) {
  ProfileOptions po;
  po.profile = Profile::Ldc;
  po.seed = seed;
  po.token_budget = 8192 + 1024 * static_cast<int64_t>(seed % 5);
  po.mask = mask;
  po.shape = AttentionShape{8, 2, 64, DType::BF16};
  return generate_batches(po, 1).front();
}

StepPlanOptions options(const std::string& method) {
  StepPlanOptions o;
  o.method = method;
  o.blocks.block_size = 512;
  o.plan.schedule.num_comm_stages = 2;
  return o;
}

TEST(PlanQueue, EveryStepComesBackAsItsOwnPlan) {
  const Cluster cluster = cluster_preset("a100-p4d", 1);
  PlanQueue queue(cluster, options("dcp"), 3);
  const char* masks[] = {"causal", "lambda", "shared_question", "mixed"};
  for (int64_t step = 0; step < 12; ++step) queue.submit(step, step_batch(static_cast<uint64_t>(step), masks[step % 4]));
  EXPECT_EQ(queue.in_flight(), 12);
  for (int64_t step = 0; step < 12; ++step) {
    const auto plan = queue.get(step);
    ASSERT_TRUE(plan);
    const Batch want = step_batch(static_cast<uint64_t>(step), masks[step % 4]);
    // The plan is the one of this step's batch: same tokens, and what planning it directly gives.
    EXPECT_EQ(plan->table.total_tokens(), want.total_tokens()) << "step " << step;
    EXPECT_EQ(plan_hash(*plan), plan_hash(plan_step(want, cluster, options("dcp")))) << "step " << step;
    EXPECT_TRUE(validate_plan(*plan).empty());
    EXPECT_GE(queue.stats(step).planning_ms, 0.0);
  }
  EXPECT_EQ(queue.in_flight(), 0);
}

TEST(PlanQueue, TwoQueuesMakeIdenticalPlans) {
  const Cluster cluster = cluster_preset("h200-nvl", 1);
  for (const std::string method : {"dcp", "zigzag", "packing"}) {
    PlanQueue a(cluster, options(method), 1), b(cluster, options(method), 4);
    for (int64_t step = 0; step < 4; ++step) {
      a.submit(step, step_batch(static_cast<uint64_t>(step + 20), "lambda"));
      b.submit(step, step_batch(static_cast<uint64_t>(step + 20), "lambda"));
    }
    for (int64_t step = 3; step >= 0; --step) EXPECT_EQ(plan_hash(*a.get(step)), plan_hash(*b.get(step))) << method;
  }
}

TEST(PlanQueue, PlanningErrorsReachGetNamingTheStep) {
  const Cluster cluster = cluster_preset("a100-p4d", 1);
  PlanQueue queue(cluster, options("dcp"), 2);
  Batch bad = step_batch(1, "causal");
  bad.sequences[0].length = -3;
  queue.submit(0, step_batch(2, "causal"));
  queue.submit(7, bad);
  queue.submit(8, step_batch(3, "causal"));
  EXPECT_TRUE(queue.get(0));
  try {
    queue.get(7);
    FAIL() << "a bad batch planned";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
    EXPECT_EQ(std::string(e.what()).rfind("step 7: ", 0), 0u) << e.what();
  }
  EXPECT_TRUE(queue.get(8)) << "a failed step does not stop later ones";
}

// An equal batch takes the plans already made (the same objects: planning is deterministic,
// so they are the plans it would get), within the last reuse_batches distinct batches.
TEST(PlanQueue, EqualBatchesReuseTheirPlans) {
  const Cluster cluster = cluster_preset("a100-p4d", 1);
  const Batch a = step_batch(1, "causal"), b = step_batch(2, "lambda"), c = step_batch(3, "mixed");
  Batch a_other_window = step_batch(1, "lambda");
  a_other_window.sequences[0].mask = Mask::lambda(64, 1024);  // one mask parameter differs
  // One worker: steps are planned in submission order. A B A C B A': with room for 2 batches,
  // the second B was evicted by C (A was used more recently), so it plans again.
  PlanQueue queue(cluster, options("dcp"), 1, 2);
  const std::vector<const Batch*> order{&a, &b, &a, &c, &b, &a_other_window};
  const std::vector<bool> reused{false, false, true, false, false, false};
  for (size_t i = 0; i < order.size(); ++i) queue.submit(static_cast<int64_t>(i), *order[i]);
  std::vector<std::shared_ptr<const Plan>> plans;
  for (size_t i = 0; i < order.size(); ++i) {
    plans.push_back(queue.get(static_cast<int64_t>(i)));
    EXPECT_EQ(plan_hash(*plans.back()), plan_hash(plan_step(*order[i], cluster, options("dcp")))) << "step " << i;
    EXPECT_EQ(queue.stats(static_cast<int64_t>(i)).reused, reused[i]) << "step " << i;
  }
  EXPECT_EQ(plans[2].get(), plans[0].get());
  EXPECT_NE(plans[4].get(), plans[1].get());

  // reuse_batches 0: every step planned.
  PlanQueue fresh(cluster, options("dcp"), 1, 0);
  fresh.submit(0, a);
  fresh.submit(1, a);
  EXPECT_NE(fresh.get(0).get(), fresh.get(1).get());
  EXPECT_FALSE(fresh.stats(1).reused);
  EXPECT_THROW(PlanQueue(cluster, options("dcp"), 1, -1), Error);
}

// Equal batches submitted together are planned once: the others wait for that step.
TEST(PlanQueue, EqualBatchesInFlightArePlannedOnce) {
  const Cluster cluster = cluster_preset("a100-p4d", 1);
  PlanQueue queue(cluster, options("dcp"), 4);
  const Batch a = step_batch(5, "shared_question");
  for (int64_t step = 0; step < 8; ++step) queue.submit(step, a);
  int planned = 0;
  const auto first = queue.get(0);
  for (int64_t step = 0; step < 8; ++step) {
    if (step > 0) {
      EXPECT_EQ(queue.get(step).get(), first.get());
    }
    planned += queue.stats(step).reused ? 0 : 1;
  }
  EXPECT_EQ(planned, 1);
  // Layer kinds: the same kinds and layer counts reuse, other counts do not.
  const std::vector<Batch> kinds{step_batch(6, "causal"), step_batch(6, "lambda")};
  queue.submit_kinds(10, kinds, {1, 3});
  queue.submit_kinds(11, kinds, {1, 3});
  queue.submit_kinds(12, kinds, {1, 3.5});
  EXPECT_EQ(queue.get_kinds(10)[1].get(), queue.get_kinds(11)[1].get());
  EXPECT_NE(queue.stats(10).reused, queue.stats(11).reused);  // one planned, whichever a worker took first
  queue.get_kinds(12);
  EXPECT_FALSE(queue.stats(12).reused);
}

// A failure is not kept: every step of the bad batch gets the error, later ones try again.
TEST(PlanQueue, EqualBadBatchesAllFail) {
  const Cluster cluster = cluster_preset("a100-p4d", 1);
  PlanQueue queue(cluster, options("dcp"), 2);
  Batch bad = step_batch(1, "causal");
  bad.sequences[0].length = -3;
  for (int64_t step = 0; step < 3; ++step) queue.submit(step, bad);
  for (int64_t step = 0; step < 3; ++step) EXPECT_THROW(queue.get(step), Error) << "step " << step;
  queue.submit(3, bad);
  EXPECT_THROW(queue.get(3), Error);
  EXPECT_FALSE(queue.stats(3).reused);
}

TEST(PlanQueue, MisuseIsRefused) {
  const Cluster cluster = cluster_preset("a100-p4d", 1);
  EXPECT_THROW(PlanQueue(cluster, options("dcp"), 0), Error);
  EXPECT_THROW(PlanQueue(cluster, options("nonsense"), 1), Error);
  PlanQueue queue(cluster, options("ring"), 1);
  EXPECT_THROW(queue.get(3), Error);  // never submitted
  queue.submit(3, step_batch(4, "causal"));
  EXPECT_THROW(queue.submit(3, step_batch(4, "causal")), Error);  // twice
  EXPECT_TRUE(queue.get(3));
  EXPECT_THROW(queue.get(3), Error);  // already taken
  EXPECT_THROW(queue.stats(99), Error);
}

}  // namespace
}  // namespace dcp
