// dcp simulate — plan DCP and every static baseline for a stream of batches, predict their
// attention time on a cluster with the event-driven simulator (sim.h), and compare; or, with
// --sweep, reproduce the paper's dry-run studies (sweep.cpp).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"
#include "dcp/error.h"
#include "dcp/metrics.h"
#include "dcp/plan.h"
#include "dcp/planner.h"
#include "dcp/sim.h"
#include "dcp/validate.h"
#include "layer_kinds.h"
#include "sweep.h"
#include "table.h"

namespace dcp::cli {
namespace {

struct SimulateArgs {
  SweepInputs in;
  std::vector<std::string> methods;
  int stages = 4;
  bool outputs_in_place = PlanOptions{}.outputs_in_place;
  std::string calibration;
  std::string trace;
  bool validate = false;
  bool search = false;
  std::vector<int64_t> search_blocks{1024, 2048, 4096};
  std::vector<double> search_eps{0.02, 0.05, 0.1};
  int search_reseed = 0;
  int search_tighten = 0;
  int search_threads = 0;  // 0: every core (search_thread_count)
  bool dcp_only = false;  // --search without the static layouts among the candidates
  int64_t max_tiles = kDefaultMaxTiles;
  std::string layer_masks;  // --layer-masks: several masks over the layers (layer_kinds.h)
  bool same_kind_blocks = false;  // --same-kind-blocks: StepPlanOptions::kinds_finer_blocks off
};

struct MethodTotals {
  std::string method;
  double fwd_s = 0, bwd_s = 0, comm_s = 0, exposed_s = 0, plan_ms = 0;
  int64_t intra_bytes = 0, inter_bytes = 0;
  std::vector<double> fwd_per_batch, bwd_per_batch;
  std::vector<std::string> notes;  // balance violations, per batch
  std::vector<std::string> choices;  // --search: what the planner chose, per batch
  double total_s() const { return fwd_s + bwd_s; }
  double hidden() const { return comm_s > 0 ? 1.0 - exposed_s / comm_s : 1.0; }
};

int run_simulate(const SimulateArgs& args) {
  if (!args.in.sweep.empty()) return run_sweep(args.in);
  if (!args.in.svg.empty())
    raise(ErrorKind::InvalidInput, "--svg: charts come with --sweep (for a picture of one plan: dcp plan --svg)");
  const SweepInputs& in = args.in;
  const std::vector<Batch> batches = resolve_batches(in.batch, in.batches);
  const Cluster cluster = resolve_cluster(in.cluster);
  in.placement.validate();
  const PlanOptions popts = plan_options_for(args.stages, args.outputs_in_place);
  if (!args.layer_masks.empty()) {
    if (!args.trace.empty()) raise(ErrorKind::InvalidInput, "--trace: not with --layer-masks");
    LayerKindsInputs k;
    k.in = in;
    k.pattern = parse_layer_pattern(args.layer_masks);
    k.methods = args.methods;
    k.plan = popts;
    k.calibration = args.calibration.empty() ? calibration_from_cluster(cluster) : load_calibration(args.calibration);
    k.search = args.search;
    k.search_blocks = args.search_blocks;
    k.search_eps = args.search_eps;
    k.search_reseed = args.search_reseed;
    k.search_tighten = args.search_tighten;
    k.search_threads = search_thread_count(args.search_threads);
    k.dcp_only = args.dcp_only;
    k.finer_blocks = !args.same_kind_blocks;
    return run_layer_kinds(k);
  }
  std::vector<std::string> methods = args.methods.empty() ? all_methods() : args.methods;
  for (const auto& m : methods) check_method(m, "--method");
  std::vector<std::string> skipped;
  std::erase_if(methods, [&](const std::string& m) {
    std::string why = tile_budget_note(m, batches, in.blocks, cluster, args.max_tiles);
    if (!why.empty()) skipped.push_back(m + ": " + why);
    return !why.empty();
  });
  for (const std::string& why : skipped) std::cerr << "dcp simulate: " << why << "\n";
  if (methods.empty()) raise(ErrorKind::InvalidInput, "dcp simulate: every placement is over --max-tiles");
  // DCP first: the speed-ups are relative to it.
  std::stable_partition(methods.begin(), methods.end(), [](const std::string& m) { return m == "dcp"; });
  SimOptions so;
  so.calibration = args.calibration.empty() ? calibration_from_cluster(cluster) : load_calibration(args.calibration);
  for (const Batch& b : batches) {
    b.validate();
    in.blocks.validate(b.shape);
  }

  std::vector<MethodTotals> totals(methods.size());
  for (size_t m = 0; m < methods.size(); ++m) totals[m].method = methods[m];
  for (size_t b = 0; b < batches.size(); ++b) {
    for (size_t m = 0; m < methods.size(); ++m) {
      Progress::show(in.progress, fmt::format("batch {}/{}: {}", b + 1, batches.size(), methods[m]));
      MethodTotals& t = totals[m];
      PlacedMethod placed;
      Plan plan;
      if (args.search && methods[m] == "dcp") {
        // The planner's choice among block sizes and compute tolerances, by simulated time.
        PlannerOptions search;
        search.block_sizes = args.search_blocks;
        search.eps_compute = args.search_eps;
        search.reseed_best = args.search_reseed;
        search.tighten_best = args.search_tighten;
        search.threads = search_thread_count(args.search_threads);
        search.placement = in.placement;
        search.plan = popts;
        search.calibration = so.calibration;
        if (args.dcp_only) search.static_layouts.clear();
        PlannedBatch pb = plan_batch(batches[b], cluster, search);
        placed.method = "dcp";
        placed.placed = PlacedBatch{std::move(pb.table), std::move(pb.placement.placement)};
        placed.violations = std::move(pb.placement.report.violations);
        plan = std::move(pb.plan);
        t.plan_ms += pb.search_s * 1e3;
        t.choices.push_back(fmt::format("batch {}: planner chose {}", b, describe(pb.chosen)));
      } else {
        placed = place_method(methods[m], batches[b], in.blocks, cluster, in.placement);
        const auto t0 = std::chrono::steady_clock::now();
        plan = build_plan(placed.placed.table, placed.placed.placement, cluster, popts);
        t.plan_ms += placed.placement_ms + ms_since(t0);
      }
      if (args.validate) check_plan(plan);
      for (const auto& v : placed.violations) t.notes.push_back(fmt::format("batch {}: {}", b, v));
      const PlacementMetrics metrics = compute_metrics(placed.placed.table, placed.placed.placement, cluster);
      t.intra_bytes += metrics.intra_bytes();
      t.inter_bytes += metrics.inter_bytes();
      SimOptions one = so;
      one.trace = !args.trace.empty() && b == 0 && methods[m] == "dcp";
      const SimResult sim = simulate(plan, cluster, one);
      t.fwd_s += sim.fwd_s;
      t.bwd_s += sim.bwd_s;
      t.comm_s += sim.comm_s;
      t.exposed_s += sim.exposed_comm_s;
      t.fwd_per_batch.push_back(sim.fwd_s);
      t.bwd_per_batch.push_back(sim.bwd_s);
      if (one.trace) {
        std::ofstream out(args.trace);
        if (!out) raise(ErrorKind::InvalidInput, "--trace: cannot write " + args.trace);
        out << sim.trace_json;
      }
    }
  }
  Progress::clear(in.progress);
  if (!args.trace.empty() && methods.front() != "dcp")
    raise(ErrorKind::InvalidInput, "--trace: the trace is of the DCP plan; add --method dcp");

  const MethodTotals* dcp = methods.front() == "dcp" ? &totals.front() : nullptr;
  const double n = static_cast<double>(batches.size());
  struct Speedup {
    double mean = 0, lo = 0, hi = 0;
  };
  auto speedup = [&](const MethodTotals& t) {
    Speedup s;
    if (!dcp || dcp->total_s() <= 0) return s;
    s.mean = t.total_s() / dcp->total_s();
    s.lo = 1e300, s.hi = 0;
    for (size_t b = 0; b < batches.size(); ++b) {
      const double r = (t.fwd_per_batch[b] + t.bwd_per_batch[b]) / (dcp->fwd_per_batch[b] + dcp->bwd_per_batch[b]);
      s.lo = std::min(s.lo, r), s.hi = std::max(s.hi, r);
    }
    return s;
  };

  if (in.json) {
    nlohmann::json out;
    out["batches"] = batches.size();
    out["tokens_per_batch"] = batches.front().total_tokens();
    out["cluster"] = {{"name", cluster.name},
                      {"nodes", cluster.nodes},
                      {"devices_per_node", cluster.devices_per_node},
                      {"devices", cluster.num_devices()}};
    out["calibration"] = so.calibration.name;
    out["stages"] = args.stages + 1;
    out["block_size"] = in.blocks.block_size;
    out["methods"] = nlohmann::json::array();
    for (const auto& t : totals) {
      const Speedup s = speedup(t);
      nlohmann::json per = nlohmann::json::array();
      for (size_t b = 0; b < batches.size(); ++b)
        per.push_back({{"fwd_ms", t.fwd_per_batch[b] * 1e3}, {"bwd_ms", t.bwd_per_batch[b] * 1e3}});
      out["methods"].push_back({{"method", t.method},
                                {"fwd_ms", t.fwd_s / n * 1e3},
                                {"bwd_ms", t.bwd_s / n * 1e3},
                                {"total_ms", t.total_s() / n * 1e3},
                                {"dcp_speedup", s.mean},
                                {"dcp_speedup_min", s.lo},
                                {"dcp_speedup_max", s.hi},
                                {"comm_hidden_fraction", t.hidden()},
                                {"intra_bytes", static_cast<double>(t.intra_bytes) / n},
                                {"inter_bytes", static_cast<double>(t.inter_bytes) / n},
                                {"plan_ms", t.plan_ms / n},
                                {"notes", t.notes},
                                {"planner_choices", t.choices},
                                {"per_batch", per}});
    }
    std::cout << out.dump(2) << "\n";
    return 0;
  }

  std::cout << fmt::format("{} batch(es) of ~{} tokens ({}, {} mask), B={}, {} stages\n", batches.size(),
                           batches.front().total_tokens(), batch_source_label(in.batch),
                           mask_label(batches), in.blocks.block_size, args.stages + 1);
  std::cout << fmt::format("cluster: {} x {} devices ({}), calibration {}\n\n", cluster.nodes, cluster.devices_per_node,
                           cluster.name, so.calibration.name);
  Table t({"method", "fwd ms", "bwd ms", "fwd+bwd ms", "DCP speed-up", "range", "comm hidden", "inter bytes",
           "plan ms"});
  for (const auto& m : totals) {
    const Speedup s = speedup(m);
    const bool base = dcp && &m != dcp;
    t.add_row({m.method, fixed(m.fwd_s / n * 1e3, 2), fixed(m.bwd_s / n * 1e3, 2), fixed(m.total_s() / n * 1e3, 2),
               base ? fmt::format("{:.2f}x", s.mean) : "-", base ? fmt::format("{:.2f}-{:.2f}x", s.lo, s.hi) : "-",
               fmt::format("{:.0f}%", 100 * m.hidden()), human_bytes(static_cast<double>(m.inter_bytes) / n),
               fixed(m.plan_ms / n, 1)});
  }
  std::cout << t.render();
  std::cout << "\ntimes: predicted attention time of the slowest device, mean per batch.\n"
               "DCP speed-up = method's fwd+bwd time / DCP's (summed over batches; range over batches).\n"
               "comm hidden = share of transfer time overlapped with compute.\n";
  for (const auto& m : totals) {
    for (const auto& v : m.notes) std::cout << fmt::format("  {}: BALANCE VIOLATED: {}\n", m.method, v);
    for (const auto& c : m.choices) std::cout << fmt::format("  {}: {}\n", m.method, c);
  }
  if (!args.trace.empty()) std::cout << "trace of DCP's plan of batch 0: " << args.trace << " (chrome://tracing, ui.perfetto.dev)\n";
  return 0;
}

}  // namespace

void Progress::show(bool enabled, const std::string& what) {
  if (!enabled) return;
  std::fprintf(stderr, "\r\033[K%s", what.c_str());
  std::fflush(stderr);
}

void Progress::clear(bool enabled) {
  if (!enabled) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
}

void register_simulate(CLI::App& app, Runner& runner) {
  auto args = std::make_shared<SimulateArgs>();
  CLI::App* sub = app.add_subcommand(
      "simulate", "Predict DCP's and every static baseline's attention time over a stream of batches; --sweep for "
                  "the paper's dry-run studies");
  add_batch_options(sub, args->in.batch);
  add_cluster_options(sub, args->in.cluster);
  add_block_options(sub, args->in.blocks);
  add_stages_option(sub, args->stages);
  add_outputs_in_place_option(sub, args->outputs_in_place);
  add_max_tiles_option(sub, args->max_tiles);
  sub->add_option("--batches", args->in.batches, "Batches of the stream to plan and simulate (from --index on)")
      ->capture_default_str()
      ->check(int_range(1, 100000));
  sub->add_option("--method", args->methods, "Only these placements (repeatable): dcp, ring, zigzag, ulysses, "
                                             "a2a_p2p, packing");
  sub->add_option("--calibration", args->calibration,
                  "Kernel calibration JSON (data/calibration/*.json; default: the cluster's rates)");
  sub->add_option("--trace", args->trace, "Write the Chrome/Perfetto trace of DCP's plan of the first batch");
  sub->add_flag("--search", args->search,
                "DCP: let the planner pick the block size, compute tolerance and schedule by simulated "
                "time (candidates: --search-blocks (on sink masks each also with the sink split) x "
                "--search-eps, each planned with the planner's schedules (8 on one node, 12 across nodes, and "
                "each pass's fastest together); plan ms then includes the search)");
  sub->add_option("--search-blocks", args->search_blocks, "Block size candidates of --search")->capture_default_str();
  sub->add_option("--search-eps", args->search_eps, "Compute tolerance candidates of --search")->capture_default_str();
  sub->add_option("--search-reseed", args->search_reseed,
                  "With --search: place the best candidate again with this many further seeds")
      ->capture_default_str()
      ->check(CLI::Range(0, 64));
  sub->add_option("--search-tighten", args->search_tighten,
                  "With --search: walk this many of the best placements down to tighter compute bounds "
                  "(0.07, 0.05, 0.03), their token homes kept")
      ->capture_default_str()
      ->check(CLI::Range(0, 64));
  sub->add_option("--search-threads", args->search_threads,
                  "With --search: threads of the search (0: every core of this machine); the plan chosen "
                  "does not depend on it, only how long the search takes")
      ->capture_default_str()
      ->check(CLI::Range(0, 256));
  sub->add_flag("--dcp-only", args->dcp_only,
                "With --search: DCP's own placements only (by default the static layouts are candidates too, "
                "so the choice is never predicted slower than they are)");
  sub->add_option("--layer-masks", args->layer_masks,
                  "A model whose layers use several masks: kinds joined by '+', each repeated by '*N' "
                  "(lambda*3+causal: three sliding-window layers per global one). Every method plans all kinds "
                  "on one token placement; the table gives each kind's time, the step's over all layers, and "
                  "DCP with every kind placed alone beside them (--mask is then ignored)");
  sub->add_flag("--same-kind-blocks", args->same_kind_blocks,
                "With --layer-masks: every kind on the lead kind's token blocks (by default each other kind also "
                "tries them cut into 2 and 4 pieces on the same devices and keeps the fastest)");
  sub->add_flag("--validate", args->validate, "Also validate every plan (symbolic execution) before simulating");
  sub->add_option("--eps-compute", args->in.placement.eps_compute, "DCP per-device compute tolerance")
      ->capture_default_str();
  sub->add_option("--eps-memory", args->in.placement.eps_memory, "DCP per-device memory tolerance")
      ->capture_default_str();
  sub->add_option("--sweep", args->in.sweep,
                  "Dry-run study instead of the comparison: block (volume and planning time vs block size), mask "
                  "(volume vs lambda window), eps (volume vs imbalance tolerance)")
      ->check(CLI::IsMember({"block", "mask", "eps"}));
  sub->add_option("--svg", args->in.svg, "With --sweep: draw the study's line charts as SVG");
  sub->add_flag("--json", args->in.json, "Print one JSON object instead of tables");
  sub->callback([args, &runner] {
    args->in.progress = isatty(STDERR_FILENO) != 0;
    runner = [args] { return run_simulate(*args); };
  });
}

}  // namespace dcp::cli
