// The placement hypergraph of a block table and the exact byte count of a partition of it.
#include <algorithm>
#include <cmath>
#include <string>

#include "dcp/error.h"
#include "dcp/partition.h"
#include "placement/driver.h"

namespace dcp {

namespace {

int64_t q_side_bytes(const BlockTable& t, int64_t tokens) {
  // forward: Q out, partial O (fp32) + LSE back; backward: Q, dO, LSE, Delta out, dQ partial
  // (fp32) back. Partials travel in fp32, as compute_metrics counts them.
  return 2 * t.data_bytes(DataKind::Q, tokens) + t.partial_bytes(DataKind::O, tokens) +
         2 * t.data_bytes(DataKind::LSE, tokens) + t.data_bytes(DataKind::dO, tokens) +
         t.data_bytes(DataKind::Delta, tokens) + t.partial_bytes(DataKind::dQ, tokens);
}

int64_t kv_side_bytes(const BlockTable& t, int64_t tokens) {
  return 2 * t.data_bytes(DataKind::KV, tokens) + t.partial_bytes(DataKind::dKV, tokens);
}

// What a non-home device touching the net holds (mirrors compute_metrics' memory model).
int64_t q_held_fwd(const BlockTable& t, int64_t n) {
  return t.data_bytes(DataKind::Q, n) + t.partial_bytes(DataKind::O, n) +
         t.partial_bytes(DataKind::LSE, n);
}
int64_t q_held_bwd(const BlockTable& t, int64_t n) {
  return t.data_bytes(DataKind::Q, n) + t.data_bytes(DataKind::dO, n) +
         t.data_bytes(DataKind::LSE, n) + t.data_bytes(DataKind::Delta, n) +
         t.partial_bytes(DataKind::dQ, n);
}
int64_t kv_held_fwd(const BlockTable& t, int64_t n) { return t.data_bytes(DataKind::KV, n); }
int64_t kv_held_bwd(const BlockTable& t, int64_t n) {
  return t.data_bytes(DataKind::KV, n) + t.partial_bytes(DataKind::dKV, n);
}

int64_t owned_bytes(const BlockTable& t, int64_t tokens) {
  const int64_t per_group = t.data_bytes(DataKind::Q, tokens) + t.data_bytes(DataKind::O, tokens) +
                            t.data_bytes(DataKind::LSE, tokens) +
                            t.data_bytes(DataKind::dO, tokens) +
                            t.data_bytes(DataKind::dQ, tokens) +
                            t.data_bytes(DataKind::Delta, tokens);
  const int64_t per_set = t.data_bytes(DataKind::KV, tokens) + t.data_bytes(DataKind::dKV, tokens);
  return per_group * t.groups.num_groups + per_set * t.groups.num_kv_sets();
}

}  // namespace

double TileCost::weight(const BlockTable& table, const Tile& t) const {
  const auto k = static_cast<size_t>(t.kind);
  return table.tile_flops_fwd(t) * fwd[k] + table.tile_flops_bwd(t) * bwd[k];
}

bool TileCost::is_flops() const {
  for (size_t k = 0; k < 3; ++k)
    if (fwd[k] != 1.0 || bwd[k] != 1.0) return false;
  return true;
}

PlacementHypergraph build_placement_hypergraph(const BlockTable& table, const TileCost& cost) {
  PlacementHypergraph h;
  const int32_t num_groups = table.groups.num_groups;
  const int32_t num_sets = table.groups.num_kv_sets();
  h.num_tiles = static_cast<int32_t>(table.tiles.size());
  h.num_token_blocks = table.num_token_blocks();
  h.num_head_groups = num_groups;
  h.nets_per_block = num_groups + num_sets;
  const int32_t num_nets = h.num_token_blocks * h.nets_per_block;
  const int32_t nv = h.num_vertices();
  h.compute_flops.assign(static_cast<size_t>(nv), 0.0);
  h.memory_bytes.assign(static_cast<size_t>(nv), 0);
  h.net_bytes.resize(static_cast<size_t>(num_nets));
  h.held_fwd_bytes.resize(static_cast<size_t>(num_nets));
  h.held_bwd_bytes.resize(static_cast<size_t>(num_nets));

  auto q_net = [&](const Tile& t) { return placement::tile_q_net(h, t); };
  auto kv_net = [&](const Tile& t) { return placement::tile_kv_net(table, h, t); };

  std::vector<int64_t> count(static_cast<size_t>(num_nets) + 1, 1);  // the home pin
  for (const Tile& t : table.tiles) {
    ++count[static_cast<size_t>(q_net(t))];
    ++count[static_cast<size_t>(kv_net(t))];
  }
  h.net_begin.assign(static_cast<size_t>(num_nets) + 1, 0);
  for (int32_t e = 0; e < num_nets; ++e) h.net_begin[e + 1] = h.net_begin[e] + count[e];
  h.pins.resize(static_cast<size_t>(h.net_begin.back()));
  std::vector<int64_t> fill(h.net_begin.begin(), h.net_begin.end() - 1);
  for (int32_t b = 0; b < h.num_token_blocks; ++b) {
    const int64_t tokens = table.token_blocks[b].length;
    h.memory_bytes[h.block_vertex(b)] = owned_bytes(table, tokens);
    for (int32_t j = 0; j < h.nets_per_block; ++j) {
      const int32_t e = b * h.nets_per_block + j;
      h.pins[fill[e]++] = h.block_vertex(b);
      const bool q = j < num_groups;
      h.net_bytes[e] = q ? q_side_bytes(table, tokens) : kv_side_bytes(table, tokens);
      h.held_fwd_bytes[e] = q ? q_held_fwd(table, tokens) : kv_held_fwd(table, tokens);
      h.held_bwd_bytes[e] = q ? q_held_bwd(table, tokens) : kv_held_bwd(table, tokens);
    }
  }
  for (int32_t i = 0; i < h.num_tiles; ++i) {
    const Tile& t = table.tiles[i];
    h.compute_flops[i] = cost.weight(table, t);
    h.pins[fill[q_net(t)]++] = i;
    h.pins[fill[kv_net(t)]++] = i;
  }
  return h;
}

std::vector<int32_t> placement_to_parts(const PlacementHypergraph& h, const Placement& p) {
  if (static_cast<int32_t>(p.tile_device.size()) != h.num_tiles ||
      static_cast<int32_t>(p.block_home.size()) != h.num_token_blocks)
    raise(ErrorKind::InvalidInput,
          "placement_to_parts: placement has " + std::to_string(p.tile_device.size()) +
              " tiles and " + std::to_string(p.block_home.size()) +
              " token blocks, the hypergraph " + std::to_string(h.num_tiles) + " and " +
              std::to_string(h.num_token_blocks));
  std::vector<int32_t> parts(p.tile_device.begin(), p.tile_device.end());
  parts.insert(parts.end(), p.block_home.begin(), p.block_home.end());
  return parts;
}

Placement parts_to_placement(const PlacementHypergraph& h, const std::vector<int32_t>& parts,
                             int num_devices, const std::string& method) {
  DCP_ASSERT(static_cast<int32_t>(parts.size()) == h.num_vertices());
  Placement p;
  p.method = method;
  p.num_devices = num_devices;
  p.tile_device.assign(parts.begin(), parts.begin() + h.num_tiles);
  p.block_home.assign(parts.begin() + h.num_tiles, parts.end());
  return p;
}

ConnectivityBytes connectivity_bytes(const PlacementHypergraph& h,
                                     const std::vector<int32_t>& parts, const Cluster& cluster) {
  DCP_ASSERT(static_cast<int32_t>(parts.size()) == h.num_vertices());
  ConnectivityBytes out;
  std::vector<int32_t> seen(static_cast<size_t>(cluster.num_devices()), -1);
  for (int32_t e = 0; e < h.num_nets(); ++e) {
    const int32_t home = parts[h.pins[h.net_begin[e]]];
    seen[home] = e;
    for (int64_t i = h.net_begin[e] + 1; i < h.net_begin[e + 1]; ++i) {
      const int32_t d = parts[h.pins[i]];
      if (seen[d] == e) continue;
      seen[d] = e;
      if (cluster.node_of(d) == cluster.node_of(home))
        out.intra_bytes += h.net_bytes[e];
      else
        out.inter_bytes += h.net_bytes[e];
    }
  }
  out.objective = static_cast<double>(out.intra_bytes) +
                  cluster.inter_weight() * static_cast<double>(out.inter_bytes);
  return out;
}

std::vector<int64_t> full_memory_bytes(const PlacementHypergraph& h,
                                       const std::vector<int32_t>& parts, int num_devices) {
  DCP_ASSERT(static_cast<int32_t>(parts.size()) == h.num_vertices());
  const auto nd = static_cast<size_t>(num_devices);
  std::vector<int64_t> owned(nd, 0), fwd(nd, 0), bwd(nd, 0);
  for (int32_t v = 0; v < h.num_vertices(); ++v) owned[parts[v]] += h.memory_bytes[v];
  std::vector<int32_t> seen(nd, -1);
  for (int32_t e = 0; e < h.num_nets(); ++e) {
    const int32_t home = parts[h.pins[h.net_begin[e]]];
    seen[home] = e;
    for (int64_t i = h.net_begin[e] + 1; i < h.net_begin[e + 1]; ++i) {
      const int32_t d = parts[h.pins[i]];
      if (seen[d] == e) continue;
      seen[d] = e;
      fwd[d] += h.held_fwd_bytes[e];
      bwd[d] += h.held_bwd_bytes[e];
    }
  }
  for (size_t d = 0; d < nd; ++d) owned[d] += std::max(fwd[d], bwd[d]);
  return owned;
}

const char* to_string(PartitionerKind kind) {
  switch (kind) {
    case PartitionerKind::Builtin: return "builtin";
    case PartitionerKind::Metis: return "metis";
    case PartitionerKind::Zoltan: return "zoltan";
  }
  return "?";
}

PartitionerKind parse_partitioner(const std::string& name) {
  for (PartitionerKind k :
       {PartitionerKind::Builtin, PartitionerKind::Metis, PartitionerKind::Zoltan})
    if (name == to_string(k)) return k;
  raise(ErrorKind::InvalidInput,
        "partitioner: unknown name '" + name + "' (expected builtin, metis or zoltan)");
}

std::vector<PartitionerKind> available_partitioners() {
  std::vector<PartitionerKind> out{PartitionerKind::Builtin};
#ifdef DCP_HAVE_METIS
  out.push_back(PartitionerKind::Metis);
#endif
#ifdef DCP_HAVE_ZOLTAN
  out.push_back(PartitionerKind::Zoltan);
#endif
  return out;
}

void PlacementOptions::validate() const {
  auto bad = [](const std::string& what) { raise(ErrorKind::InvalidInput, "placement: " + what); };
  if (!(eps_compute >= 0))
    bad("eps_compute must be >= 0 (got " + std::to_string(eps_compute) + ")");
  if (!(eps_memory >= 0)) bad("eps_memory must be >= 0 (got " + std::to_string(eps_memory) + ")");
  if (!(node_eps_factor > 0))
    bad("node_eps_factor must be > 0 (got " + std::to_string(node_eps_factor) + ")");
  if (!(node_compute_eps_factor >= 0))
    bad("node_compute_eps_factor must be >= 0, 0 = auto (got " +
        std::to_string(node_compute_eps_factor) + ")");
  if (refine.passes < 0)
    bad("refine.passes must be >= 0 (got " + std::to_string(refine.passes) + ")");
  if (!(refine.min_pass_gain >= 0) || !(refine.min_pass_gain_all_devices >= 0) ||
      !(refine.idle_moves_share > 0) || refine.idle_moves_min < 1 ||
      refine.idle_moves_max < refine.idle_moves_min || !(refine.idle_moves_share_all_devices > 0) ||
      refine.idle_moves_min_all_devices < 1 || refine.idle_moves_max < refine.idle_moves_min_all_devices)
    bad("refine: min_pass_gain >= 0, min_pass_gain_all_devices >= 0, idle_moves_share > 0, "
        "idle_moves_share_all_devices > 0, 1 <= idle_moves_min <= idle_moves_max and "
        "1 <= idle_moves_min_all_devices <= idle_moves_max are required");
  if (multilevel.node_deeper_vertices_per_part < 0)
    bad("multilevel.node_deeper_vertices_per_part must be >= 0, 0 = none (got " +
        std::to_string(multilevel.node_deeper_vertices_per_part) + ")");
  if (multilevel.vertices_per_part < 1 || !(multilevel.cluster_compute_share > 0) ||
      !(multilevel.cluster_memory_share > 0) || !(multilevel.min_shrink >= 0) ||
      multilevel.max_rated_net_pins < 2 || multilevel.max_levels < 0)
    bad("multilevel: vertices_per_part >= 1, cluster shares > 0, min_shrink >= 0, "
        "max_rated_net_pins >= 2 and max_levels >= 0 are required");
  if (!(node_candidate_margin >= 0))
    bad("node_candidate_margin must be >= 0 (got " + std::to_string(node_candidate_margin) + ")");
  if (std::isnan(candidate_refine_margin))
    bad("candidate_refine_margin must be a number (< 0: none)");
  if (full_memory_rounds < 0 || !(full_memory_target_first > 0 && full_memory_target_first <= 1) ||
      !(full_memory_target_later > 0 && full_memory_target_later <= 1))
    bad("full_memory_rounds must be >= 0 and the full-memory targets in (0, 1]");
  if (large_vertices < 0)
    bad("large_vertices must be >= 0, 0 = none (got " + std::to_string(large_vertices) + ")");
  if (threads < 1 || threads > 256)
    bad("threads must be in [1, 256] (got " + std::to_string(threads) + ")");
  if (initial_starts < 0 || initial_starts > 3)
    bad("initial_starts must be in [0, 3], 0 = auto (got " + std::to_string(initial_starts) + ")");
  for (size_t k = 0; k < 3; ++k)
    for (double c : {tile_cost.fwd[k], tile_cost.bwd[k]})
      if (!(c > 0) || !std::isfinite(c))
        bad("tile_cost entries must be positive and finite (got " + std::to_string(c) + " for tile kind " +
            std::to_string(k) + ")");
}

}  // namespace dcp
