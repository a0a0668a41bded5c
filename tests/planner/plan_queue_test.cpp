// PlanQueue: plans steps on worker threads and hands each back by step, whatever order they
// finish in; errors reach get() naming their step; every queue makes the same plans.
#include <gtest/gtest.h>

#include <string>

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
