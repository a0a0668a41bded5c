// The sub-hypergraphs the driver's levels and repairs work on.
#include <algorithm>

#include "placement/driver.h"

namespace dcp::placement {

SubHypergraph make_sub(const BlockTable& table, const PlacementHypergraph& h,
                                  const std::vector<int32_t>& level_part, int32_t which,
                                  double inter_weight) {
  SubHypergraph s;
  const int32_t nv = h.num_vertices();
  std::vector<int32_t> local(static_cast<size_t>(nv), -1);
  size_t count = static_cast<size_t>(nv);
  if (which >= 0) count = static_cast<size_t>(std::count(level_part.begin(), level_part.end(), which));
  for (auto* v : {&s.global, &s.seq, &s.group, &s.row, &s.col}) v->reserve(count);
  s.compute.reserve(count);
  s.memory.reserve(count);
  for (int32_t v = 0; v < nv; ++v) {
    if (which >= 0 && level_part[v] != which) continue;
    local[v] = static_cast<int32_t>(s.global.size());
    s.global.push_back(v);
    s.compute.push_back(h.compute_flops[v]);
    s.memory.push_back(static_cast<double>(h.memory_bytes[v]));
    if (v < h.num_tiles) {
      const Tile& t = table.tiles[v];
      s.seq.push_back(t.seq);
      s.group.push_back(t.head_group);
      s.row.push_back(t.q_block);
      s.col.push_back(t.kv_block);
    } else {
      const int32_t b = v - h.num_tiles;
      s.seq.push_back(table.token_blocks[b].seq);
      s.group.push_back(-1);
      s.row.push_back(b);
      s.col.push_back(b);
    }
  }
  s.anchor.assign(s.global.size(), -1);
  s.net_begin.push_back(0);
  // The nets with a pin here (a part's vertices touch a small share of the nets, whose pins are
  // all that need walking): its token blocks' nets and its tiles' two nets each.
  std::vector<uint8_t> has_pin(static_cast<size_t>(h.num_nets()), static_cast<uint8_t>(which < 0 ? 1 : 0));
  if (which >= 0) {
    for (const int32_t v : s.global) {
      if (v < h.num_tiles) {
        const Tile& t = table.tiles[v];
        has_pin[static_cast<size_t>(tile_q_net(h, t))] = 1;
        has_pin[static_cast<size_t>(tile_kv_net(table, h, t))] = 1;
      } else {
        const int32_t first_net = (v - h.num_tiles) * h.nets_per_block;
        std::fill_n(has_pin.begin() + first_net, h.nets_per_block, uint8_t{1});
      }
    }
  }
  for (int32_t e = 0; e < h.num_nets(); ++e) {
    if (!has_pin[static_cast<size_t>(e)]) continue;
    const int32_t home = h.pins[h.net_begin[e]];
    const size_t first = s.pins.size();
    for (int64_t i = h.net_begin[e]; i < h.net_begin[e + 1]; ++i)
      if (local[h.pins[i]] >= 0) s.pins.push_back(local[h.pins[i]]);
    if (s.pins.size() == first) continue;
    const bool external = local[home] < 0;
    if (!external) {
      const bool q_side = e % h.nets_per_block < h.num_head_groups;
      for (size_t i = first + 1; i < s.pins.size(); ++i) {
        int32_t& a = s.anchor[s.pins[i]];
        // Q side wins: nets come block by block, so a KV anchor may be overwritten by Q.
        if (q_side || a < 0) a = local[home];
      }
    }
    s.net_begin.push_back(static_cast<int64_t>(s.pins.size()));
    // At the node level (which < 0) every cut byte crosses nodes; at the device level a net
    // whose home is on another node is inter-node for every device it touches here.
    const double w = which < 0 || external ? inter_weight : 1.0;
    s.net_weight.push_back(w * static_cast<double>(h.net_bytes[e]));
    s.net_external.push_back(external ? 1 : 0);
    s.net_held.push_back(static_cast<double>(std::max(h.held_fwd_bytes[e], h.held_bwd_bytes[e])));
    s.net_home.push_back(local[home]);
  }
  s.finish_incidence();
  return s;
}

SubHypergraph make_all_devices(const BlockTable& table, const PlacementHypergraph& h,
                               const Cluster& cluster) {
  const std::vector<int32_t> none(static_cast<size_t>(h.num_vertices()), 0);
  SubHypergraph all = make_sub(table, h, none, -1, 1.0);
  all.part_node.resize(static_cast<size_t>(cluster.num_devices()));
  for (int d = 0; d < cluster.num_devices(); ++d) all.part_node[d] = cluster.node_of(d);
  all.node_factor = cluster.inter_weight();
  return all;
}

}  // namespace dcp::placement
