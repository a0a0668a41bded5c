// Cluster presets, checks and the cluster JSON file.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "batch/test_helpers.h"
#include "dcp/cluster.h"
#include "dcp/io.h"

namespace dcp {
namespace {

TEST(Cluster, Presets) {
  EXPECT_EQ(cluster_preset_names(), (std::vector<std::string>{"a100-p4d", "h100-sxm", "h200-nvl"}));
  const Cluster a = cluster_preset("a100-p4d", 4);
  EXPECT_EQ(a.num_devices(), 32);
  EXPECT_EQ(a.node_of(17), 2);
  EXPECT_EQ(a.intra_bw, 300e9);
  EXPECT_EQ(a.inter_bw_device, 12.5e9);
  EXPECT_EQ(a.nic_bw_node, 50e9);
  EXPECT_EQ(a.attn_fwd_flops, 190e12);
  EXPECT_EQ(a.attn_bwd_flops, 150e12);
  EXPECT_EQ(a.device_memory_bytes, 80e9);
  EXPECT_DOUBLE_EQ(a.inter_weight(), 24.0);
  const Cluster h = cluster_preset("h200-nvl", 2);
  EXPECT_EQ(h.num_devices(), 16);
  EXPECT_EQ(h.intra_bw, 450e9);
  EXPECT_EQ(h.inter_bw_device, 50e9);
  EXPECT_EQ(h.nic_bw_node, 400e9);
  EXPECT_EQ(h.attn_fwd_flops, 600e12);
  EXPECT_EQ(h.attn_bwd_flops, 530e12);
  EXPECT_EQ(h.device_memory_bytes, 141e9);
  EXPECT_DOUBLE_EQ(h.inter_weight(), 9.0);
  // The H100 node: the H200's links, its own kernel rates and memory.
  const Cluster g = cluster_preset("h100-sxm", 2);
  EXPECT_EQ(g.name, "h100-sxm");
  EXPECT_EQ(g.num_devices(), 16);
  EXPECT_EQ(g.intra_bw, h.intra_bw);
  EXPECT_EQ(g.inter_bw_device, h.inter_bw_device);
  EXPECT_EQ(g.nic_bw_node, h.nic_bw_node);
  EXPECT_EQ(g.attn_fwd_flops, 620e12);
  EXPECT_EQ(g.attn_bwd_flops, 545e12);
  EXPECT_EQ(g.device_memory_bytes, 80e9);
}

TEST(Cluster, PresetOfTheGpu) {
  EXPECT_EQ(cluster_preset_for_gpu("NVIDIA H100 80GB HBM3"), "h100-sxm");
  EXPECT_EQ(cluster_preset_for_gpu("NVIDIA H200"), "h200-nvl");
  EXPECT_EQ(cluster_preset_for_gpu("NVIDIA A100-SXM4-80GB"), "");
  EXPECT_EQ(cluster_preset_for_gpu("NVIDIA H100 PCIe"), "");
  EXPECT_EQ(cluster_preset_for_gpu("NVIDIA GH200 480GB"), "");
  EXPECT_EQ(cluster_preset_for_gpu(""), "");
  for (const char* gpu : {"NVIDIA H100 80GB HBM3", "NVIDIA H200"}) cluster_preset(cluster_preset_for_gpu(gpu), 1);
}

TEST(Cluster, BadPresetAndSizes) {
  test::expect_invalid_input([] { cluster_preset("dgx-b200", 1); }, {"'dgx-b200'", "a100-p4d, h100-sxm, h200-nvl"});
  test::expect_invalid_input([] { cluster_preset("a100-p4d", 0); }, {"cluster.nodes: must be in [1, 1024], got 0"});
  Cluster c;
  c.devices_per_node = 0;
  test::expect_invalid_input([&] { c.validate("cluster"); }, {"cluster.devices_per_node: must be in [1, 1024], got 0"});
  c = Cluster{};
  c.inter_bw_device = 0;
  test::expect_invalid_input([&] { c.validate("cluster"); }, {"cluster.inter_bw_device", "got 0"});
  c = Cluster{};
  c.nic_bw_node = -5e9;
  test::expect_invalid_input([&] { c.validate("cluster"); }, {"cluster.nic_bw_node", "got -5e+09"});
}

TEST(Cluster, NodeLayoutOfRanks) {
  auto layout = [](const std::vector<int>& ids) {
    const NodeLayout l = node_layout_of(ids);
    return std::pair{l.nodes, l.devices_per_node};
  };
  EXPECT_EQ(layout({7}), std::pair(1, 1));
  EXPECT_EQ(layout({3, 3, 3, 3}), std::pair(1, 4));
  EXPECT_EQ(layout({0, 0, 4, 4, 2, 2}), std::pair(3, 2));
  EXPECT_EQ(layout({5, 1, 9}), std::pair(3, 1));
  // Round-robin over nodes: rank 2 is on node 0 again.
  test::expect_invalid_input([] { node_layout_of({0, 1, 0, 1}); },
                             {"not grouped by node", "rank 2: node 0", "rank 3: node 1"});
  test::expect_invalid_input([] { node_layout_of({0, 0, 0, 3}); }, {"different numbers of ranks", "rank 3: node 1"});
  test::expect_invalid_input([] { node_layout_of({}); }, {"no ranks"});
}

TEST(ClusterJson, PresetWithOverrides) {
  const Cluster c = parse_cluster(R"({"preset": "a100-p4d", "nodes": 4, "inter_bw_device_GBps": 25,
                                      "intra_latency_us": 3})",
                                  "c.json");
  EXPECT_EQ(c.name, "a100-p4d");
  EXPECT_EQ(c.nodes, 4);
  EXPECT_EQ(c.devices_per_node, 8);
  EXPECT_EQ(c.inter_bw_device, 25e9);
  EXPECT_DOUBLE_EQ(c.intra_latency_s, 3e-6);
  EXPECT_EQ(c.intra_bw, 300e9);
  EXPECT_EQ(parse_cluster(R"({"preset": "h200-nvl"})", "c.json").nodes, 1);
}

TEST(ClusterJson, CustomDefinitionRoundTrips) {
  const Cluster c = parse_cluster(R"({"name": "lab", "nodes": 3, "devices_per_node": 2, "intra_bw_GBps": 100,
      "inter_bw_device_GBps": 10, "nic_bw_node_GBps": 20, "attn_fwd_TFLOPs": 50, "attn_bwd_TFLOPs": 40,
      "device_memory_GB": 24})",
                                  "lab.json");
  EXPECT_EQ(c.name, "lab");
  EXPECT_EQ(c.num_devices(), 6);
  EXPECT_EQ(c.nic_bw_node, 20e9);
  EXPECT_EQ(c.device_memory_bytes, 24e9);
  EXPECT_DOUBLE_EQ(c.inter_weight(), 10.0);
  for (const Cluster& x : {c, cluster_preset("a100-p4d", 4), cluster_preset("h200-nvl", 2)}) {
    const Cluster y = parse_cluster(cluster_to_json(x), "back.json");
    EXPECT_EQ(y.name, x.name);
    EXPECT_EQ(y.nodes, x.nodes);
    EXPECT_EQ(y.devices_per_node, x.devices_per_node);
    EXPECT_DOUBLE_EQ(y.intra_bw, x.intra_bw);
    EXPECT_DOUBLE_EQ(y.inter_bw_device, x.inter_bw_device);
    EXPECT_DOUBLE_EQ(y.nic_bw_node, x.nic_bw_node);
    EXPECT_DOUBLE_EQ(y.intra_latency_s, x.intra_latency_s);
    EXPECT_DOUBLE_EQ(y.inter_latency_s, x.inter_latency_s);
    EXPECT_DOUBLE_EQ(y.attn_fwd_flops, x.attn_fwd_flops);
    EXPECT_DOUBLE_EQ(y.attn_bwd_flops, x.attn_bwd_flops);
    EXPECT_DOUBLE_EQ(y.device_memory_bytes, x.device_memory_bytes);
  }
}

TEST(ClusterJson, WrongTypes) {
  test::expect_invalid_input([] { parse_cluster(R"({"preset": "a100-p4d", "nodes": "4"})", "c.json"); },
                             {"c.json: nodes: expected an integer, got string '4'"});
  test::expect_invalid_input([] { parse_cluster(R"({"preset": 7})", "c.json"); },
                             {"c.json: preset: expected a string, got number 7"});
  test::expect_invalid_input([] { parse_cluster(R"({"preset": "a100-p4d", "intra_bw_GBps": null})", "c.json"); },
                             {"intra_bw_GBps: expected a number, got null"});
}

}  // namespace
}  // namespace dcp
