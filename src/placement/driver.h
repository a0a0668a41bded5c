// placement/driver.h — the pieces of the hierarchical driver shared by place.cpp (the levels)
// and full_memory.cpp (the repairs after them). Not part of the public interface.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "dcp/partition.h"
#include "placement/kway.h"

namespace dcp::placement {

// True when the instance takes the light path (PlacementOptions::large_vertices).
inline bool is_large(const PlacementHypergraph& h, const PlacementOptions& opts) {
  return opts.large_vertices > 0 && h.num_vertices() > opts.large_vertices;
}

// The nets of build_placement_hypergraph's numbering: token block b holds nets
// b * nets_per_block + j (its head groups' Q sides, then its KV sets); a tile is a pin of the
// Q-side net of its query block and head group and the KV-side net of its key block and KV set.
inline int32_t tile_q_net(const PlacementHypergraph& h, const Tile& t) {
  return t.q_block * h.nets_per_block + t.head_group;
}
inline int32_t tile_kv_net(const BlockTable& table, const PlacementHypergraph& h, const Tile& t) {
  return t.kv_block * h.nets_per_block + h.num_head_groups + table.groups.kv_set(t.head_group);
}

// The sub-hypergraph of the vertices with level_part[v] == which (all of them when which < 0),
// with the tile geometry. Nets keep their pins inside; a net whose home lies outside is
// external. Net weight: bytes x inter_weight at the node level (which < 0: every cut byte
// crosses nodes) and for external nets (read from another node by every device touching it),
// bytes otherwise.
SubHypergraph make_sub(const BlockTable& table, const PlacementHypergraph& h,
                       const std::vector<int32_t>& level_part, int32_t which, double inter_weight);

// Every device as one level under the exact hierarchical cost (net weight = bytes, node of every
// device, node_factor = the cluster's inter weight): its objective is connectivity_bytes'.
SubHypergraph make_all_devices(const BlockTable& table, const PlacementHypergraph& h,
                               const Cluster& cluster);

// Every device as one level (make_all_devices), built on first use: it does not depend on the
// partition, so the repairs of every node candidate and the global refinement share one (node
// candidates placed at the same time included: the first caller builds it, the others wait).
class AllDevices {
 public:
  AllDevices(const BlockTable& table, const PlacementHypergraph& h, const Cluster& cluster)
      : table_(table), h_(h), cluster_(cluster) {}
  const SubHypergraph& get() {
    std::call_once(built_, [this] { all_ = make_all_devices(table_, h_, cluster_); });
    return all_;
  }

 private:
  const BlockTable& table_;
  const PlacementHypergraph& h_;
  const Cluster& cluster_;
  SubHypergraph all_;
  std::once_flag built_;
};

// The bounds after the levels: per-device compute and owned memory (moving blocks across nodes
// when a node's share cannot be split), then full memory (enforce_full_memory). `backend`
// (nullptr: repairs only, nothing is refined) re-partitions nodes under the full-memory bound
// and refines what the repairs moved. `pool` (may be null) repairs the nodes of a round at the
// same time; the result does not depend on it.
void repair_bounds(const BlockTable& table, const PlacementHypergraph& h, const Cluster& cluster,
                   const PlacementOptions& opts, const Partitioner* backend,
                   AllDevices& all_devices, TaskPool* pool, std::vector<int32_t>& parts);

// The report of a finished placement (bytes, objective, every bound checked) and the placement
// itself, with `method`; a violated bound is named in its note.
void measure(const PlacementHypergraph& h, const std::vector<int32_t>& parts, const Cluster& cluster,
             const PlacementOptions& opts, DcpPlacement& out, const std::string& method);
// With opts.global_refinement and several nodes: FM over all devices on the exact objective
// under every bound, kept only when it adds no violation (PlacementOptions::global_refinement).
// `pool` (may be null): as refine_fm's.
void refine_all_devices(const PlacementHypergraph& h, const Cluster& cluster,
                        const PlacementOptions& opts, AllDevices& all_devices, TaskPool* pool,
                        std::vector<int32_t>& parts);

}  // namespace dcp::placement
