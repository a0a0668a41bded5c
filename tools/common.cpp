#include "common.h"

#include <filesystem>

#include "dcp/error.h"
#include "dcp/io.h"
#include "dcp/profiles.h"

namespace dcp::cli {

void add_batch_options(CLI::App* app, BatchSource& src) {
  app->add_option("--batch", src.batch_file, "Batch JSON file (docs/formats.md); overrides --profile");
  app->add_option("--dataset", src.dataset_file, "Dataset JSONL file (one batch per line); use with --index");
  app->add_option("--index", src.index, "Which batch of the dataset or of the profile's stream (0-based)")
      ->check(CLI::NonNegativeNumber);
  app->add_option("--profile", src.profile, "Synthetic length profile: ldc, longalign, uniform, fixed")
      ->capture_default_str();
  app->add_option("--seed", src.seed, "Seed of the profile generator")->capture_default_str();
  app->add_option("--tokens", src.tokens, "Token budget per generated batch")->capture_default_str();
  app->add_option("--scale", src.scale, "Length scale factor of the profile (paper: 0.5, 1, 2, 4)")
      ->capture_default_str();
  app->add_option("--mask", src.mask,
                  "Mask of generated sequences: causal, full, lambda, causal_blockwise, shared_question, mixed")
      ->capture_default_str();
  app->add_option("--q-heads", src.q_heads, "Query heads (generated batches)")->capture_default_str();
  app->add_option("--kv-heads", src.kv_heads, "KV heads (generated batches)")->capture_default_str();
  app->add_option("--head-dim", src.head_dim, "Head dimension (generated batches)")->capture_default_str();
  app->add_option("--dtype", src.dtype, "Element type of generated batches: bf16, fp16, fp32")->capture_default_str();
}

void add_cluster_options(CLI::App* app, ClusterSource& src) {
  app->add_option("--cluster", src.preset, "Cluster preset (a100-p4d, h200-nvl) or a cluster JSON file")
      ->capture_default_str();
  app->add_option("--nodes", src.nodes, "Number of nodes")->capture_default_str();
  app->add_option("--devices-per-node", src.devices_per_node, "Devices per node (default: the preset's)");
}

void add_block_options(CLI::App* app, BlockOptions& opts) {
  app->add_option("--block", opts.block_size, "Token block size B (a multiple of 16)")->capture_default_str();
  app->add_option("--q-heads-per-group", opts.q_heads_per_group,
                  "Query heads per head group (default: the query heads of one KV head)");
}

Batch resolve_batch(const BatchSource& src) {
  if (!src.batch_file.empty()) return load_batch(src.batch_file);
  if (!src.dataset_file.empty()) {
    auto batches = load_dataset(src.dataset_file);
    if (src.index >= static_cast<int>(batches.size()))
      raise(ErrorKind::InvalidInput, "--index: " + std::to_string(src.index) + " is out of range (" +
                                         src.dataset_file + " holds " + std::to_string(batches.size()) +
                                         " batches)");
    return batches[static_cast<size_t>(src.index)];
  }
  ProfileOptions p;
  p.profile = parse_profile(src.profile);
  p.seed = src.seed;
  p.token_budget = src.tokens;
  p.scale = src.scale;
  p.mask = src.mask;
  p.shape.q_heads = src.q_heads;
  p.shape.kv_heads = src.kv_heads;
  p.shape.head_dim = src.head_dim;
  p.shape.dtype = parse_dtype(src.dtype, "--dtype");
  p.validate();
  auto batches = generate_batches(p, src.index + 1);
  return batches.back();
}

Cluster resolve_cluster(const ClusterSource& src) {
  Cluster c;
  if (std::filesystem::exists(src.preset) && src.preset.find(".json") != std::string::npos) {
    c = load_cluster(src.preset);
  } else {
    c = cluster_preset(src.preset, src.nodes);
  }
  if (src.devices_per_node > 0) c.devices_per_node = src.devices_per_node;
  c.validate("--cluster");
  return c;
}

void check_block_options(const BlockOptions& opts, const AttentionShape& shape) { opts.validate(shape); }

}  // namespace dcp::cli
