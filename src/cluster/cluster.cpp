// Cluster model: checks, the inter-node weight and the named presets.
#include "dcp/cluster.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "dcp/error.h"
#include "dcp/limits.h"

namespace dcp {

namespace {

std::string field(const std::string& where, const char* name) {
  return where.empty() ? std::string(name) : where + "." + name;
}

std::string number_text(double v) {
  // Shortest text that reads back as the same double, for error messages.
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  for (int precision = 1; precision <= 17; ++precision) {
    char shorter[32];
    std::snprintf(shorter, sizeof shorter, "%.*g", precision, v);
    if (std::strtod(shorter, nullptr) == v) return shorter;
  }
  return buf;
}

void require_positive(double v, const std::string& where, const char* name) {
  if (!(v > 0.0) || !std::isfinite(v)) {
    raise(ErrorKind::InvalidInput,
          field(where, name) + ": must be a finite number > 0, got " + number_text(v));
  }
}

void require_non_negative(double v, const std::string& where, const char* name) {
  if (!(v >= 0.0) || !std::isfinite(v)) {
    raise(ErrorKind::InvalidInput,
          field(where, name) + ": must be a finite number >= 0, got " + number_text(v));
  }
}

// p4d/p4de: 8 x A100-80GB on NVSwitch (300 GB/s per GPU per direction) and 4 x 100 Gbps EFA
// NICs per node, 50 GB/s per node. The 4 NICs are shared by 8 GPUs. One GPU sending alone gets
// one NIC, 12.5 GB/s: that is inter_bw_device. When all 8 send across nodes at once they share
// the node's 50 GB/s, 6.25 GB/s each; the node cap nic_bw_node models that case, so the two
// figures are kept apart rather than folded into one pessimistic per-device rate.
// Attention rates are FlashAttention-2 on an A100 (mask-area FLOPs: 4 x area x head dim x
// query heads).
Cluster a100_p4d(int nodes) {
  Cluster c;
  c.name = "a100-p4d";
  c.nodes = nodes;
  c.devices_per_node = 8;
  c.intra_bw = 300e9;
  c.inter_bw_device = 12.5e9;
  c.nic_bw_node = 50e9;
  c.intra_latency_s = 5e-6;
  c.inter_latency_s = 15e-6;
  c.attn_fwd_flops = 190e12;
  c.attn_bwd_flops = 150e12;
  c.device_memory_bytes = 80e9;
  return c;
}

// 8 x H200 on NVLink (450 GB/s per GPU per direction) and 8 x 400 Gbps NICs per node: one NIC
// per GPU, 50 GB/s each, 400 GB/s per node. Attention rates are cuDNN SDPA as measured on an
// H200 (fwd ~600, bwd ~530 TFLOP/s for long causal sequences; /work/shared/device.md).
// Latencies are typical figures, not measured here.
Cluster h200_nvl(int nodes) {
  Cluster c;
  c.name = "h200-nvl";
  c.nodes = nodes;
  c.devices_per_node = 8;
  c.intra_bw = 450e9;
  c.inter_bw_device = 50e9;
  c.nic_bw_node = 400e9;
  c.intra_latency_s = 5e-6;
  c.inter_latency_s = 15e-6;
  c.attn_fwd_flops = 600e12;
  c.attn_bwd_flops = 530e12;
  c.device_memory_bytes = 141e9;
  return c;
}

// 8 x H100 SXM 80 GB on NVLink (450 GB/s per GPU per direction) and 8 x 400 Gbps NICs per node,
// as in DGX H100 / p5 nodes. Attention rates are cuDNN SDPA as measured on an H100 80GB HBM3 in
// this project's kernel calls (bench/results/kernels_h100_2026-12-05.json: fwd ~620-634, bwd
// ~545-556 TFLOP/s for 32K sequences). Latencies are typical figures, not measured here.
Cluster h100_sxm(int nodes) {
  Cluster c = h200_nvl(nodes);
  c.name = "h100-sxm";
  c.attn_fwd_flops = 620e12;
  c.attn_bwd_flops = 545e12;
  c.device_memory_bytes = 80e9;
  return c;
}

}  // namespace

double Cluster::inter_weight() const { return intra_bw / inter_bw_device; }

void Cluster::validate(const std::string& where) const {
  if (nodes < 1 || nodes > kMaxNodes) {
    raise(ErrorKind::InvalidInput, field(where, "nodes") + ": must be in [1, " + std::to_string(kMaxNodes) + "], got " +
                                       std::to_string(nodes));
  }
  if (devices_per_node < 1 || devices_per_node > kMaxDevicesPerNode) {
    raise(ErrorKind::InvalidInput, field(where, "devices_per_node") + ": must be in [1, " +
                                       std::to_string(kMaxDevicesPerNode) + "], got " + std::to_string(devices_per_node));
  }
  if (int64_t{nodes} * devices_per_node > kMaxDevices) {
    raise(ErrorKind::InvalidInput, field(where, "nodes") + " x " + field(where, "devices_per_node") + ": " +
                                       std::to_string(nodes) + " x " + std::to_string(devices_per_node) +
                                       " devices exceed the limit of " + std::to_string(kMaxDevices));
  }
  require_positive(intra_bw, where, "intra_bw");
  require_positive(inter_bw_device, where, "inter_bw_device");
  require_positive(nic_bw_node, where, "nic_bw_node");
  require_non_negative(intra_latency_s, where, "intra_latency");
  require_non_negative(inter_latency_s, where, "inter_latency");
  require_positive(attn_fwd_flops, where, "attn_fwd_flops");
  require_positive(attn_bwd_flops, where, "attn_bwd_flops");
  require_positive(device_memory_bytes, where, "device_memory_bytes");
}

std::vector<std::string> cluster_preset_names() { return {"a100-p4d", "h100-sxm", "h200-nvl"}; }

std::string cluster_preset_for_gpu(const std::string& gpu_name) {
  // Only the cards the kernels were measured on: an H100 PCIe or NVL, or a GH200, runs at other
  // power and memory limits.
  const auto has = [&](const char* s) { return gpu_name.find(s) != std::string::npos; };
  if (has("H100") && has("HBM3") && !has("PCIe")) return "h100-sxm";  // "NVIDIA H100 80GB HBM3"
  if (gpu_name.starts_with("NVIDIA H200")) return "h200-nvl";         // "NVIDIA H200", "NVIDIA H200 NVL"
  return "";
}

Cluster cluster_preset(const std::string& name, int nodes) {
  Cluster c;
  if (name == "a100-p4d") {
    c = a100_p4d(nodes);
  } else if (name == "h100-sxm") {
    c = h100_sxm(nodes);
  } else if (name == "h200-nvl") {
    c = h200_nvl(nodes);
  } else {
    std::string known;
    for (const std::string& n : cluster_preset_names()) known += (known.empty() ? "" : ", ") + n;
    raise(ErrorKind::InvalidInput,
          "cluster.preset: unknown preset '" + name + "' (expected one of " + known + ")");
  }
  c.validate("cluster");
  return c;
}

NodeLayout node_layout_of(const std::vector<int>& node_of_rank) {
  if (node_of_rank.empty()) raise(ErrorKind::InvalidInput, "node layout: no ranks");
  // Runs of equal ids: one per node when the ranks come in blocks.
  std::vector<int> run_ids;
  std::vector<int> run_sizes;
  for (const int id : node_of_rank) {
    if (!run_ids.empty() && run_ids.back() == id) {
      ++run_sizes.back();
    } else {
      run_ids.push_back(id);
      run_sizes.push_back(1);
    }
  }
  std::vector<int> distinct;  // ids in order of first appearance: node k is the k-th
  for (const int id : node_of_rank)
    if (std::find(distinct.begin(), distinct.end(), id) == distinct.end()) distinct.push_back(id);
  auto ranks_text = [&] {
    std::string text;
    for (size_t r = 0; r < node_of_rank.size() && r < 64; ++r) {
      const auto node = std::find(distinct.begin(), distinct.end(), node_of_rank[r]) - distinct.begin();
      text += (r ? ", " : "") + std::string("rank ") + std::to_string(r) + ": node " + std::to_string(node);
    }
    return node_of_rank.size() > 64 ? text + ", ..." : text;
  };
  if (run_ids.size() != distinct.size())
    raise(ErrorKind::InvalidInput, "node layout: the ranks are not grouped by node (" + ranks_text() +
                                       "); devices are numbered node by node: launch ranks in blocks per node "
                                       "(mpirun --map-by slot, srun's block distribution), or give the node size");
  for (const int size : run_sizes)
    if (size != run_sizes.front())
      raise(ErrorKind::InvalidInput, "node layout: the nodes hold different numbers of ranks (" + ranks_text() +
                                         "); the cluster model needs as many on every node (or give the node size)");
  return NodeLayout{static_cast<int>(run_ids.size()), run_sizes.front()};
}

}  // namespace dcp
