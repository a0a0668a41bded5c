// The hierarchical driver: nodes first, then the devices of each node, then the bounds; every
// backend result is checked, repaired and measured here, never trusted.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <string>

#include "dcp/error.h"
#include "placement/driver.h"
#include "core/task_pool.h"

namespace dcp {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string fmt_ratio(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", x);
  return buf;
}

void check_parts(const std::vector<int32_t>& part, int32_t n, int k, const char* backend) {
  if (static_cast<int32_t>(part.size()) != n)
    raise(ErrorKind::InvalidPlan, std::string("placement: backend ") + backend + " returned " +
                                      std::to_string(part.size()) + " part ids for " +
                                      std::to_string(n) + " vertices");
  for (int32_t p : part)
    if (p < 0 || p >= k)
      raise(ErrorKind::InvalidPlan, std::string("placement: backend ") + backend +
                                        " returned part id " + std::to_string(p) +
                                        " outside [0, " + std::to_string(k) + ")");
}

}  // namespace

namespace placement {

void measure(const PlacementHypergraph& h, const std::vector<int32_t>& parts,
             const Cluster& cluster, const PlacementOptions& opts, DcpPlacement& out,
             const std::string& method) {
  PlacementReport& rep = out.report;
  const ConnectivityBytes bytes = connectivity_bytes(h, parts, cluster);
  rep.intra_bytes = bytes.intra_bytes;
  rep.inter_bytes = bytes.inter_bytes;
  rep.objective = bytes.objective;
  rep.violations = check_balance(h, parts, cluster, opts, rep);
  out.placement = parts_to_placement(h, parts, cluster.num_devices(), method);
  out.placement.note = "partitioner " + rep.partitioner;
  if (!rep.violations.empty())
    out.placement.note += "; BALANCE VIOLATED (" + std::to_string(rep.violations.size()) +
                          "): " + rep.violations.front();
}

}  // namespace placement

std::vector<std::string> check_balance(const PlacementHypergraph& h,
                                       const std::vector<int32_t>& parts, const Cluster& cluster,
                                       const PlacementOptions& opts, PlacementReport& report) {
  const int num_dev = cluster.num_devices();
  std::vector<double> c(static_cast<size_t>(num_dev), 0.0), m(static_cast<size_t>(num_dev), 0.0);
  for (int32_t v = 0; v < h.num_vertices(); ++v) {
    c[parts[v]] += h.compute_flops[v];
    m[parts[v]] += static_cast<double>(h.memory_bytes[v]);
  }
  const double mean_c = std::accumulate(c.begin(), c.end(), 0.0) / num_dev;
  const double mean_m = std::accumulate(m.begin(), m.end(), 0.0) / num_dev;
  auto ratio = [](double x, double mean) { return mean > 0 ? x / mean : 1.0; };
  std::vector<std::string> out;
  report.compute_imbalance = report.memory_imbalance = 0;
  for (int d = 0; d < num_dev; ++d) {
    const double rc = ratio(c[d], mean_c), rm = ratio(m[d], mean_m);
    report.compute_imbalance = std::max(report.compute_imbalance, rc);
    report.memory_imbalance = std::max(report.memory_imbalance, rm);
    const double slack = 1e-9;
    if (rc > 1 + opts.eps_compute + slack)
      out.push_back("device " + std::to_string(d) + ": compute " + fmt_ratio(rc) +
                    " x mean > 1 + eps_compute = " + fmt_ratio(1 + opts.eps_compute));
    if (rm > 1 + opts.eps_memory + slack)
      out.push_back("device " + std::to_string(d) + ": owned memory " + fmt_ratio(rm) +
                    " x mean > 1 + eps_memory = " + fmt_ratio(1 + opts.eps_memory));
    if (m[d] > cluster.device_memory_bytes)
      out.push_back("device " + std::to_string(d) + ": owned memory " + std::to_string(m[d]) +
                    " bytes exceeds the device memory " +
                    std::to_string(cluster.device_memory_bytes));
  }
  // Everything a device holds, against its own mean (copies and partials grow with the cut).
  const std::vector<int64_t> full = full_memory_bytes(h, parts, num_dev);
  const double mean_f =
      static_cast<double>(std::accumulate(full.begin(), full.end(), int64_t{0})) / num_dev;
  report.full_memory_imbalance = 0;
  for (int d = 0; d < num_dev; ++d) {
    const double rf = ratio(static_cast<double>(full[d]), mean_f);
    report.full_memory_imbalance = std::max(report.full_memory_imbalance, rf);
    if (rf > 1 + opts.eps_memory + 1e-9)
      out.push_back("device " + std::to_string(d) + ": memory with received copies " +
                    fmt_ratio(rf) + " x mean > 1 + eps_memory = " + fmt_ratio(1 + opts.eps_memory));
    if (static_cast<double>(full[d]) > cluster.device_memory_bytes)
      out.push_back("device " + std::to_string(d) + ": memory with received copies " +
                    std::to_string(full[d]) + " bytes exceeds the device memory " +
                    std::to_string(cluster.device_memory_bytes));
  }
  report.node_compute_imbalance = report.node_memory_imbalance = 0;
  const int dpn = cluster.devices_per_node;
  for (int n = 0; n < cluster.nodes; ++n) {
    double nc = 0, nm = 0;
    for (int d = n * dpn; d < (n + 1) * dpn; ++d) {
      nc += c[d];
      nm += m[d];
    }
    report.node_compute_imbalance = std::max(report.node_compute_imbalance, ratio(nc, mean_c * dpn));
    report.node_memory_imbalance = std::max(report.node_memory_imbalance, ratio(nm, mean_m * dpn));
  }
  return out;
}

DcpPlacement repair_placement(const BlockTable& table, const Cluster& cluster,
                              const PlacementOptions& opts, const Placement& start) {
  opts.validate();
  cluster.validate("cluster");
  start.validate(table);
  if (start.num_devices != cluster.num_devices())
    raise(ErrorKind::InvalidInput, "repair_placement: placement has " +
                                       std::to_string(start.num_devices) + " devices, cluster " +
                                       std::to_string(cluster.num_devices()));
  const auto t_start = Clock::now();
  DcpPlacement out;
  out.report.partitioner = start.method;
  const PlacementHypergraph h = build_placement_hypergraph(table, opts.tile_cost);
  std::vector<int32_t> parts = placement_to_parts(h, start);
  placement::AllDevices all_devices(table, h, cluster);
  placement::repair_bounds(table, h, cluster, opts, nullptr, all_devices, nullptr, parts);
  placement::measure(h, parts, cluster, opts, out, start.method);
  out.report.total_s = seconds_since(t_start);
  return out;
}

DcpPlacement place_dcp(const BlockTable& table, const Cluster& cluster,
                       const PlacementOptions& opts) {
  opts.validate();
  if (cluster.nodes < 1 || cluster.devices_per_node < 1)
    raise(ErrorKind::InvalidInput,
          "place_dcp: cluster needs nodes >= 1 and devices_per_node >= 1 (got " +
              std::to_string(cluster.nodes) + " nodes x " +
              std::to_string(cluster.devices_per_node) + " devices: more nodes than devices)");
  cluster.validate("cluster");
  const auto t_start = Clock::now();
  DcpPlacement out;
  PlacementReport& rep = out.report;
  rep.partitioner = to_string(opts.partitioner);
  const int starts = opts.initial_starts > 0       ? opts.initial_starts
                     : opts.multilevel.enabled     ? 1
                     : cluster.num_devices() <= 16 ? 3
                                                   : 2;
  const bool builtin = opts.partitioner == PartitionerKind::Builtin;
  const char* name = rep.partitioner.c_str();

  const PlacementHypergraph h = build_placement_hypergraph(table, opts.tile_cost);
  rep.build_s = seconds_since(t_start);
  const int32_t nv = h.num_vertices();
  const bool light = builtin && placement::is_large(h, opts);
  // Independent work runs on the pool (PlacementOptions::threads); every result is combined in
  // a fixed order, so the placement does not depend on the thread count. The outside backends
  // run one call at a time.
  TaskPool pool(builtin ? opts.threads : 1);
  TaskPool* const par = pool.threads() > 1 ? &pool : nullptr;
  const auto backend = placement::make_partitioner(opts.partitioner, starts, opts.multilevel, light, par);
  const int num_nodes = cluster.nodes, dpn = cluster.devices_per_node;
  const int num_dev = cluster.num_devices();
  const double total_c = std::accumulate(h.compute_flops.begin(), h.compute_flops.end(), 0.0);
  const double total_m = static_cast<double>(
      std::accumulate(h.memory_bytes.begin(), h.memory_bytes.end(), int64_t{0}));
  const double w_inter = cluster.inter_weight();

  // Level 1: nodes. The backend's candidates within node_candidate_margin of the best node
  // objective all go on (see PlacementOptions::node_candidate_margin).
  auto t0 = Clock::now();
  auto node_candidates = [&](const placement::Partitioner& b) {
    std::vector<std::vector<int32_t>> kept;
    if (num_nodes <= 1) {
      kept.emplace_back(static_cast<size_t>(nv), 0);
      return kept;
    }
    placement::SubHypergraph s = placement::make_sub(table, h, std::vector<int32_t>(nv, 0), -1, w_inter);
    s.sub_parts = dpn;
    // Two devices per node split a node's tiles by head group (exact halves), so the node
    // level may use more of the compute tolerance there (PlacementOptions).
    const double node_c_factor = opts.node_compute_eps_factor > 0 ? opts.node_compute_eps_factor
                                 : dpn <= 2                       ? 0.75
                                                                  : opts.node_eps_factor;
    placement::PartCaps caps;
    caps.compute.assign(num_nodes, (1 + opts.eps_compute * node_c_factor) * total_c / num_nodes);
    caps.memory.assign(num_nodes, (1 + opts.eps_memory * opts.node_eps_factor) * total_m / num_nodes);
    placement::PartCaps hard;
    hard.compute.assign(num_nodes, (1 + opts.eps_compute) * total_c / num_nodes);
    hard.memory.assign(num_nodes, (1 + opts.eps_memory) * total_m / num_nodes);
    std::vector<std::vector<int32_t>> cands = b.candidates(s, caps, opts.seed, opts.refine);
    std::vector<double> objective;
    for (std::vector<int32_t>& c : cands) {
      check_parts(c, s.num_vertices(), num_nodes, name);
      placement::repair_balance(s, hard, c);
      objective.push_back(placement::sub_objective(s, c, num_nodes));
    }
    const double best = *std::min_element(objective.begin(), objective.end());
    for (size_t i = 0; i < cands.size(); ++i)
      if (i == 0 || objective[i] <= (1 + opts.node_candidate_margin) * best)
        kept.push_back(std::move(cands[i]));
    return kept;
  };
  // Every device as one level (the repairs across nodes and the global refinement) does not
  // depend on the partition: with several threads it is built beside the node level, where a
  // thread is often free, instead of on the sequential path after the device level.
  placement::AllDevices all_devices(table, h, cluster);
  std::vector<std::vector<int32_t>> node_parts;
  if (par != nullptr && builtin && num_nodes > 1)
    run_both(par, [&] { node_parts = node_candidates(*backend); }, [&] { all_devices.get(); });
  else
    node_parts = node_candidates(*backend);
  rep.node_level_s = seconds_since(t0);

  // Level 2: devices of each node, against the global per-device bounds; then the bounds over
  // everything and the global refinement. The lowest final objective among the node candidates
  // wins, those without a violated bound first, the earlier candidate on ties. Node candidates,
  // and the nodes of one candidate, are placed at the same time on the pool. Among several
  // candidates, one behind another by more than PlacementOptions::candidate_refine_margin after
  // the repairs drops out before the global refinement.
  t0 = Clock::now();
  struct Placed {
    std::vector<int32_t> parts;
    size_t violations = 0;
    double objective = 0;
  };
  auto score = [&](Placed& placed) {
    PlacementReport r;
    placed.violations = check_balance(h, placed.parts, cluster, opts, r).size();
    placed.objective = connectivity_bytes(h, placed.parts, cluster).objective;
  };
  auto place_devices = [&](const std::vector<int32_t>& node, bool scored) {
    Placed placed;
    std::vector<int32_t>& parts = placed.parts;
    parts.assign(static_cast<size_t>(nv), 0);
    for (int32_t v = 0; v < nv; ++v) parts[v] = node[v] * dpn;
    if (dpn > 1) {
      placement::PartCaps caps;
      caps.compute.assign(dpn, (1 + opts.eps_compute) * total_c / num_dev);
      caps.memory.assign(dpn, (1 + opts.eps_memory) * total_m / num_dev);
      // Each node's vertices are its own: the nodes write disjoint entries of `parts`.
      run_each(par, num_nodes, [&](int n) {
        const placement::SubHypergraph s = placement::make_sub(table, h, node, n, w_inter);
        if (s.num_vertices() == 0) return;
        std::vector<int32_t> dev = backend->partition(s, caps, opts.seed, opts.refine);
        check_parts(dev, s.num_vertices(), dpn, name);
        placement::repair_balance(s, caps, dev);
        for (int32_t i = 0; i < s.num_vertices(); ++i) parts[s.global[i]] = n * dpn + dev[i];
      });
    }
    placement::repair_bounds(table, h, cluster, opts, builtin ? backend.get() : nullptr,
                             all_devices, par, parts);
    if (scored) score(placed);
    return placed;
  };
  // (violations, objective) of a before b, the objective lowered by `margin`.
  auto ahead = [](const Placed& a, const Placed& b, double margin) {
    return a.violations < b.violations ||
           (a.violations == b.violations && a.objective * (1 + margin) < b.objective);
  };
  Placed best;
  bool have_best = false;
  auto place_all = [&](const std::vector<std::vector<int32_t>>& candidates) {
    const int count = static_cast<int>(candidates.size());
    std::vector<Placed> placed(candidates.size());
    run_each(par, count, [&](int i) { placed[i] = place_devices(candidates[i], count > 1); });
    // The global refinement never adds a violation nor raises the objective of the candidate
    // ahead; the one behind would have to win back more than the margin.
    std::vector<uint8_t> dropped(candidates.size(), 0);
    const double margin = opts.candidate_refine_margin;
    for (int i = 0; i < count && margin >= 0; ++i)
      for (int j = 0; j < count && !dropped[i]; ++j)
        if (j != i && ahead(placed[j], placed[i], margin)) dropped[i] = 1;
    if (builtin) {
      std::vector<int> refined;
      for (int i = 0; i < count; ++i)
        if (!dropped[i]) refined.push_back(i);
      run_each(par, static_cast<int>(refined.size()), [&](int r) {
        Placed& p = placed[static_cast<size_t>(refined[static_cast<size_t>(r)])];
        placement::refine_all_devices(h, cluster, opts, all_devices, par, p.parts);
        score(p);
      });
    } else if (count == 1) {
      score(placed[0]);  // several were scored when placed
    }
    for (int i = 0; i < count; ++i) {
      if (dropped[i]) continue;
      Placed& p = placed[static_cast<size_t>(i)];
      if (!have_best || ahead(p, best, 0)) {
        best = std::move(p);
        have_best = true;
      }
    }
  };
  place_all(node_parts);
  // The light path's single node candidate can leave a bound violated that another start of
  // the full portfolio meets: those run then, on such batches only.
  if (light && best.violations > 0 && num_nodes > 1) {
    const auto full = placement::make_partitioner(opts.partitioner, starts, opts.multilevel, false, par);
    place_all(node_candidates(*full));
  }
  rep.device_level_s = seconds_since(t0);
  const std::vector<int32_t>& best_parts = best.parts;

  placement::measure(h, best_parts, cluster, opts, out, "dcp");
  rep.total_s = seconds_since(t_start);
  return out;
}

}  // namespace dcp
