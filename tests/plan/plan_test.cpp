// Plan builder and plan file: round trips, corruption, determinism, memory sizing, schedule.
#include <gtest/gtest.h>

#include <functional>

#include "dcp/error.h"
#include "dcp/metrics.h"
#include "dcp/validate.h"
#include "plan/plan_fixtures.h"

namespace dcp {
namespace {

// Q side (O, LSE, dQ) or KV side (dKV) of an output kind.
int sched_side(DataKind k) { return k == DataKind::dKV || k == DataKind::KV ? 1 : 0; }

using testing::cluster_for;
using testing::placed;
using testing::plan_for;
using testing::skewed_batch;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Plan, ScheduleIsConsistentAndEveryTileHasAStage) {
  for (BaselineKind kind : all_baselines()) {
    auto pb = placed(kind, skewed_batch("causal"), 8);
    for (int stages : {1, 3}) {
      ScheduleOptions o;
      o.num_comm_stages = stages;
      Schedule s = build_schedule(pb.table, pb.placement, cluster_for(8), o);
      EXPECT_NO_THROW(s.validate(pb.table, pb.placement)) << to_string(kind);
      // Stage 0 holds exactly the tiles whose inputs are all home.
      for (size_t t = 0; t < pb.table.tiles.size(); ++t) {
        const Tile& tile = pb.table.tiles[t];
        const int d = pb.placement.tile_device[t];
        const bool local = pb.placement.block_home[tile.q_block] == d && pb.placement.block_home[tile.kv_block] == d;
        EXPECT_EQ(s.fwd.tile_stage[t] == 0, local);
      }
    }
  }
}

TEST(Plan, FileRoundTripIsBitIdentical) {
  auto pb = placed(BaselineKind::Zigzag, skewed_batch("shared_question"), 4);
  Plan p = plan_for(pb, 4);
  std::vector<uint8_t> bytes = serialize_plan(p);
  Plan q = deserialize_plan(bytes, "mem");
  EXPECT_EQ(serialize_plan(q), bytes);
  EXPECT_TRUE(validate_plan(q).empty());
  EXPECT_EQ(plan_to_json(q), plan_to_json(p));
}

TEST(Plan, SameInputSamePlanBytes) {
  auto pb = placed(BaselineKind::A2AP2P, skewed_batch("lambda"), 8);
  EXPECT_EQ(serialize_plan(plan_for(pb, 8)), serialize_plan(plan_for(pb, 8)));
}

TEST(Plan, CorruptFilesAreRefusedClearly) {
  auto pb = placed(BaselineKind::Ring, skewed_batch("causal"), 4);
  std::vector<uint8_t> bytes = serialize_plan(plan_for(pb, 4));
  auto flipped = bytes;
  flipped[flipped.size() / 2] ^= 0x40;
  EXPECT_EQ(error_of([&] { deserialize_plan(flipped, "plan.bin"); }), "plan.bin: checksum mismatch");
  auto truncated = bytes;
  truncated.resize(bytes.size() - 9);
  EXPECT_NE(error_of([&] { deserialize_plan(truncated, "plan.bin"); }).find("truncated"), std::string::npos);
  auto version = bytes;
  version[8] = 7;
  EXPECT_EQ(error_of([&] { deserialize_plan(version, "plan.bin"); }),
            "plan.bin: format version 7, this build reads 1");
  auto magic = bytes;
  magic[0] = 'X';
  EXPECT_NE(error_of([&] { deserialize_plan(magic, "plan.bin"); }).find("bad magic"), std::string::npos);
  EXPECT_NE(error_of([&] { deserialize_plan({}, "plan.bin"); }).find("too short"), std::string::npos);
  Plan p = deserialize_plan(bytes, "plan.bin");
  EXPECT_EQ(error_of([&] { check_plan_world_size(p, 8, "exec"); }), "exec: plan for world size 4, communicator has 8");
  EXPECT_NO_THROW(check_plan_world_size(p, 4, "exec"));
}

TEST(Plan, SlotReuseNeverIncreasesMemoryAndSlotsFitBlocks) {
  auto pb = placed(BaselineKind::Ring, skewed_batch("causal"), 8);
  PlanOptions reuse, no_reuse;
  no_reuse.reuse_slots = false;
  Plan a = build_plan(pb.table, pb.placement, cluster_for(8), reuse);
  Plan b = build_plan(pb.table, pb.placement, cluster_for(8), no_reuse);
  EXPECT_TRUE(validate_plan(b).empty());
  PlacementMetrics m = compute_metrics(pb.table, pb.placement, cluster_for(8));
  for (int d = 0; d < 8; ++d) {
    DeviceMemory ma = plan_memory(a, d), mb = plan_memory(b, d);
    EXPECT_LE(ma.peak_bytes, mb.peak_bytes);
    EXPECT_EQ(ma.local_bytes, mb.local_bytes);
    EXPECT_EQ(a.devices[d].owned_tokens, m.devices[d].tokens);
    // Every residency of a slot fits it and no two residencies of one slot overlap.
    for (const Program* prog : {&a.devices[d].fwd, &a.devices[d].bwd}) {
      for (size_t i = 0; i < prog->slot_uses.size(); ++i) {
        const SlotUse& u = prog->slot_uses[i];
        EXPECT_LT(u.slot, prog->num_slots[static_cast<int>(u.kind)]);
        EXPECT_LE(pb.table.token_blocks[u.token_block].length, a.header.max_block_tokens);
        for (size_t j = i + 1; j < prog->slot_uses.size(); ++j) {
          const SlotUse& v = prog->slot_uses[j];
          if (v.kind == u.kind && v.slot == u.slot) {
            EXPECT_TRUE(v.first > u.last || u.first > v.last);
          }
        }
      }
    }
  }
}

TEST(Plan, OutputsLeaveBeforeTheFinalRoundWhenTheirTilesAreEarly) {
  auto pb = testing::scattered(placed(BaselineKind::Zigzag, skewed_batch("causal", 8192), 8), 7);
  ScheduleOptions o;
  o.num_comm_stages = 4;
  Schedule s = build_schedule(pb.table, pb.placement, cluster_for(8), o);
  int early = 0;
  for (const ScheduledTransfer& x : s.fwd.outputs) early += x.round <= s.fwd.num_stages;
  EXPECT_GT(early, 0);
}

TEST(Plan, TwoPhaseRelaysCrossTheNetworkOncePerNode) {
  auto pb = placed(BaselineKind::Ring, skewed_batch("full", 8192), 8);
  ScheduleOptions on, off;
  off.two_phase = false;
  const Cluster c = cluster_for(8);
  auto inter = [&](const Schedule& s) {
    int64_t n = 0;
    for (const ScheduledTransfer& x : s.fwd.inputs) n += c.node_of(x.src) != c.node_of(x.dst);
    return n;
  };
  Schedule a = build_schedule(pb.table, pb.placement, c, on);
  Schedule b = build_schedule(pb.table, pb.placement, c, off);
  EXPECT_NO_THROW(a.validate(pb.table, pb.placement));
  EXPECT_LT(inter(a), inter(b));
  PlanOptions po;
  EXPECT_TRUE(validate_plan(build_plan(pb.table, pb.placement, c, a, po)).empty());
}

TEST(Plan, PartialOutputsCrossTheNetworkOncePerNodeWhenReduced) {
  // A ring over 2 nodes x 4: every device computing with a remote block sends its partial. Reduced
  // per node, the partials of one output block leave each node at most once, except those that
  // could not reach the relay in time for the final round.
  for (const char* mask : {"causal", "full"}) {
    auto pb = placed(BaselineKind::Ring, skewed_batch(mask, 8192), 8);
    const Cluster c = cluster_for(8);
    ScheduleOptions on, off;
    off.reduce_outputs_per_node = false;
    for (int stages : {2, 4}) {
      on.num_comm_stages = off.num_comm_stages = stages;
      const Schedule a = build_schedule(pb.table, pb.placement, c, on);
      const Schedule b = build_schedule(pb.table, pb.placement, c, off);
      auto inter = [&](const Schedule& sc) {
        int64_t n = 0;
        for (const PassSchedule* p : {&sc.fwd, &sc.bwd})
          for (const ScheduledTransfer& x : p->outputs) n += c.node_of(x.src) != c.node_of(x.dst);
        return n;
      };
      // (A ring's queries stay home: its partials are the backward's dKV.)
      EXPECT_LT(inter(a), inter(b)) << mask << " stages " << stages;
      for (const PassSchedule* ps : {&a.fwd, &a.bwd}) {
        const PassSchedule& pb_ps = ps == &a.fwd ? b.fwd : b.bwd;
        // Same number of transfers (rerouted, not dropped); a relay forwards after what it merges.
        EXPECT_EQ(ps->outputs.size(), pb_ps.outputs.size());
        for (const ScheduledTransfer& x : ps->outputs) {
          EXPECT_GE(x.round, 1);
          EXPECT_LE(x.round, ps->num_stages + 1);
          if (c.node_of(x.src) != c.node_of(x.dst)) continue;
          for (const ScheduledTransfer& y : ps->outputs) {
            if (y.src == x.dst && y.token_block == x.token_block && y.group == x.group &&
                sched_side(y.kind) == sched_side(x.kind) && c.node_of(y.dst) != c.node_of(y.src)) {
              EXPECT_GT(y.round, x.round);
            }
          }
        }
      }
      PlanOptions po;
      po.schedule = on;
      EXPECT_TRUE(validate_plan(build_plan(pb.table, pb.placement, c, a, po)).empty()) << mask << " stages " << stages;
    }
  }
}

}  // namespace
}  // namespace dcp
