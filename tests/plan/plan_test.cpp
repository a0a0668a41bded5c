// Plan builder and plan file: round trips, corruption, determinism, memory sizing, schedule.
#include <gtest/gtest.h>

#include <cmath>

#include <functional>
#include <map>
#include <tuple>

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
    on.proxies = off.proxies = false;  // the reduction alone
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

// Every combination of the schedule's options, on static and DCP placements of every mask: the
// schedule is consistent, the plan computes exact attention (validator), tail tiles send no
// output and take from each stage no more than the compute left once its round's inputs are
// hidden, with far_outputs_first no tile with an output to another node runs in the last stage,
// and with relay_first_round no block crosses the network directly to two devices of one node
// (a proxy's crossing, one round before its block is needed, counts as one of them).
TEST(Plan, ScheduleOptionsKeepPlansExactAndRelayRoundOne) {
  const Cluster c = cluster_for(8);
  int proxied = 0;  // schedules where proxies added legs
  for (const std::string& mask : testing::mask_names()) {
    const Batch batch = skewed_batch(mask);
    const std::vector<std::pair<std::string, PlacedBatch>> placements = {
        {"ring", placed(BaselineKind::Ring, batch, 8)},
        {"a2a_p2p", placed(BaselineKind::A2AP2P, batch, 8)},
        {"dcp", testing::dcp_placed(batch, 8)},
        {"scattered", testing::scattered(placed(BaselineKind::Zigzag, batch, 8), 3)}};
    for (const auto& [name, pb] : placements) {
      for (int bits = 0; bits < 64; ++bits) {
        for (int stages : {2, 4}) {
          ScheduleOptions o;
          o.num_comm_stages = stages;
          o.tail_overlaps_final_round = (bits & 1) != 0;
          o.far_outputs_first = (bits & 2) != 0;
          o.relay_first_round = (bits & 4) != 0;
          o.last_round_share = (bits & 8) != 0 ? 0.5 : 1.0;
          o.level_stage_compute = (bits & 16) != 0;
          o.proxies = (bits & 32) != 0;
          o.proxy_slack = 0;  // proxy wherever a port is over its node's mean
          SCOPED_TRACE(mask + " " + name + " options " + std::to_string(bits) + " stages " + std::to_string(stages));
          const Schedule s = build_schedule(pb.table, pb.placement, c, o);
          ASSERT_NO_THROW(s.validate(pb.table, pb.placement));
          if (o.proxies) {
            ScheduleOptions direct = o;
            direct.proxies = false;
            const Schedule d = build_schedule(pb.table, pb.placement, c, direct);
            proxied += s.fwd.inputs.size() + s.bwd.inputs.size() > d.fwd.inputs.size() + d.bwd.inputs.size() ? 1 : 0;
          }
          for (const PassSchedule* ps : {&s.fwd, &s.bwd}) {
            ASSERT_EQ(ps->tile_tail.size(), pb.table.tiles.size());
            std::map<std::pair<int, int>, double> tail_s;  // (device, stage) -> held-back seconds
            for (size_t t = 0; t < pb.table.tiles.size(); ++t) {
              if (ps->tile_tail[t] == 0) continue;
              EXPECT_TRUE(o.tail_overlaps_final_round);
              const Tile& tile = pb.table.tiles[t];
              const int d = pb.placement.tile_device[t];
              EXPECT_EQ(pb.placement.block_home[tile.q_block], d);
              if (ps->pass == Pass::Backward) {
                EXPECT_EQ(pb.placement.block_home[tile.kv_block], d);
              }
              tail_s[{d, ps->tile_stage[t]}] +=
                  (ps->pass == Pass::Forward ? pb.table.tile_flops_fwd(tile) / c.attn_fwd_flops
                                             : pb.table.tile_flops_bwd(tile) / c.attn_bwd_flops);
            }
            for (const auto& [key, secs] : tail_s) {
              const auto [d, st] = key;
              EXPECT_LE(secs, ps->stage_compute_s[d][st] - ps->round_transfer_s[d][st + 1] + 1e-12);
            }
            // With far outputs first, no tile with an output to another node runs in the last
            // stage (with 3 stages the first-round relays may still delay one into it).
            if (o.far_outputs_first && ps->num_stages >= 4) {
              for (size_t t = 0; t < pb.table.tiles.size(); ++t) {
                const Tile& tile = pb.table.tiles[t];
                const int node = c.node_of(pb.placement.tile_device[t]);
                const bool far = c.node_of(pb.placement.block_home[tile.q_block]) != node ||
                                 (ps->pass == Pass::Backward && c.node_of(pb.placement.block_home[tile.kv_block]) != node);
                if (far) {
                  EXPECT_LT(ps->tile_stage[t], ps->num_stages - 1) << "tile " << t;
                }
              }
            }
            if (!o.relay_first_round || stages < 2) continue;
            // (kind, block, group, destination node) crossing directly from the home in round 1.
            std::map<std::tuple<int, int32_t, int32_t, int>, int> direct;
            for (const ScheduledTransfer& x : ps->inputs)
              if (x.round == 1 && !x.via_relay && c.node_of(x.src) != c.node_of(x.dst)) {
                const auto k = std::make_tuple(static_cast<int>(x.kind), x.token_block, x.group, c.node_of(x.dst));
                EXPECT_EQ(++direct[k], 1);
              }
          }
          PlanOptions po;
          po.schedule = o;
          const Plan plan = build_plan(pb.table, pb.placement, c, s, po);
          EXPECT_TRUE(validate_plan(plan).empty());
        }
      }
    }
  }
  EXPECT_GT(proxied, 100) << "proxies never taken: the test does not exercise them";
}

TEST(Plan, BadScheduleOptionsAreNamed) {
  ScheduleOptions o;
  EXPECT_NO_THROW(o.validate());
  for (double bad : {-0.1, std::nan("")}) {
    o.proxy_slack = bad;
    try {
      o.validate();
      ADD_FAILURE() << "proxy_slack " << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("proxy_slack"), std::string::npos) << e.what();
    }
  }
  o = ScheduleOptions{};
  o.last_round_share = 0;
  EXPECT_THROW(o.validate(), Error);
  o = ScheduleOptions{};
  o.backward = ScheduleOptions::PassChoices{};
  o.backward->last_round_share = 1.5;
  try {
    o.validate();
    ADD_FAILURE() << "the backward's last_round_share 1.5 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("backward's last_round_share"), std::string::npos) << e.what();
  }
}

// The backward's own choices (ScheduleOptions::backward) schedule the backward as those options
// alone would and leave the forward as it was; rounds shared out per link class keep plans
// exact, and change the rounds only across nodes (on one node every input is of one class).
TEST(Plan, BackwardChoicesAndRoundsPerLinkClass) {
  const Cluster c = cluster_for(8);
  int per_class_moved = 0;
  for (const std::string& mask : {std::string("causal"), std::string("shared_question"), std::string("lambda")}) {
    const Batch batch = skewed_batch(mask);
    for (const PlacedBatch& pb : {testing::dcp_placed(batch, 8), placed(BaselineKind::A2AP2P, batch, 8)}) {
      for (int bits = 0; bits < 16; ++bits) {
        SCOPED_TRACE(mask + " options " + std::to_string(bits));
        ScheduleOptions a;
        a.num_comm_stages = 3;
        a.far_outputs_first = (bits & 1) != 0;
        a.rounds_per_link_class = (bits & 2) != 0;
        ScheduleOptions b = a;
        b.level_stage_compute = (bits & 4) != 0;
        b.last_round_share = (bits & 8) != 0 ? 0.5 : 1.0;
        b.far_outputs_first = !a.far_outputs_first;
        b.rounds_per_link_class = !a.rounds_per_link_class;
        ScheduleOptions mixed = a;
        mixed.backward = ScheduleOptions::PassChoices{b.far_outputs_first, b.last_round_share, b.level_stage_compute,
                                                      b.rounds_per_link_class};
        const Schedule s = build_schedule(pb.table, pb.placement, c, mixed);
        ASSERT_NO_THROW(s.validate(pb.table, pb.placement));
        EXPECT_TRUE(s.fwd == build_schedule(pb.table, pb.placement, c, a).fwd);
        EXPECT_TRUE(s.bwd == build_schedule(pb.table, pb.placement, c, b).bwd);
        PlanOptions po;
        po.schedule = mixed;
        EXPECT_TRUE(validate_plan(build_plan(pb.table, pb.placement, c, po)).empty());
        if (a.rounds_per_link_class) {
          ScheduleOptions plain = a;
          plain.rounds_per_link_class = false;
          per_class_moved += build_schedule(pb.table, pb.placement, c, plain) == build_schedule(pb.table, pb.placement, c, a) ? 0 : 1;
        }
      }
    }
  }
  EXPECT_GT(per_class_moved, 0) << "rounds per link class never changed a schedule across nodes";
  // One node: every remote input comes from the device's node, so sharing rounds per class is
  // sharing them as before.
  Cluster one = cluster_for(8);
  one.devices_per_node = 8;
  one.nodes = 1;
  const PlacedBatch pb = testing::dcp_placed(skewed_batch("causal"), 8);
  ScheduleOptions plain;
  ScheduleOptions per_class;
  per_class.rounds_per_link_class = true;
  const Schedule x = build_schedule(pb.table, pb.placement, one, plain);
  const Schedule y = build_schedule(pb.table, pb.placement, one, per_class);
  EXPECT_EQ(x.fwd.tile_stage, y.fwd.tile_stage);
  EXPECT_EQ(x.bwd.tile_stage, y.bwd.tile_stage);
}

// The tail runs after the final round is posted and before it is waited for, on the devices
// that have one; nothing else moves.
TEST(Plan, TailTilesRunWhileTheFinalRoundMoves) {
  auto pb = testing::dcp_placed(skewed_batch("lambda", 8192), 8);
  const Cluster c = cluster_for(8);
  ScheduleOptions o;
  const Schedule s = build_schedule(pb.table, pb.placement, c, o);
  PlanOptions po;
  const Plan plan = build_plan(pb.table, pb.placement, c, s, po);
  const int32_t final_round = o.num_comm_stages + 2;
  int with_tail = 0;
  for (const DeviceProgram& dp : plan.devices) {
    for (const Program* p : {&dp.fwd, &dp.bwd}) {
      const PassSchedule& ps = p == &dp.fwd ? s.fwd : s.bwd;
      int64_t want = 0;
      for (size_t t = 0; t < pb.table.tiles.size(); ++t)
        want += pb.placement.tile_device[t] == dp.device && ps.tile_tail[t] != 0;
      bool posted = false, waited = false;
      int64_t after = 0;
      for (const Instruction& ins : p->code) {
        if (const auto* cs = std::get_if<CommStart>(&ins)) posted = posted || cs->id == final_round;
        if (const auto* w = std::get_if<CommWait>(&ins)) waited = waited || w->id == final_round;
        if (const auto* a = std::get_if<Attend>(&ins); a != nullptr && posted && !waited)
          after += static_cast<int64_t>(a->tiles.size());
      }
      if (posted) {
        EXPECT_EQ(after, want);
      }
      with_tail += want > 0;
    }
  }
  EXPECT_GT(with_tail, 0);
}

}  // namespace
}  // namespace dcp
