// The bounds after the levels: compute and owned memory per device, full memory (owned data +
// received copies + fp32 partials), and the refinement over all devices that follows them.
#include <algorithm>
#include <numeric>
#include <string>

#include "placement/driver.h"
#include "placement/multilevel.h"
#include "core/task_pool.h"

namespace dcp::placement {

namespace {

void refine(const SubHypergraph& s, const PartCaps& caps, const PlacementOptions& opts,
            const RefineOptions& refine_opts, TaskPool* pool, std::vector<int32_t>& part) {
  if (opts.multilevel.enabled)
    refine_multilevel(s, caps, opts.multilevel, refine_opts, opts.seed, part, pool);
  else
    refine_fm(s, caps, refine_opts, opts.seed, part, pool);
}

// The levels' FM stopping rules for FM over all devices (RefineOptions).
void level_stopping(RefineOptions& r) {
  r.min_pass_gain_all_devices = r.min_pass_gain;
  r.idle_moves_share_all_devices = r.idle_moves_share;
  r.idle_moves_min_all_devices = r.idle_moves_min;
}

// The global refinement over all devices stops by its own rules (min_pass_gain_all_devices,
// idle_moves_*_all_devices), except on the light path, where it is what meets the full-memory
// bound (RefineOptions::min_pass_gain_all_devices).
RefineOptions all_devices_refine(const PlacementHypergraph& h, const PlacementOptions& opts) {
  RefineOptions r = opts.refine;
  if (is_large(h, opts)) level_stopping(r);
  return r;
}

// FM over all devices after the cross-node full-memory repair keeps the levels' rules: it is what
// wins back the repair's cost under the bound, and stopping it early left bounds violated.
RefineOptions bound_refine(const PlacementOptions& opts) {
  RefineOptions r = opts.refine;
  level_stopping(r);
  return r;
}

double mean_of(const std::vector<int64_t>& v) {
  return static_cast<double>(std::accumulate(v.begin(), v.end(), int64_t{0})) /
         static_cast<double>(v.size());
}

// Full memory against (1 + eps_memory) x its mean. The levels bound owned memory only: a device
// computing a band of a long sequence can hold far more than its share in copies. Each round,
// the nodes with a device over the bound are fixed inside: the current split repaired under the
// full bound (aiming under it, since fixing moves tiles back to their data and so lowers the
// mean) and refined, and where that still misses a bound, against a fresh partition of the node
// by the backend with that bound from the start; the better one is kept (the repair moves whole
// remote groups greedily, and the fresh partition won on about half of such nodes of the
// comparison instances). A fresh partition also where the repaired split meets every bound won
// on a third of those nodes, but for little: PlacementOptions::full_memory_fresh_always. On a
// large instance (light path, PlacementOptions::large_vertices) the first round re-partitions
// only where compute or owned memory is missed (large_defer_fresh): most nodes are over after
// the device level there, and the fresh partitions doubled the cost for more bytes on most of
// the 1M-token batches measured. What a node cannot fix inside is repaired across nodes on the
// exact hierarchical objective, then refined by FM there.
void enforce_full_memory(const BlockTable& table, const PlacementHypergraph& h,
                         const Cluster& cluster, const PlacementOptions& opts,
                         const Partitioner* backend, AllDevices& all_devices, TaskPool* pool,
                         std::vector<int32_t>& parts) {
  const int num_dev = cluster.num_devices(), dpn = cluster.devices_per_node;
  const int32_t nv = h.num_vertices();
  const double total_c = std::accumulate(h.compute_flops.begin(), h.compute_flops.end(), 0.0);
  const double total_m = static_cast<double>(
      std::accumulate(h.memory_bytes.begin(), h.memory_bytes.end(), int64_t{0}));
  const double w_inter = cluster.inter_weight();
  for (int round = 0; round < opts.full_memory_rounds; ++round) {
    const std::vector<int64_t> full = full_memory_bytes(h, parts, num_dev);
    const double mean_f = mean_of(full);
    const double bound = (1 + opts.eps_memory) * mean_f;
    const double aim = round == 0 ? opts.full_memory_target_first : opts.full_memory_target_later;
    std::vector<uint8_t> node_over(static_cast<size_t>(cluster.nodes), 0);
    bool any = false;
    for (int d = 0; d < num_dev; ++d)
      if (static_cast<double>(full[d]) > bound) node_over[cluster.node_of(d)] = 1, any = true;
    if (!any) return;
    if (dpn > 1) {
      PartCaps caps;
      caps.compute.assign(dpn, (1 + opts.eps_compute) * total_c / num_dev);
      caps.memory.assign(dpn, (1 + opts.eps_memory) * total_m / num_dev);
      caps.full_memory.assign(dpn, (1 + opts.eps_memory * aim) * mean_f);
      std::vector<int32_t> node(static_cast<size_t>(nv));
      for (int32_t v = 0; v < nv; ++v) node[v] = cluster.node_of(parts[v]);
      // Each node is repaired on its own vertices: the nodes write disjoint entries of `parts`.
      std::vector<int32_t> over_nodes;
      for (int n = 0; n < cluster.nodes; ++n)
        if (node_over[n]) over_nodes.push_back(n);
      run_each(pool, static_cast<int>(over_nodes.size()), [&](int i) {
        const int n = over_nodes[static_cast<size_t>(i)];
        const SubHypergraph s = make_sub(table, h, node, n, w_inter);
        std::vector<int32_t> dev(static_cast<size_t>(s.num_vertices()));
        for (int32_t j = 0; j < s.num_vertices(); ++j) dev[j] = parts[s.global[j]] - n * dpn;
        repair_balance(s, caps, dev);
        if (backend != nullptr) refine(s, caps, opts, opts.refine, pool, dev);
        // A fresh partition only where the repaired split still misses a bound (unless
        // full_memory_fresh_always); on the light path, in the first round only where it misses
        // compute or owned memory (large_defer_fresh).
        bool fresh_run = backend != nullptr;
        const bool large = is_large(h, opts);
        if (fresh_run && (large || !opts.full_memory_fresh_always)) {
          const CapExcess x = cap_excess(s, caps, dev);
          fresh_run = !x.same(CapExcess{});
          if (large) fresh_run = fresh_run && (round > 0 || !opts.large_defer_fresh || x.hard > 1e-9);
        }
        if (fresh_run) {
          std::vector<int32_t> fresh = backend->partition(s, caps, opts.seed, opts.refine);
          repair_balance(s, caps, fresh);
          const CapExcess x_dev = cap_excess(s, caps, dev), x_fresh = cap_excess(s, caps, fresh);
          if (x_fresh.less(x_dev) ||
              (x_fresh.same(x_dev) && sub_objective(s, fresh, dpn) < sub_objective(s, dev, dpn)))
            dev = std::move(fresh);
        }
        for (int32_t j = 0; j < s.num_vertices(); ++j) parts[s.global[j]] = n * dpn + dev[j];
      });
    }
    if (cluster.nodes > 1) {
      const std::vector<int64_t> after = full_memory_bytes(h, parts, num_dev);
      const double mean_a = mean_of(after);
      bool still = false;
      for (int d = 0; d < num_dev; ++d)
        still = still || static_cast<double>(after[d]) > (1 + opts.eps_memory) * mean_a;
      if (still) {
        PartCaps caps;
        caps.compute.assign(num_dev, (1 + opts.eps_compute) * total_c / num_dev);
        caps.memory.assign(num_dev, (1 + opts.eps_memory) * total_m / num_dev);
        caps.full_memory.assign(num_dev, (1 + opts.eps_memory * opts.full_memory_target_first) * mean_a);
        const SubHypergraph& all = all_devices.get();
        const std::vector<int32_t> before = parts;
        repair_balance(all, caps, parts);
        // The repair moves vertices greedily, one bound at a time; FM on the exact objective
        // under the same bounds wins much of their cost back. It moves a few vertices (2 to 200
        // of 500 to 18000 on the comparison instances), so FM starts around them rather than at
        // every boundary vertex of all devices; the global refinement that follows refines
        // everywhere. Measured on the 48 comparison instances with
        // placement seeds 1-3: 5.6 % fewer instructions per placement on one thread, objective
        // +0.8 % on average, instance-runs above 1.3 of the best feasible Mt-KaHyPar result 3
        // (4 before), none with a violated bound (1 before). Starting from every vertex of the
        // devices the repair moved from or to instead: about a third of the saving, +0.2 %.
        // Not on the light path (PlacementOptions::large_vertices), where this FM is what meets
        // the full-memory bound: around the moves, later rounds had more to repair (1M tokens
        // on 256 devices, longalign causal scale 4: 835 -> 1340 ms, bench_placement).
        if (backend != nullptr && is_large(h, opts)) {
          refine_fm(all, caps, bound_refine(opts), opts.seed, parts, pool);
        } else if (backend != nullptr) {
          std::vector<int32_t> moved;
          for (int32_t v = 0; v < nv; ++v)
            if (parts[v] != before[v]) moved.push_back(v);
          refine_fm_around(all, caps, bound_refine(opts), opts.seed, parts, moved, pool);
        }
      }
    }
  }
}

// FM over all devices on the exact objective (intra + inter_weight x inter bytes) under every
// bound: it sees what neither level does (a remote net costs once per device reading it, and
// moves across nodes). Full memory is bounded against the current mean, aiming under the bound
// as the repair does; the result is kept only when it adds no violation (the mean moves with
// the copies that FM removes). On a large instance flat FM only: the V-cycle's coarse levels
// hold vertices with many nets and hundreds of candidate devices, and cost ten times the finest.
void refine_globally(const PlacementHypergraph& h, const Cluster& cluster,
                     const PlacementOptions& opts, AllDevices& all_devices, TaskPool* pool,
                     std::vector<int32_t>& parts) {
  const int num_dev = cluster.num_devices();
  const double total_c = std::accumulate(h.compute_flops.begin(), h.compute_flops.end(), 0.0);
  const double total_m = static_cast<double>(
      std::accumulate(h.memory_bytes.begin(), h.memory_bytes.end(), int64_t{0}));
  PartCaps caps;
  caps.compute.assign(num_dev, (1 + opts.eps_compute) * total_c / num_dev);
  caps.memory.assign(num_dev, (1 + opts.eps_memory) * total_m / num_dev);
  caps.full_memory.assign(num_dev, (1 + opts.eps_memory * opts.full_memory_target_first) *
                                       mean_of(full_memory_bytes(h, parts, num_dev)));
  std::vector<int32_t> trial = parts;
  const SubHypergraph& all = all_devices.get();
  if (is_large(h, opts))
    refine_fm(all, caps, all_devices_refine(h, opts), opts.seed, trial, pool);
  else
    refine(all, caps, opts, all_devices_refine(h, opts), pool, trial);
  PlacementReport before, after;
  const size_t v_before = check_balance(h, parts, cluster, opts, before).size();
  size_t v_trial = check_balance(h, trial, cluster, opts, after).size();
  // FM bounds full memory against the mean before it, but the copies it removes lower that mean,
  // so a device it left near its cap can end over the bound at the new mean: on the 48
  // comparison instances (placement seeds 1-3) about one global refinement in five, often after
  // winning several per cent. Such a trial is repaired under the bound at its own mean, as the
  // cross-node repair does (two rounds: the repair lowers the mean again), and kept only when it
  // then adds no violation and still lowers the objective. Measured there: ours / best feasible
  // Mt-KaHyPar 0.975 / 0.972 / 0.991 -> 0.972 / 0.969 / 0.990, no instance newly above 1.3.
  bool repaired = false;
  for (int round = 0; round < 2 && v_trial > v_before; ++round) {
    PartCaps at_mean = caps;
    at_mean.full_memory.assign(num_dev, (1 + opts.eps_memory * opts.full_memory_target_first) *
                                            mean_of(full_memory_bytes(h, trial, num_dev)));
    repair_balance(all, at_mean, trial);
    v_trial = check_balance(h, trial, cluster, opts, after).size();
    repaired = true;
  }
  if (v_trial > v_before) return;
  if (repaired && !(sub_objective(all, trial, num_dev) < sub_objective(all, parts, num_dev))) return;
  parts = std::move(trial);
}

}  // namespace

void repair_bounds(const BlockTable& table, const PlacementHypergraph& h, const Cluster& cluster,
                   const PlacementOptions& opts, const Partitioner* backend,
                   AllDevices& all_devices, TaskPool* pool, std::vector<int32_t>& parts) {
  const int num_dev = cluster.num_devices();
  if (num_dev <= 1) return;
  const int32_t nv = h.num_vertices();
  const double total_c = std::accumulate(h.compute_flops.begin(), h.compute_flops.end(), 0.0);
  const double total_m = static_cast<double>(
      std::accumulate(h.memory_bytes.begin(), h.memory_bytes.end(), int64_t{0}));
  // Token blocks are coarse (a few per device), so a node can hold a memory share no split of
  // its devices meets even when the node bound holds. Moving such a block to another node costs
  // inter-node bytes, but the bounds come first.
  PartCaps dev_caps;
  dev_caps.compute.assign(num_dev, (1 + opts.eps_compute) * total_c / num_dev);
  dev_caps.memory.assign(num_dev, (1 + opts.eps_memory) * total_m / num_dev);
  std::vector<double> c(static_cast<size_t>(num_dev), 0.0), m(static_cast<size_t>(num_dev), 0.0);
  for (int32_t v = 0; v < nv; ++v) {
    c[parts[v]] += h.compute_flops[v];
    m[parts[v]] += static_cast<double>(h.memory_bytes[v]);
  }
  bool over = false;
  for (int d = 0; d < num_dev; ++d)
    over = over || c[d] > dev_caps.compute[d] || m[d] > dev_caps.memory[d];
  if (over) repair_balance(all_devices.get(), dev_caps, parts);
  enforce_full_memory(table, h, cluster, opts, backend, all_devices, pool, parts);
}

void refine_all_devices(const PlacementHypergraph& h, const Cluster& cluster,
                        const PlacementOptions& opts, AllDevices& all_devices, TaskPool* pool,
                        std::vector<int32_t>& parts) {
  if (opts.global_refinement && cluster.nodes > 1 && cluster.num_devices() > 1)
    refine_globally(h, cluster, opts, all_devices, pool, parts);
}

}  // namespace dcp::placement
