// Fuzz target: the cluster JSON reader (a preset with overrides, or a full definition).
// Accepted clusters must be valid and read back from their own JSON with the same sizes.
#include <cmath>
#include <string>

#include "dcp/io.h"
#include "fuzz/fuzz_common.h"

using namespace dcp;

fuzz::Outcome dcp_fuzz_one(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  return fuzz::guarded([&] {
    const Cluster c = parse_cluster(text, "fuzz.json");
    c.validate("cluster");
    const Cluster again = parse_cluster(cluster_to_json(c), "round trip");
    fuzz::require(again.nodes == c.nodes && again.devices_per_node == c.devices_per_node && again.name == c.name,
                  "cluster sizes changed by a round trip");
    fuzz::require(std::abs(again.intra_bw - c.intra_bw) <= 1e-9 * c.intra_bw, "bandwidth changed by a round trip");
  });
}
