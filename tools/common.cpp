#include "common.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "dcp/baselines.h"
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

namespace {
ProfileOptions profile_options(const BatchSource& src) {
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
  return p;
}
}  // namespace

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
  auto batches = generate_batches(profile_options(src), src.index + 1);
  return batches.back();
}

std::vector<Batch> resolve_batches(const BatchSource& src, int count) {
  if (count < 1) raise(ErrorKind::InvalidInput, "--batches: must be at least 1 (got " + std::to_string(count) + ")");
  if (!src.batch_file.empty()) return {load_batch(src.batch_file)};
  std::vector<Batch> all;
  if (!src.dataset_file.empty()) {
    all = load_dataset(src.dataset_file);
    if (src.index + count > static_cast<int>(all.size()))
      raise(ErrorKind::InvalidInput, "--index/--batches: batches " + std::to_string(src.index) + ".." +
                                         std::to_string(src.index + count - 1) + " are out of range (" +
                                         src.dataset_file + " holds " + std::to_string(all.size()) + " batches)");
  } else {
    all = generate_batches(profile_options(src), src.index + count);
  }
  return {all.begin() + src.index, all.begin() + src.index + count};
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

void add_stages_option(CLI::App* app, int& stages) {
  app->add_option("--stages", stages, "Communication stages after the local stage 0 (the paper's divisions)")
      ->capture_default_str();
}

PlanOptions plan_options_for(int stages) {
  if (stages < 1) raise(ErrorKind::InvalidInput, "--stages: must be at least 1 (got " + std::to_string(stages) + ")");
  PlanOptions opts;
  opts.schedule.num_comm_stages = stages;
  opts.validate();
  return opts;
}

CudaKernelOptions kernel_options_from_environment() {
  const auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v != nullptr ? v : "");
  };
  CudaKernelOptions k;
  k.forward = parse_kernel_route(env("DCP_ATTN_FORWARD"), "DCP_ATTN_FORWARD");
  k.backward = parse_kernel_route(env("DCP_ATTN_BACKWARD"), "DCP_ATTN_BACKWARD");
  k.dq = parse_dq_reduction(env("DCP_ATTN_BACKWARD_DQ"), "DCP_ATTN_BACKWARD_DQ");
  return k;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace dcp::cli
