// Tiles placed on token homes fixed beforehand (place_tiles_on_homes), and homes refined for
// several tables at once (refine_homes_for_kinds): one token placement shared by the plans of
// several layer kinds.
//
// The homes are pinned without a special case in the refinement: every device's owned-memory
// capacity is set to exactly what its homes own. Tiles weigh no memory, so they move freely under
// the compute and full-memory capacities, while a token block could only enter a device by
// raising its owned memory above that capacity, which no repair or FM move does (both keep every
// capacity that holds). Coarse levels of a V-cycle keep this: a cluster holding a token block
// carries its memory.
#include <algorithm>
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

std::vector<Placement> refine_homes_for_kinds(const std::vector<const BlockTable*>& tables,
                                              const std::vector<double>& layers, const Cluster& cluster,
                                              const PlacementOptions& opts, const std::vector<Placement>& starts) {
  opts.validate();
  const int num_dev = cluster.num_devices();
  const size_t nk = tables.size();
  if (nk == 0 || starts.size() != nk || layers.size() != nk)
    raise(ErrorKind::InvalidInput, "refine_homes_for_kinds: " + std::to_string(nk) + " tables, " +
                                       std::to_string(starts.size()) + " placements, " + std::to_string(layers.size()) +
                                       " layer counts");
  for (size_t k = 0; k < nk; ++k) {
    starts[k].validate(*tables[k]);
    if (starts[k].block_home != starts[0].block_home || tables[k]->num_token_blocks() != tables[0]->num_token_blocks())
      raise(ErrorKind::InvalidInput, "refine_homes_for_kinds: table " + std::to_string(k) +
                                         " does not share table 0's token blocks and homes");
  }
  if (num_dev <= 1) return starts;
  // One sub-hypergraph over every kind: token blocks first, then each table's tiles; each table's
  // nets with their pins renumbered, weighed by its layers (its transfers repeat every layer).
  const int32_t nb = tables[0]->num_token_blocks();
  std::vector<PlacementHypergraph> hs;
  std::vector<int32_t> offset{nb};
  for (size_t k = 0; k < nk; ++k) {
    hs.push_back(build_placement_hypergraph(*tables[k], opts.tile_cost));
    offset.push_back(offset.back() + hs.back().num_tiles);
  }
  placement::SubHypergraph s;
  const int32_t nv = offset.back();
  s.global.resize(static_cast<size_t>(nv));
  for (int32_t v = 0; v < nv; ++v) s.global[v] = v;
  s.compute.assign(static_cast<size_t>(nv), 0.0);
  s.memory.assign(static_cast<size_t>(nv), 0.0);
  // Flat FM reads no geometry (seq, group, row, col, anchor): they stay empty.
  for (int32_t b = 0; b < nb; ++b) s.memory[b] = static_cast<double>(hs[0].memory_bytes[hs[0].block_vertex(b)]);
  s.net_begin.push_back(0);
  for (size_t k = 0; k < nk; ++k) {
    const PlacementHypergraph& h = hs[k];
    const auto map = [&](int32_t v) { return v < h.num_tiles ? offset[k] + v : v - h.num_tiles; };
    for (int32_t t = 0; t < h.num_tiles; ++t) s.compute[offset[k] + t] = layers[k] * h.compute_flops[t];
    for (int32_t e = 0; e < h.num_nets(); ++e) {
      if (h.net_begin[e + 1] - h.net_begin[e] < 2) continue;  // a home alone costs nothing
      for (int64_t i = h.net_begin[e]; i < h.net_begin[e + 1]; ++i) s.pins.push_back(map(h.pins[i]));
      s.net_begin.push_back(static_cast<int64_t>(s.pins.size()));
      s.net_weight.push_back(layers[k] * static_cast<double>(h.net_bytes[e]));
      s.net_external.push_back(0);
      s.net_held.push_back(static_cast<double>(std::max(h.held_fwd_bytes[e], h.held_bwd_bytes[e])));
      s.net_home.push_back(map(h.pins[h.net_begin[e]]));
    }
  }
  s.finish_incidence();
  if (cluster.nodes > 1) {
    s.part_node.resize(static_cast<size_t>(num_dev));
    for (int d = 0; d < num_dev; ++d) s.part_node[d] = cluster.node_of(d);
    s.node_factor = cluster.inter_weight();
  }
  // Flat k-way FM from the kinds' own placements. A V-cycle instead did better on one setting and
  // worse on another (lambda*3+causal, ldc: a100-p4d 2 x 8, 65536 tokens, predicted step 13.19
  // against 13.47 ms; 4 x 8, 131072 tokens, 18.99 against 17.70).
  std::vector<int32_t> part(static_cast<size_t>(nv));
  for (int32_t b = 0; b < nb; ++b) part[b] = starts[0].block_home[b];
  for (size_t k = 0; k < nk; ++k)
    for (int32_t t = 0; t < hs[k].num_tiles; ++t) part[offset[k] + t] = starts[k].tile_device[t];
  placement::PartCaps caps;
  const double total_c = std::accumulate(s.compute.begin(), s.compute.end(), 0.0);
  const double total_m = std::accumulate(s.memory.begin(), s.memory.end(), 0.0);
  caps.compute.assign(num_dev, (1 + opts.eps_compute) * total_c / num_dev);
  caps.memory.assign(num_dev, (1 + opts.eps_memory) * total_m / num_dev);
  const std::vector<double> full = placement::full_loads(s, [&] {
    std::vector<int32_t> count(static_cast<size_t>(s.num_nets()) * num_dev, 0);
    for (int32_t e = 0; e < s.num_nets(); ++e)
      for (int64_t i = s.net_begin[e]; i < s.net_begin[e + 1]; ++i) ++count[static_cast<size_t>(e) * num_dev + part[s.pins[i]]];
    return count;
  }(), num_dev, part);
  caps.full_memory.assign(num_dev, (1 + opts.eps_memory * opts.full_memory_target_first) *
                                       std::accumulate(full.begin(), full.end(), 0.0) / num_dev);
  placement::refine_fm(s, caps, opts.refine, opts.seed, part);
  std::vector<Placement> out = starts;
  for (size_t k = 0; k < nk; ++k) {
    for (int32_t b = 0; b < nb; ++b) out[k].block_home[b] = part[b];
    for (int32_t t = 0; t < hs[k].num_tiles; ++t) out[k].tile_device[t] = part[offset[k] + t];
  }
  return out;
}

}  // namespace dcp
