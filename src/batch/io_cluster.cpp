// Cluster JSON (docs/formats.md): a preset with overrides, or a full custom definition.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "batch/json_reader.h"
#include "dcp/error.h"
#include "dcp/io.h"
#include "dcp/limits.h"

namespace dcp {

using detail::Json;
using detail::JsonReader;

namespace {

// A numeric cluster field: its JSON name, the unit factor to SI and where it lives.
struct NumberField {
  const char* key;
  double to_si;
  double Cluster::*value;
  bool allow_zero;  // latencies may be 0; rates and sizes may not
};

const NumberField kNumberFields[] = {
    {"intra_bw_GBps", 1e9, &Cluster::intra_bw, false},
    {"inter_bw_device_GBps", 1e9, &Cluster::inter_bw_device, false},
    {"nic_bw_node_GBps", 1e9, &Cluster::nic_bw_node, false},
    {"intra_latency_us", 1e-6, &Cluster::intra_latency_s, true},
    {"inter_latency_us", 1e-6, &Cluster::inter_latency_s, true},
    {"attn_fwd_TFLOPs", 1e12, &Cluster::attn_fwd_flops, false},
    {"attn_bwd_TFLOPs", 1e12, &Cluster::attn_bwd_flops, false},
    {"device_memory_GB", 1e9, &Cluster::device_memory_bytes, false},
};

// Without a preset these must be given; latencies and the name have defaults.
const char* const kRequiredCustom[] = {"nodes",           "devices_per_node", "intra_bw_GBps",
                                       "inter_bw_device_GBps", "nic_bw_node_GBps", "attn_fwd_TFLOPs",
                                       "attn_bwd_TFLOPs", "device_memory_GB"};

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

Cluster parse_cluster(const std::string& json_text, const std::string& source) {
  const JsonReader r(source);
  const Json root = detail::parse_json_text(json_text, source);
  r.require_object(root, "");
  r.check_keys(root, "",
               {"preset", "name", "nodes", "devices_per_node", "intra_bw_GBps", "inter_bw_device_GBps",
                "nic_bw_node_GBps", "intra_latency_us", "inter_latency_us", "attn_fwd_TFLOPs",
                "attn_bwd_TFLOPs", "device_memory_GB"});
  Cluster c;
  if (auto p = root.find("preset"); p != root.end()) {
    const std::string name = r.get_string(*p, "preset");
    const std::vector<std::string> known = cluster_preset_names();
    bool found = false;
    for (const std::string& k : known) found = found || k == name;
    if (!found) r.fail("preset", "unknown preset '" + name + "' (expected one of " + join(known) + ")");
    c = cluster_preset(name, 1);  // nodes: 1 unless the file says otherwise
  } else {
    for (const char* key : kRequiredCustom) {
      if (!root.contains(key)) {
        r.fail(key, "missing (a cluster without \"preset\" must give " +
                        join(std::vector<std::string>(std::begin(kRequiredCustom), std::end(kRequiredCustom))) +
                        ")");
      }
    }
  }
  if (auto it = root.find("name"); it != root.end()) c.name = r.get_string(*it, "name");
  if (auto it = root.find("nodes"); it != root.end()) {
    c.nodes = r.get_int32(*it, "nodes");
    if (c.nodes < 1 || c.nodes > kMaxNodes)
      r.fail("nodes", "must be in [1, " + std::to_string(kMaxNodes) + "], got " + std::to_string(c.nodes));
  }
  if (auto it = root.find("devices_per_node"); it != root.end()) {
    c.devices_per_node = r.get_int32(*it, "devices_per_node");
    if (c.devices_per_node < 1 || c.devices_per_node > kMaxDevicesPerNode)
      r.fail("devices_per_node", "must be in [1, " + std::to_string(kMaxDevicesPerNode) + "], got " +
                                     std::to_string(c.devices_per_node));
  }
  for (const NumberField& f : kNumberFields) {
    auto it = root.find(f.key);
    if (it == root.end()) continue;
    const double v = r.get_number(*it, f.key);
    if (f.allow_zero ? v < 0.0 : v <= 0.0) {
      r.fail(f.key, std::string("must be ") + (f.allow_zero ? ">= 0" : "> 0") + ", got " + it->dump());
    }
    c.*(f.value) = v * f.to_si;
  }
  try {
    c.validate("cluster");
  } catch (const Error& e) {
    raise(e.kind(), source + ": " + e.what());
  }
  return c;
}

Cluster load_cluster(const std::string& path) { return parse_cluster(read_text_file(path), path); }

std::string cluster_to_json(const Cluster& cluster) {
  nlohmann::ordered_json j;
  j["name"] = cluster.name;
  j["nodes"] = cluster.nodes;
  j["devices_per_node"] = cluster.devices_per_node;
  for (const NumberField& f : kNumberFields) j[f.key] = cluster.*(f.value) / f.to_si;
  return j.dump(2) + "\n";
}

}  // namespace dcp
