// GPU executor checks (plain program, so it runs under mpirun without GoogleTest):
//   exec_cuda_check            every config on this rank's GPU: CUDA backend (+ NCCL comm under
//                              mpirun with several ranks) vs the CPU backend on the same plan and
//                              bf16-rounded inputs (CPU ranks run as threads on every MPI rank);
//                              relative error of O, LSE, dQ, dK, dV < 2e-2, no NaN; every device
//                              array poisoned (NaN) first; a second and third step allocate nothing.
//                              Each config runs twice: merges batched (ExecOptions::batch_merges,
//                              fewer launches than merges) and one launch per merge. With
//                              DCP_ATTN_DETERMINISTIC=1 the three steps' gradients must also be
//                              bitwise equal.
//   exec_cuda_check die        rank 1 exits after setting up; the others must abort the NCCL
//                              communicator and exit non-zero within the timeout.
// Exit 0: all passed; 1: a check failed; 77: skipped (no GPU).
#include <cuda_runtime_api.h>
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "dcp/baselines.h"
#include "dcp/batch.h"
#include "dcp/comm.h"
#include "dcp/cuda_backend.h"
#include "dcp/nccl_comm.h"
#include "dcp/dispatch.h"
#include "dcp/error.h"
#include "dcp/detail/attention_cpu.h"
#include "dcp/executor.h"
#include "dcp/partition.h"
#include "dcp/plan.h"
#include "exec/reference_attention.h"

namespace {

using namespace dcp;

struct Config {
  int q_heads, kv_heads, head_dim;
  std::string method;     // "dcp" or a baseline name
  bool in_place = false;  // PlanOptions::outputs_in_place
};

Batch make_batch(int q_heads, int kv_heads, int head_dim) {
  Batch batch;
  batch.shape = AttentionShape{q_heads, kv_heads, head_dim, DType::BF16};
  const int64_t lengths[] = {700, 300, 520, 190, 260};
  Mask masks[] = {Mask::causal(), Mask::lambda(16, 128), Mask::causal_blockwise(64, 2, 1),
                  Mask::shared_question_for(190, 0.2, 3), Mask::full()};
  if (std::getenv("DCP_CHECK_CAUSAL"))  // bisecting aid: every sequence causal
    for (Mask& m : masks) m = Mask::causal();
  for (int i = 0; i < 5; ++i) {
    Sequence seq;
    seq.length = lengths[i];
    seq.mask = masks[i];
    batch.sequences.push_back(seq);
  }
  return batch;
}

double rel(const std::vector<float>& got, const std::vector<float>& want, double floor) {
  double err = 0, ref = floor;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i])) return 1e30;
    if (std::isinf(want[i])) {
      if (!(std::isinf(got[i]) && got[i] < 0)) return 1e30;
      continue;
    }
    err = std::max(err, std::abs(static_cast<double>(got[i]) - want[i]));
    ref = std::max(ref, std::abs(static_cast<double>(want[i])));
  }
  return err / ref;
}

// Diagnostics for a failed tensor: the first bad rows, with the owned block they fall in.
void explain(const char* name, const std::vector<float>& got, const std::vector<float>& want, int64_t row_width,
             const Plan& plan, int rank) {
  const DeviceProgram& dev = plan.devices[static_cast<size_t>(rank)];
  int shown = 0;
  for (size_t i = 0; i < got.size() && shown < 6; ++i) {
    const bool bad = std::isnan(got[i]) || (std::isinf(want[i]) != std::isinf(got[i])) ||
                     (!std::isinf(want[i]) && std::abs(static_cast<double>(got[i]) - want[i]) > 0.05 * (1 + std::abs(want[i])));
    if (!bad) continue;
    const int64_t row = static_cast<int64_t>(i) / row_width;
    size_t b = 0;
    while (b + 1 < dev.owned_blocks.size() && dev.owned_token_offset[b + 1] <= row) ++b;
    const TokenBlock& tb = plan.table.token_blocks[static_cast<size_t>(dev.owned_blocks[b])];
    std::printf("  rank %d %s[%lld] (row %lld, col %lld): got %g want %g; block %d (seq %d, len %lld, row %lld in block)\n",
                rank, name, static_cast<long long>(i), static_cast<long long>(row),
                static_cast<long long>(static_cast<int64_t>(i) % row_width), got[i], want[i], dev.owned_blocks[b], tb.seq,
                static_cast<long long>(tb.length), static_cast<long long>(row - dev.owned_token_offset[b]));
    ++shown;
  }
}

void poison(const ArraySet& a) {
  for (int i = 0; i < kNumArrays; ++i) {
    const auto k = static_cast<size_t>(i);
    cudaMemset(a.base[k], 0xff, static_cast<size_t>(a.rows[k] * a.row_elems[k] * elem_bytes(a.type[k])));
  }
  cudaDeviceSynchronize();
}

Plan plan_for(const Batch& batch, const std::string& method, int world, bool in_place = false) {
  Cluster cluster;
  cluster.nodes = 1;
  cluster.devices_per_node = world;
  BlockOptions opts;
  opts.block_size = 128;
  PlanOptions popts;
  popts.schedule.num_comm_stages = std::getenv("DCP_CHECK_STAGES") ? std::atoi(std::getenv("DCP_CHECK_STAGES")) : 2;
  popts.outputs_in_place = in_place;
  if (method == "dcp") {
    const BlockTable table = build_block_table(batch, opts);
    return build_plan(table, place_dcp(table, cluster).placement, cluster, popts);
  }
  for (BaselineKind k : all_baselines())
    if (method == to_string(k)) {
      const PlacedBatch pb = make_baseline(k, batch, opts, cluster);
      return build_plan(pb.table, pb.placement, cluster, popts);
    }
  raise(ErrorKind::InvalidInput, "unknown method " + method);
}

int check_gpu(const Config& c, Comm& comm, int device, const Plan& plan, LocalTensors got, const LocalTensors& want,
              bool batched);

int check(const Config& c, Comm& comm, int device) {
  const Batch batch = make_batch(c.q_heads, c.kv_heads, c.head_dim);
  const int world = comm.world_size();
  const Plan plan = plan_for(batch, c.method, world, c.in_place);
  const AttentionShape& s = batch.shape;
  const int64_t total = batch.total_tokens();
  const int64_t qw = int64_t{s.q_heads} * s.head_dim, kw = int64_t{s.kv_heads} * s.head_dim;
  test::SplitMix64 rng(11);
  auto bf16 = [](std::vector<float> v) { cpu::round_to_bf16(v); return v; };
  const auto q = bf16(test::random_tensor(rng, static_cast<size_t>(total * qw), 2.0f));
  const auto k = bf16(test::random_tensor(rng, static_cast<size_t>(total * kw), 2.0f));
  const auto v = bf16(test::random_tensor(rng, static_cast<size_t>(total * kw)));
  const auto d_o = bf16(test::random_tensor(rng, static_cast<size_t>(total * qw)));
  auto local = [&](int rank) {
    const LocalTokens tok = local_tokens(plan.table, plan.devices[static_cast<size_t>(rank)].owned_blocks);
    LocalTensors t = LocalTensors::allocate(s, tok.num_rows());
    gather_rows<float>(q, t.q, qw, tok);
    gather_rows<float>(k, t.k, kw, tok);
    gather_rows<float>(v, t.v, kw, tok);
    gather_rows<float>(d_o, t.d_o, qw, tok);
    return t;
  };
  // CPU reference of this rank: all ranks as threads, keep ours.
  LocalTensors want;
  run_local_ranks(world, [&](Comm& lc) {
    LocalTensors t = local(lc.rank());
    auto cpu = make_cpu_backend();
    Executor exec(plan, *cpu, lc);
    exec.forward(t);
    exec.backward(t);
    if (lc.rank() == comm.rank()) want = std::move(t);
  });
  int failures = 0;
  for (bool batched : {true, false}) failures += check_gpu(c, comm, device, plan, local(comm.rank()), want, batched);
  return failures;
}

// Kernel routes as the command line reads them (DCP_ATTN_FORWARD, DCP_ATTN_BACKWARD,
// DCP_ATTN_BACKWARD_DQ, DCP_ATTN_WIDE_BACKWARD, DCP_ATTN_BACKWARD_RUN_ROWS), so the device script checks every route with the
// same binary.
CudaBackendOptions backend_options(int device) {
  const auto env = [](const char* name) { return std::string(std::getenv(name) ? std::getenv(name) : ""); };
  CudaBackendOptions o;
  o.device = device;
  o.kernels.forward = parse_kernel_route(env("DCP_ATTN_FORWARD"), "DCP_ATTN_FORWARD");
  o.kernels.backward = parse_kernel_route(env("DCP_ATTN_BACKWARD"), "DCP_ATTN_BACKWARD");
  o.kernels.dq = parse_dq_reduction(env("DCP_ATTN_BACKWARD_DQ"), "DCP_ATTN_BACKWARD_DQ");
  o.kernels.deterministic_backward = parse_switch(env("DCP_ATTN_DETERMINISTIC"), "DCP_ATTN_DETERMINISTIC");
  if (const std::string one_pass = env("DCP_ATTN_DETERMINISTIC_ONE_PASS"); !one_pass.empty())
    o.kernels.deterministic_one_pass = parse_switch(one_pass, "DCP_ATTN_DETERMINISTIC_ONE_PASS");
  if (const std::string ordered = env("DCP_ATTN_DETERMINISTIC_ORDERED"); !ordered.empty())
    o.kernels.deterministic_ordered = parse_switch(ordered, "DCP_ATTN_DETERMINISTIC_ORDERED");
  o.kernels.deterministic_unit_rows = parse_row_count(env("DCP_ATTN_DETERMINISTIC_UNIT_ROWS"), "DCP_ATTN_DETERMINISTIC_UNIT_ROWS");
  if (const std::string wide = env("DCP_ATTN_WIDE_BACKWARD"); !wide.empty())
    o.kernels.wide_backward = parse_switch(wide, "DCP_ATTN_WIDE_BACKWARD");
  if (const std::string run_rows = env("DCP_ATTN_BACKWARD_RUN_ROWS"); !run_rows.empty())
    o.kernels.backward_run_rows = parse_row_count(run_rows, "DCP_ATTN_BACKWARD_RUN_ROWS");
  return o;
}

// The GPU executor (merges batched: one launch per run of independent merges; or one launch
// per merge) against the CPU executor's outputs `want`.
int check_gpu(const Config& c, Comm& comm, int device, const Plan& plan, LocalTensors got, const LocalTensors& want,
              bool batched) {
  const AttentionShape& s = plan.header.shape;
  const int64_t qw = int64_t{s.q_heads} * s.head_dim, kw = int64_t{s.kv_heads} * s.head_dim;
  const int world = comm.world_size();
  auto gpu = make_cuda_backend(backend_options(device));
  Executor exec(plan, *gpu, comm, ExecOptions{.comm_timeout_s = 60.0, .batch_merges = batched});
  int64_t allocs = 0;
  double worst = 0;
  bool steady = true;
  bool explained = false;
  int merges = 0, launches = 0;
  // Deterministic backward: every step's gradients equal the first step's bit for bit.
  const bool deterministic = backend_options(device).kernels.deterministic_backward;
  std::vector<float> first_dq, first_dk, first_dv;
  bool repeat_ok = true;
  for (int step = 0; step < 3; ++step) {
    poison(exec.arrays());
    exec.upload(0, got, Pass::Forward);
    const ExecStats fs = exec.forward_layer(0);
    exec.download(0, got, Pass::Forward);
    // Backward from the GPU's own O/LSE (already on the device); dO uploaded.
    exec.upload(0, got, Pass::Backward);
    // Step 1 runs the backward twice: the first one's gradients are never read, so the one-pass
    // deterministic backward drops its dQ counts unconverted; the second must rewrite every row.
    if (step == 1) exec.backward_layer(0);
    const ExecStats bs = exec.backward_layer(0);
    exec.download(0, got, Pass::Backward);
    merges = fs.num_merges + bs.num_merges;
    launches = fs.num_merge_calls + bs.num_merge_calls;
    if (step == 0) allocs = gpu->num_allocations();
    else steady = steady && gpu->num_allocations() == allocs;
    if (deterministic && step == 0) {
      first_dq = got.dq;
      first_dk = got.dk;
      first_dv = got.dv;
    } else if (deterministic) {
      repeat_ok = repeat_ok && got.dq == first_dq && got.dk == first_dk && got.dv == first_dv;
    }
    const double e[] = {rel(got.o, want.o, 1e-30), rel(got.lse, want.lse, 1.0), rel(got.dq, want.dq, 1.0),
                        rel(got.dk, want.dk, 1.0), rel(got.dv, want.dv, 1.0), rel(got.delta, want.delta, 1.0)};
    for (double x : e) worst = std::max(worst, x);
    if (worst >= 2e-2 && !explained) {
      explained = true;
      std::printf("rank %d %s step %d: O %.2e LSE %.2e dQ %.2e dK %.2e dV %.2e Delta %.2e\n", comm.rank(),
                  c.method.c_str(), step, e[0], e[1], e[2], e[3], e[4], e[5]);
      if (e[2] >= 2e-2) explain("dQ", got.dq, want.dq, qw, plan, comm.rank());
      if (e[3] >= 2e-2) explain("dK", got.dk, want.dk, kw, plan, comm.rank());
    }
  }
  // Batched: fewer launches than merges (every plan ends with a run of final merges).
  const bool batching_ok = batched ? launches <= merges && (launches < merges || merges <= 2) : launches == merges;
  const bool ok = worst < 2e-2 && steady && batching_ok && repeat_ok;
  std::printf("rank %d/%d %-8s hq=%d hkv=%d d=%d rows=%lld %s merges %d in %d launches: max rel err %.2e, "
              "allocations %lld (steady: %s)%s %s\n",
              comm.rank(), world, (c.method + (c.in_place ? "+ip" : "")).c_str(), c.q_heads, c.kv_heads, c.head_dim,
              static_cast<long long>(got.rows), batched ? "batched" : "one-by-one", merges, launches, worst,
              static_cast<long long>(allocs), steady ? "yes" : "NO",
              deterministic ? (repeat_ok ? ", deterministic: gradients bitwise equal over 3 steps" : ", deterministic: gradients DIFFER")
                            : "",
              ok ? "ok" : "FAIL");
  std::fflush(stdout);
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const bool die = argc > 1 && std::string(argv[1]) == "die";
  int devices = dcp::cuda_device_count();
  if (devices == 0) {
    std::printf("no GPU: skipped\n");
    return 77;
  }
  try {
    dcp::MpiSession session(&argc, &argv);
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const int device = rank % devices;
    std::unique_ptr<dcp::Comm> comm;
    comm = size > 1 ? dcp::make_nccl_comm_world(device) : dcp::make_self_comm(false);
    dcp::Comm& c = *comm;
    if (die) {
      Config cfg{8, 2, 128, "dcp"};
      const dcp::Batch batch = make_batch(cfg.q_heads, cfg.kv_heads, cfg.head_dim);
      const dcp::Plan plan = plan_for(batch, "zigzag", size);
      auto gpu = dcp::make_cuda_backend(backend_options(device));
      dcp::Executor exec(plan, *gpu, c, dcp::ExecOptions{.comm_timeout_s = 5.0});
      if (rank == 1) std::_Exit(3);
      exec.forward_layer(0);
      gpu->synchronize();
      std::printf("rank %d: forward finished although its peer died\n", rank);
      return 0;
    }
    int failures = 0;
    if (argc > 2 && std::string(argv[1]) == "only") {
      for (int i = 2; i < argc; ++i) failures += check(Config{8, 2, 128, argv[i]}, c, device);
      return failures == 0 ? 0 : 1;
    }
    for (auto [hq, hkv] : {std::pair{8, 8}, {8, 2}, {8, 1}})
      for (int d : {64, 128}) failures += check(Config{hq, hkv, d, "dcp"}, c, device);
    for (dcp::BaselineKind k : dcp::all_baselines()) failures += check(Config{8, 2, 128, dcp::to_string(k)}, c, device);
    // Owned outputs accumulated in place (PlanOptions::outputs_in_place), "+ip" in the lines.
    for (const char* m : {"dcp", "zigzag", "a2a_p2p"})
      failures += check(Config{8, 2, 128, m, true}, c, device);
    return failures == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
