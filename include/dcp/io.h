// dcp/io.h — reading and writing the file formats (docs/formats.md).
//
// Errors name the source (file name, JSONL line), the JSON path of the field and the value:
//   "batch.json: sequences[2].mask.kind: unknown mask kind 'foo' (expected one of ...)".
#pragma once

#include <string>
#include <vector>

#include "dcp/batch.h"
#include "dcp/cluster.h"

namespace dcp {

Batch parse_batch(const std::string& json_text, const std::string& source);
Batch load_batch(const std::string& path);
std::vector<Batch> load_dataset(const std::string& path);  // JSONL, one batch per line
// JSONL text; errors name `source` and the line ("data.jsonl:line 3: ...").
std::vector<Batch> parse_dataset(const std::string& text, const std::string& source);
std::string batch_to_json(const Batch& batch, bool pretty = true);
// Document lengths for the `lengths` profile: a text file with one length (an integer >= 1)
// per line; blank lines and lines starting with '#' are skipped. Errors name the file and line.
std::vector<int64_t> load_lengths(const std::string& path);
std::vector<int64_t> parse_lengths(const std::string& text, const std::string& source);
void save_batch(const Batch& batch, const std::string& path);
void save_dataset(const std::vector<Batch>& batches, const std::string& path);

// A cluster file: {"name": ..., "nodes": 4, "devices_per_node": 8, "intra_bw_GBps": 300, ...}
// or {"preset": "a100-p4d", "nodes": 4} with optional overrides.
Cluster parse_cluster(const std::string& json_text, const std::string& source);
Cluster load_cluster(const std::string& path);
// The full custom form (no "preset"), every field in the file units (GB/s, us, TFLOP/s, GB);
// parse_cluster reads it back equal up to the rounding of the unit conversion.
std::string cluster_to_json(const Cluster& cluster);

std::string read_text_file(const std::string& path);  // throws InvalidInput if unreadable

}  // namespace dcp
