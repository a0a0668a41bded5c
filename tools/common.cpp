#include "common.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <thread>

#include "dcp/baselines.h"
#include "dcp/error.h"
#include "dcp/io.h"
#include "dcp/limits.h"
#include "dcp/profiles.h"

namespace dcp::cli {

void add_batch_options(CLI::App* app, BatchSource& src) {
  CLI::Option* file =
      app->add_option("--batch", src.batch_file, "Batch JSON file (docs/formats.md); overrides --profile");
  CLI::Option* dataset =
      app->add_option("--dataset", src.dataset_file, "Dataset JSONL file (one batch per line); use with --index");
  CLI::Option* index = app->add_option("--index", src.index, "Which batch of the dataset or of the profile's stream (0-based)")
                           ->check(int_range(0, 1000000));
  // Options that shape a generated batch: a batch file fixes all of them itself, so giving one
  // with --batch (or --dataset) is refused rather than silently ignored.
  CLI::Option* profile =
      app->add_option("--profile", src.profile, "Synthetic length profile: ldc, longalign, uniform, fixed")
          ->capture_default_str();
  CLI::Option* lengths = app->add_option(
      "--lengths", src.lengths_file,
      "Document lengths to pack into batches instead of a synthetic profile: a text file, one length per line "
      "(your corpus's); replayed in seeded shuffled epochs, each batch cut at --tokens, lengths over it clamped");
  CLI::Option* in_order =
      app->add_flag("--lengths-in-order", src.lengths_in_order, "With --lengths: the file's order, not shuffled");
  lengths->excludes(profile);
  in_order->needs(lengths);
  std::vector<CLI::Option*> generator{
      profile,
      lengths,
      in_order,
      app->add_option("--seed", src.seed, "Seed of the profile generator")->capture_default_str()->check(non_negative_integer()),
      app->add_option("--tokens", src.tokens, "Token budget per generated batch")
          ->capture_default_str()
          ->check(int_range(1, kMaxBatchTokens)),
      app->add_option("--scale", src.scale, "Length scale factor of the profile (paper: 0.5, 1, 2, 4)")
          ->capture_default_str(),
      app->add_option("--mask", src.mask,
                      "Mask of generated sequences: causal, full, lambda, causal_blockwise, chunked, shared_question, mixed")
          ->capture_default_str(),
      app->add_option("--q-heads", src.q_heads, "Query heads (generated batches)")->capture_default_str(),
      app->add_option("--kv-heads", src.kv_heads, "KV heads (generated batches)")->capture_default_str(),
      app->add_option("--head-dim", src.head_dim, "Head dimension (generated batches)")->capture_default_str(),
      app->add_option("--dtype", src.dtype, "Element type of generated batches: bf16, fp16, fp32")->capture_default_str()};
  file->excludes(dataset);
  file->excludes(index);
  for (CLI::Option* g : generator) {
    file->excludes(g);
    dataset->excludes(g);
  }
}

void add_cluster_options(CLI::App* app, ClusterSource& src) {
  app->add_option("--cluster", src.preset,
                  "Cluster preset (a100-p4d, h100-sxm, h200-nvl), auto (the preset measured on this machine's GPU: "
                  "an H100 or H200; h200-nvl otherwise) or a cluster JSON file")
      ->capture_default_str();
  app->add_option_function<int>(
         "--nodes",
         [&src](const int& n) {
           src.nodes = n;
           src.nodes_given = true;
         },
         "Number of nodes (default " + std::to_string(src.nodes) + "; with a cluster file: the file's)")
      ->check(int_range(1, kMaxNodes));
  app->add_option("--devices-per-node", src.devices_per_node, "Devices per node (default: the preset's or the file's)")
      ->check(int_range(1, kMaxDevicesPerNode));
}

void add_block_options(CLI::App* app, BlockOptions& opts) {
  app->add_option("--block", opts.block_size, "Token block size B (a multiple of 16)")
      ->capture_default_str()
      ->check(int_range(16, kMaxBatchTokens));
  app->add_option("--q-heads-per-group", opts.q_heads_per_group,
                  "Query heads per head group (default: the query heads of one KV head)");
  app->add_flag("--split-sink", opts.split_sink,
                "DCP: a sink shorter than B (lambda, causal_blockwise) gets a token block of its own");
}

namespace {
ProfileOptions profile_options(const BatchSource& src) {
  ProfileOptions p;
  p.profile = parse_profile(src.profile);
  if (!src.lengths_file.empty()) {
    p.profile = Profile::Lengths;
    p.lengths = load_lengths(src.lengths_file);
    p.lengths_shuffle = !src.lengths_in_order;
  }
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

Cluster resolve_cluster(const ClusterSource& src, int device) {
  Cluster c;
  const auto presets = cluster_preset_names();
  std::string name = src.preset;
  if (name == "auto") {
    name = cluster_preset_for_gpu(cuda_device_name(device));
    if (name.empty()) name = "h200-nvl";
  }
  const bool preset = std::find(presets.begin(), presets.end(), name) != presets.end();
  if (preset) {
    c = cluster_preset(name, 1);  // sized below, checked once complete
    c.nodes = src.nodes;
  } else if (std::filesystem::exists(src.preset) || src.preset.find('/') != std::string::npos ||
             src.preset.ends_with(".json")) {
    c = load_cluster(src.preset);  // a missing or unreadable file is reported as such
    if (src.nodes_given) c.nodes = src.nodes;
  } else {
    std::string list;
    for (const auto& p : presets) list += (list.empty() ? "" : ", ") + p;
    raise(ErrorKind::InvalidInput, "--cluster: '" + src.preset + "' is neither a preset (" + list +
                                       ") nor an existing cluster file");
  }
  if (src.devices_per_node > 0) c.devices_per_node = src.devices_per_node;
  c.validate("--cluster");
  return c;
}

void add_stages_option(CLI::App* app, int& stages) {
  app->add_option("--stages", stages, "Communication stages after the local stage 0 (the paper's divisions)")
      ->capture_default_str()
      ->check(int_range(1, 64));
}

void add_outputs_in_place_option(CLI::App* app, bool& in_place) {
  app->add_flag("--outputs-in-place,!--no-outputs-in-place", in_place,
                "Owned output blocks accumulate in their local tensors (no output slots, no final merges; "
                "the default); --no-outputs-in-place merges each into a slot, then into the local tensor");
}

PlanOptions plan_options_for(int stages, bool outputs_in_place) {
  if (stages < 1) raise(ErrorKind::InvalidInput, "--stages: must be at least 1 (got " + std::to_string(stages) + ")");
  PlanOptions opts;
  opts.schedule.num_comm_stages = stages;
  opts.outputs_in_place = outputs_in_place;
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
  k.deterministic_backward = parse_switch(env("DCP_ATTN_DETERMINISTIC"), "DCP_ATTN_DETERMINISTIC");
  if (const std::string one_pass = env("DCP_ATTN_DETERMINISTIC_ONE_PASS"); !one_pass.empty())
    k.deterministic_one_pass = parse_switch(one_pass, "DCP_ATTN_DETERMINISTIC_ONE_PASS");
  if (const std::string ordered = env("DCP_ATTN_DETERMINISTIC_ORDERED"); !ordered.empty())
    k.deterministic_ordered = parse_switch(ordered, "DCP_ATTN_DETERMINISTIC_ORDERED");
  k.deterministic_unit_rows = parse_row_count(env("DCP_ATTN_DETERMINISTIC_UNIT_ROWS"), "DCP_ATTN_DETERMINISTIC_UNIT_ROWS");
  if (const std::string cells = env("DCP_ATTN_PARTIAL_CELLS"); !cells.empty())
    k.partial_cells = parse_switch(cells, "DCP_ATTN_PARTIAL_CELLS");
  if (const std::string persistent = env("DCP_ATTN_PERSISTENT"); !persistent.empty())
    k.persistent_forward = parse_switch(persistent, "DCP_ATTN_PERSISTENT");
  if (const std::string wide = env("DCP_ATTN_WIDE_BACKWARD"); !wide.empty())
    k.wide_backward = parse_switch(wide, "DCP_ATTN_WIDE_BACKWARD");
  if (const std::string run_rows = env("DCP_ATTN_BACKWARD_RUN_ROWS"); !run_rows.empty())
    k.backward_run_rows = parse_row_count(run_rows, "DCP_ATTN_BACKWARD_RUN_ROWS");
  return k;
}

void check_methods(const std::vector<std::string>& names, const std::string& flag) {
  for (const std::string& n : names) check_method(n, flag);
}

CLI::Validator int_range(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        int64_t v = 0;
        const char* end = text.data() + text.size();
        const auto [p, ec] = std::from_chars(text.data(), end, v);
        if (ec != std::errc() || p != end || v < lo || v > hi)
          return "'" + text + "' is not an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
        return {};
      },
      "INT in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

CLI::Validator non_negative_integer() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        uint64_t v = 0;
        const char* end = text.data() + text.size();
        const auto [p, ec] = std::from_chars(text.data(), end, v);
        if (text.empty() || text[0] == '-' || ec != std::errc() || p != end)
          return "'" + text + "' is not an integer in [0, 2^64 - 1]";
        return {};
      },
      "UINT64");
}

CLI::Validator seconds_option() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v) || v <= 0 || v > 1e6)
          return "'" + text + "' is not a number of seconds in (0, 1e6]";
        return {};
      },
      "SECONDS in (0, 1e6]");
}

std::string mask_label(const std::vector<Batch>& batches) {
  std::map<std::string, int64_t> count;
  for (const Batch& b : batches)
    for (const Sequence& s : b.sequences) ++count[to_string(s.mask.kind)];
  if (count.size() == 1) return count.begin()->first;
  std::string out;
  for (const auto& [name, n] : count) out += (out.empty() ? "" : ", ") + name + " " + std::to_string(n);
  return "mixed (" + out + ")";
}

std::string batch_source_label(const BatchSource& src) {
  if (!src.batch_file.empty()) return "batch file";
  if (!src.dataset_file.empty()) return "dataset " + src.dataset_file;
  if (!src.lengths_file.empty()) return "lengths of " + src.lengths_file;
  return src.profile + " profile";
}

std::string batch_origin(const BatchSource& src) {
  if (!src.batch_file.empty()) return src.batch_file;
  if (!src.dataset_file.empty()) return src.dataset_file + " (batch " + std::to_string(src.index) + ")";
  return "";
}

void add_max_tiles_option(CLI::App* app, int64_t& max_tiles) {
  app->add_option("--max-tiles", max_tiles,
                  "Skip (with a note) a placement whose tiles would exceed this many (its plan needs ~800 bytes "
                  "per tile)")
      ->capture_default_str()
      ->check(int_range(1, int64_t{1} << 40));
}

int64_t estimate_tiles(const std::string& method, const Batch& batch, const BlockOptions& blocks,
                       const Cluster& cluster) {
  const int64_t per_group = blocks.q_heads_per_group > 0 ? blocks.q_heads_per_group : batch.shape.group_ratio();
  const int64_t groups = per_group > 0 ? std::max<int64_t>(1, batch.shape.q_heads / per_group) : 1;
  const int64_t P = cluster.num_devices();
  int64_t pairs = 0;
  for (const Sequence& s : batch.sequences) {
    // Chunks of the sequence: blocks of B for DCP and packing, the method's cut otherwise
    // (chunks of zero tokens are skipped, so never more chunks than tokens).
    int64_t n = 0;
    if (method == "dcp" || method == "packing") n = (s.length + blocks.block_size - 1) / std::max<int64_t>(1, blocks.block_size);
    else if (method == "ring" || method == "ulysses") n = std::min(P, s.length);
    else n = std::min(2 * P, s.length);  // zigzag, a2a_p2p: two chunks per device
    // Keys never beyond the row (causal family): chunk pairs at or below the diagonal.
    const bool below = s.mask.kind != MaskKind::Full && s.mask.kind != MaskKind::Ranges;
    pairs = checked_add(pairs, below ? checked_mul(n, n + 1, "tile estimate") / 2 : checked_mul(n, n, "tile estimate"),
                        "tile estimate");
  }
  return checked_mul(pairs, groups, "tile estimate");
}

std::string tile_budget_note(const std::string& method, const std::vector<Batch>& batches, const BlockOptions& blocks,
                             const Cluster& cluster, int64_t max_tiles) {
  for (const Batch& b : batches) {
    const int64_t n = estimate_tiles(method, b, blocks, cluster);
    if (n > max_tiles)
      return "skipped: up to " + std::to_string(n) + " tiles, more than --max-tiles " + std::to_string(max_tiles) +
             (method == "dcp" || method == "packing" ? " (use a larger --block)"
                                                     : " (it cuts every sequence into chunks per device)");
  }
  return {};
}

int search_thread_count(int requested) {
  if (requested > 0) return std::min(requested, 256);
  return std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 256);
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace dcp::cli
