// compare_partitioners: the built-in placement against outside hypergraph partitioners on the
// same instances, objective and constraints. The outside partitioners (KaHyPar, Mt-KaHyPar) run
// from bench/compare_partitioners.py; this program writes the instances and scores every
// partition with the library's own measure (connectivity_bytes, check_balance), so that every
// method is judged by one piece of code.
//
//   compare_partitioners export DIR [--profiles ldc,longalign] [--masks causal,...]
//                        [--nodes 2,4,8,16] [--seeds 1] [--repeat 3] [--threads 2]
//                        [--set name=value,...]
//     Per instance NAME (profile_mask_NxD_sSEED), writes into DIR:
//       NAME.hgr      hMETIS hypergraph (write_hgr): net weight = bytes / 1 KiB, vertex weight =
//                     compute FLOPs / 1e6
//       NAME.weights  exact vertex weights, one line per vertex: "compute_flops memory_bytes"
//                     (write_vertex_weights: the memory constraint the .hgr cannot carry)
//       NAME.fix      hMETIS fixed-vertex file: the device of every token block in the built-in
//                     placement, -1 for tiles (write_fixed_homes)
//       NAME.json     the cluster, the bounds, and the built-in's and the static baselines'
//                     results (objective, bytes, balance); the built-in's planning time
//                     (block table + placement), fastest of --repeat, on one thread (process
//                     CPU and wall time) and on --threads threads (PlacementOptions::threads;
//                     wall time), the two alternating; the placements of both must be equal
//                     (the export fails otherwise)
//   compare_partitioners report DIR [--md PATH] [--json PATH]
//     Scores every DIR/NAME.METHOD.part (one device per vertex, 0-based) with its time from
//     DIR/NAME.METHOD.time (seconds), prints one table and writes it as Markdown / JSON.
//
// Instances: tokens = 4096 x devices (65536 on 2 x 8 ... 524288 on 16 x 8), B = 1024, 8 query /
// 2 KV heads, head dim 128, bf16, a100-p4d links (inter-node weight 24), eps_compute 0.1,
// eps_memory 0.2; one batch of generate_batches per seed.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "dcp/baselines.h"
#include "dcp/blocks.h"
#include "dcp/error.h"
#include "dcp/metrics.h"
#include "dcp/partition.h"
#include "dcp/profiles.h"

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

struct Instance {
  std::string profile, mask;
  int nodes = 2;
  uint64_t seed = 1;
  std::string name() const {
    return fmt::format("{}_{}_{}x8_s{}", profile, mask, nodes, seed);
  }
};

constexpr int kDevicesPerNode = 8;
constexpr int64_t kTokensPerDevice = 4096;
constexpr int64_t kBlockSize = 1024;

dcp::Cluster cluster_of(const Instance& in) {
  dcp::Cluster c = dcp::cluster_preset("a100-p4d", in.nodes);
  c.devices_per_node = kDevicesPerNode;
  return c;
}

dcp::Batch batch_of(const Instance& in) {
  dcp::ProfileOptions po;
  po.profile = dcp::parse_profile(in.profile);
  po.seed = in.seed;
  po.token_budget = kTokensPerDevice * in.nodes * kDevicesPerNode;
  po.mask = in.mask;
  po.shape = {.q_heads = 8, .kv_heads = 2, .head_dim = 128, .dtype = dcp::DType::BF16};
  return dcp::generate_batches(po, 1).front();
}

const dcp::BlockOptions kBlocks{.block_size = kBlockSize, .q_heads_per_group = 0};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');)
    if (!x.empty()) out.push_back(x);
  return out;
}

nlohmann::json score(const dcp::PlacementHypergraph& h, const std::vector<int32_t>& parts,
                     const dcp::Cluster& c, const dcp::PlacementOptions& po) {
  const dcp::ConnectivityBytes b = dcp::connectivity_bytes(h, parts, c);
  dcp::PlacementReport r;
  const std::vector<std::string> v = dcp::check_balance(h, parts, c, po, r);
  return {{"objective", b.objective},
          {"inter_bytes", b.inter_bytes},
          {"intra_bytes", b.intra_bytes},
          {"compute_imbalance", r.compute_imbalance},
          {"memory_imbalance", r.memory_imbalance},
          {"full_memory_imbalance", r.full_memory_imbalance},
          {"violations", v.size()},
          // Violations other than full memory (which the outside partitioners cannot see).
          {"hard_violations", std::count_if(v.begin(), v.end(), [](const std::string& x) {
             return x.find("received copies") == std::string::npos;
           })},
          {"first_violation", v.empty() ? "" : v.front()}};
}

// `--set name=value,...`: placement options by name, to measure a tuning constant.
dcp::PlacementOptions options_from(const std::string& set) {
  dcp::PlacementOptions po;
  for (const std::string& kv : split(set)) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) dcp::raise(dcp::ErrorKind::InvalidInput, "--set: expected name=value, got " + kv);
    const std::string k = kv.substr(0, eq);
    const double v = std::stod(kv.substr(eq + 1));
    if (k == "seed") po.seed = static_cast<uint64_t>(v);
    else if (k == "initial_starts") po.initial_starts = static_cast<int>(v);
    else if (k == "node_candidate_margin") po.node_candidate_margin = v;
    else if (k == "candidate_refine_margin") po.candidate_refine_margin = v;
    else if (k == "global_refinement") po.global_refinement = v != 0;
    else if (k == "full_memory_rounds") po.full_memory_rounds = static_cast<int>(v);
    else if (k == "full_memory_target_first") po.full_memory_target_first = v;
    else if (k == "full_memory_target_later") po.full_memory_target_later = v;
    else if (k == "full_memory_fresh_always") po.full_memory_fresh_always = v != 0;
    else if (k == "large_vertices") po.large_vertices = static_cast<int32_t>(v);
    else if (k == "large_defer_fresh") po.large_defer_fresh = v != 0;
    else if (k == "threads") po.threads = static_cast<int>(v);
    else if (k == "multilevel.enabled") po.multilevel.enabled = v != 0;
    else if (k == "multilevel.vertices_per_part") po.multilevel.vertices_per_part = static_cast<int>(v);
    else if (k == "multilevel.cluster_compute_share") po.multilevel.cluster_compute_share = v;
    else if (k == "multilevel.cluster_memory_share") po.multilevel.cluster_memory_share = v;
    else if (k == "multilevel.node_deeper_vertices_per_part") po.multilevel.node_deeper_vertices_per_part = static_cast<int>(v);
    else if (k == "multilevel.max_shrink") po.multilevel.max_shrink = v;
    else if (k == "multilevel.max_rated_net_pins") po.multilevel.max_rated_net_pins = static_cast<int>(v);
    else if (k == "refine.passes") po.refine.passes = static_cast<int>(v);
    else if (k == "refine.min_pass_gain") po.refine.min_pass_gain = v;
    else if (k == "refine.min_pass_gain_all_devices") po.refine.min_pass_gain_all_devices = v;
    else if (k == "refine.idle_moves_share") po.refine.idle_moves_share = v;
    else if (k == "refine.idle_moves_min") po.refine.idle_moves_min = static_cast<int>(v);
    else if (k == "refine.idle_moves_max") po.refine.idle_moves_max = static_cast<int>(v);
    else if (k == "refine.idle_moves_share_all_devices") po.refine.idle_moves_share_all_devices = v;
    else if (k == "refine.idle_moves_min_all_devices") po.refine.idle_moves_min_all_devices = static_cast<int>(v);
    else dcp::raise(dcp::ErrorKind::InvalidInput, "--set: unknown option " + k);
  }
  po.validate();
  return po;
}

int cmd_export(const fs::path& dir, const std::vector<Instance>& instances, int repeat, int threads,
               const dcp::PlacementOptions& po) {
  fs::create_directories(dir);
  dcp::PlacementOptions one = po, many = po;
  one.threads = 1;
  many.threads = threads;
  for (const Instance& in : instances) {
    const dcp::Cluster c = cluster_of(in);
    const dcp::Batch batch = batch_of(in);
    std::vector<double> ms, cpu_ms, mt_ms, mt_cpu_ms;
    dcp::DcpPlacement d, dm;
    // One thread and `threads` threads alternate, so that other jobs' load falls on both alike.
    auto timed = [&](const dcp::PlacementOptions& o, dcp::DcpPlacement& out, std::vector<double>& wall,
                     std::vector<double>& cpu) {
      const auto t0 = Clock::now();
      const std::clock_t c0 = std::clock();
      const dcp::BlockTable table = dcp::build_block_table(batch, kBlocks);
      out = dcp::place_dcp(table, c, o);
      cpu.push_back(1e3 * static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC);
      wall.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    };
    for (int r = 0; r < repeat; ++r) {
      timed(one, d, ms, cpu_ms);
      if (threads > 1) timed(many, dm, mt_ms, mt_cpu_ms);
    }
    if (threads > 1 && (dm.placement.tile_device != d.placement.tile_device ||
                        dm.placement.block_home != d.placement.block_home))
      dcp::raise(dcp::ErrorKind::InvalidPlan, in.name() + ": the placement on " + std::to_string(threads) +
                                                  " threads differs from the one on one thread");
    std::sort(ms.begin(), ms.end());
    std::sort(cpu_ms.begin(), cpu_ms.end());
    std::sort(mt_ms.begin(), mt_ms.end());
    std::sort(mt_cpu_ms.begin(), mt_cpu_ms.end());
    const dcp::BlockTable table = dcp::build_block_table(batch, kBlocks);
    const dcp::PlacementHypergraph h = dcp::build_placement_hypergraph(table);
    const std::vector<int32_t> parts = dcp::placement_to_parts(h, d.placement);
    const std::string name = in.name();
    {
      std::ofstream out(dir / (name + ".hgr"));
      dcp::write_hgr(h, dcp::HgrOptions{}, out);
    }
    {
      std::ofstream out(dir / (name + ".weights"));
      dcp::write_vertex_weights(h, out);
    }
    {
      std::ofstream out(dir / (name + ".fix"));
      dcp::write_fixed_homes(h, parts, out);
    }
    {
      std::ofstream out(dir / (name + ".builtin.part"));
      dcp::write_partition(parts, out);
      std::ofstream(dir / (name + ".builtin.time")) << ms[ms.size() / 2] / 1e3 << "\n";
    }
    nlohmann::json statics = nlohmann::json::object();
    for (dcp::BaselineKind k : {dcp::BaselineKind::Zigzag, dcp::BaselineKind::A2AP2P}) {
      const dcp::PlacedBatch pb = dcp::make_baseline(k, batch, kBlocks, c);
      const dcp::PlacementMetrics m = dcp::compute_metrics(pb.table, pb.placement, c);
      statics[dcp::to_string(k)] = {
          {"inter_bytes", m.inter_bytes()},
          {"intra_bytes", m.intra_bytes()},
          {"objective", static_cast<double>(m.intra_bytes()) +
                            c.inter_weight() * static_cast<double>(m.inter_bytes())},
          {"compute_imbalance", m.compute_imbalance},
          {"memory_imbalance", m.memory_imbalance}};
    }
    nlohmann::json meta = {{"name", name},
                           {"profile", in.profile},
                           {"mask", in.mask},
                           {"seed", in.seed},
                           {"nodes", c.nodes},
                           {"devices_per_node", c.devices_per_node},
                           {"tokens", batch.total_tokens()},
                           {"sequences", batch.sequences.size()},
                           {"block_size", kBlockSize},
                           {"num_tiles", h.num_tiles},
                           {"num_token_blocks", h.num_token_blocks},
                           {"num_nets", h.num_nets()},
                           {"num_pins", h.pins.size()},
                           {"inter_weight", c.inter_weight()},
                           {"eps_compute", po.eps_compute},
                           {"eps_memory", po.eps_memory},
                           {"builtin_ms_median", ms[ms.size() / 2]},
                           {"builtin_ms_min", ms.front()},
                           {"builtin_cpu_ms_min", cpu_ms.front()},
                           {"builtin_threads", threads},
                           {"builtin_threads_ms_min", threads > 1 ? mt_ms.front() : ms.front()},
                           {"builtin_threads_cpu_ms_min", threads > 1 ? mt_cpu_ms.front() : cpu_ms.front()},
                           {"builtin_objective", d.report.objective},
                           {"builtin_inter_bytes", d.report.inter_bytes},
                           {"builtin_violations", d.report.violations.size()},
                           {"static", statics}};
    std::ofstream(dir / (name + ".json")) << meta.dump(2) << "\n";
    fmt::print("{:<40} {:>7} tiles {:>5} blocks  builtin {:8.2f} ms CPU, {:8.2f} ms wall on {} threads  "
               "violations {}{}\n",
               name, h.num_tiles, h.num_token_blocks, cpu_ms.front(), threads > 1 ? mt_ms.front() : ms.front(),
               threads, d.report.violations.size(),
               d.report.violations.empty() ? "" : " (" + d.report.violations.front() + ")");
    std::fflush(stdout);
  }
  return 0;
}

double geomean(const std::vector<double>& v) {
  if (v.empty()) return 0;
  double s = 0;
  for (double x : v) s += std::log(x);
  return std::exp(s / static_cast<double>(v.size()));
}

double max_of(const std::vector<double>& v) { return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end()); }

// The best (lowest objective) result among `methods` whose name starts with `prefix` and that
// passes `ok`; "" when none does.
template <class Ok>
std::string best_of(const nlohmann::json& methods, const std::string& prefix, Ok ok) {
  std::string best;
  double obj = 0;
  for (const auto& [m, sc] : methods.items()) {
    if (m.rfind(prefix, 0) != 0 || !ok(m, sc)) continue;
    const double o = sc.at("objective");
    if (best.empty() || o < obj) {
      best = m;
      obj = o;
    }
  }
  return best;
}

int cmd_report(const fs::path& dir, const std::string& md_path, const std::string& json_path) {
  std::vector<fs::path> metas;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".json" && e.path().filename() != "outside.json") metas.push_back(e.path());
  std::sort(metas.begin(), metas.end());
  int threads = 1;
  if (fs::exists(dir / "outside.json")) {
    nlohmann::json o;
    std::ifstream(dir / "outside.json") >> o;
    threads = o.value("threads", 1);
  }
  const dcp::PlacementOptions po;
  nlohmann::json rows = nlohmann::json::array();
  std::vector<double> r_feasible, r_relaxed, r_kahypar, t_wall, t_cpu, t_mt_wall, t_mt_cpu;
  int our_threads = 1;
  int behind_static = 0, ours_violations = 0, no_feasible = 0;
  std::string table =
      "| instance | tiles | ours objective | best feasible Mt-KaHyPar | ours / it | ours / best Mt-KaHyPar "
      "ignoring full memory | ours / best feasible KaHyPar | ours ms: one thread CPU (wall); several "
      "threads wall | Mt-KaHyPar default s wall (CPU) | ours threads wall / its wall | ours one-thread CPU / "
      "its CPU per thread | ours inter GB | best static inter GB | ours / best static objective |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const fs::path& mp : metas) {
    nlohmann::json meta;
    std::ifstream(mp) >> meta;
    if (!meta.contains("name")) continue;
    const std::string name = meta["name"];
    Instance in{meta["profile"], meta["mask"], meta["nodes"], meta["seed"]};
    const dcp::Cluster c = cluster_of(in);
    const dcp::BlockTable tbl = dcp::build_block_table(batch_of(in), kBlocks);
    const dcp::PlacementHypergraph h = dcp::build_placement_hypergraph(tbl);
    nlohmann::json row = meta;
    nlohmann::json methods = nlohmann::json::object();
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string fn = e.path().filename().string();
      if (fn.rfind(name + ".", 0) != 0 || e.path().extension() != ".part") continue;
      const std::string method = fn.substr(name.size() + 1, fn.size() - name.size() - 6);
      std::ifstream pin(e.path());
      const std::vector<int32_t> parts =
          dcp::read_partition(pin, e.path().string(), h.num_vertices(), c.num_devices());
      nlohmann::json sc = score(h, parts, c, po);
      double wall = 0, cpu = 0;
      std::ifstream(dir / (name + "." + method + ".time")) >> wall >> cpu;
      sc["seconds"] = wall;
      sc["cpu_seconds"] = cpu;
      methods[method] = sc;
      if (method == "builtin" || sc["violations"].get<size_t>() == 0) continue;
      // The outside result made feasible by the driver's own repairs (no refinement): what a
      // user importing it would run.
      const dcp::Placement imported = dcp::parts_to_placement(h, parts, c.num_devices(), method);
      const auto t0 = Clock::now();
      const dcp::DcpPlacement fixed = dcp::repair_placement(tbl, c, po, imported);
      const double repair_s = std::chrono::duration<double>(Clock::now() - t0).count();
      nlohmann::json r = score(h, dcp::placement_to_parts(h, fixed.placement), c, po);
      r["seconds"] = wall + repair_s;
      r["cpu_seconds"] = cpu + repair_s;
      methods[method + "+repair"] = r;
    }
    if (!methods.contains("builtin")) continue;
    const nlohmann::json& ours = methods["builtin"];
    const double ours_obj = ours["objective"];
    auto feasible = [](const std::string&, const nlohmann::json& sc) { return sc["violations"].get<size_t>() == 0; };
    auto relaxed = [](const std::string& m, const nlohmann::json& sc) {
      return m.find("+repair") == std::string::npos && sc["hard_violations"].get<size_t>() == 0;
    };
    const std::string best = best_of(methods, "mtkahypar", feasible);
    const std::string best_relaxed = best_of(methods, "mtkahypar", relaxed);
    const std::string best_kahypar = best_of(methods, "kahypar", feasible);
    auto ratio = [&](const std::string& m) {
      return m.empty() ? 0.0 : ours_obj / std::max(1.0, methods[m]["objective"].get<double>());
    };
    if (best.empty()) ++no_feasible;
    else r_feasible.push_back(ratio(best));
    if (!best_relaxed.empty()) r_relaxed.push_back(ratio(best_relaxed));
    if (!best_kahypar.empty()) r_kahypar.push_back(ratio(best_kahypar));
    const nlohmann::json def = methods.value("mtkahypar_default_fixed", nlohmann::json::object());
    const double def_wall = def.value("seconds", 0.0), def_cpu = def.value("cpu_seconds", 0.0);
    const double ours_cpu = meta["builtin_cpu_ms_min"].get<double>() / 1e3;
    const double ours_wall = meta["builtin_ms_min"].get<double>() / 1e3;
    // Exports without a threaded run count as one thread.
    our_threads = meta.value("builtin_threads", 1);
    const double ours_mt_wall = meta.value("builtin_threads_ms_min", meta["builtin_ms_min"].get<double>()) / 1e3;
    if (def_wall > 0) t_wall.push_back(ours_cpu / def_wall);
    if (def_cpu > 0) t_cpu.push_back(ours_cpu / (def_cpu / threads));
    if (def_wall > 0) t_mt_wall.push_back(ours_mt_wall / def_wall);
    if (def_cpu > 0) t_mt_cpu.push_back(ours_mt_wall / (def_cpu / threads));
    double static_inter = 1e300, static_obj = 1e300;
    for (const auto& [k, st] : meta["static"].items()) {
      static_inter = std::min(static_inter, st["inter_bytes"].get<double>());
      static_obj = std::min(static_obj, st["objective"].get<double>());
    }
    if (ours["inter_bytes"].get<double>() > static_inter || ours_obj > static_obj) ++behind_static;
    ours_violations += ours["violations"].get<size_t>() > 0 ? 1 : 0;
    auto cell = [&](const std::string& m) { return m.empty() ? std::string("-") : fmt::format("{:.3f}", ratio(m)); };
    table += fmt::format(
        "| {} | {} | {:.4g} | {} {:.4g} | **{}** | {} | {} | {:.1f} ({:.1f}); {:.1f} | {:.2f} ({:.2f}) | {:.3f} | "
        "{:.3f} | {:.3f} | {:.3f} | {:.3f} |\n",
        name, meta["num_tiles"].get<int>(), ours_obj, best.empty() ? "none" : best,
        best.empty() ? 0.0 : methods[best]["objective"].get<double>(), cell(best), cell(best_relaxed),
        cell(best_kahypar), ours_cpu * 1e3, ours_wall * 1e3, ours_mt_wall * 1e3, def_wall, def_cpu,
        def_wall > 0 ? ours_mt_wall / def_wall : 0.0, def_cpu > 0 ? ours_cpu / (def_cpu / threads) : 0.0,
        ours["inter_bytes"].get<double>() / 1e9, static_inter / 1e9, ours_obj / static_obj);
    row["methods"] = methods;
    row["best_feasible_mtkahypar"] = best;
    row["ours_over_best_feasible_mtkahypar"] = ratio(best);
    row["best_mtkahypar_ignoring_full_memory"] = best_relaxed;
    row["ours_over_best_mtkahypar_ignoring_full_memory"] = ratio(best_relaxed);
    row["best_feasible_kahypar"] = best_kahypar;
    row["ours_over_best_feasible_kahypar"] = ratio(best_kahypar);
    rows.push_back(row);
  }
  std::string summary = fmt::format(
      "\n- instances: {}; without a feasible Mt-KaHyPar result: {}\n"
      "- ours / best feasible Mt-KaHyPar: geometric mean **{:.3f}** (target <= 1.05), max **{:.3f}**, above 1.3: "
      "**{}** (target 0)\n"
      "- ours / best Mt-KaHyPar ignoring full memory (compute and owned memory hold): geometric mean {:.3f}, max {:.3f}\n"
      "- ours / best feasible KaHyPar (on {} instances): geometric mean {:.3f}, max {:.3f}\n"
      "- time, ours on {} threads (wall) / Mt-KaHyPar default ({} threads): vs its wall time geometric mean "
      "**{:.3f}**, max **{:.3f}**; vs its CPU time per thread geometric mean {:.3f}, max {:.3f} (target <= 0.1)\n"
      "- time, ours on one thread (CPU) / Mt-KaHyPar default ({} threads): vs its wall time geometric mean {:.3f}, "
      "max {:.3f}; vs its CPU time per thread geometric mean **{:.3f}**, max **{:.3f}**\n"
      "- instances where ours is behind the best static layout (zigzag, a2a_p2p) in inter-node bytes or "
      "objective: **{}** (target 0); instances where ours violates a bound: **{}** (target 0)\n",
      rows.size(), no_feasible, geomean(r_feasible), max_of(r_feasible),
      std::count_if(r_feasible.begin(), r_feasible.end(), [](double x) { return x > 1.3; }),
      geomean(r_relaxed), max_of(r_relaxed), r_kahypar.size(), geomean(r_kahypar), max_of(r_kahypar), our_threads,
      threads, geomean(t_mt_wall), max_of(t_mt_wall), geomean(t_mt_cpu), max_of(t_mt_cpu), threads,
      geomean(t_wall), max_of(t_wall), geomean(t_cpu), max_of(t_cpu), behind_static, ours_violations);
  std::map<std::string, std::vector<double>> by_method;
  std::map<std::string, std::vector<double>> secs_by_method;
  for (const auto& row : rows) {
    const double ours_obj = row["methods"]["builtin"]["objective"];
    for (const auto& [m, sc] : row["methods"].items()) {
      if (m == "builtin") continue;
      secs_by_method[m].push_back(sc["seconds"].get<double>());
      if (sc["violations"].get<size_t>() == 0)
        by_method[m].push_back(ours_obj / std::max(1.0, sc["objective"].get<double>()));
    }
  }
  std::string per_method =
      "\n| method | instances run | feasible | ours / method, geometric mean over its feasible results | "
      "mean wall s |\n|---|---|---|---|---|\n";
  for (const auto& [m, secs] : secs_by_method) {
    const auto it = by_method.find(m);
    const size_t n_ok = it == by_method.end() ? 0 : it->second.size();
    per_method += fmt::format("| {} | {} | {} | {} | {:.2f} |\n", m, secs.size(), n_ok,
                              n_ok ? fmt::format("{:.3f}", geomean(it->second)) : "-",
                              std::accumulate(secs.begin(), secs.end(), 0.0) / static_cast<double>(secs.size()));
  }
  fmt::print("{}{}{}", table, summary, per_method);
  if (!md_path.empty()) std::ofstream(md_path) << table << summary << per_method;
  if (!json_path.empty())
    std::ofstream(json_path) << nlohmann::json{{"rows", rows}, {"summary", summary}}.dump(2) << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr,
                 "usage: %s export DIR [--profiles P,..] [--masks M,..] [--nodes N,..] [--seeds S,..] "
                 "[--repeat R] [--threads T] [--set name=value,...]\n       %s report DIR [--md PATH] [--json PATH]\n",
                 argv[0], argv[0]);
    return 2;
  }
  const std::string cmd = argv[1];
  const fs::path dir = argv[2];
  std::map<std::string, std::string> opt{{"--profiles", "ldc,longalign"},
                                         {"--masks", "causal,lambda,shared_question"},
                                         {"--nodes", "2,4,8,16"},
                                         {"--seeds", "1"},
                                         {"--repeat", "3"},
                                         {"--threads", "2"},
                                         {"--set", ""},
                                         {"--md", ""},
                                         {"--json", ""}};
  for (int i = 3; i + 1 < argc; i += 2) {
    if (!opt.contains(argv[i])) {
      std::fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
    opt[argv[i]] = argv[i + 1];
  }
  try {
    if (cmd == "export") {
      std::vector<Instance> instances;
      for (const std::string& n : split(opt["--nodes"]))
        for (const std::string& p : split(opt["--profiles"]))
          for (const std::string& m : split(opt["--masks"]))
            for (const std::string& s : split(opt["--seeds"]))
              instances.push_back({p, m, std::stoi(n), std::stoull(s)});
      return cmd_export(dir, instances, std::max(1, std::stoi(opt["--repeat"])),
                        std::clamp(std::stoi(opt["--threads"]), 1, 256), options_from(opt["--set"]));
    }
    if (cmd == "report") return cmd_report(dir, opt["--md"], opt["--json"]);
  } catch (const dcp::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "unknown command %s\n", cmd.c_str());
  return 2;
}
