// Batching of consecutive Merge instructions (src/exec/merge_batches.h, ExecOptions::batch_merges):
// the row-set and the batcher against brute-force per-row bitmaps, and whole executors whose
// backend runs every batch in REVERSE order against the sequential CPU executor (any dependency
// inside a batch then changes the result).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/rng.h"
#include "dcp/baselines.h"
#include "dcp/batch.h"
#include "dcp/comm.h"
#include "dcp/executor.h"
#include "dcp/plan.h"
#include "exec/forwarding_backend.h"
#include "exec/merge_batches.h"

namespace dcp::test {
namespace {

using exec_detail::MergeBatcher;
using exec_detail::RowSet;

TEST(RowSet, MatchesBitmapOnRandomIntervals) {
  SplitMix64 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    RowSet set;
    std::vector<char> bits(64, 0);
    for (int op = 0; op < 12; ++op) {
      const int64_t b = rng.below(60), e = b + rng.uniform(0, 8);
      for (int q = 0; q < 10; ++q) {
        const int64_t qb = rng.below(64), qe = std::min<int64_t>(64, qb + rng.uniform(0, 10));
        bool want = false;
        for (int64_t i = qb; i < qe; ++i) want = want || bits[static_cast<size_t>(i)];
        ASSERT_EQ(set.overlaps(qb, qe), want) << "trial " << trial << " [" << qb << ", " << qe << ")";
      }
      set.add(b, e);
      for (int64_t i = b; i < std::min<int64_t>(e, 64); ++i) bits[static_cast<size_t>(i)] = 1;
    }
  }
}

// Calls over small arrays: rows [0, 40) of every array; sources and destinations anywhere.
struct CallStore {
  std::vector<std::vector<int64_t>> src, lse;
  std::vector<MergeCall> calls;
  void add(DataKind kind, int64_t rows, int64_t dst, int64_t dst_lse, std::vector<int64_t> s, std::vector<int64_t> l,
           bool accumulate) {
    src.push_back(std::move(s));
    lse.push_back(std::move(l));
    MergeCall c;
    c.kind = kind;
    c.num_rows = rows;
    c.dst = dst;
    c.dst_lse = dst_lse;
    c.accumulate = accumulate;
    calls.push_back(c);
  }
  MergeCall at(size_t i) const {
    MergeCall c = calls[i];
    c.src = src[i];
    c.src_lse = lse[i];
    return c;
  }
};

TEST(MergeBatcher, RefusesEveryKindOfDependencyAndPartialOverlap) {
  CallStore s;
  s.add(DataKind::O, 10, 0, 0, {100}, {100}, false);          // 0: O/LSE [0,10) := merge([100,110))
  s.add(DataKind::O, 10, 10, 10, {105}, {200}, false);        // 1: reads O [105,115): independent
  s.add(DataKind::O, 10, 20, 20, {5}, {300}, false);          // 2: reads O [5,15): written by 0 and 1
  s.add(DataKind::O, 4, 108, 108, {}, {}, false);             // 3: writes O [108,112): read by 0, 1
  s.add(DataKind::O, 1, 9, 50, {}, {}, false);                // 4: writes O row 9: written by 0
  s.add(DataKind::O, 5, 30, 30, {400}, {14}, false);          // 5: reads LSE row 14: written by 1
  s.add(DataKind::O, 5, 30, 30, {400}, {20}, true);           // 6: reads LSE [20,25) and its own dst: fine
  s.add(DataKind::dQ, 10, 0, 0, {0}, {}, false);              // 7: another array: independent
  MergeBatcher b;
  EXPECT_TRUE(b.try_add(s.at(0)));
  EXPECT_TRUE(b.try_add(s.at(1)));
  EXPECT_FALSE(b.try_add(s.at(2)));  // read after write (partial overlap)
  EXPECT_FALSE(b.try_add(s.at(3)));  // write after read (partial overlap)
  EXPECT_FALSE(b.try_add(s.at(4)));  // write after write (one row)
  EXPECT_FALSE(b.try_add(s.at(5)));  // LSE read after write
  EXPECT_TRUE(b.try_add(s.at(6)));
  EXPECT_TRUE(b.try_add(s.at(7)));
  EXPECT_EQ(b.size(), 4);
  // dK and dV rows are written together: a dKV call conflicts through either.
  MergeBatcher kv;
  CallStore t;
  t.add(DataKind::dKV, 8, 0, 0, {16}, {}, false);
  t.add(DataKind::dKV, 8, 8, 0, {20}, {}, false);  // reads [20, 28) of dK and dV: fine
  t.add(DataKind::dKV, 8, 30, 0, {4}, {}, true);   // reads rows 4..11: written
  EXPECT_TRUE(kv.try_add(t.at(0)));
  EXPECT_TRUE(kv.try_add(t.at(1)));
  EXPECT_FALSE(kv.try_add(t.at(2)));
  kv.clear();
  EXPECT_TRUE(kv.try_add(t.at(2)));
}

// Element-level reference: the arrays each call reads and writes, one flag per row.
struct Bitmaps {
  std::vector<std::vector<char>> read, written;
  explicit Bitmaps(int64_t rows)
      : read(kNumArrays, std::vector<char>(static_cast<size_t>(rows), 0)),
        written(kNumArrays, std::vector<char>(static_cast<size_t>(rows), 0)) {}
  static void mark(std::vector<char>& v, int64_t row, int64_t n) {
    for (int64_t i = row; i < row + n; ++i) v[static_cast<size_t>(i)] = 1;
  }
  static bool any(const std::vector<char>& v, int64_t row, int64_t n) {
    for (int64_t i = row; i < row + n; ++i)
      if (v[static_cast<size_t>(i)]) return true;
    return false;
  }
  // Rows of each array read (r) and written (w) by `c`.
  static void footprint(const MergeCall& c, Bitmaps& f) {
    const std::vector<Array> arrs = c.kind == DataKind::O    ? std::vector<Array>{Array::O}
                                    : c.kind == DataKind::dQ ? std::vector<Array>{Array::dQ}
                                                             : std::vector<Array>{Array::dK, Array::dV};
    for (Array a : arrs) {
      auto& w = f.written[static_cast<size_t>(a)];
      auto& r = f.read[static_cast<size_t>(a)];
      mark(w, c.dst, c.num_rows);
      if (c.accumulate) mark(r, c.dst, c.num_rows);
      for (int64_t s : c.src) mark(r, s, c.num_rows);
    }
    if (c.kind == DataKind::O) {
      auto& w = f.written[static_cast<size_t>(Array::LSE)];
      auto& r = f.read[static_cast<size_t>(Array::LSE)];
      mark(w, c.dst_lse, c.num_rows);
      if (c.accumulate) mark(r, c.dst_lse, c.num_rows);
      for (int64_t s : c.src_lse) mark(r, s, c.num_rows);
    }
  }
  bool conflicts(const Bitmaps& f) const {
    for (size_t a = 0; a < static_cast<size_t>(kNumArrays); ++a)
      for (size_t i = 0; i < read[a].size(); ++i) {
        if (f.written[a][i] && (written[a][i] || read[a][i])) return true;
        if (f.read[a][i] && written[a][i]) return true;
      }
    return false;
  }
  void absorb(const Bitmaps& f) {
    for (size_t a = 0; a < static_cast<size_t>(kNumArrays); ++a)
      for (size_t i = 0; i < read[a].size(); ++i) {
        read[a][i] = read[a][i] || f.read[a][i];
        written[a][i] = written[a][i] || f.written[a][i];
      }
  }
};

TEST(MergeBatcher, AdmitsExactlyTheIndependentCallsOnRandomRuns) {
  SplitMix64 rng(9);
  constexpr int64_t kRows = 64;
  int accepted = 0, refused = 0;
  for (int trial = 0; trial < 300; ++trial) {
    MergeBatcher batcher;
    Bitmaps batch(kRows);
    CallStore s;
    for (int i = 0; i < 10; ++i) {
      const DataKind kinds[] = {DataKind::O, DataKind::dQ, DataKind::dKV};
      const DataKind kind = kinds[rng.below(3)];
      const int64_t n = rng.uniform(1, 6);
      auto row = [&] { return rng.below(kRows - n + 1); };
      std::vector<int64_t> src, lse;
      for (int64_t k = rng.uniform(0, 2); k > 0; --k) {
        src.push_back(row());
        if (kind == DataKind::O) lse.push_back(row());
      }
      s.add(kind, n, row(), kind == DataKind::O ? row() : 0, src, lse, rng.coin());
      const MergeCall c = s.at(s.calls.size() - 1);
      Bitmaps f(kRows);
      Bitmaps::footprint(c, f);
      const bool independent = !batch.conflicts(f);
      ASSERT_EQ(batcher.try_add(c), independent) << "trial " << trial << " call " << i;
      if (independent) {
        batch.absorb(f);
        ++accepted;
      } else {
        ++refused;
      }
    }
  }
  EXPECT_GT(accepted, 300);  // both outcomes are exercised
  EXPECT_GT(refused, 300);
}

// Runs each batch in reverse order (after checking it against the bitmaps) and records the
// instruction indices of every batch: a batch with a dependency gives a different result.
class ReversingBackend final : public ForwardingBackend {
 public:
  std::vector<std::vector<uint32_t>> batches;  // instruction index (low key bits) of each call
  bool independent = true;

  std::string name() const override { return "reversing-cpu"; }
  void merge(const ArraySet& a, const MergeCall& c) override {
    batches.push_back({static_cast<uint32_t>(c.key)});
    cpu->merge(a, c);
  }
  void merge_batch(const ArraySet& a, const MergeBatchCall& b) override {
    const int64_t rows = *std::max_element(a.rows.begin(), a.rows.end());
    Bitmaps seen(rows);
    std::vector<uint32_t> idx;
    for (const MergeCall& c : b.calls) {
      Bitmaps f(rows);
      Bitmaps::footprint(c, f);
      independent = independent && !seen.conflicts(f);
      seen.absorb(f);
      idx.push_back(static_cast<uint32_t>(c.key));
    }
    batches.push_back(idx);
    for (size_t i = b.calls.size(); i-- > 0;) cpu->merge(a, b.calls[i]);
  }
};

// A one-device plan whose programs are replaced: 4 q heads in 2 groups, 2 KV sets, blocks of
// 32 tokens (the last of each sequence shorter, so sources of one slot overlap in part).
Plan one_device_plan() {
  Batch batch;
  batch.shape = AttentionShape{4, 2, 16, DType::FP32};
  for (int64_t len : {100, 45}) {
    Sequence s;
    s.length = len;
    s.mask = Mask::causal();
    batch.sequences.push_back(s);
  }
  Cluster cluster;
  cluster.nodes = 1;
  cluster.devices_per_node = 1;
  BlockOptions opts;
  opts.block_size = 32;
  const PlacedBatch placed = make_baseline(BaselineKind::Ring, batch, opts, cluster);
  Plan plan = build_plan(placed.table, placed.placement, cluster, PlanOptions{});
  for (Program* p : {&plan.devices[0].fwd, &plan.devices[0].bwd}) {
    p->code.clear();
    p->slot_uses.clear();
    p->num_slots.fill(0);
  }
  return plan;
}

constexpr int kSlots = 5;

// A random Merge of pass `pass`: random sources (possibly overlapping slots of other merges),
// a local or slot destination; forward LSE slots not always paired with their O slots.
Instruction random_instruction(SplitMix64& rng, const Plan& plan, Pass pass) {
  const DeviceProgram& dev = plan.devices[0];
  const auto pos = static_cast<int32_t>(rng.below(static_cast<int64_t>(dev.owned_blocks.size())));
  const int32_t block = dev.owned_blocks[static_cast<size_t>(pos)];
  const DataKind kind = pass == Pass::Forward ? DataKind::O : (rng.coin() ? DataKind::dQ : DataKind::dKV);
  const int32_t group = static_cast<int32_t>(rng.below(2));
  auto slot = [&] { return static_cast<int32_t>(rng.below(kSlots)); };
  if (rng.below(8) == 0) return Copy{kind, block, group, BufRef{Space::Slot, kind, slot()}, BufRef{Space::Slot, kind, slot()}};
  Merge m;
  m.kind = kind;
  m.token_block = block;
  m.group = group;
  for (int64_t k = rng.uniform(0, 2); k > 0; --k) {
    m.src_slots.push_back(slot());
    if (kind == DataKind::O) m.src_lse_slots.push_back(rng.below(3) == 0 ? slot() : m.src_slots.back());
  }
  const bool local = rng.below(3) == 0;
  m.dst = local ? BufRef{Space::Local, kind, pos} : BufRef{Space::Slot, kind, slot()};
  if (kind == DataKind::O) m.dst_lse = local ? BufRef{Space::Local, DataKind::LSE, pos} : BufRef{Space::Slot, DataKind::LSE, m.dst.index};
  m.accumulate = !local && rng.coin();
  return m;
}

// Every fp32 array of `e` filled from `seed`: O/dQ/dK/dV in [-1, 1], LSE in [-3, 3] with some
// -inf rows (empty partials).
void fill_outputs(const Executor& e, uint64_t seed) {
  SplitMix64 rng(seed);
  const ArraySet& a = e.arrays();
  for (Array arr : {Array::O, Array::LSE, Array::dQ, Array::dK, Array::dV, Array::Delta}) {
    const auto i = static_cast<size_t>(arr);
    auto* p = static_cast<float*>(a.base[i]);
    for (int64_t k = 0; k < a.rows[i] * a.row_elems[i]; ++k)
      p[k] = arr != Array::LSE ? rng.symmetric() : rng.below(6) == 0 ? -std::numeric_limits<float>::infinity()
                                                                      : 3.0f * rng.symmetric();
  }
}

bool same_outputs(const Executor& x, const Executor& y) {
  for (Array arr : {Array::O, Array::LSE, Array::dQ, Array::dK, Array::dV}) {
    const auto i = static_cast<size_t>(arr);
    const auto bytes = static_cast<size_t>(x.arrays().rows[i] * x.arrays().row_elems[i]) * sizeof(float);
    if (std::memcmp(x.arrays().base[i], y.arrays().base[i], bytes) != 0) return false;
  }
  return true;
}

// Runs `plan` sequentially (CPU backend, one merge per call) and batched (reversing backend);
// the results must be bit-identical. Returns the batches of each pass.
std::array<std::vector<std::vector<uint32_t>>, 2> run_both(const Plan& plan, uint64_t seed) {
  std::array<std::vector<std::vector<uint32_t>>, 2> out;
  run_local_ranks(1, [&](Comm& comm) {
    auto cpu = make_cpu_backend();
    ReversingBackend rev;
    Executor seq(plan, *cpu, comm, ExecOptions{.batch_merges = false});
    Executor bat(plan, rev, comm);
    fill_outputs(seq, seed);
    fill_outputs(bat, seed);
    seq.forward_layer(0);
    const ExecStats fs = bat.forward_layer(0);
    out[0] = rev.batches;
    EXPECT_EQ(fs.num_merge_calls, static_cast<int>(out[0].size()));
    rev.batches.clear();
    seq.backward_layer(0);
    bat.backward_layer(0);
    out[1] = rev.batches;
    EXPECT_TRUE(rev.independent) << "a batch holds dependent merges";
    EXPECT_TRUE(same_outputs(seq, bat)) << "batched merges differ from sequential ones";
  });
  return out;
}

TEST(MergeBatches, ADependentMergeStartsANewBatch) {
  Plan plan = one_device_plan();
  Program& fwd = plan.devices[0].fwd;
  fwd.num_slots[static_cast<size_t>(DataKind::O)] = fwd.num_slots[static_cast<size_t>(DataKind::LSE)] = kSlots;
  const int32_t b0 = plan.devices[0].owned_blocks[0], b1 = plan.devices[0].owned_blocks[1];
  auto slot = [](DataKind k, int32_t s) { return BufRef{Space::Slot, k, s}; };
  // 0: slot 0 += slot 1; 1: local b0 := slot 0 (reads what 0 wrote); 2: local b1 := slot 2.
  fwd.code.push_back(Merge{DataKind::O, b0, 0, {1}, {1}, slot(DataKind::O, 0), slot(DataKind::LSE, 0), true});
  fwd.code.push_back(Merge{DataKind::O, b0, 0, {0}, {0}, BufRef{Space::Local, DataKind::O, 0},
                           BufRef{Space::Local, DataKind::LSE, 0}, false});
  fwd.code.push_back(Merge{DataKind::O, b1, 1, {2}, {2}, BufRef{Space::Local, DataKind::O, 1},
                           BufRef{Space::Local, DataKind::LSE, 1}, false});
  const auto batches = run_both(plan, 3);
  EXPECT_EQ(batches[0], (std::vector<std::vector<uint32_t>>{{0}, {1, 2}}));
}

TEST(MergeBatches, RandomProgramsMatchSequentialMerges) {
  const Plan base = one_device_plan();
  SplitMix64 rng(21);
  int num_merges = 0, num_batches = 0, num_multi = 0;
  for (int trial = 0; trial < 40; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    Plan plan = base;
    for (Pass pass : {Pass::Forward, Pass::Backward}) {
      Program& p = pass == Pass::Forward ? plan.devices[0].fwd : plan.devices[0].bwd;
      for (DataKind k : {DataKind::O, DataKind::LSE, DataKind::dQ, DataKind::dKV})
        p.num_slots[static_cast<size_t>(k)] = kSlots;
      for (int64_t i = rng.uniform(1, 24); i > 0; --i) p.code.push_back(random_instruction(rng, plan, pass));
    }
    const auto batches = run_both(plan, 100 + static_cast<uint64_t>(trial));
    for (int pass = 0; pass < 2; ++pass) {
      const Program& p = pass == 0 ? plan.devices[0].fwd : plan.devices[0].bwd;
      std::vector<int> covered(p.code.size(), 0);
      for (const auto& b : batches[static_cast<size_t>(pass)]) {
        for (size_t k = 0; k < b.size(); ++k) {
          ASSERT_EQ(b[k], b[0] + k) << "a batch spans non-consecutive instructions";
          ASSERT_TRUE(std::holds_alternative<Merge>(p.code[b[k]]));
          ++covered[b[k]];
        }
        ++num_batches;
        num_multi += b.size() > 1 ? 1 : 0;
      }
      for (size_t i = 0; i < p.code.size(); ++i) {
        EXPECT_EQ(covered[i], std::holds_alternative<Merge>(p.code[i]) ? 1 : 0) << "instruction " << i;
        num_merges += std::holds_alternative<Merge>(p.code[i]) ? 1 : 0;
      }
    }
  }
  // Both batching and splitting are exercised.
  EXPECT_LT(num_batches, num_merges);
  EXPECT_GT(num_multi, 20);
  EXPECT_GT(num_batches, 160);
}

}  // namespace
}  // namespace dcp::test
