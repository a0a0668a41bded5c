// tools/common.h — options shared by the dcp subcommands: where the batch comes from, which
// cluster it runs on, and how blocks are cut.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "dcp/batch.h"
#include "dcp/blocks.h"
#include "dcp/cluster.h"

namespace dcp::cli {

struct BatchSource {
  std::string batch_file;    // --batch
  std::string dataset_file;  // --dataset (JSONL)
  int index = 0;             // --index: which batch of the dataset/profile stream
  std::string profile = "ldc";
  uint64_t seed = 1;
  int64_t tokens = 131072;
  double scale = 1.0;
  std::string mask = "causal";
  int q_heads = 32, kv_heads = 8, head_dim = 128;
  std::string dtype = "bf16";
};

struct ClusterSource {
  std::string preset = "a100-p4d";  // --cluster: a preset name or a JSON file
  int nodes = 4;
  int devices_per_node = 0;          // 0: the preset's
};

void add_batch_options(CLI::App* app, BatchSource& src);
void add_cluster_options(CLI::App* app, ClusterSource& src);
void add_block_options(CLI::App* app, BlockOptions& opts);

Batch resolve_batch(const BatchSource& src);
Cluster resolve_cluster(const ClusterSource& src);

// Fills `opts` for the CLI's own error messages; throws InvalidInput naming the flag.
void check_block_options(const BlockOptions& opts, const AttentionShape& shape);

}  // namespace dcp::cli
