// dcp plan — cut a batch into blocks, place it with every available method, and compare.
#include <chrono>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"
#include "dcp/baselines.h"
#include "dcp/error.h"
#include "dcp/io.h"
#include "dcp/metrics.h"
#include "dcp/partition.h"
#include "dcp/plan.h"
#include "dcp/sim.h"
#include "table.h"

#if __has_include("dcp/plan_svg.h")
#include "dcp/plan_svg.h"
#define DCP_CLI_HAVE_PLAN_SVG 1
#endif

namespace dcp::cli {
namespace {

struct PlanArgs {
  BatchSource batch;
  ClusterSource cluster;
  BlockOptions blocks;
  bool json = false;
  std::string write_batch;
  std::vector<std::string> methods;
  std::vector<std::string> partitioners{"builtin"};
  PlacementOptions placement;
  std::string export_hgr;
  int stages = 4;
  bool outputs_in_place = PlanOptions{}.outputs_in_place;
  std::string plan_method = "dcp";  // whose plan --save-plan / --dump / --svg use
  std::string save_plan;
  bool dump = false;
  std::string svg;
  int64_t max_tiles = kDefaultMaxTiles;
};

struct MethodResult {
  std::string method;
  std::string note;
  PlacementMetrics metrics;
  double plan_ms = 0;
  std::vector<std::string> violations;
  // What the executor allocates per device for this placement's plan (plan_memory: the one
  // sizing formula), local tensors + the larger pass's slot arrays after liveness reuse.
  std::vector<int64_t> plan_memory_bytes;
  std::string skipped = {};  // why the placement was not made (tile budget); nothing else is set
  double plan_memory_imbalance() const {
    if (plan_memory_bytes.empty()) return 1.0;
    double sum = 0, mx = 0;
    for (int64_t b : plan_memory_bytes) {
      sum += static_cast<double>(b);
      mx = std::max(mx, static_cast<double>(b));
    }
    return sum > 0 ? mx / (sum / static_cast<double>(plan_memory_bytes.size())) : 1.0;
  }
};

MethodResult skipped_result(const std::string& method, const std::string& why) {
  MethodResult r;
  r.method = method;
  r.skipped = why;
  return r;
}

std::vector<int64_t> plan_peaks(const BlockTable& table, const Placement& placement, const Cluster& cluster,
                                const PlanOptions& opts) {
  const Plan plan = build_plan(table, placement, cluster, opts);
  std::vector<int64_t> out;
  for (int d = 0; d < plan.header.world_size; ++d) out.push_back(plan_memory(plan, d).peak_bytes);
  return out;
}

// The picture includes the simulated time, so people see cost beside the geometry.
void write_plan_svg(const Plan& plan, const Cluster& cluster, const std::string& path) {
#ifdef DCP_CLI_HAVE_PLAN_SVG
  SimOptions so;
  so.calibration = calibration_from_cluster(cluster);
  const SimResult sim = simulate(plan, cluster, so);
  write_svg(plan, path, SvgOptions{}, &sim);
#else
  (void)plan, (void)cluster;
  raise(ErrorKind::Unsupported, "--svg " + path + ": this build has no plan SVG writer (dcp/plan_svg.h)");
#endif
}

nlohmann::json to_json(const MethodResult& r) {
  if (!r.skipped.empty()) return {{"method", r.method}, {"skipped", r.skipped}};
  nlohmann::json devices = nlohmann::json::array();
  for (size_t i = 0; i < r.metrics.devices.size(); ++i) {
    const DeviceLoad& d = r.metrics.devices[i];
    devices.push_back({{"tokens", d.tokens},
                       {"tiles", d.num_tiles},
                       {"fwd_flops", d.fwd_flops},
                       {"bwd_flops", d.bwd_flops},
                       {"memory_bytes", d.memory_bytes},
                       {"memory_fwd_bytes", d.memory_fwd_bytes},
                       {"memory_bwd_bytes", d.memory_bwd_bytes},
                       {"send_bytes", d.send_bytes},
                       {"recv_bytes", d.recv_bytes},
                       {"plan_memory_bytes", r.plan_memory_bytes.at(i)}});
  }
  const auto& m = r.metrics;
  return {{"method", r.method},
          {"note", r.note},
          {"plan_ms", r.plan_ms},
          {"compute_imbalance", m.compute_imbalance},
          {"memory_imbalance", m.memory_imbalance},
          {"plan_memory_imbalance", r.plan_memory_imbalance()},
          {"intra_bytes", m.intra_bytes()},
          {"inter_bytes", m.inter_bytes()},
          {"intra_bytes_fwd", m.intra_bytes_fwd},
          {"inter_bytes_fwd", m.inter_bytes_fwd},
          {"intra_bytes_bwd", m.intra_bytes_bwd},
          {"inter_bytes_bwd", m.inter_bytes_bwd},
          {"bytes_per_token", m.bytes_per_token()},
          {"violations", r.violations},
          {"devices", devices}};
}

int run_plan(const PlanArgs& args) {
  const Batch batch = resolve_batch(args.batch);
  batch.validate();
  const Cluster cluster = resolve_cluster(args.cluster);
  args.blocks.validate(batch.shape);
  args.placement.validate();
  const PlanOptions plan_opts = plan_options_for(args.stages, args.outputs_in_place);
  check_method(args.plan_method, "--plan-method");
  check_methods(args.methods, "--method");
  for (const std::string& p : args.partitioners) (void)parse_partitioner(p);
  const bool want_plan = !args.save_plan.empty() || args.dump || !args.svg.empty();
  if (!args.write_batch.empty()) save_batch(batch, args.write_batch);
  PlacedBatch chosen;  // the placement of --plan-method, when a plan is wanted

  auto t0 = std::chrono::steady_clock::now();
  const BlockTable table = build_block_table(batch, args.blocks);
  const double table_ms = ms_since(t0);

  std::vector<MethodResult> results;
  auto wanted = [&](const std::string& name) {
    return args.methods.empty() || std::find(args.methods.begin(), args.methods.end(), name) != args.methods.end();
  };
  for (const std::string& backend : args.partitioners) {
    PlacementOptions popts = args.placement;
    popts.partitioner = parse_partitioner(backend);
    const std::string name = args.partitioners.size() == 1 ? "dcp" : "dcp-" + backend;
    if (!wanted(name) && !wanted("dcp")) continue;
    if (std::string why = tile_budget_note("dcp", {batch}, args.blocks, cluster, args.max_tiles); !why.empty()) {
      results.push_back(skipped_result(name, why));
      continue;
    }
    auto t1 = std::chrono::steady_clock::now();
    DcpPlacement dcp = place_dcp(table, cluster, popts);
    const double ms = ms_since(t1) + table_ms;  // planning = block table + partition
    MethodResult r{name, dcp.placement.note, compute_metrics(table, dcp.placement, cluster), ms,
                   dcp.report.violations, plan_peaks(table, dcp.placement, cluster, plan_opts)};
    if (want_plan && args.plan_method == "dcp" && chosen.placement.num_devices == 0) chosen = {table, dcp.placement};
    results.push_back(std::move(r));
  }
  if (!args.export_hgr.empty()) {
    std::ofstream out(args.export_hgr);
    if (!out) raise(ErrorKind::InvalidInput, "--export-hgr: cannot write " + args.export_hgr);
    const PlacementHypergraph h = build_placement_hypergraph(table);
    write_hgr(h, HgrOptions{}, out);
    // Both vertex weights (compute and owned memory) beside the .hgr, which carries one.
    std::ofstream weights(args.export_hgr + ".weights");
    if (!weights) raise(ErrorKind::InvalidInput, "--export-hgr: cannot write " + args.export_hgr + ".weights");
    write_vertex_weights(h, weights);
  }
  for (BaselineKind kind : all_baselines()) {
    const std::string name = to_string(kind);
    if (!wanted(name)) continue;
    if (std::string why = tile_budget_note(name, {batch}, args.blocks, cluster, args.max_tiles); !why.empty()) {
      results.push_back(skipped_result(name, why));
      continue;
    }
    auto t1 = std::chrono::steady_clock::now();
    PlacedBatch placed = make_baseline(kind, batch, args.blocks, cluster);
    const double ms = ms_since(t1);
    if (want_plan && args.plan_method == name) chosen = placed;
    results.push_back({name, placed.placement.note, compute_metrics(placed.table, placed.placement, cluster), ms, {},
                       plan_peaks(placed.table, placed.placement, cluster, plan_opts)});
  }

  if (want_plan) {
    if (chosen.placement.num_devices == 0) {  // filtered out by --method or skipped: place it now
      if (std::string why = tile_budget_note(args.plan_method, {batch}, args.blocks, cluster, args.max_tiles);
          !why.empty())
        raise(ErrorKind::InvalidInput, "--plan-method " + args.plan_method + ": " + why);
      chosen = place_method(args.plan_method, batch, args.blocks, cluster, args.placement).placed;
    }
    const Plan plan = build_plan(chosen.table, chosen.placement, cluster, plan_opts);
    if (!args.save_plan.empty()) save_plan(plan, args.save_plan);
    if (!args.svg.empty()) write_plan_svg(plan, cluster, args.svg);
    if (args.dump) {
      std::cout << plan_to_json(plan, true) << "\n";
      return 0;
    }
  }

  if (args.json) {
    nlohmann::json out;
    out["batch"] = {{"sequences", batch.sequences.size()},
                    {"tokens", batch.total_tokens()},
                    {"tiles", table.tiles.size()},
                    {"mask_area", batch.mask_area()},
                    {"forward_flops", batch.forward_flops()},
                    {"backward_flops", 2.5 * batch.forward_flops()},
                    {"heads", {{"q", batch.shape.q_heads}, {"kv", batch.shape.kv_heads}, {"dim", batch.shape.head_dim}}},
                    {"dtype", to_string(batch.shape.dtype)}};
    out["block_size"] = args.blocks.block_size;
    out["block_table_ms"] = table_ms;
    out["cluster"] = {{"name", cluster.name},
                      {"nodes", cluster.nodes},
                      {"devices_per_node", cluster.devices_per_node},
                      {"devices", cluster.num_devices()}};
    out["placements"] = nlohmann::json::array();
    for (const auto& r : results) out["placements"].push_back(to_json(r));
    std::cout << out.dump(2) << "\n";
    return 0;
  }

  std::cout << fmt::format("batch: {} sequences, {} tokens, {} tiles at B={} ({} head groups), mask area {} pairs/head, "
                           "{} fwd\n",
                           batch.sequences.size(), batch.total_tokens(), table.tiles.size(), args.blocks.block_size,
                           table.groups.num_groups, batch.mask_area(), human_flops(batch.forward_flops()));
  std::cout << fmt::format("cluster: {} x {} devices ({}), block table built in {:.1f} ms\n\n", cluster.nodes,
                           cluster.devices_per_node, cluster.name, table_ms);
  Table t({"placement", "compute imb", "memory imb", "plan peak mem", "plan mem imb", "intra bytes", "inter bytes",
           "bytes/token", "time ms"});
  for (const auto& r : results) {
    if (!r.skipped.empty()) {
      t.add_row({r.method, "-", "-", "-", "-", "-", "-", "-", "-"});
      continue;
    }
    const auto& m = r.metrics;
    const int64_t peak = r.plan_memory_bytes.empty()
                             ? 0
                             : *std::max_element(r.plan_memory_bytes.begin(), r.plan_memory_bytes.end());
    t.add_row({r.method, fixed(m.compute_imbalance, 3), fixed(m.memory_imbalance, 3),
               human_bytes(static_cast<double>(peak)), fixed(r.plan_memory_imbalance(), 3),
               human_bytes(static_cast<double>(m.intra_bytes())), human_bytes(static_cast<double>(m.inter_bytes())),
               fixed(m.bytes_per_token(), 1), fixed(r.plan_ms, 1)});
  }
  std::cout << t.render();
  std::cout << "\nimbalance = max/mean per device (compute: fwd+bwd FLOPs; memory: owned + received + partials,\n"
               "counted from the placement). plan peak mem = what the executor allocates on the busiest device\n"
               "for this placement's plan (owned tensors + slot arrays after liveness reuse; plan_memory()).\n"
               "bytes = forward + backward traffic (inputs to remote tiles, fp32 partials back to owners).\n";
  for (const auto& r : results) {
    if (!r.skipped.empty()) std::cout << fmt::format("  {}: {}\n", r.method, r.skipped);
    if (!r.note.empty()) std::cout << fmt::format("  {}: {}\n", r.method, r.note);
    for (const auto& v : r.violations) std::cout << fmt::format("  {}: BALANCE VIOLATED: {}\n", r.method, v);
  }
  return 0;
}

}  // namespace

void register_plan(CLI::App& app, Runner& runner) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* sub = app.add_subcommand("plan", "Place a batch with DCP and every static baseline; compare their costs");
  add_batch_options(sub, args->batch);
  add_cluster_options(sub, args->cluster);
  add_block_options(sub, args->blocks);
  sub->add_flag("--json", args->json, "Print one JSON object instead of tables");
  sub->add_option("--write-batch", args->write_batch, "Also write the batch used as JSON to this file");
  sub->add_option("--method", args->methods,
                  "Only these placements (repeatable): dcp, ring, zigzag, ulysses, a2a_p2p, packing");
  sub->add_option("--partitioner", args->partitioners,
                  "DCP partitioner backend(s): builtin, metis, zoltan (repeatable: one row each)")
      ->capture_default_str();
  sub->add_option("--eps-compute", args->placement.eps_compute, "Per-device compute tolerance (max <= (1+eps) x mean)")
      ->capture_default_str();
  sub->add_option("--eps-memory", args->placement.eps_memory, "Per-device memory tolerance")->capture_default_str();
  sub->add_option("--placement-seed", args->placement.seed, "Seed of the partitioner's tie-breaking")
      ->capture_default_str()
      ->check(non_negative_integer());
  sub->add_option("--placement-threads", args->placement.threads,
                  "Threads of the built-in partitioner (the same placement on any count)")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  sub->add_option("--export-hgr", args->export_hgr,
                  "Also write the placement hypergraph in hMETIS format (docs/formats.md) to this file, and "
                  "both vertex weights (compute, memory) to FILE.weights");
  add_stages_option(sub, args->stages);
  add_outputs_in_place_option(sub, args->outputs_in_place);
  add_max_tiles_option(sub, args->max_tiles);
  sub->add_option("--plan-method", args->plan_method, "Placement whose plan --save-plan, --dump and --svg use")
      ->capture_default_str();
  sub->add_option("--save-plan", args->save_plan, "Write the binary plan (docs/formats.md) to this file");
  sub->add_flag("--dump", args->dump, "Print the plan as JSON (header, memory, programs) instead of the tables");
  sub->add_option("--svg", args->svg, "Draw the plan (tile grids by device, memory and compute per device) as SVG");
  sub->callback([args, &runner] { runner = [args] { return run_plan(*args); }; });
}

}  // namespace dcp::cli
