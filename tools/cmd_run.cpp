// dcp run — plan a batch, run forward and backward attention on every rank through the
// Executor, and check the assembled outputs against a dense fp64 reference.
//
// Ranks: under mpirun (one process per rank, MpiComm) or, without an MPI launcher, `--ranks P`
// threads of this process (LocalWorld). Every rank builds the same plan and the same inputs
// from the same options (both deterministic), so nothing but data blocks and the final results
// travel: each rank gathers its own rows (dispatch.h), runs its programs, and sends its outputs
// and timings to rank 0, which scatters them into the global layout and compares.
#include <array>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"
#include "dcp/detail/attention_cpu.h"
#include "dcp/comm.h"
#include "dcp/cuda_backend.h"
#include "dcp/nccl_comm.h"
#include "dcp/dispatch.h"
#include "dcp/error.h"
#include "dcp/executor.h"
#include "dcp/io.h"
#include "dcp/plan.h"
#include "dcp/limits.h"
#include "dcp/validate.h"
#include "dense_reference.h"
#include "exit_codes.h"
#include "startup_watchdog.h"
#include "table.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace dcp::cli {
namespace {

// Message rounds of the tool itself, above every plan round (tags stay below MPI's 32767).
constexpr int32_t kPlanHashRound = 32000;
constexpr int32_t kResultRound = 32001;
constexpr int kNumStats = 6;  // plan_ms, fwd_ms, bwd_ms, fwd_wait_ms, bwd_wait_ms, tokens
// In-process ranks are threads each holding its own plan and tensors: a few hundred at most
// make sense on one machine.
constexpr int kMaxInProcessRanks = 1024;

struct RunArgs {
  BatchSource batch;
  ClusterSource cluster;
  BlockOptions blocks;
  PlacementOptions placement;
  std::string method = "dcp";
  int stages = 4;
  bool outputs_in_place = PlanOptions{}.outputs_in_place;
  std::string backend = "cpu";
  std::string plan_file;
  int ranks = 4;
  bool ranks_given = false;  // --ranks on the command line (the CUDA backend defaults to 1)
  uint64_t data_seed = 7;
  int threads = 0;
  double timeout_s = 120;
  bool json = false;
};

struct RankResult {  // what rank 0 reports
  std::string comm_name;
  int world_size = 0;
  Plan plan;
  std::vector<std::array<double, kNumStats>> stats;  // per rank
  ErrorStats err[5];                                  // O, LSE, dQ, dK, dV
  double reference_ms = 0;
  double tolerance = 0;
  bool pass = false;
};

const char* const kTensorNames[5] = {"O", "LSE", "dQ", "dK", "dV"};

bool launched_by_mpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(var) != nullptr) return true;
  return false;
}

int local_ranks_on_host(bool mpi, int world) {
  if (!mpi) return world;
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"})
    if (const char* v = std::getenv(var)) return std::max(1, std::atoi(v));
  return 1;
}

// One GPU per local rank: the rank's index on its host modulo the visible devices.
int local_device(bool mpi, int rank) {
  const int local = mpi ? mpi_local_rank() : rank;
  const int n = cuda_device_count();
  if (n == 0) raise(ErrorKind::Unsupported, "--backend cuda: no GPU is visible (or dcp was built without CUDA)");
  return local % n;
}

// The plan every rank runs: loaded, or built from the options for this world size.
Plan make_plan(const RunArgs& args, int world_size, double& plan_ms) {
  const auto t0 = std::chrono::steady_clock::now();
  if (!args.plan_file.empty()) {
    // Whatever `dcp validate` refuses is refused here, before any rank touches the plan.
    Plan plan = load_plan(args.plan_file);
    try {
      check_plan(plan);
    } catch (const Error& e) {
      raise(e.kind(), args.plan_file + ": " + e.what());
    }
    plan_ms = ms_since(t0);
    return plan;
  }
  const Batch batch = resolve_batch(args.batch);
  batch.validate();
  if (batch.shape.dtype == DType::FP16) {
    const std::string origin = batch_origin(args.batch);
    raise(ErrorKind::Unsupported, (origin.empty() ? std::string("--dtype fp16") : origin + ": dtype fp16") +
                                      ": dcp run checks fp32 and bf16-rounded inputs only");
  }
  args.blocks.validate(batch.shape);
  args.placement.validate();
  const PlanOptions popts = plan_options_for(args.stages, args.outputs_in_place);
  if (args.cluster.nodes < 1 || world_size % args.cluster.nodes != 0)
    raise(ErrorKind::InvalidInput, fmt::format("--nodes: {} ranks cannot be split over {} nodes", world_size,
                                               args.cluster.nodes));
  ClusterSource cs = args.cluster;
  cs.devices_per_node = world_size / args.cluster.nodes;
  const Cluster cluster = resolve_cluster(cs);
  const PlacedMethod placed = place_method(args.method, batch, args.blocks, cluster, args.placement);
  Plan plan = build_plan(placed.placed.table, placed.placed.placement, cluster, popts);
  plan_ms = ms_since(t0);
  return plan;
}

void assemble(const Plan& plan, int rank, const LocalTensors& t, std::vector<float> (&global)[5]) {
  const AttentionShape& s = plan.table.shape;
  const int64_t qw = int64_t{s.q_heads} * s.head_dim, kw = int64_t{s.kv_heads} * s.head_dim;
  const LocalTokens tok = local_tokens(plan.table, plan.devices[static_cast<size_t>(rank)].owned_blocks);
  scatter_rows<float>(t.o, global[0], qw, tok);
  scatter_rows<float>(t.lse, global[1], s.q_heads, tok);
  scatter_rows<float>(t.dq, global[2], qw, tok);
  scatter_rows<float>(t.dk, global[3], kw, tok);
  scatter_rows<float>(t.dv, global[4], kw, tok);
}

// One rank's whole run. Rank 0 fills `out`.
// `comm` carries the host-side exchanges (plan checksums, results to rank 0); `exec_comm` (the
// NCCL comm for the CUDA backend, else `comm`) carries the plan's transfers.
void rank_main(Comm& comm, Comm* exec_comm, const RunArgs& args, bool mpi, RankResult* out) {
  const int rank = comm.rank(), world = comm.world_size();
#ifdef _OPENMP
  omp_set_num_threads(args.threads > 0 ? args.threads
                                       : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) /
                                                         local_ranks_on_host(mpi, world)));
#endif
  double plan_ms = 0;
  const Plan plan = make_plan(args, world, plan_ms);
  // Before any communication: every rank sees the mismatch itself and says so.
  check_plan_world_size(plan, world, "dcp run" + (args.plan_file.empty() ? "" : " --plan " + args.plan_file));

  // Same options must give the same plan on every rank; compare checksums at rank 0.
  uint64_t hash = plan_hash(plan);
  std::vector<uint64_t> hashes(static_cast<size_t>(world), hash);
  {
    std::vector<CommOp> ops;
    if (rank == 0) {
      for (int r = 1; r < world; ++r) ops.push_back({r, false, &hashes[static_cast<size_t>(r)], 8});
    } else {
      ops.push_back({0, true, &hash, 8});
    }
    comm.start(kPlanHashRound, ops);
    comm.wait(kPlanHashRound, args.timeout_s);
    for (int r = 1; r < world; ++r)
      if (hashes[static_cast<size_t>(r)] != hashes[0])
        raise(ErrorKind::InvalidPlan, fmt::format("dcp run: rank {} built a different plan than rank 0 "
                                                  "(options or inputs differ between ranks)", r));
  }

  const AttentionShape& s = plan.table.shape;
  const int64_t total = plan.table.total_tokens();
  const int64_t qw = int64_t{s.q_heads} * s.head_dim, kw = int64_t{s.kv_heads} * s.head_dim;
  const AttentionInputs exact = make_inputs(s, total, args.data_seed);
  AttentionInputs in = exact;
  if (s.dtype == DType::BF16) {  // bf16 storage, fp32 math
    for (auto* v : {&in.q, &in.k, &in.v, &in.d_o}) cpu::round_to_bf16(*v);
  }
  const DeviceProgram& dev = plan.devices[static_cast<size_t>(rank)];
  const LocalTokens tok = local_tokens(plan.table, dev.owned_blocks);
  LocalTensors t = LocalTensors::allocate(s, tok.num_rows());
  gather_rows<float>(in.q, t.q, qw, tok);
  gather_rows<float>(in.k, t.k, kw, tok);
  gather_rows<float>(in.v, t.v, kw, tok);
  gather_rows<float>(in.d_o, t.d_o, qw, tok);

  std::unique_ptr<Backend> backend;
  std::unique_ptr<Comm> self;  // one GPU: its device memory pairs with a comm of one rank
  if (args.backend == "cuda") {
    CudaBackendOptions options;
    options.device = local_device(mpi, rank);
    options.kernels = kernel_options_from_environment();
    backend = make_cuda_backend(options);
    if (world == 1 && exec_comm == nullptr) {
      self = make_self_comm(false);
      exec_comm = self.get();
    }
  } else {
    backend = make_cpu_backend();
  }
  Executor exec(plan, *backend, exec_comm ? *exec_comm : comm, ExecOptions{.comm_timeout_s = args.timeout_s});
  const ExecStats fwd = exec.forward(t);
  const ExecStats bwd = exec.backward(t);
  std::array<double, kNumStats> stats{plan_ms,          fwd.total_s * 1e3, bwd.total_s * 1e3, fwd.comm_wait_s * 1e3,
                                      bwd.comm_wait_s * 1e3, static_cast<double>(tok.num_rows())};

  // Results to rank 0: stats, then O, LSE, dQ, dK, dV of the rank's rows.
  std::vector<std::array<double, kNumStats>> all_stats(static_cast<size_t>(world), stats);
  std::vector<LocalTensors> remote;
  std::vector<CommOp> ops;
  auto bytes = [](const std::vector<float>& v) { return static_cast<int64_t>(v.size() * sizeof(float)); };
  if (rank == 0) {
    remote.resize(static_cast<size_t>(world));
    for (int r = 1; r < world; ++r) {
      LocalTensors& rt = remote[static_cast<size_t>(r)];
      rt = LocalTensors::allocate(s, plan.devices[static_cast<size_t>(r)].owned_tokens);
      ops.push_back({r, false, all_stats[static_cast<size_t>(r)].data(), kNumStats * 8});
      for (auto* v : {&rt.o, &rt.lse, &rt.dq, &rt.dk, &rt.dv}) ops.push_back({r, false, v->data(), bytes(*v)});
    }
  } else {
    ops.push_back({0, true, stats.data(), kNumStats * 8});
    for (auto* v : {&t.o, &t.lse, &t.dq, &t.dk, &t.dv}) ops.push_back({0, true, v->data(), bytes(*v)});
  }
  comm.start(kResultRound, ops);
  comm.wait(kResultRound, args.timeout_s);
  if (rank != 0) return;

  std::vector<float> global[5];
  for (int i = 0; i < 5; ++i) {
    const int64_t width = (i == 1) ? s.q_heads : (i >= 3 ? kw : qw);
    global[i].assign(static_cast<size_t>(total * width), std::nanf(""));
  }
  assemble(plan, 0, t, global);
  for (int r = 1; r < world; ++r) assemble(plan, r, remote[static_cast<size_t>(r)], global);

#ifdef _OPENMP
  omp_set_num_threads(args.threads > 0 ? args.threads : static_cast<int>(std::thread::hardware_concurrency()));
#endif
  const auto t0 = std::chrono::steady_clock::now();
  const ReferenceOutputs want = dense_reference(s, plan.table.seq_length, plan.table.seq_mask, exact);
  out->reference_ms = ms_since(t0);
  const std::vector<double>* wants[5] = {&want.o, &want.lse, &want.dq, &want.dk, &want.dv};
  // A backend that stores Q, K, V and dO in bf16 (CUDA) gets the bf16 tolerance whatever the
  // batch dtype.
  out->tolerance = s.dtype == DType::BF16 || backend->storage_type() == ElemType::BF16 ? 2e-2 : 1e-5;
  out->pass = true;
  const std::array<double, 5> floors = error_floors(exact);
  for (int i = 0; i < 5; ++i) {
    out->err[i] = compare(global[i], *wants[i], floors[i]);
    if (!(out->err[i].max_rel < out->tolerance)) out->pass = false;
  }
  out->comm_name = comm.name();
  out->world_size = world;
  out->stats = std::move(all_stats);
  out->plan = plan;
}

double max_stat(const RankResult& r, int i) {
  double m = 0;
  for (const auto& s : r.stats) m = std::max(m, s[static_cast<size_t>(i)]);
  return m;
}

void print_report(const RunArgs& args, const RankResult& r) {
  const Plan& plan = r.plan;
  const AttentionShape& s = plan.table.shape;
  const PlanHeader& h = plan.header;
  if (args.json) {
    nlohmann::json errors, ranks = nlohmann::json::array();
    for (int i = 0; i < 5; ++i) errors[kTensorNames[i]] = {{"max_rel", r.err[i].max_rel}, {"mean_rel", r.err[i].mean_rel}};
    for (size_t k = 0; k < r.stats.size(); ++k)
      ranks.push_back({{"rank", k},
                       {"tokens", static_cast<int64_t>(r.stats[k][5])},
                       {"fwd_ms", r.stats[k][1]},
                       {"bwd_ms", r.stats[k][2]},
                       {"fwd_comm_wait_ms", r.stats[k][3]},
                       {"bwd_comm_wait_ms", r.stats[k][4]}});
    nlohmann::json out{{"backend", args.backend},
                       {"comm", r.comm_name},
                       {"ranks", r.world_size},
                       {"placement", h.method},
                       {"stages", h.options.schedule.num_comm_stages + 1},
                       {"block_size", h.block_size},
                       {"batch",
                        {{"sequences", plan.table.num_sequences()},
                         {"tokens", plan.table.total_tokens()},
                         {"heads", {{"q", s.q_heads}, {"kv", s.kv_heads}, {"dim", s.head_dim}}},
                         {"dtype", to_string(s.dtype)}}},
                       {"tolerance", r.tolerance},
                       {"pass", r.pass},
                       {"errors", errors},
                       {"plan_ms", max_stat(r, 0)},
                       {"fwd_ms", max_stat(r, 1)},
                       {"bwd_ms", max_stat(r, 2)},
                       {"reference_ms", r.reference_ms},
                       {"per_rank", ranks}};
    std::cout << out.dump(2) << "\n";
    return;
  }
  std::cout << fmt::format("run: {} placement, {} ranks ({} comm, {} backend), {} stages, {}\n", h.method,
                           r.world_size, r.comm_name, args.backend, h.options.schedule.num_comm_stages + 1,
                           h.block_size > 0 ? fmt::format("B={}", h.block_size) : std::string("blocks cut per method"));
  std::cout << fmt::format("batch: {} sequences, {} tokens, {} q / {} kv heads x {}, {} inputs{}\n\n",
                           plan.table.num_sequences(), plan.table.total_tokens(), s.q_heads, s.kv_heads, s.head_dim,
                           to_string(s.dtype), s.dtype == DType::BF16 ? " (bf16-rounded, fp32 math)" : "");
  Table errs({"tensor", "max rel err", "mean rel err", "tolerance", "ok"});
  for (int i = 0; i < 5; ++i)
    errs.add_row({kTensorNames[i], fmt::format("{:.2e}", r.err[i].max_rel), fmt::format("{:.2e}", r.err[i].mean_rel),
                  fmt::format("{:.0e}", r.tolerance), r.err[i].max_rel < r.tolerance ? "yes" : "NO"});
  std::cout << errs.render() << "\n";
  Table times({"rank", "tokens", "fwd ms", "bwd ms", "fwd comm wait", "bwd comm wait"});
  for (size_t k = 0; k < r.stats.size(); ++k)
    times.add_row({std::to_string(k), fmt::format("{:.0f}", r.stats[k][5]), fixed(r.stats[k][1], 1),
                   fixed(r.stats[k][2], 1), fixed(r.stats[k][3], 1), fixed(r.stats[k][4], 1)});
  std::cout << times.render();
  std::cout << fmt::format("\nplan {:.1f} ms, forward {:.1f} ms, backward {:.1f} ms (max over ranks); "
                           "fp64 reference {:.1f} ms\n",
                           max_stat(r, 0), max_stat(r, 1), max_stat(r, 2), r.reference_ms);
  std::cout << (r.pass ? "PASS: every output within tolerance of the dense fp64 reference\n"
                       : "FAIL: some output differs from the dense fp64 reference beyond tolerance\n");
}

int run_run(const RunArgs& args) {
  if (args.backend != "cpu" && args.backend != "cuda")
    raise(ErrorKind::InvalidInput, "--backend: unknown backend '" + args.backend + "' (expected cpu or cuda)");
  const bool cuda = args.backend == "cuda";
  const bool mpi_launch = launched_by_mpi() && mpi_available();
  if (cuda && !mpi_launch && args.ranks > 1)
    raise(ErrorKind::InvalidInput, "--backend cuda with --ranks " + std::to_string(args.ranks) +
                                       ": GPU ranks are processes; use mpirun -np P (one rank per GPU)");
  if (cuda) (void)kernel_options_from_environment();  // a bad DCP_ATTN_* value is named first
  if (cuda && cuda_device_count() == 0)
    raise(ErrorKind::Unsupported, "--backend cuda: no GPU is visible (or dcp was built without CUDA)");
  check_method(args.method, "--placement");
  RankResult result;
  const bool mpi = mpi_launch;
  if (mpi) {
    StartupWatchdog watchdog(args.timeout_s, "dcp run");
    MpiSession session(nullptr, nullptr);
    watchdog.disarm();
    std::unique_ptr<Comm> comm = make_mpi_comm_world();
    try {
      // GPU transfers go over NCCL; the host-side exchanges stay on MPI.
      std::unique_ptr<Comm> nccl;
      if (cuda && comm->world_size() > 1) nccl = make_nccl_comm_world(local_device(true, comm->rank()));
      rank_main(*comm, nccl.get(), args, true, &result);
    } catch (const std::exception& e) {
      // Report on the failing rank, then take the whole job down with the error's exit code
      // (the one in-process ranks give too), so mpirun exits with it.
      const int code = exit_code_of(e);
      std::cerr << fmt::format("dcp run: rank {}: {}\n", comm->rank(), error_text(e)) << std::flush;
      mpi_abort_world(code);
      return code;
    }
    if (comm->rank() != 0) return 0;
  } else {
    run_local_ranks(args.ranks,
                    [&](Comm& comm) { rank_main(comm, nullptr, args, false, comm.rank() == 0 ? &result : nullptr); });
  }
  print_report(args, result);
  return result.pass ? kExitOk : kExitCheckFailed;
}

}  // namespace

void register_run(CLI::App& app, Runner& runner) {
  auto args = std::make_shared<RunArgs>();
  // Small defaults: seconds on a laptop, enough blocks per rank to exercise every stage.
  args->batch.tokens = 4096;
  args->batch.q_heads = 4;
  args->batch.kv_heads = 2;
  args->batch.head_dim = 64;
  args->batch.dtype = "fp32";
  args->blocks.block_size = 256;
  args->cluster.nodes = 1;
  CLI::App* sub = app.add_subcommand(
      "run", "Run a plan's forward and backward attention on every rank (mpirun, or --ranks threads) and check it "
             "against a dense fp64 reference");
  add_batch_options(sub, args->batch);
  add_block_options(sub, args->blocks);
  sub->add_option("--cluster", args->cluster.preset, "Cluster preset or JSON file (link model of the schedule)")
      ->capture_default_str();
  sub->add_option("--nodes", args->cluster.nodes, "Nodes the ranks are split over (ranks / nodes per node)")
      ->capture_default_str()
      ->check(int_range(1, kMaxNodes));
  sub->add_option("--placement", args->method, "Placement: dcp, ring, zigzag, ulysses, a2a_p2p, packing")
      ->capture_default_str();
  add_stages_option(sub, args->stages);
  add_outputs_in_place_option(sub, args->outputs_in_place);
  sub->add_option("--backend", args->backend,
                  "Compute backend: cpu, or cuda (one rank per GPU under mpirun; transfers over NCCL)")
      ->capture_default_str();
  sub->add_option("--plan", args->plan_file, "Run this saved plan (dcp plan --save-plan) instead of planning");
  CLI::Option* ranks_opt = sub->add_option("--ranks", args->ranks, "In-process ranks (threads) when not launched by mpirun")
      ->capture_default_str()
      ->check(int_range(1, kMaxInProcessRanks));
  sub->add_option("--data-seed", args->data_seed, "Seed of the random Q, K, V, dO")
      ->capture_default_str()
      ->check(non_negative_integer());
  sub->add_option("--threads", args->threads, "OpenMP threads per rank (0, the default: cores / ranks on this host)")
      ->check(int_range(0, 1024));
  sub->add_option("--timeout", args->timeout_s,
                  "Seconds any communication (and MPI start-up) may wait before failing")
      ->capture_default_str()
      ->check(seconds_option());
  sub->add_option("--eps-compute", args->placement.eps_compute, "DCP per-device compute tolerance")
      ->capture_default_str();
  sub->add_option("--eps-memory", args->placement.eps_memory, "DCP per-device memory tolerance")->capture_default_str();
  sub->add_flag("--json", args->json, "Print one JSON object instead of tables (rank 0)");
  sub->callback([args, ranks_opt, &runner] {
    args->ranks_given = ranks_opt->count() > 0;
    if (args->backend == "cuda" && !args->ranks_given) args->ranks = 1;
    runner = [args] { return run_run(*args); };
  });
}

}  // namespace dcp::cli
