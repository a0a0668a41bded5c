// Small batches and plans for the plan, validate and sim tests (kept fast: few thousand tokens).
#pragma once

#include <string>
#include <vector>

#include "dcp/baselines.h"
#include "dcp/batch.h"
#include "dcp/cluster.h"
#include "dcp/partition.h"
#include "dcp/plan.h"

namespace dcp::testing {

inline Mask mask_named(const std::string& name, int64_t length) {
  if (name == "full") return Mask::full();
  if (name == "lambda") return Mask::lambda(64, 512);
  if (name == "causal_blockwise") return Mask::causal_blockwise(128, 2, 1);
  if (name == "shared_question") return Mask::shared_question_for(length, 0.2, 3);
  return Mask::causal();
}

inline const std::vector<std::string>& mask_names() {
  static const std::vector<std::string> names = {"causal", "full", "lambda", "causal_blockwise", "shared_question"};
  return names;
}

// Skewed lengths (one long, several short), like the paper's batches, `total` tokens in all.
inline Batch skewed_batch(const std::string& mask, int64_t total = 6144) {
  Batch b;
  b.shape.q_heads = 8;
  b.shape.kv_heads = 2;
  b.shape.head_dim = 64;
  const std::vector<int64_t> parts = {total / 2, total / 6, total / 8, total / 12, total / 24};
  int64_t used = 0;
  for (int64_t len : parts) {
    b.sequences.push_back(Sequence{len, mask_named(mask, len), ""});
    used += len;
  }
  if (total - used > 0) b.sequences.push_back(Sequence{total - used, mask_named(mask, total - used), ""});
  return b;
}

// P devices as nodes x devices_per_node with two nodes when P is even and >= 4.
inline Cluster cluster_for(int num_devices) {
  const int nodes = (num_devices >= 4 && num_devices % 2 == 0) ? 2 : 1;
  Cluster c = cluster_preset("a100-p4d", nodes);
  c.devices_per_node = num_devices / nodes;
  return c;
}

inline PlacedBatch placed(BaselineKind kind, const Batch& batch, int num_devices, int64_t block = 256) {
  BlockOptions opts;
  opts.block_size = block;
  return make_baseline(kind, batch, opts, cluster_for(num_devices));
}

// The DCP placement (built-in partitioner) on uniform token blocks of `block` tokens.
inline PlacedBatch dcp_placed(const Batch& batch, int num_devices, int64_t block = 256) {
  BlockOptions opts;
  opts.block_size = block;
  PlacedBatch pb;
  pb.table = build_block_table(batch, opts);
  pb.placement = place_dcp(pb.table, cluster_for(num_devices)).placement;
  return pb;
}

// The placement's token-block homes with every tile moved to a pseudo-random device
// (splitmix64 of the tile id and seed): outputs, Q and KV all travel, which baselines never do.
inline PlacedBatch scattered(PlacedBatch pb, uint64_t seed) {
  for (size_t t = 0; t < pb.placement.tile_device.size(); ++t) {
    uint64_t x = t * 0x9e3779b97f4a7c15ull + seed;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    x ^= x >> 31;
    pb.placement.tile_device[t] = static_cast<int32_t>(x % static_cast<uint64_t>(pb.placement.num_devices));
  }
  pb.placement.method = "scattered";
  return pb;
}

inline Plan plan_for(const PlacedBatch& pb, int num_devices, int comm_stages = 4) {
  PlanOptions opts;
  opts.schedule.num_comm_stages = comm_stages;
  return build_plan(pb.table, pb.placement, cluster_for(num_devices), opts);
}

}  // namespace dcp::testing
