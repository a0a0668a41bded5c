// What each CommStart waits for on the compute stream (dcp/detail/comm_order.h): hand-made
// programs with known answers, and every program of real plans against a brute-force pairwise
// check (any compute instruction before a CommStart that conflicts with one of its transfers
// must be at or before the point the CommStart follows, and that point must be noted).
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "dcp/baselines.h"
#include "dcp/batch.h"
#include "dcp/partition.h"
#include "dcp/plan.h"
#include "common/batches.h"
#include "dcp/detail/comm_order.h"

namespace dcp::test {
namespace {


BufRef slot(DataKind k, int32_t i) { return BufRef{Space::Slot, k, i}; }
BufRef local(DataKind k, int32_t i) { return BufRef{Space::Local, k, i}; }

Transfer xfer(bool send, BufRef b) {
  Transfer t;
  t.peer = 1;
  t.send = send;
  t.kind = b.kind;
  t.buf = b;
  t.bytes = 64;
  return t;
}

Attend fwd_attend(BufRef q, BufRef kv, BufRef out, BufRef out_lse) {
  TileOp t;
  t.q = q;
  t.kv = kv;
  t.out = out;
  t.out_lse = out_lse;
  Attend a;
  a.tiles.push_back(t);
  return a;
}

TEST(CommOrder, SendOfInputsFollowsOnlyThePassStart) {
  Program p;
  p.code.push_back(CommStart{1, {xfer(true, local(DataKind::KV, 0))}});
  p.code.push_back(fwd_attend(local(DataKind::Q, 0), local(DataKind::KV, 0), slot(DataKind::O, 0), slot(DataKind::LSE, 0)));
  p.code.push_back(CommWait{1});
  // Round 2 sends another input: the long Attend above is no reason to wait.
  p.code.push_back(CommStart{2, {xfer(true, local(DataKind::KV, 1))}});
  p.code.push_back(CommWait{2});
  const auto order = comm_order(p);
  EXPECT_EQ(order.after[0], kPassStartPoint);
  EXPECT_EQ(order.after[3], kPassStartPoint);
  for (uint8_t m : order.mark_after) EXPECT_EQ(m, 0);
}

TEST(CommOrder, SendOfAComputedPartialFollowsItsWriter) {
  Program p;
  p.code.push_back(fwd_attend(local(DataKind::Q, 0), local(DataKind::KV, 0), slot(DataKind::O, 3), slot(DataKind::LSE, 3)));
  p.code.push_back(fwd_attend(local(DataKind::Q, 1), local(DataKind::KV, 1), slot(DataKind::O, 4), slot(DataKind::LSE, 4)));
  p.code.push_back(CommStart{1, {xfer(true, slot(DataKind::O, 3)), xfer(true, local(DataKind::Q, 1))}});
  const auto order = comm_order(p);
  EXPECT_EQ(order.after[2], 0);  // slot O 3 was written by instruction 0; instruction 1 is unrelated
  EXPECT_EQ(order.mark_after[0], 1);
  EXPECT_EQ(order.mark_after[1], 0);
}

TEST(CommOrder, ReceiveIntoAReusedSlotFollowsItsLastReader) {
  Program p;
  p.code.push_back(CommStart{1, {xfer(false, slot(DataKind::KV, 0))}});
  p.code.push_back(CommWait{1});
  p.code.push_back(fwd_attend(local(DataKind::Q, 0), slot(DataKind::KV, 0), slot(DataKind::O, 0), slot(DataKind::LSE, 0)));
  p.code.push_back(fwd_attend(local(DataKind::Q, 1), local(DataKind::KV, 1), slot(DataKind::O, 1), slot(DataKind::LSE, 1)));
  Merge m;
  m.kind = DataKind::O;
  m.src_slots = {1};
  m.src_lse_slots = {1};
  m.dst = local(DataKind::O, 1);
  m.dst_lse = local(DataKind::LSE, 1);
  p.code.push_back(m);
  // KV slot 0 is overwritten: wait for instruction 2 (its reader), not 3 or 4.
  p.code.push_back(CommStart{2, {xfer(false, slot(DataKind::KV, 0))}});
  // O slot 1 is overwritten: its last reader is the Merge (4).
  p.code.push_back(CommStart{3, {xfer(false, slot(DataKind::O, 1))}});
  const auto order = comm_order(p);
  EXPECT_EQ(order.after[0], kPassStartPoint);
  EXPECT_EQ(order.after[5], 2);
  EXPECT_EQ(order.after[6], 4);
  EXPECT_EQ(order.mark_after[2], 1);
  EXPECT_EQ(order.mark_after[4], 1);
  EXPECT_EQ(order.mark_after[3], 0);
}

// ---- brute force over real plans ----------------------------------------------------------

struct Access {
  std::vector<BufRef> reads, writes;
};

Access access_of(const Instruction& ins) {
  Access a;
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, Attend>) {
          for (const TileOp& t : x.tiles) {
            a.reads.insert(a.reads.end(), {t.q, t.kv, t.d_o, t.lse_in, t.delta, t.out, t.out_lse, t.out_kv});
            a.writes.insert(a.writes.end(), {t.out, t.out_lse, t.out_kv});
          }
        } else if constexpr (std::is_same_v<T, Merge>) {
          for (int32_t s : x.src_slots) a.reads.push_back(slot(x.kind, s));
          for (int32_t s : x.src_lse_slots) a.reads.push_back(slot(DataKind::LSE, s));
          a.writes.insert(a.writes.end(), {x.dst, x.dst_lse});
        } else if constexpr (std::is_same_v<T, Copy>) {
          a.reads.push_back(x.src);
          a.writes.push_back(x.dst);
        }
      },
      ins);
  return a;
}

bool same(const BufRef& a, const BufRef& b) { return a.space != Space::None && a == b; }

void check_program(const Program& p) {
  const auto order = comm_order(p);
  ASSERT_EQ(order.after.size(), p.code.size());
  for (size_t i = 0; i < p.code.size(); ++i) {
    const auto* start = std::get_if<CommStart>(&p.code[i]);
    if (start == nullptr) continue;
    const int32_t after = order.after[i];
    ASSERT_LT(after, static_cast<int32_t>(i));
    if (after != kPassStartPoint) {
      EXPECT_EQ(order.mark_after[static_cast<size_t>(after)], 1) << "point " << after << " is used but not noted";
    }
    int32_t needed = kPassStartPoint;
    for (size_t j = 0; j < i; ++j) {
      const Access a = access_of(p.code[j]);
      for (const Transfer& t : start->ops) {
        bool conflict = false;
        for (const BufRef& w : a.writes) conflict = conflict || same(w, t.buf);
        if (!t.send)
          for (const BufRef& r : a.reads) conflict = conflict || same(r, t.buf);
        if (conflict) needed = static_cast<int32_t>(j);
      }
    }
    EXPECT_EQ(after, needed) << "CommStart at " << i;
  }
}

TEST(CommOrder, EveryCommStartOfRealPlansFollowsExactlyItsLastConflict) {
  const Batch batch = batch_of(AttentionShape{4, 2, 64, DType::FP32},
                               {{300, Mask::causal()}, {70, Mask::lambda(8, 40)}, {200, Mask::causal_blockwise(32, 2, 1)},
                                {33, Mask::shared_question_for(33, 0.2, 2)}, {129, Mask::causal()}});
  BlockOptions opts;
  opts.block_size = 32;
  int programs = 0;
  for (int stages : {1, 2, 4}) {
    for (auto [nodes, per_node] : {std::pair{1, 2}, std::pair{2, 2}, std::pair{1, 3}}) {
      Cluster cluster;
      cluster.nodes = nodes;
      cluster.devices_per_node = per_node;
      std::vector<PlacedBatch> placed;
      PlacedBatch dcp;
      dcp.table = build_block_table(batch, opts);
      dcp.placement = place_dcp(dcp.table, cluster, PlacementOptions{}).placement;
      placed.push_back(std::move(dcp));
      for (BaselineKind k : all_baselines()) placed.push_back(make_baseline(k, batch, opts, cluster));
      for (const PlacedBatch& pb : placed) {
        PlanOptions popts;
        popts.schedule.num_comm_stages = stages;
        const Plan plan = build_plan(pb.table, pb.placement, cluster, popts);
        for (const DeviceProgram& d : plan.devices) {
          SCOPED_TRACE("stages " + std::to_string(stages) + " device " + std::to_string(d.device));
          check_program(d.fwd);
          check_program(d.bwd);
          programs += 2;
        }
      }
    }
  }
  EXPECT_GT(programs, 100);
}

}  // namespace
}  // namespace dcp::test
