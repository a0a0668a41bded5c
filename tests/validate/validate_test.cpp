// Validator: every plan the builder makes is valid (all baselines, masks, stage counts, world
// sizes 1..16), and mutated plans are rejected.
#include <gtest/gtest.h>

#include "dcp/error.h"
#include "dcp/validate.h"
#include "plan/plan_fixtures.h"

namespace dcp {
namespace {

using testing::placed;
using testing::plan_for;
using testing::skewed_batch;

std::string first(const std::vector<PlanViolation>& v) { return v.empty() ? "" : v.front().to_string(); }

TEST(Validate, EveryBaselineEveryMaskEveryStageCount) {
  for (const std::string& mask : testing::mask_names()) {
    const Batch batch = skewed_batch(mask);
    for (BaselineKind kind : all_baselines()) {
      auto pb = placed(kind, batch, 8);
      for (int stages = 1; stages <= 5; ++stages) {
        Plan p = plan_for(pb, 8, stages);
        EXPECT_EQ(first(validate_plan(p)), "") << mask << " " << to_string(kind) << " stages " << stages;
        Plan s = plan_for(testing::scattered(pb, static_cast<uint64_t>(stages)), 8, stages);
        EXPECT_EQ(first(validate_plan(s)), "") << mask << " scattered " << to_string(kind) << " stages " << stages;
      }
    }
  }
}

TEST(Validate, DcpPlacementsEveryMaskEveryStageCount) {
  for (const std::string& mask : testing::mask_names()) {
    auto pb = testing::dcp_placed(skewed_batch(mask), 8);
    for (int stages = 1; stages <= 5; ++stages)
      EXPECT_EQ(first(validate_plan(plan_for(pb, 8, stages))), "") << mask << " dcp stages " << stages;
  }
  for (int p : {1, 2, 3, 5, 6, 12, 16}) {
    auto pb = testing::dcp_placed(skewed_batch("causal_blockwise", 8192), p, 128);
    EXPECT_EQ(first(validate_plan(plan_for(pb, p, 4))), "") << "dcp P=" << p;
  }
}

TEST(Validate, WorldSizesOneToSixteen) {
  const Batch batch = skewed_batch("causal", 8192);
  for (int p = 1; p <= 16; ++p) {
    for (BaselineKind kind : all_baselines()) {
      auto pb = placed(kind, batch, p);
      Plan plan = plan_for(pb, p, 1 + p % 5);
      EXPECT_EQ(first(validate_plan(plan)), "") << "P=" << p << " " << to_string(kind);
      Plan s = plan_for(testing::scattered(pb, 11), p, 1 + p % 5);
      EXPECT_EQ(first(validate_plan(s)), "") << "P=" << p << " scattered " << to_string(kind);
    }
  }
}

Plan ring_plan() { return plan_for(testing::scattered(placed(BaselineKind::Ring, skewed_batch("causal"), 4), 3), 4, 3); }

TEST(Validate, RejectsADroppedReceive) {
  Plan p = ring_plan();
  bool done = false;
  for (DeviceProgram& dp : p.devices)
    for (Instruction& ins : dp.fwd.code)
      if (auto* cs = std::get_if<CommStart>(&ins); cs && !done)
        for (size_t i = 0; i < cs->ops.size() && !done; ++i)
          if (!cs->ops[i].send) {
            cs->ops.erase(cs->ops.begin() + static_cast<std::ptrdiff_t>(i));
            done = true;
          }
  ASSERT_TRUE(done);
  EXPECT_FALSE(validate_plan(p).empty());
  EXPECT_THROW(check_plan(p), Error);
}

TEST(Validate, RejectsASwappedSlot) {
  Plan p = ring_plan();
  bool done = false;
  for (DeviceProgram& dp : p.devices)
    for (Instruction& ins : dp.fwd.code)
      if (auto* a = std::get_if<Attend>(&ins); a && !done)
        for (TileOp& op : a->tiles)
          if (!done && op.kv.space == Space::Slot && dp.fwd.num_slots[static_cast<int>(DataKind::KV)] > 1) {
            op.kv.index = (op.kv.index + 1) % dp.fwd.num_slots[static_cast<int>(DataKind::KV)];
            done = true;
          }
  ASSERT_TRUE(done);
  auto v = validate_plan(p);
  ASSERT_FALSE(v.empty());
  EXPECT_NE(first(v).find("Attend kv"), std::string::npos) << first(v);
}

TEST(Validate, RejectsADuplicatedTile) {
  Plan p = ring_plan();
  for (Instruction& ins : p.devices[1].bwd.code)
    if (auto* a = std::get_if<Attend>(&ins)) {
      TileOp op = a->tiles.front();
      op.accumulate_q = op.accumulate_kv = true;
      a->tiles.push_back(op);
      break;
    }
  auto v = validate_plan(p);
  ASSERT_FALSE(v.empty());
  bool twice = false;
  for (const auto& x : v) twice |= x.what.find("computed 2 times") != std::string::npos;
  EXPECT_TRUE(twice) << first(v);
}

TEST(Validate, RejectsAMissingMergeAndAWrongRound) {
  Plan p = ring_plan();
  auto& code = p.devices[0].fwd.code;
  for (size_t i = code.size(); i-- > 0;)
    if (std::holds_alternative<Merge>(code[i])) {
      code.erase(code.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
  EXPECT_NE(first(validate_plan(p)).find("never merged"), std::string::npos);

  Plan q = ring_plan();
  bool done = false;
  for (Instruction& ins : q.devices[2].fwd.code)
    if (auto* cs = std::get_if<CommStart>(&ins); cs && !done) {
      cs->ops.front().bytes += 2;
      done = true;
    }
  ASSERT_TRUE(done);
  EXPECT_FALSE(validate_plan(q).empty());
}

TEST(Validate, RejectsAnOverwriteWhileLive) {
  // Force two received KV blocks into one slot: the second receive lands on a live block.
  Plan p = plan_for(placed(BaselineKind::Ring, skewed_batch("full"), 4), 4, 1);
  bool done = false;
  for (Instruction& ins : p.devices[3].fwd.code)
    if (auto* cs = std::get_if<CommStart>(&ins); cs && !done) {
      int seen = 0;
      for (Transfer& x : cs->ops)
        if (!x.send && x.kind == DataKind::KV && ++seen == 2) {
          x.buf.index = 0;
          done = true;
        }
    }
  ASSERT_TRUE(done);
  EXPECT_FALSE(validate_plan(p).empty());
}

}  // namespace
}  // namespace dcp
