// dcp/metrics.h — exact costs of a placement: compute and memory per device, bytes moved.
//
// Communication model (what a plan will move, counted once per (data block, remote device)):
//   forward : Q and KV to every non-home device computing a tile that reads them;
//             partial O (fp32) + LSE back from each such device to the Q block's home.
//   backward: Q, dO, LSE, Delta and KV to remote devices; dQ and dKV partials (fp32) back.
// So each Q-side and KV-side data group is a net whose cost is bytes x (devices touching it - 1).
// Memory per device counts owned data, received copies and partial buffers; the figure is the
// larger of the forward and backward working sets.
#pragma once

#include <cstdint>
#include <vector>

#include "dcp/cluster.h"
#include "dcp/placement.h"

namespace dcp {

struct DeviceLoad {
  int64_t tokens = 0;            // tokens owned (home)
  int64_t num_tiles = 0;
  double fwd_flops = 0;
  double bwd_flops = 0;
  int64_t owned_bytes = 0;       // home data blocks (all tensors of fwd + bwd)
  int64_t recv_copy_bytes_fwd = 0;
  int64_t recv_copy_bytes_bwd = 0;
  int64_t partial_bytes_fwd = 0; // fp32 partial O + LSE kept for remote outputs
  int64_t partial_bytes_bwd = 0; // fp32 dQ / dKV partials kept for remote owners
  int64_t memory_fwd_bytes = 0;
  int64_t memory_bwd_bytes = 0;
  int64_t memory_bytes = 0;      // max(memory_fwd_bytes, memory_bwd_bytes)
  int64_t send_bytes = 0;        // fwd + bwd
  int64_t recv_bytes = 0;
};

struct PlacementMetrics {
  std::vector<DeviceLoad> devices;
  int64_t intra_bytes_fwd = 0, inter_bytes_fwd = 0;
  int64_t intra_bytes_bwd = 0, inter_bytes_bwd = 0;
  int64_t intra_bytes() const { return intra_bytes_fwd + intra_bytes_bwd; }
  int64_t inter_bytes() const { return inter_bytes_fwd + inter_bytes_bwd; }
  int64_t total_tokens = 0;
  double compute_imbalance = 0;  // max / mean of fwd+bwd FLOPs
  double memory_imbalance = 0;   // max / mean of memory_bytes
  double bytes_per_token() const;
};

PlacementMetrics compute_metrics(const BlockTable& table, const Placement& placement,
                                 const Cluster& cluster);

}  // namespace dcp
