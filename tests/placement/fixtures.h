// Shared fixtures of the placement tests: random batches, clusters, and one level of a table
// with capacities.
#pragma once

#include <cstdint>
#include <vector>

#include "dcp/blocks.h"
#include "dcp/partition.h"
#include "placement/kway.h"

namespace dcp::placement_test {

inline uint64_t next(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Skewed lengths (many short, a few long) filling `tokens`.
inline Batch random_batch(uint64_t seed, int64_t tokens, int q_heads, int kv_heads, Mask mask) {
  Batch b;
  b.shape.q_heads = q_heads;
  b.shape.kv_heads = kv_heads;
  b.shape.head_dim = 64;
  uint64_t s = seed;
  int64_t left = tokens;
  while (left > 0) {
    const int64_t r = static_cast<int64_t>(next(s) % 1000);
    int64_t len = r < 700 ? 16 + static_cast<int64_t>(next(s) % 200) : 200 + static_cast<int64_t>(next(s) % 1200);
    len = std::min(len, left);
    Sequence q;
    q.length = len;
    q.mask = mask;
    b.sequences.push_back(q);
    left -= len;
  }
  return b;
}

inline Cluster make_cluster(int nodes, int dpn) {
  Cluster c;
  c.nodes = nodes;
  c.devices_per_node = dpn;
  return c;
}

// The whole hypergraph of a table as one level (no external nets), with its geometry.
inline placement::SubHypergraph whole_level(const BlockTable& t, const PlacementHypergraph& h) {
  placement::SubHypergraph s;
  for (int32_t v = 0; v < h.num_vertices(); ++v) {
    s.global.push_back(v);
    s.compute.push_back(h.compute_flops[v]);
    s.memory.push_back(static_cast<double>(h.memory_bytes[v]));
    const bool tile = v < h.num_tiles;
    const int32_t b = v - h.num_tiles;
    s.seq.push_back(tile ? t.tiles[v].seq : t.token_blocks[b].seq);
    s.group.push_back(tile ? t.tiles[v].head_group : -1);
    s.row.push_back(tile ? t.tiles[v].q_block : b);
    s.col.push_back(tile ? t.tiles[v].kv_block : b);
  }
  s.anchor.assign(s.global.size(), -1);
  s.net_begin = h.net_begin;
  s.pins = h.pins;
  for (int64_t w : h.net_bytes) s.net_weight.push_back(static_cast<double>(w));
  s.net_external.assign(h.net_bytes.size(), 0);
  s.finish_incidence();
  return s;
}

// A partition's compute and memory per part.
struct PartLoads {
  std::vector<double> c, m;
};
inline PartLoads part_loads(const placement::SubHypergraph& s, const std::vector<int32_t>& part, int k) {
  PartLoads l{std::vector<double>(static_cast<size_t>(k), 0.0), std::vector<double>(static_cast<size_t>(k), 0.0)};
  for (int32_t v = 0; v < s.num_vertices(); ++v) {
    l.c[static_cast<size_t>(part[v])] += s.compute[v];
    l.m[static_cast<size_t>(part[v])] += s.memory[v];
  }
  return l;
}
// Every part within its caps (times 1 + rel, for round-off).
inline bool within_caps(const PartLoads& l, const placement::PartCaps& caps, double rel = 0.0) {
  for (size_t p = 0; p < l.c.size(); ++p)
    if (l.c[p] > caps.compute[p] * (1 + rel) || l.m[p] > caps.memory[p] * (1 + rel)) return false;
  return true;
}

// `batch` (block size 64) as one level of `sub_parts` devices per part, with k parts' caps at
// compute_slack / memory_slack times the mean compute / memory.
struct Level {
  BlockTable table;
  placement::SubHypergraph s;
  placement::PartCaps caps;
  double total_compute = 0;
};
inline Level whole_level_with_caps(const Batch& batch, int k, double compute_slack, double memory_slack, int sub_parts = 1) {
  Level level;
  level.table = build_block_table(batch, BlockOptions{.block_size = 64});
  level.s = whole_level(level.table, build_placement_hypergraph(level.table));
  level.s.sub_parts = sub_parts;
  double tm = 0;
  for (int32_t v = 0; v < level.s.num_vertices(); ++v) {
    level.total_compute += level.s.compute[v];
    tm += level.s.memory[v];
  }
  level.caps.compute.assign(static_cast<size_t>(k), compute_slack * level.total_compute / k);
  level.caps.memory.assign(static_cast<size_t>(k), memory_slack * tm / k);
  return level;
}

}  // namespace dcp::placement_test
