// Tiles placed on token homes fixed beforehand (place_tiles_on_homes): one token placement shared
// by the plans of several layer kinds.
//
// The homes are pinned without a special case in the refinement: every device's owned-memory
// capacity is set to exactly what its homes own. Tiles weigh no memory, so they move freely under
// the compute and full-memory capacities, while a token block could only enter a device by
// raising its owned memory above that capacity, which no repair or FM move does (both keep every
// capacity that holds). Coarse levels of a V-cycle keep this: a cluster holding a token block
// carries its memory.
#include <chrono>
#include <numeric>
#include <string>

#include "dcp/error.h"
#include "placement/driver.h"
#include "placement/multilevel.h"

namespace dcp {

namespace {

double mean_full_memory(const PlacementHypergraph& h, const std::vector<int32_t>& parts, int num_dev) {
  const std::vector<int64_t> full = full_memory_bytes(h, parts, num_dev);
  return static_cast<double>(std::accumulate(full.begin(), full.end(), int64_t{0})) / num_dev;
}

}  // namespace

DcpPlacement place_tiles_on_homes(const BlockTable& table, const Cluster& cluster,
                                  const PlacementOptions& opts, const Placement& start) {
  opts.validate();
  cluster.validate("cluster");
  start.validate(table);
  const int num_dev = cluster.num_devices();
  if (start.num_devices != num_dev)
    raise(ErrorKind::InvalidInput, "place_tiles_on_homes: placement has " + std::to_string(start.num_devices) +
                                       " devices, cluster " + std::to_string(num_dev));
  const auto t_start = std::chrono::steady_clock::now();
  DcpPlacement out;
  out.report.partitioner = "homes fixed";
  const PlacementHypergraph h = build_placement_hypergraph(table, opts.tile_cost);
  std::vector<int32_t> parts = placement_to_parts(h, start);
  if (num_dev > 1) {
    placement::SubHypergraph all = placement::make_all_devices(table, h, cluster);
    // On one node the flat cost is the objective (every remote device is on the home's node),
    // and flat FM keeps its gains in a cache.
    if (cluster.nodes == 1) all.part_node.clear();
    std::vector<int32_t> sub(static_cast<size_t>(all.num_vertices()));
    for (int32_t i = 0; i < all.num_vertices(); ++i) sub[i] = parts[all.global[i]];
    placement::PartCaps caps;
    const double total_c = std::accumulate(h.compute_flops.begin(), h.compute_flops.end(), 0.0);
    caps.compute.assign(num_dev, (1 + opts.eps_compute) * total_c / num_dev);
    caps.memory.assign(num_dev, 0.0);
    for (int32_t i = 0; i < all.num_vertices(); ++i) caps.memory[sub[i]] += all.memory[i];
    // Room for rounding in the refinement's running sums, far below any token block's bytes.
    for (double& m : caps.memory) m += 0.5 + m * 1e-12;
    // Full memory: the repairs hold the bound itself, FM aims below it (full_memory_target_first),
    // so that the mean, which drops as tiles move to their data, leaves its devices under it.
    const auto full_caps = [&](const std::vector<int32_t>& p, double share_of_eps) {
      std::vector<int32_t> global(parts.size());
      for (int32_t i = 0; i < all.num_vertices(); ++i) global[all.global[i]] = p[i];
      caps.full_memory.assign(num_dev, (1 + opts.eps_memory * share_of_eps) * mean_full_memory(h, global, num_dev));
    };
    // Compute first, with full memory unbounded: a start far from balance (every tile at its
    // query block's home) would otherwise find most targets closed by the copies a move brings.
    placement::repair_balance(all, caps, sub);
    full_caps(sub, 1.0);
    placement::repair_balance(all, caps, sub);
    full_caps(sub, opts.full_memory_target_first);
    if (opts.multilevel.enabled)
      placement::refine_multilevel(all, caps, opts.multilevel, opts.refine, opts.seed, sub);
    else
      placement::refine_fm(all, caps, opts.refine, opts.seed, sub);
    // A device left near its cap can end over the bound at the new mean: repaired there (the
    // repair lowers the mean again, hence a second round).
    for (int round = 0; round < 2; ++round) {
      full_caps(sub, 1.0);
      if (!(placement::cap_excess(all, caps, sub).full > 0)) break;
      placement::repair_balance(all, caps, sub);
    }
    for (int32_t i = 0; i < all.num_vertices(); ++i) parts[all.global[i]] = sub[i];
    for (int32_t b = 0; b < table.num_token_blocks(); ++b)
      if (parts[h.block_vertex(b)] != start.block_home[b])
        raise(ErrorKind::Internal, "place_tiles_on_homes: token block " + std::to_string(b) + " left its home");
  }
  placement::measure(h, parts, cluster, opts, out, "dcp");
  out.report.total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  return out;
}

}  // namespace dcp
