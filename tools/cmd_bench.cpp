// dcp bench — run a batch's plans (DCP and every static baseline) through the executor on GPUs
// (CUDA backend; NCCL between ranks under mpirun, one rank per GPU), L layers forward then
// backward, and report measured time (max over ranks), mask-area TFLOP/s per GPU, bytes moved
// and the simulator's prediction for the same plan. --check compares against the CPU backend.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "exit_codes.h"
#include "gpu_energy.h"
#include "startup_watchdog.h"
#include "common.h"
#include "dcp/detail/attention_cpu.h"
#include "dcp/baselines.h"
#include "dcp/comm.h"
#include "dcp/cuda_backend.h"
#include "dcp/nccl_comm.h"
#include "dcp/dispatch.h"
#include "dcp/error.h"
#include "dcp/executor.h"
#include "dcp/partition.h"
#include "dcp/plan.h"
#include "dcp/planner.h"
#include "dcp/sim.h"

namespace dcp::cli {
namespace {

struct BenchArgs {
  BatchSource batch;
  // "auto": the preset measured on this machine's GPU (h100-sxm, h200-nvl), else h200-nvl.
  ClusterSource cluster{.preset = "auto", .nodes = 1, .devices_per_node = 0};
  BlockOptions blocks;
  std::vector<std::string> methods;
  int layers = 2;
  int warmup = 1;
  int iters = 3;
  int stages = 2;
  bool outputs_in_place = PlanOptions{}.outputs_in_place;
  bool check = false;
  bool verbose = false;
  double timeout_s = 120.0;
  std::string json;
  std::string backend = "cuda";
  PlacementOptions placement;  // DCP's partitioner options
  std::string trace;           // --trace PREFIX: measured and simulated timelines
  std::string calibration;     // simulator rates (default: the cluster's)
  bool search = false;         // DCP's plan from the planner's search (planner.h)
  bool balance_time = false;   // dcp without --search: weigh tiles by the calibration's kernel time
  std::vector<int64_t> search_blocks{1024, 2048, 4096};
  std::vector<double> search_eps{0.02, 0.05, 0.1};
  bool dcp_only = false;  // --search without the static layouts among the candidates
  int energy_iters = 0;   // > 0: that many further steps per pass with GPU 0's energy counter read around them
};

std::vector<float> random_bf16(uint64_t seed, size_t n, float amplitude) {
  std::vector<float> v(n);
  uint64_t x = seed;
  for (float& f : v) {
    x += 0x9e3779b97f4a7c15ULL;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    f = amplitude * (static_cast<float>(z >> 40) / static_cast<float>(1ULL << 24) * 2.0f - 1.0f);
  }
  cpu::round_to_bf16(v);
  return v;
}

LocalTensors inputs_for(const Plan& plan, int rank, uint64_t seed) {
  const AttentionShape& s = plan.header.shape;
  const DeviceProgram& dev = plan.devices[static_cast<size_t>(rank)];
  LocalTensors t = LocalTensors::allocate(s, dev.owned_tokens);
  // Rows are generated per global token so every rank (and the CPU check) sees the same data.
  const LocalTokens tok = local_tokens(plan.table, dev.owned_blocks);
  const int64_t qw = int64_t{s.q_heads} * s.head_dim, kw = int64_t{s.kv_heads} * s.head_dim;
  for (int64_t r = 0; r < tok.num_rows(); ++r) {
    const auto g = static_cast<uint64_t>(tok.global_row[static_cast<size_t>(r)]);
    const auto q = random_bf16(seed * 4 + g * 1000003ULL, static_cast<size_t>(qw), 2.0f);
    const auto k = random_bf16(seed * 4 + 1 + g * 1000003ULL, static_cast<size_t>(kw), 2.0f);
    const auto v = random_bf16(seed * 4 + 2 + g * 1000003ULL, static_cast<size_t>(kw), 1.0f);
    const auto d = random_bf16(seed * 4 + 3 + g * 1000003ULL, static_cast<size_t>(qw), 1.0f);
    std::copy(q.begin(), q.end(), t.q.begin() + r * qw);
    std::copy(d.begin(), d.end(), t.d_o.begin() + r * qw);
    std::copy(k.begin(), k.end(), t.k.begin() + r * kw);
    std::copy(v.begin(), v.end(), t.v.begin() + r * kw);
  }
  return t;
}

double rel(const std::vector<float>& got, const std::vector<float>& want, double floor) {
  double err = 0, ref = floor;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i])) return INFINITY;
    if (std::isinf(want[i])) {
      if (!(std::isinf(got[i]) && got[i] < 0)) return INFINITY;
      continue;
    }
    err = std::max(err, std::abs(static_cast<double>(got[i]) - want[i]));
    ref = std::max(ref, std::abs(static_cast<double>(want[i])));
  }
  return err / ref;
}

struct Row {
  std::string method;
  double fwd_ms = 0, bwd_ms = 0, sim_fwd_ms = 0, sim_bwd_ms = 0;
  double fwd_tflops = 0, bwd_tflops = 0;  // per GPU
  double bytes = 0;                        // sent, all devices, fwd + bwd, one layer
  double check_err = -1;
  double imbalance = 0;
  std::string chosen;  // --search: the planner's choice for dcp
  uint64_t plan_hash = 0;  // what a run through another front end (the PyTorch operator) compares
  // --energy-iters, GPU 0 (rank 0's): joules per layer and pass, mean watts, median SM clock.
  struct Energy {
    double joules = 0, watts = 0, mhz = 0;
  };
  std::optional<Energy> fwd_energy, bwd_energy;
};

// Runs `pass` (one step of one pass, all layers, synchronized) `iters` times and reads the energy
// counter of `meter` around them (null on ranks that do not measure: they only run the steps).
// The driver updates the counter every few tens of milliseconds, so a window of a few hundred
// milliseconds reads up to 10 % off (a 0.3 s window of short steps measured 780 W on a 700 W
// GPU): on one rank the steps go on, in whole steps, until they fill kMinEnergySeconds. Several
// ranks run exactly `iters` steps: each must run as many as the others (their collectives pair
// up), and no rank's clock decides for the others.
constexpr double kMinEnergySeconds = 2.0;
template <typename F>
std::optional<Row::Energy> measure_energy(const Comm& comm, const GpuEnergyMeter* meter, int iters, int layers,
                                          F&& pass) {
  const std::optional<uint64_t> e0 = meter != nullptr ? meter->energy_mj() : std::nullopt;
  const auto t0 = std::chrono::steady_clock::now();
  const auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  std::vector<double> mhz;
  int done = 0;
  while (done < iters || (comm.world_size() == 1 && elapsed() < kMinEnergySeconds)) {
    pass();
    ++done;
    if (meter != nullptr)
      if (const auto c = meter->sm_clock_mhz()) mhz.push_back(*c);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::optional<uint64_t> e1 = meter != nullptr ? meter->energy_mj() : std::nullopt;
  if (!e0 || !e1 || seconds <= 0) return std::nullopt;
  std::sort(mhz.begin(), mhz.end());
  const double joules = static_cast<double>(*e1 - *e0) / 1e3;
  return Row::Energy{joules / (done * layers), joules / seconds, mhz.empty() ? 0.0 : mhz[mhz.size() / 2]};
}

Plan make_plan(const std::string& method, const Batch& batch, const BenchArgs& args, const Cluster& cluster,
               const Calibration& calibration, std::string& chosen) {
  const BlockOptions& blocks = args.blocks;
  PlanOptions popts;
  popts.schedule.num_comm_stages = args.stages;
  popts.outputs_in_place = args.outputs_in_place;
  if (method == "dcp" && args.search) {
    // Every rank runs the same deterministic search, so all hold the same plan.
    PlannerOptions search;
    search.block_sizes = args.search_blocks;
    search.eps_compute = args.search_eps;
    search.q_heads_per_group = blocks.q_heads_per_group;
    search.placement = args.placement;
    search.plan = popts;
    search.calibration = calibration;
    if (args.dcp_only) search.static_layouts.clear();
    PlannedBatch pb = plan_batch(batch, cluster, search);
    chosen = fmt::format("{} (search {:.0f} ms)", describe(pb.chosen), pb.search_s * 1e3);
    return std::move(pb.plan);
  }
  PlacementOptions placement = args.placement;
  if (args.balance_time) placement.tile_cost = tile_cost_from(calibration);
  if (method == "dcp") {
    const BlockTable table = build_block_table(batch, blocks);
    return build_plan(table, place_dcp(table, cluster, placement).placement, cluster, popts);
  }
  for (BaselineKind k : all_baselines())
    if (method == to_string(k)) {
      const PlacedBatch pb = make_baseline(k, batch, blocks, cluster);
      return build_plan(pb.table, pb.placement, cluster, popts);
    }
  raise(ErrorKind::InvalidInput, "--method: unknown placement '" + method + "'");
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  if (!out) raise(ErrorKind::InvalidInput, "--trace: cannot write " + path);
  out << text;
}

// Chrome/Perfetto trace of one rank's measured instructions: forward on thread 0, backward on
// thread 1 starting where the forward ended (the same layout as the simulator's trace).
std::string measured_trace(const std::vector<MeasuredInstruction>& fwd, const std::vector<MeasuredInstruction>& bwd,
                           int rank) {
  nlohmann::json events = nlohmann::json::array();
  const double offset = fwd.empty() ? 0.0 : fwd.back().end_s;
  for (const auto* pass : {&fwd, &bwd}) {
    const bool is_bwd = pass == &bwd;
    for (const MeasuredInstruction& m : *pass)
      events.push_back({{"name", m.kind},
                        {"ph", "X"},
                        {"pid", rank},
                        {"tid", is_bwd ? 1 : 0},
                        {"ts", (m.start_s + (is_bwd ? offset : 0.0)) * 1e6},
                        {"dur", (m.end_s - m.start_s) * 1e6},
                        {"args",
                         {{"index", m.index}, {"instructions", m.num_instructions}, {"pass", is_bwd ? "bwd" : "fwd"}}}});
  }
  return nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump();
}

Row bench_one(const BenchArgs& args, const std::string& method, const Batch& batch, const Cluster& cluster,
              const Calibration& calibration, Comm& comm, Backend& backend, const GpuEnergyMeter* meter) {
  using Clock = std::chrono::steady_clock;
  std::string chosen;
  const Plan plan = make_plan(method, batch, args, cluster, calibration, chosen);
  Row row;
  row.method = method;
  row.chosen = chosen;
  row.plan_hash = plan_hash(plan);
  const auto progress = [&](const std::string& what) {
    if (args.verbose) std::fprintf(stderr, "[rank %d] %s: %s\n", comm.rank(), method.c_str(), what.c_str());
  };
  progress("planned");
  double fwd_flops = 0;
  for (const Tile& t : plan.table.tiles) fwd_flops += plan.table.tile_flops_fwd(t);
  for (const DeviceProgram& d : plan.devices)
    for (const Program* p : {&d.fwd, &d.bwd})
      for (const Instruction& ins : p->code)
        if (const auto* cs = std::get_if<CommStart>(&ins))
          for (const Transfer& t : cs->ops) row.bytes += t.send ? static_cast<double>(t.bytes) : 0.0;
  SimOptions sopts;
  sopts.calibration = calibration;
  sopts.trace = !args.trace.empty() && comm.rank() == 0;
  const SimResult sim = simulate(plan, cluster, sopts);
  if (sopts.trace) write_text(args.trace + "." + method + ".sim.json", sim.trace_json);
  row.sim_fwd_ms = sim.fwd_s * 1e3;
  row.sim_bwd_ms = sim.bwd_s * 1e3;

  progress("simulated");
  Executor exec(plan, backend, comm,
                ExecOptions{.comm_timeout_s = args.timeout_s, .num_layers = args.layers, .timeline = !args.trace.empty()});
  progress("executor ready");
  // --check: the same host data for both backends; otherwise random inputs made on the device.
  LocalTensors t;
  if (args.check) {
    t = inputs_for(plan, comm.rank(), 7);
    for (int l = 0; l < args.layers; ++l) exec.upload(l, t, Pass::Backward);  // O, LSE rewritten by forward
  } else {
    for (int l = 0; l < args.layers; ++l) exec.fill_random_inputs(l, 7);
  }
  std::vector<double> fwd, bwd;
  for (int it = 0; it < args.warmup + args.iters; ++it) {
    comm.barrier(120.0);
    const auto t0 = Clock::now();
    for (int l = 0; l < args.layers; ++l) exec.forward_layer(l);
    backend.synchronize();
    comm.barrier(120.0);
    const auto t1 = Clock::now();
    for (int l = args.layers - 1; l >= 0; --l) exec.backward_layer(l);
    backend.synchronize();
    comm.barrier(120.0);
    const auto t2 = Clock::now();
    progress(fmt::format("step {} done", it));
    if (it < args.warmup) continue;
    fwd.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count() / args.layers);
    bwd.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count() / args.layers);
  }
  if (args.energy_iters > 0) {
    // Every rank runs the steps (their collectives pair up); rank 0 reads its GPU's counter.
    progress("energy");
    row.fwd_energy = measure_energy(comm, meter, args.energy_iters, args.layers, [&] {
      for (int l = 0; l < args.layers; ++l) exec.forward_layer(l);
      backend.synchronize();
    });
    row.bwd_energy = measure_energy(comm, meter, args.energy_iters, args.layers, [&] {
      for (int l = args.layers - 1; l >= 0; --l) exec.backward_layer(l);
      backend.synchronize();
    });
  }
  if (!args.trace.empty()) {
    // One more step, measured instruction by instruction (markers are reused per pass).
    exec.forward_layer(0);
    const auto tf = exec.timeline(Pass::Forward);
    exec.backward_layer(0);
    const auto tb = exec.timeline(Pass::Backward);
    write_text(fmt::format("{}.{}.rank{}.json", args.trace, method, comm.rank()), measured_trace(tf, tb, comm.rank()));
  }
  std::sort(fwd.begin(), fwd.end());
  std::sort(bwd.begin(), bwd.end());
  row.fwd_ms = fwd[fwd.size() / 2];
  row.bwd_ms = bwd[bwd.size() / 2];
  const int world = comm.world_size();
  row.fwd_tflops = fwd_flops / (row.fwd_ms * 1e-3) / world / 1e12;
  row.bwd_tflops = 2.5 * fwd_flops / (row.bwd_ms * 1e-3) / world / 1e12;

  if (args.check) {
    LocalTensors got = t;
    exec.download(0, got, Pass::Forward);
    exec.download(0, got, Pass::Backward);
    LocalTensors want;
    run_local_ranks(world, [&](Comm& lc) {
      LocalTensors w = inputs_for(plan, lc.rank(), 7);
      auto cpu = make_cpu_backend();
      Executor e(plan, *cpu, lc);
      e.forward(w);
      e.backward(w);
      if (lc.rank() == comm.rank()) want = std::move(w);
    });
    row.check_err = std::max({rel(got.o, want.o, 1e-30), rel(got.lse, want.lse, 1.0), rel(got.dq, want.dq, 1.0),
                              rel(got.dk, want.dk, 1.0), rel(got.dv, want.dv, 1.0)});
  }
  return row;
}

int bench_main(const BenchArgs& args, int& world_out) {
  std::unique_ptr<Comm> world_comm = mpi_available() ? make_mpi_comm_world() : nullptr;
  const int rank = world_comm ? world_comm->rank() : 0;
  const int world = world_comm ? world_comm->world_size() : 1;
  world_out = world;
  world_comm.reset();
  const bool cuda = args.backend == "cuda";
  if (!cuda && args.backend != "cpu") raise(ErrorKind::InvalidInput, "--backend: cuda or cpu");
  const int gpus = cuda_device_count();
  if (cuda && gpus == 0) raise(ErrorKind::Unsupported, "dcp bench: no GPU visible (use --backend cpu)");
  const int device = cuda ? (mpi_available() ? mpi_local_rank() : rank) % gpus : 0;
  CudaBackendOptions backend_options;
  backend_options.device = device;
  backend_options.kernels = kernel_options_from_environment();
  std::unique_ptr<Backend> backend = cuda ? make_cuda_backend(backend_options) : make_cpu_backend();
  std::unique_ptr<Comm> comm;
  if (world > 1) comm = cuda ? make_nccl_comm_world(device) : make_mpi_comm_world();
  else comm = make_self_comm(!cuda);

  const Batch batch = resolve_batch(args.batch);
  batch.validate();
  ClusterSource cs = args.cluster;
  if (cs.preset == "auto" && !cuda) cs.preset = "h200-nvl";  // the CPU backend: no card to price
  if (cs.preset == "auto" && rank == 0 && cluster_preset_for_gpu(cuda_device_name(device)).empty())
    std::cerr << "dcp bench: no preset was measured on '" << cuda_device_name(device)
              << "': the sim columns price h200-nvl (see --cluster)\n";
  if (cs.devices_per_node == 0) cs.devices_per_node = world / std::max(1, cs.nodes);
  const Cluster cluster = resolve_cluster(cs, device);
  if (cluster.num_devices() != world)
    raise(ErrorKind::InvalidInput, fmt::format("dcp bench: cluster has {} devices, {} ranks run", cluster.num_devices(), world));
  args.blocks.validate(batch.shape);
  const Calibration calibration =
      args.calibration.empty() ? calibration_from_cluster(cluster) : load_calibration(args.calibration);
  std::vector<std::string> methods = args.methods;
  check_methods(methods, "--method");
  if (methods.empty()) {
    methods.push_back("dcp");
    for (BaselineKind k : all_baselines()) methods.push_back(to_string(k));
  }
  std::unique_ptr<GpuEnergyMeter> meter;
  if (args.energy_iters > 0 && rank == 0) {
    std::string why = "the CPU backend";
    if (cuda) meter = GpuEnergyMeter::open(device, why);
    if (!meter) std::cerr << "dcp bench: --energy-iters: no energy figures: " << why << "\n";
  }
  std::vector<Row> rows;
  for (const std::string& m : methods) {
    try {
      rows.push_back(bench_one(args, m, batch, cluster, calibration, *comm, *backend, meter.get()));
      const Row& r = rows.back();
      if (rank == 0)
        std::fprintf(stderr, "%s: fwd %.2f ms, bwd %.2f ms, %.1f / %.1f TFLOP/s per GPU\n", m.c_str(), r.fwd_ms,
                     r.bwd_ms, r.fwd_tflops, r.bwd_tflops);
    } catch (const Error& e) {
      if (e.kind() == ErrorKind::Timeout || e.kind() == ErrorKind::Nccl || e.kind() == ErrorKind::Cuda) throw;
      if (rank == 0) std::cerr << fmt::format("dcp bench: {}: skipped: {}\n", m, e.what());
    }
  }
  if (rank != 0) return 0;
  double best_static = 0;
  for (const Row& r : rows)
    if (r.method != "dcp" && (best_static == 0 || r.fwd_ms + r.bwd_ms < best_static)) best_static = r.fwd_ms + r.bwd_ms;
  std::cout << fmt::format("dcp bench: {} tokens, {} sequences, mask {}, {} GPU(s), backend {}, {} layers, block {}, "
                           "cluster {}\n",
                           batch.total_tokens(), batch.sequences.size(), mask_label({batch}), world, backend->name(),
                           args.layers, args.blocks.block_size, cluster.name);
  std::cout << fmt::format("{:<10} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10} {:>9} {:>9} {:>9}\n", "method", "fwd ms",
                           "bwd ms", "fwd TF/s", "bwd TF/s", "sim fwd", "sim bwd", "MB moved", "speedup", "check");
  nlohmann::json j = nlohmann::json::array();
  for (const Row& r : rows) {
    const double total = r.fwd_ms + r.bwd_ms;
    const double speed = best_static > 0 ? best_static / total : 1.0;
    std::cout << fmt::format("{:<10} {:>9.2f} {:>9.2f} {:>9.1f} {:>9.1f} {:>10.2f} {:>10.2f} {:>9.1f} {:>8.2f}x {:>9}\n",
                             r.method, r.fwd_ms, r.bwd_ms, r.fwd_tflops, r.bwd_tflops, r.sim_fwd_ms, r.sim_bwd_ms,
                             r.bytes / 1e6, speed, r.check_err < 0 ? "-" : fmt::format("{:.1e}", r.check_err));
    if (!r.chosen.empty()) std::cout << fmt::format("  {}: planner chose {}\n", r.method, r.chosen);
    j.push_back({{"method", r.method}, {"chosen", r.chosen}, {"fwd_ms", r.fwd_ms}, {"bwd_ms", r.bwd_ms}, {"fwd_tflops_per_gpu", r.fwd_tflops},
                 {"bwd_tflops_per_gpu", r.bwd_tflops}, {"sim_fwd_ms", r.sim_fwd_ms}, {"sim_bwd_ms", r.sim_bwd_ms},
                 {"bytes_sent", r.bytes}, {"speedup_vs_best_static", speed}, {"check_max_rel_err", r.check_err},
                 {"plan_hash", r.plan_hash}});
    // Energy of GPU 0 per layer and pass: TFLOP per kJ counts that GPU's share of the mask-area FLOPs.
    const auto energy = [&](const char* pass, const std::optional<Row::Energy>& e, double tflops, double ms) {
      if (!e) return;
      const double tflop_per_kj = e->joules > 0 ? tflops * ms * 1e-3 / e->joules * 1e3 : 0.0;
      std::cout << fmt::format("  {} {}: {:.3f} J a layer, {:.0f} W, SM clock {:.0f} MHz, {:.0f} TFLOP per kJ\n", r.method,
                               pass, e->joules, e->watts, e->mhz, tflop_per_kj);
      j.back()[std::string(pass) + "_energy"] = {{"joules_per_layer", e->joules}, {"watts", e->watts},
                                                 {"sm_clock_mhz", e->mhz}, {"tflop_per_kj", tflop_per_kj}};
    };
    energy("fwd", r.fwd_energy, r.fwd_tflops, r.fwd_ms);
    energy("bwd", r.bwd_energy, r.bwd_tflops, r.bwd_ms);
  }
  if (!args.json.empty()) {
    nlohmann::json out = {{"tokens", batch.total_tokens()}, {"sequences", batch.sequences.size()},
                          {"profile", args.batch.lengths_file.empty() ? args.batch.profile : std::string("lengths")},
                          {"source", batch_source_label(args.batch)}, {"mask", mask_label({batch})}, {"world", world},
                          {"backend", backend->name()}, {"layers", args.layers}, {"block", args.blocks.block_size},
                          {"search", args.search}, {"balance_time", args.balance_time},
                          {"outputs_in_place", args.outputs_in_place},
                          {"cluster", cluster.name}, {"calibration", args.calibration},
                          {"sim_calibration", calibration.name}, {"rows", j}};
    std::ofstream(args.json) << out.dump(2) << "\n";
  }
  for (const Row& r : rows)
    if (r.check_err > 2e-2) return kExitCheckFailed;
  return kExitOk;
}

int run_bench(const BenchArgs& args) {
  std::unique_ptr<MpiSession> session;
  if (mpi_available()) {
    StartupWatchdog watchdog(args.timeout_s, "dcp bench");
    session = std::make_unique<MpiSession>(nullptr, nullptr);
  }
  int world = 1;
  try {
    return bench_main(args, world);
  } catch (const std::exception& e) {
    if (world <= 1) throw;
    // One rank's error would leave the others waiting: report it and end the job with its code.
    const int code = exit_code_of(e);
    std::cerr << "dcp bench: " << error_text(e) << "\n" << std::flush;
    mpi_abort_world(code);
    return code;
  }
}

}  // namespace

void register_bench(CLI::App& app, Runner& runner) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* sub = app.add_subcommand(
      "bench", "Run a batch's plans (dcp and every static baseline) on GPUs: time, TFLOP/s per GPU, vs the simulator");
  add_batch_options(sub, args->batch);
  add_cluster_options(sub, args->cluster);
  add_block_options(sub, args->blocks);
  sub->add_option("--method", args->methods, "Only these placements (repeatable)");
  sub->add_option("--trace", args->trace,
                  "Write PREFIX.<method>.rank<r>.json (measured per-instruction timeline, one extra step) and "
                  "PREFIX.<method>.sim.json (the simulator's prediction of the same plan), Chrome/Perfetto format");
  sub->add_option("--eps-compute", args->placement.eps_compute, "DCP per-device compute tolerance")->capture_default_str();
  sub->add_option("--eps-memory", args->placement.eps_memory, "DCP per-device memory tolerance")->capture_default_str();
  sub->add_option("--layers", args->layers, "Layers per step (forward all, then backward all)")
      ->capture_default_str()
      ->check(int_range(1, 2000));
  sub->add_option("--warmup", args->warmup, "Untimed steps")->capture_default_str()->check(int_range(0, 100000));
  sub->add_option("--iters", args->iters, "Timed steps (median reported)")->capture_default_str()->check(int_range(1, 100000));
  sub->add_option("--stages", args->stages, "Communication stages of the schedule")
      ->capture_default_str()
      ->check(int_range(1, 64));
  add_outputs_in_place_option(sub, args->outputs_in_place);
  sub->add_option("--backend", args->backend, "cuda or cpu")->capture_default_str();
  sub->add_flag("--verbose", args->verbose, "Progress of every rank on stderr");
  sub->add_option("--timeout", args->timeout_s, "Seconds every communication wait may take")
      ->capture_default_str()
      ->check(seconds_option());
  sub->add_flag("--check", args->check, "Compare outputs with the CPU backend (small batches)");
  sub->add_option("--json", args->json, "Also write the results as JSON to this file");
  sub->add_option("--calibration", args->calibration,
                  "Kernel calibration JSON for the sim columns and --search (default: the cluster's rates)");
  sub->add_flag("--search", args->search,
                "Plan dcp with the planner's search over --search-blocks x --search-eps by simulated time "
                "(baselines keep --block)");
  sub->add_flag("--balance-time", args->balance_time,
                "dcp: balance predicted kernel time (tile weights from the calibration's per-kind rates) "
                "instead of FLOPs (--search always does)");
  sub->add_option("--search-blocks", args->search_blocks, "Block size candidates of --search")->capture_default_str();
  sub->add_option("--search-eps", args->search_eps, "Compute tolerance candidates of --search")->capture_default_str();
  sub->add_option("--energy-iters", args->energy_iters,
                  "After the timed steps, N more steps of each pass with GPU 0's energy counter (NVML) read around "
                  "them: joules per layer, watts, SM clock and TFLOP per kJ (on one rank, more steps until they fill 2 s: the "
                  "counter's updates would blur a shorter window; on several, exactly N: choose N for 2 s or more)")
      ->capture_default_str()
      ->check(int_range(0, 100000));
  sub->add_flag("--dcp-only", args->dcp_only,
                "With --search: DCP's own placements only (by default the static layouts are candidates too, "
                "so the choice is never predicted slower than they are)");
  sub->callback([args, &runner] { runner = [args] { return run_bench(*args); }; });
}

}  // namespace dcp::cli
