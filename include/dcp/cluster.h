// dcp/cluster.h — the machines a plan runs on: nodes x devices, links and compute rates.
//
// Bandwidths are bytes per second in one direction. A device reaches devices of its own node
// over `intra_bw` and other nodes over `inter_bw_device`, while all devices of a node share
// the node's NICs (`nic_bw_node`).
#pragma once

#include <string>
#include <vector>

namespace dcp {

struct Cluster {
  std::string name = "custom";
  int nodes = 1;
  int devices_per_node = 8;
  double intra_bw = 300e9;         // B/s per device, one direction (NVLink/NVSwitch)
  double inter_bw_device = 12.5e9; // B/s per device toward other nodes
  double nic_bw_node = 50e9;       // B/s per node, all NICs together
  double intra_latency_s = 5e-6;
  double inter_latency_s = 15e-6;
  double attn_fwd_flops = 190e12;  // attention kernel rate (mask-area FLOPs/s), forward
  double attn_bwd_flops = 150e12;  // backward
  double device_memory_bytes = 80e9;
  // Weight of an inter-node byte relative to an intra-node byte in placement objectives.
  double inter_weight() const;

  int num_devices() const { return nodes * devices_per_node; }
  int node_of(int device) const { return device / devices_per_node; }
  void validate(const std::string& where) const;  // throws InvalidInput naming the field
};

// How ranks sit on machines: node_of_rank[r] names rank r's machine (any ids; equal ids, one
// machine). The cluster model numbers devices node by node, so each machine's ranks must be
// consecutive and every machine must hold as many: anything else throws InvalidInput naming
// each rank's node (a launcher that deals ranks round-robin over nodes, or uneven nodes).
struct NodeLayout {
  int nodes = 1;
  int devices_per_node = 1;
};
NodeLayout node_layout_of(const std::vector<int>& node_of_rank);

// Presets: "a100-p4d" (paper: 8 x A100-80GB, NVSwitch, 4 x 100 Gbps per node),
// "h100-sxm" (8 x H100 SXM 80 GB, NVLink, 8 x 400 Gbps per node), "h200-nvl" (8 x H200, NVLink,
// 8 x 400 Gbps per node). Throws InvalidInput for other names, listing the known ones.
Cluster cluster_preset(const std::string& name, int nodes);
std::vector<std::string> cluster_preset_names();
// The preset whose kernels were measured on the GPU of this product name (as CUDA names it:
// "NVIDIA H100 80GB HBM3" -> "h100-sxm", "NVIDIA H200" -> "h200-nvl"); empty for other GPUs,
// other H100 forms (PCIe, NVL) and the GH200 among them.
std::string cluster_preset_for_gpu(const std::string& gpu_name);

}  // namespace dcp
