// Executor over real plans: every rank (LocalComm threads) gathers its tokens, runs forward and
// backward, scatters its outputs; the assembled outputs must equal the dense fp64 reference.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dcp/baselines.h"
#include "dcp/batch.h"
#include "dcp/comm.h"
#include "dcp/dispatch.h"
#include "dcp/error.h"
#include "dcp/attention.h"
#include "dcp/detail/attention_cpu.h"
#include "dcp/detail/bf16.h"
#include "dcp/executor.h"
#include "dcp/partition.h"
#include "dcp/plan.h"
#include "dcp/validate.h"
#include "common/batches.h"
#include "exec/forwarding_backend.h"
#include "exec/reference_attention.h"

namespace dcp::test {
namespace {

Batch test_batch(int q_heads, int kv_heads, int head_dim, DType dtype = DType::FP32) {
  return batch_of(AttentionShape{q_heads, kv_heads, head_dim, dtype},
                  {{150, Mask::causal()}, {70, Mask::lambda(8, 40)}, {200, Mask::causal_blockwise(32, 2, 1)},
                   {33, Mask::shared_question_for(33, 0.2, 2)}});
}

struct Global {
  std::vector<float> q, k, v, d_o;
  std::vector<float> o, lse, dq, dk, dv;
  std::vector<float> d_lse;  // empty: lse takes no gradient
};

DenseResult reference(const Batch& batch, const Global& g) {
  const AttentionShape& s = batch.shape;
  const int64_t total = batch.total_tokens();
  DenseResult all;
  all.o.resize(static_cast<size_t>(total * s.q_heads * s.head_dim));
  all.lse.resize(static_cast<size_t>(total * s.q_heads));
  all.dq.resize(all.o.size());
  all.dk.resize(static_cast<size_t>(total * s.kv_heads * s.head_dim));
  all.dv.resize(all.dk.size());
  int64_t start = 0;
  std::vector<Range> row;
  for (const Sequence& seq : batch.sequences) {
    DenseProblem p;
    p.num_q = p.num_kv = seq.length;
    p.q_heads = s.q_heads;
    p.kv_heads = s.kv_heads;
    p.head_dim = s.head_dim;
    p.allowed.assign(static_cast<size_t>(seq.length * seq.length), 0);
    for (int64_t i = 0; i < seq.length; ++i) {
      seq.mask.row_ranges(i, seq.length, row);
      for (const Range& r : row)
        for (int64_t j = r.begin; j < r.end; ++j) p.allowed[static_cast<size_t>(i * seq.length + j)] = 1;
    }
    const auto slice = [&](const std::vector<float>& v, int64_t width) {
      return std::vector<float>(v.begin() + start * width, v.begin() + (start + seq.length) * width);
    };
    const int64_t qw = int64_t{s.q_heads} * s.head_dim, kw = int64_t{s.kv_heads} * s.head_dim;
    p.q = slice(g.q, qw);
    p.k = slice(g.k, kw);
    p.v = slice(g.v, kw);
    p.d_o = slice(g.d_o, qw);
    if (!g.d_lse.empty()) p.d_lse = slice(g.d_lse, s.q_heads);
    const DenseResult r = dense_reference(p);
    std::copy(r.o.begin(), r.o.end(), all.o.begin() + start * qw);
    std::copy(r.dq.begin(), r.dq.end(), all.dq.begin() + start * qw);
    std::copy(r.lse.begin(), r.lse.end(), all.lse.begin() + start * s.q_heads);
    std::copy(r.dk.begin(), r.dk.end(), all.dk.begin() + start * kw);
    std::copy(r.dv.begin(), r.dv.end(), all.dv.begin() + start * kw);
    start += seq.length;
  }
  return all;
}

// method: a baseline name, or "dcp:<partitioner>". nodes x devices_per_node devices.
// bf16: the batch is declared bf16 and the ranks get bf16-rounded inputs; the reference keeps
// the fp32 inputs (the bf16 bar: relative error below 2e-2). in_place:
// PlanOptions::outputs_in_place.
void run_case(const Batch& batch, const std::string& method, int nodes, int devices_per_node, int comm_stages,
              bool bf16 = false, bool in_place = false) {
  const std::string what = method + " " + std::to_string(nodes) + "x" + std::to_string(devices_per_node) +
                           " stages " + std::to_string(comm_stages + 1) + (in_place ? " outputs in place" : "");
  SCOPED_TRACE(what);
  const int world = nodes * devices_per_node;
  Cluster cluster;
  cluster.nodes = nodes;
  cluster.devices_per_node = devices_per_node;
  BlockOptions opts;
  opts.block_size = 32;
  PlacedBatch placed;
  if (method.rfind("dcp:", 0) == 0) {
    placed.table = build_block_table(batch, opts);
    PlacementOptions popt;
    popt.partitioner = parse_partitioner(method.substr(4));
    placed.placement = place_dcp(placed.table, cluster, popt).placement;
  } else {
    BaselineKind kind = BaselineKind::Ring;
    for (BaselineKind k : all_baselines())
      if (method == to_string(k)) kind = k;
    placed = make_baseline(kind, batch, opts, cluster);
  }
  PlanOptions popts;
  popts.schedule.num_comm_stages = comm_stages;
  popts.outputs_in_place = in_place;
  const Plan plan = build_plan(placed.table, placed.placement, cluster, popts);
  ASSERT_TRUE(validate_plan(plan).empty()) << "the validator rejects the plan";

  const AttentionShape& s = batch.shape;
  const int64_t total = batch.total_tokens();
  const int64_t qw = int64_t{s.q_heads} * s.head_dim, kw = int64_t{s.kv_heads} * s.head_dim;
  SplitMix64 rng(77);
  Global g;
  g.q = random_tensor(rng, static_cast<size_t>(total * qw), 2.0f);
  g.k = random_tensor(rng, static_cast<size_t>(total * kw), 2.0f);
  g.v = random_tensor(rng, static_cast<size_t>(total * kw));
  g.d_o = random_tensor(rng, static_cast<size_t>(total * qw));
  g.o.assign(g.q.size(), std::nanf(""));
  g.dq.assign(g.q.size(), std::nanf(""));
  g.lse.assign(static_cast<size_t>(total * s.q_heads), std::nanf(""));
  g.dk.assign(g.k.size(), std::nanf(""));
  g.dv.assign(g.k.size(), std::nanf(""));

  Global in = g;
  if (bf16) {
    cpu::round_to_bf16(in.q);
    cpu::round_to_bf16(in.k);
    cpu::round_to_bf16(in.v);
    cpu::round_to_bf16(in.d_o);
  }
  run_local_ranks(world, [&](Comm& comm) {
    const DeviceProgram& dev = plan.devices[static_cast<size_t>(comm.rank())];
    const LocalTokens tok = local_tokens(plan.table, dev.owned_blocks);
    ASSERT_EQ(tok.num_rows(), dev.owned_tokens);
    for (size_t i = 0; i < dev.owned_blocks.size(); ++i) ASSERT_EQ(tok.block_offset[i], dev.owned_token_offset[i]);
    LocalTensors t = LocalTensors::allocate(s, tok.num_rows());
    gather_rows<float>(in.q, t.q, qw, tok);
    gather_rows<float>(in.k, t.k, kw, tok);
    gather_rows<float>(in.v, t.v, kw, tok);
    gather_rows<float>(in.d_o, t.d_o, qw, tok);
    auto backend = make_cpu_backend();
    Executor exec(plan, *backend, comm, ExecOptions{.comm_timeout_s = 30.0});
    // One sizing formula: what the planner predicts is what the executor allocates.
    const DeviceMemory mem = plan_memory(plan, comm.rank());
    if (!bf16) {
      EXPECT_EQ(exec.slot_bytes_allocated(Pass::Forward), mem.fwd.slots_total_bytes);
      EXPECT_EQ(exec.slot_bytes_allocated(Pass::Backward), mem.bwd.slots_total_bytes);
    }
    exec.forward(t);
    exec.backward(t);
    // Ranks write disjoint rows of the global outputs.
    scatter_rows<float>(t.o, g.o, qw, tok);
    scatter_rows<float>(t.lse, g.lse, s.q_heads, tok);
    scatter_rows<float>(t.dq, g.dq, qw, tok);
    scatter_rows<float>(t.dk, g.dk, kw, tok);
    scatter_rows<float>(t.dv, g.dv, kw, tok);
  });
  const DenseResult want = reference(batch, g);
  const double tol = bf16 ? 2e-2 : 1e-5;
  EXPECT_LT(rel_error(g.o, want.o), tol) << "O";
  EXPECT_LT(rel_error(g.lse, want.lse, 1.0), tol) << "LSE";
  EXPECT_LT(rel_error(g.dq, want.dq, 1.0), tol) << "dQ";
  EXPECT_LT(rel_error(g.dk, want.dk, 1.0), tol) << "dK";
  EXPECT_LT(rel_error(g.dv, want.dv, 1.0), tol) << "dV";
}

TEST(Executor, BaselinePlansMatchDenseReference) {
  const Batch batch = test_batch(4, 2, 64);
  for (BaselineKind kind : all_baselines())
    for (int world : {1, 2, 3, 4}) run_case(batch, to_string(kind), 1, world, 1 + world % 3);
  run_case(batch, "a2a_p2p", 2, 2, 2);
  // Several devices per node computing with remote blocks: partial outputs are reduced at a relay
  // of their node before they cross to the home's node.
  run_case(batch, "ring", 2, 3, 2);
  run_case(batch, "zigzag", 2, 3, 3);
}

TEST(Executor, DcpPlansMatchDenseReference) {
  const Batch batch = test_batch(4, 2, 64);
  int stages = 1;
  for (PartitionerKind p : available_partitioners()) {
    const std::string method = std::string("dcp:") + to_string(p);
    for (auto [nodes, per_node] : {std::pair{1, 1}, {1, 2}, {1, 3}, {2, 2}, {2, 3}}) {
      run_case(batch, method, nodes, per_node, stages);
      stages = stages % 4 + 1;  // 2..5 stages in total, round robin
    }
  }
}

TEST(Executor, GqaRatiosAndHeadDims) {
  run_case(test_batch(8, 1, 128), "zigzag", 1, 2, 2);
  run_case(test_batch(4, 4, 64), "ulysses", 1, 4, 3);
  run_case(test_batch(8, 1, 64), "dcp:builtin", 1, 3, 4);
}

TEST(Executor, Bf16RoundedInputsWithinBf16Tolerance) {
  run_case(test_batch(4, 2, 64, DType::BF16), "dcp:builtin", 1, 3, 3, true);
  run_case(test_batch(8, 1, 128, DType::BF16), "ring", 1, 2, 1, true);
}

// A random mask of every kind for a sequence of `length` tokens (explicit ranges included, with
// empty rows and several ranges per row).
Mask random_mask(SplitMix64& rng, int64_t length) {
  switch (rng.below(6)) {
    case 0: return Mask::full();
    case 1: return Mask::causal();
    case 2: return Mask::lambda(rng.below(8), 1 + rng.below(40));
    case 3: return Mask::causal_blockwise(16 * (1 + rng.below(2)), rng.below(3), rng.below(2));
    case 4:
      if (length >= 5) return Mask::shared_question_for(length, 0.2, 1 + static_cast<int>(rng.below(4)));
      return Mask::causal();
    default: {
      std::vector<std::vector<Range>> rows(static_cast<size_t>(length));
      for (auto& row : rows) {
        int64_t at = 0;
        while (at < length && rng.below(3) != 0) {
          const int64_t begin = at + rng.below(std::max<int64_t>(1, length / 4));
          if (begin >= length) break;
          const int64_t end = std::min(length, begin + 1 + rng.below(std::max<int64_t>(1, length / 3)));
          row.push_back({begin, end});
          at = end + 1;
        }
      }
      return Mask::ranges(std::move(rows));
    }
  }
}

// The correctness matrix of the executor issue, sampled: random batches over every mask kind,
// GQA ratios 1/4/8, head dims 64/128, world sizes 1..8, 1..5 communication stages, every placement.
TEST(Executor, RandomMatrixMatchesDenseReference) {
  SplitMix64 rng(2026);
  std::vector<std::string> methods;
  for (BaselineKind k : all_baselines()) methods.push_back(to_string(k));
  for (PartitionerKind p : available_partitioners()) methods.push_back(std::string("dcp:") + to_string(p));
  const int ratios[] = {1, 4, 8};
  for (int c = 0; c < 24; ++c) {
    const int ratio = ratios[c % 3];
    const int kv_heads = 1 + static_cast<int>(rng.below(2));
    const int head_dim = c % 2 == 0 ? 64 : 128;
    Batch batch;
    batch.shape = AttentionShape{ratio * kv_heads, kv_heads, head_dim, DType::FP32};
    const int num_seqs = 1 + static_cast<int>(rng.below(4));
    for (int i = 0; i < num_seqs; ++i) {
      Sequence seq;
      seq.length = 1 + rng.below(120);
      seq.mask = random_mask(rng, seq.length);
      batch.sequences.push_back(seq);
    }
    const int world = 1 + c % 8;
    // Any world: one node of `world` devices, or two nodes when it splits evenly.
    const int nodes = world % 2 == 0 && rng.below(2) == 0 ? 2 : 1;
    const std::string& method = methods[static_cast<size_t>(c) % methods.size()];
    run_case(batch, method, nodes, world / nodes, 1 + c % 5, false, c % 3 == 1);
  }
}

// Owned outputs accumulated in place: the same results as through slots and final merges, on
// every placement, with no more slot memory (none at all for the outputs on one device).
TEST(Executor, OutputsInPlaceMatchDenseReference) {
  const Batch batch = test_batch(4, 2, 64);
  for (BaselineKind kind : all_baselines()) run_case(batch, to_string(kind), 1, 3, 2, false, true);
  run_case(batch, "ring", 2, 3, 2, false, true);
  run_case(batch, "zigzag", 2, 3, 3, false, true);
  for (auto [nodes, per_node] : {std::pair{1, 1}, {1, 2}, {2, 2}, {2, 3}})
    run_case(batch, "dcp:builtin", nodes, per_node, 1 + nodes + per_node, false, true);
  run_case(test_batch(4, 2, 64, DType::BF16), "dcp:builtin", 1, 3, 3, true, true);

  Cluster cluster;
  cluster.nodes = 2;
  cluster.devices_per_node = 2;
  BlockOptions bo;
  bo.block_size = 32;
  const BlockTable table = build_block_table(batch, bo);
  const Placement placement = place_dcp(table, cluster, PlacementOptions{}).placement;
  PlanOptions in_place;
  in_place.outputs_in_place = true;
  const Plan a = build_plan(table, placement, cluster, PlanOptions{});
  const Plan b = build_plan(table, placement, cluster, in_place);
  ASSERT_TRUE(validate_plan(b).empty());
  for (int d = 0; d < cluster.num_devices(); ++d) {
    const DeviceMemory ma = plan_memory(a, d), mb = plan_memory(b, d);
    EXPECT_LE(mb.fwd.slots_total_bytes, ma.fwd.slots_total_bytes) << "device " << d;
    EXPECT_LE(mb.bwd.slots_total_bytes, ma.bwd.slots_total_bytes) << "device " << d;
  }
  Cluster one;
  one.devices_per_node = 1;
  const BlockTable t1 = build_block_table(batch, bo);
  const Plan single = build_plan(t1, place_dcp(t1, one, PlacementOptions{}).placement, one, in_place);
  for (DataKind k : {DataKind::O, DataKind::dQ, DataKind::dKV}) {
    EXPECT_EQ(single.devices[0].fwd.num_slots[static_cast<size_t>(k)], 0) << to_string(k);
    EXPECT_EQ(single.devices[0].bwd.num_slots[static_cast<size_t>(k)], 0) << to_string(k);
  }
}

// `batch` placed by a static baseline on one node of `devices` devices (B = 32), planned.
Plan one_node_plan(BaselineKind kind, const Batch& batch, int devices, const PlanOptions& popts = {}) {
  Cluster cluster;
  cluster.nodes = 1;
  cluster.devices_per_node = devices;
  BlockOptions opts;
  opts.block_size = 32;
  const PlacedBatch placed = make_baseline(kind, batch, opts, cluster);
  return build_plan(placed.table, placed.placement, cluster, popts);
}

// A rank's tensors for its owned rows (inputs zero: these tests look at the instructions run).
LocalTensors owned_tensors(const Plan& plan, int rank) {
  const DeviceProgram& dev = plan.devices[static_cast<size_t>(rank)];
  return LocalTensors::allocate(plan.header.shape, local_tokens(plan.table, dev.owned_blocks).num_rows());
}

// The measured timeline has one span per instruction of the pass just run (one per batch of
// merges), in program order and covering it, with the program's instruction kinds, non-negative
// and non-overlapping on the compute stream.
TEST(Executor, TimelineMeasuresEveryInstruction) {
  const Batch batch = test_batch(4, 2, 64);
  const Plan plan = one_node_plan(BaselineKind::Zigzag, batch, 2);
  run_local_ranks(2, [&](Comm& comm) {
    const DeviceProgram& dev = plan.devices[static_cast<size_t>(comm.rank())];
    LocalTensors t = owned_tensors(plan, comm.rank());
    auto backend = make_cpu_backend();
    Executor exec(plan, *backend, comm, ExecOptions{.comm_timeout_s = 30.0, .timeline = true});
    for (Pass pass : {Pass::Forward, Pass::Backward}) {
      const ExecStats stats = pass == Pass::Forward ? exec.forward(t) : exec.backward(t);
      const Program& prog = pass == Pass::Forward ? dev.fwd : dev.bwd;
      const auto tl = exec.timeline(pass);
      double last_end = 0;
      size_t next = 0;
      int num_merges = 0, num_merge_entries = 0;
      for (const MeasuredInstruction& m : tl) {
        EXPECT_EQ(m.index, static_cast<int>(next));
        ASSERT_GE(m.num_instructions, 1);
        ASSERT_LE(next + static_cast<size_t>(m.num_instructions), prog.code.size());
        EXPECT_GE(m.start_s, last_end);
        EXPECT_GE(m.end_s, m.start_s);
        last_end = m.end_s;
        for (int k = 0; k < m.num_instructions; ++k) {
          const char* want = std::visit(
              [](const auto& x) {
                using T = std::decay_t<decltype(x)>;
                if constexpr (std::is_same_v<T, Attend>) return "Attend";
                else if constexpr (std::is_same_v<T, Merge>) return "Merge";
                else if constexpr (std::is_same_v<T, Copy>) return "Copy";
                else if constexpr (std::is_same_v<T, CommStart>) return "CommStart";
                else return "CommWait";
              },
              prog.code[next + static_cast<size_t>(k)]);
          EXPECT_EQ(m.kind, want);
        }
        if (m.kind == "Merge") {
          num_merges += m.num_instructions;
          ++num_merge_entries;
        }
        next += static_cast<size_t>(m.num_instructions);
      }
      EXPECT_EQ(next, prog.code.size());
      EXPECT_EQ(stats.num_merges, num_merges);
      EXPECT_EQ(stats.num_merge_calls, num_merge_entries);
      // Owned outputs accumulate in place, so ring-like plans have few merges; those that
      // follow one another form one batch.
      if (num_merges > 1) {
        EXPECT_LT(num_merge_entries, num_merges) << "consecutive merges form one batch";
      }
    }
    // Without the option nothing is recorded.
    auto quiet_backend = make_cpu_backend();
    Executor quiet(plan, *quiet_backend, comm);
    EXPECT_TRUE(quiet.timeline(Pass::Forward).empty());
  });
}

// Every Attend call says whether one of the device's transfer rounds is started and not yet
// waited for (the CUDA backend keeps SMs free for NCCL then): exactly the Attends that follow a
// CommStart before its CommWait in the program.
class InFlightRecorder final : public ForwardingBackend {
 public:
  std::vector<std::pair<uint32_t, bool>> attends;  // (instruction index, comm_in_flight)
  void attend(const ArraySet& a, const AttendCall& c) override {
    attends.emplace_back(static_cast<uint32_t>(c.key), c.comm_in_flight);
    cpu->attend(a, c);
  }
};

TEST(Executor, AttendCallsKnowWhetherTransfersAreInFlight) {
  const Batch batch = test_batch(4, 2, 64);
  for (const auto& [kind, devices] : {std::pair{BaselineKind::Zigzag, 2}, std::pair{BaselineKind::Ring, 2},
                                      std::pair{BaselineKind::Zigzag, 1}}) {
    const Plan plan = one_node_plan(kind, batch, devices);
    run_local_ranks(devices, [&](Comm& comm) {
      const DeviceProgram& dev = plan.devices[static_cast<size_t>(comm.rank())];
      LocalTensors t = owned_tensors(plan, comm.rank());
      InFlightRecorder backend;
      Executor exec(plan, backend, comm, ExecOptions{.comm_timeout_s = 30.0});
      int with = 0, without = 0;
      for (const Pass pass : {Pass::Forward, Pass::Backward}) {
        backend.attends.clear();
        if (pass == Pass::Forward) exec.forward(t);
        else exec.backward(t);
        std::vector<std::pair<uint32_t, bool>> want;
        int open = 0;
        const Program& prog = pass == Pass::Forward ? dev.fwd : dev.bwd;
        for (size_t i = 0; i < prog.code.size(); ++i) {
          const auto& x = prog.code[i];
          if (std::holds_alternative<CommStart>(x)) ++open;
          if (std::holds_alternative<CommWait>(x)) --open;
          if (std::holds_alternative<Attend>(x)) want.emplace_back(static_cast<uint32_t>(i), open > 0);
        }
        EXPECT_EQ(backend.attends, want);
        for (const auto& [index, in_flight] : want) (in_flight ? with : without) += 1;
      }
      if (devices > 1) {
        EXPECT_GT(with, 0) << "stage 0 runs while the next stage's inputs travel";
      } else {
        EXPECT_EQ(with, 0) << "one device moves nothing";
        EXPECT_GT(without, 0);
      }
    });
  }
}

// begin_backward and end_backward bracket each layer's backward program with the same rows,
// and say whether the program adds dQ in place on one device (what the CUDA backend's one-pass
// deterministic backward needs): yes for a one-device plan with outputs in place, no when dQ
// partials are merged from slots or other devices take part.
class BackwardRowsRecorder final : public ForwardingBackend {
 public:
  std::vector<std::string> events;
  std::vector<BackwardRows> begins, ends;
  void begin_backward(const ArraySet& a, const BackwardRows& r) override {
    events.push_back("begin");
    begins.push_back(r);
    cpu->begin_backward(a, r);
  }
  void end_backward(const ArraySet& a, const BackwardRows& r) override {
    events.push_back("end");
    ends.push_back(r);
    cpu->end_backward(a, r);
  }
  void attend(const ArraySet& a, const AttendCall& c) override {
    events.push_back(c.pass == Pass::Backward ? "bwd" : "fwd");
    cpu->attend(a, c);
  }
};

TEST(Executor, BackwardRowsBracketTheBackwardProgram) {
  const Batch batch = test_batch(4, 2, 64);
  for (const auto& [devices, in_place] : {std::pair{1, true}, std::pair{1, false}, std::pair{2, true}}) {
    PlanOptions popts;
    popts.outputs_in_place = in_place;
    const Plan plan = one_node_plan(BaselineKind::Zigzag, batch, devices, popts);
    run_local_ranks(devices, [&](Comm& comm) {
      LocalTensors t = owned_tensors(plan, comm.rank());
      BackwardRowsRecorder backend;
      Executor exec(plan, backend, comm, ExecOptions{.comm_timeout_s = 30.0});
      exec.forward(t);
      backend.events.clear();
      exec.backward(t);
      ASSERT_EQ(backend.begins.size(), 1U);
      ASSERT_EQ(backend.ends.size(), 1U);
      ASSERT_GE(backend.events.size(), 3U);
      EXPECT_EQ(backend.events.front(), "begin");
      EXPECT_EQ(backend.events.back(), "end");
      const BackwardRows& b = backend.begins[0];
      const BackwardRows& e = backend.ends[0];
      EXPECT_EQ(b.dq_row, e.dq_row);
      EXPECT_EQ(b.dout_row, e.dout_row);
      EXPECT_EQ(b.rows, e.rows);
      EXPECT_EQ(b.rows, t.rows * plan.table.groups.num_groups);
      EXPECT_EQ(b.one_device, devices == 1);
      EXPECT_EQ(b.dq_in_place, in_place) << devices << " device(s)";
      EXPECT_EQ(e.dq_in_place, b.dq_in_place);
    });
  }
}

TEST(Executor, PlanForAnotherWorldSizeIsRefusedBeforeCommunicating) {
  const Batch batch = test_batch(4, 2, 64);
  const Plan plan = one_node_plan(BaselineKind::Ring, batch, 2);
  EXPECT_THROW(run_local_ranks(3, [&](Comm& comm) {
                 auto backend = make_cpu_backend();
                 Executor exec(plan, *backend, comm);
               }),
               Error);
}

// ---- Attention on caller tensors -----------------------------------------------------------

// One rank's tensors as a training framework holds them: q, k, v as views of one fused
// projection output [tokens, (Hq + 2 Hkv) x D] (row stride larger than a tensor's heads), the
// outputs dense, in fp32 or bf16 (lse always fp32).
struct CallerTensors {
  ElemType type = ElemType::F32;
  int64_t rows = 0;
  int q_heads = 0, kv_heads = 0, dim = 0;
  std::vector<uint8_t> qkv, o, d_o, dq, dk, dv;
  std::vector<float> lse, d_lse;

  CallerTensors(ElemType t, int64_t r, const AttentionShape& s)
      : type(t), rows(r), q_heads(s.q_heads), kv_heads(s.kv_heads), dim(s.head_dim) {
    const int64_t e = elem_bytes(t);
    qkv.resize(static_cast<size_t>(r * (q_heads + 2 * kv_heads) * dim * e));
    for (auto* v : {&o, &d_o, &dq}) v->resize(static_cast<size_t>(r * q_heads * dim * e));
    for (auto* v : {&dk, &dv}) v->resize(static_cast<size_t>(r * kv_heads * dim * e));
    lse.resize(static_cast<size_t>(r * q_heads));
  }
  int64_t fused_width() const { return int64_t{q_heads + 2 * kv_heads} * dim; }
  TensorView view(void* data, int heads, int64_t row_stride = 0) const {
    return TensorView{data, type, rows, heads, dim, row_stride, 0};
  }
  TensorView q() { return view(qkv.data(), q_heads, fused_width()); }
  TensorView k() { return view(qkv.data() + int64_t{q_heads} * dim * elem_bytes(type), kv_heads, fused_width()); }
  TensorView v() {
    return view(qkv.data() + int64_t{q_heads + kv_heads} * dim * elem_bytes(type), kv_heads, fused_width());
  }
  TensorView lse_view() { return TensorView{lse.data(), ElemType::F32, rows, q_heads, 1, 0, 0}; }
  TensorView d_lse_view() {
    return d_lse.empty() ? TensorView{} : TensorView{d_lse.data(), ElemType::F32, rows, q_heads, 1, 0, 0};
  }

  void put(std::vector<uint8_t>& buf, int64_t index, float x) const {
    if (type == ElemType::F32) reinterpret_cast<float*>(buf.data())[index] = x;
    else reinterpret_cast<uint16_t*>(buf.data())[index] = to_bf16_bits(x);
  }
  float get(const std::vector<uint8_t>& buf, int64_t index) const {
    return type == ElemType::F32 ? reinterpret_cast<const float*>(buf.data())[index]
                                 : from_bf16_bits(reinterpret_cast<const uint16_t*>(buf.data())[index]);
  }
  // Local rows of the global inputs into the fused buffer and dO.
  void fill(const Global& in, const LocalTokens& tok) {
    const int64_t qw = int64_t{q_heads} * dim, kw = int64_t{kv_heads} * dim;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t g = tok.global_row[static_cast<size_t>(r)];
      for (int64_t x = 0; x < qw; ++x) {
        put(qkv, r * fused_width() + x, in.q[static_cast<size_t>(g * qw + x)]);
        put(d_o, r * qw + x, in.d_o[static_cast<size_t>(g * qw + x)]);
      }
      for (int64_t x = 0; x < kw; ++x) {
        put(qkv, r * fused_width() + qw + x, in.k[static_cast<size_t>(g * kw + x)]);
        put(qkv, r * fused_width() + qw + kw + x, in.v[static_cast<size_t>(g * kw + x)]);
      }
    }
    if (!in.d_lse.empty()) {
      d_lse.resize(static_cast<size_t>(rows * q_heads));
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t h = 0; h < q_heads; ++h)
          d_lse[static_cast<size_t>(r * q_heads + h)] =
              in.d_lse[static_cast<size_t>(tok.global_row[static_cast<size_t>(r)] * q_heads + h)];
    }
  }
  void scatter(Global& out, const LocalTokens& tok) const {
    const int64_t qw = int64_t{q_heads} * dim, kw = int64_t{kv_heads} * dim;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t g = tok.global_row[static_cast<size_t>(r)];
      for (int64_t x = 0; x < qw; ++x) {
        out.o[static_cast<size_t>(g * qw + x)] = get(o, r * qw + x);
        out.dq[static_cast<size_t>(g * qw + x)] = get(dq, r * qw + x);
      }
      for (int64_t x = 0; x < kw; ++x) {
        out.dk[static_cast<size_t>(g * kw + x)] = get(dk, r * kw + x);
        out.dv[static_cast<size_t>(g * kw + x)] = get(dv, r * kw + x);
      }
      for (int64_t h = 0; h < q_heads; ++h)
        out.lse[static_cast<size_t>(g * q_heads + h)] = lse[static_cast<size_t>(r * q_heads + h)];
    }
  }
};

Global random_global(const Batch& batch, uint64_t seed, bool bf16) {
  const AttentionShape& s = batch.shape;
  const int64_t total = batch.total_tokens();
  const int64_t qw = int64_t{s.q_heads} * s.head_dim, kw = int64_t{s.kv_heads} * s.head_dim;
  SplitMix64 rng(seed);
  Global g;
  g.q = random_tensor(rng, static_cast<size_t>(total * qw), 2.0f);
  g.k = random_tensor(rng, static_cast<size_t>(total * kw), 2.0f);
  g.v = random_tensor(rng, static_cast<size_t>(total * kw));
  g.d_o = random_tensor(rng, static_cast<size_t>(total * qw));
  if (bf16)
    for (auto* v : {&g.q, &g.k, &g.v, &g.d_o}) cpu::round_to_bf16(*v);
  g.o.assign(g.q.size(), std::nanf(""));
  g.dq.assign(g.q.size(), std::nanf(""));
  g.lse.assign(static_cast<size_t>(total * s.q_heads), std::nanf(""));
  g.dk.assign(g.k.size(), std::nanf(""));
  g.dv.assign(g.k.size(), std::nanf(""));
  return g;
}

// Two "layers" (different inputs) through one Attention per rank, in the order autograd with
// activation checkpointing runs them: forward 0, forward 1, backward 1, forward 0 again
// (recomputation), backward 0. Every output matches the dense fp64 reference.
void run_attention_case(const Plan& plan, const Batch& batch, ElemType type, bool with_d_lse = false) {
  const int world = plan.header.world_size;
  const bool bf16 = type == ElemType::BF16;
  Global layer_in[2] = {random_global(batch, 11, bf16), random_global(batch, 12, bf16)};
  if (with_d_lse) {
    SplitMix64 rng(13);
    for (Global& g : layer_in) g.d_lse = random_tensor(rng, static_cast<size_t>(g.lse.size()));
  }
  Global layer_out[2] = {layer_in[0], layer_in[1]};
  run_local_ranks(world, [&](Comm& comm) {
    const DeviceProgram& dev = plan.devices[static_cast<size_t>(comm.rank())];
    const LocalTokens tok = local_tokens(plan.table, dev.owned_blocks);
    auto backend = make_cpu_backend();
    Attention attn(plan, *backend, comm, ExecOptions{.comm_timeout_s = 30.0});
    ASSERT_EQ(attn.num_tokens(), tok.num_rows());
    std::vector<CallerTensors> t;
    for (int l = 0; l < 2; ++l) {
      t.emplace_back(type, tok.num_rows(), batch.shape);
      t.back().fill(layer_in[l], tok);
    }
    auto forward = [&](int l) {
      CallerTensors& x = t[static_cast<size_t>(l)];
      attn.forward({x.q(), x.k(), x.v(), x.view(x.o.data(), x.q_heads), x.lse_view()});
    };
    auto backward = [&](int l) {
      CallerTensors& x = t[static_cast<size_t>(l)];
      attn.backward({x.q(), x.k(), x.v(), x.view(x.o.data(), x.q_heads), x.lse_view(), x.view(x.d_o.data(), x.q_heads),
                     x.view(x.dq.data(), x.q_heads), x.view(x.dk.data(), x.kv_heads), x.view(x.dv.data(), x.kv_heads),
                     x.d_lse_view()});
    };
    forward(0);
    forward(1);
    backward(1);
    forward(0);
    backward(0);
    for (int l = 0; l < 2; ++l) t[static_cast<size_t>(l)].scatter(layer_out[l], tok);
  });
  const double tol = bf16 ? 2e-2 : 1e-5;
  for (int l = 0; l < 2; ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    const DenseResult want = reference(batch, layer_in[l]);
    EXPECT_LT(rel_error(layer_out[l].o, want.o), tol) << "O";
    EXPECT_LT(rel_error(layer_out[l].lse, want.lse, 1.0), tol) << "LSE";
    EXPECT_LT(rel_error(layer_out[l].dq, want.dq, 1.0), tol) << "dQ";
    EXPECT_LT(rel_error(layer_out[l].dk, want.dk, 1.0), tol) << "dK";
    EXPECT_LT(rel_error(layer_out[l].dv, want.dv, 1.0), tol) << "dV";
  }
}

Plan dcp_plan(const Batch& batch, int devices) {
  Cluster cluster;
  cluster.nodes = 1;
  cluster.devices_per_node = devices;
  BlockOptions opts;
  opts.block_size = 32;
  const BlockTable table = build_block_table(batch, opts);
  const Placement placement = place_dcp(table, cluster, PlacementOptions{}).placement;
  PlanOptions popts;
  popts.schedule.num_comm_stages = 2;
  return build_plan(table, placement, cluster, popts);
}

TEST(Attention, CallerTensorsEveryLayerOrderFp32) {
  const Batch batch = test_batch(4, 2, 64);
  for (int devices : {1, 2, 3}) {
    SCOPED_TRACE(std::to_string(devices) + " ranks");
    run_attention_case(dcp_plan(batch, devices), batch, ElemType::F32);
  }
  run_attention_case(one_node_plan(BaselineKind::Zigzag, batch, 2), batch, ElemType::F32);
}

// A loss that reads lse itself (learned sink logits): its gradient enters as Delta - d_lse, on
// every rank count and layer order, against the reference's backward with that Delta.
TEST(Attention, GradientOfLseEntersThroughDelta) {
  const Batch batch = test_batch(4, 2, 64);
  for (int devices : {1, 2, 3}) {
    SCOPED_TRACE(std::to_string(devices) + " ranks");
    run_attention_case(dcp_plan(batch, devices), batch, ElemType::F32, true);
  }
}

TEST(Attention, CallerTensorsBf16) {
  const Batch batch = test_batch(8, 1, 128, DType::BF16);
  run_attention_case(dcp_plan(batch, 3), batch, ElemType::BF16);
}

TEST(Attention, BadTensorsAreRefusedBeforeAnythingRuns) {
  const Batch batch = test_batch(4, 2, 64);
  const Plan plan = dcp_plan(batch, 1);
  auto comm = make_self_comm(true);
  auto backend = make_cpu_backend();
  Attention attn(plan, *backend, *comm);
  CallerTensors x(ElemType::F32, attn.num_tokens(), batch.shape);
  const AttentionForwardArgs good{x.q(), x.k(), x.v(), x.view(x.o.data(), x.q_heads), x.lse_view()};
  auto expect_error = [&](AttentionForwardArgs args, const std::string& needle) {
    try {
      attn.forward(args);
      ADD_FAILURE() << "accepted a bad tensor (" << needle << ")";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  AttentionForwardArgs a = good;
  a.q.rows -= 1;
  expect_error(a, "attention: q is [");
  a = good;
  a.k.heads = 4;
  expect_error(a, "attention: k is [");
  a = good;
  a.lse.type = ElemType::BF16;
  expect_error(a, "lse must be fp32");
  a = good;
  a.v.row_stride = 32;  // rows overlap the 2 heads x 64 of a token
  expect_error(a, "attention: v: strides");
  a = good;
  a.o.data = nullptr;
  expect_error(a, "attention: o: no data");
  attn.forward(good);  // the good call still runs after the refusals
}

}  // namespace
}  // namespace dcp::test
