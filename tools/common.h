// tools/common.h — options shared by the dcp subcommands: where the batch comes from, which
// cluster it runs on, and how blocks are cut.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "dcp/batch.h"
#include "dcp/blocks.h"
#include "dcp/cluster.h"
#include "dcp/cuda_backend.h"
#include "dcp/partition.h"
#include "dcp/placement.h"
#include "dcp/plan.h"
#include "dcp/planner.h"

namespace dcp::cli {

struct BatchSource {
  std::string batch_file;    // --batch
  std::string dataset_file;  // --dataset (JSONL)
  int index = 0;             // --index: which batch of the dataset/profile stream
  std::string profile = "ldc";
  std::string lengths_file;       // --lengths: the lengths profile over these document lengths
  bool lengths_in_order = false;  // --lengths-in-order: the file's order instead of shuffled epochs
  uint64_t seed = 1;
  int64_t tokens = 131072;
  double scale = 1.0;
  std::string mask = "causal";
  int q_heads = 32, kv_heads = 8, head_dim = 128;
  std::string dtype = "bf16";
};

struct ClusterSource {
  std::string preset = "a100-p4d";  // --cluster: a preset name or a JSON file
  int nodes = 4;                     // a preset's node count; a cluster file's unless nodes_given
  bool nodes_given = false;          // --nodes on the command line (overrides a cluster file)
  int devices_per_node = 0;          // 0: the preset's or the file's
};

void add_batch_options(CLI::App* app, BatchSource& src);
void add_cluster_options(CLI::App* app, ClusterSource& src);
void add_block_options(CLI::App* app, BlockOptions& opts);

// Where the batches come from, for a table's heading: "ldc profile", "lengths of FILE", "batch file", ...
std::string batch_source_label(const BatchSource& src);
Batch resolve_batch(const BatchSource& src);
// `count` consecutive batches from --index on (a --batch file gives exactly one).
std::vector<Batch> resolve_batches(const BatchSource& src, int count);
// --cluster auto: the preset measured on the GPU `device` (cluster_preset_for_gpu), h200-nvl where
// there is none (no GPU, or a card without a measured preset).
Cluster resolve_cluster(const ClusterSource& src, int device = 0);

// --stages: communication stages after the local stage 0 (plan.h's num_comm_stages).
void add_stages_option(CLI::App* app, int& stages);
// --outputs-in-place / --no-outputs-in-place (PlanOptions::outputs_in_place).
void add_outputs_in_place_option(CLI::App* app, bool& in_place);
PlanOptions plan_options_for(int stages, bool outputs_in_place);  // throws InvalidInput naming --stages

// Placement methods by name (dcp/planner.h): "dcp" first, then every static baseline.
inline std::vector<std::string> all_methods() { return placement_methods(); }
// Throws InvalidInput naming `flag` and listing the methods if `name` is not one of them.
inline void check_method(const std::string& name, const std::string& flag) { check_placement_method(name, flag); }
void check_methods(const std::vector<std::string>& names, const std::string& flag);

// Option checks with short messages ("--nodes: 0 is not in [1, 4096]"), for options whose
// silent wrap-around or fallback would change what runs.
CLI::Validator int_range(int64_t lo, int64_t hi);
CLI::Validator non_negative_integer();  // 64-bit seeds: digits only, no sign
CLI::Validator seconds_option();        // a finite number of seconds in (0, 1e6]

// The masks of `batches` as one label: "causal", or "mixed (causal 3, lambda 2)".
std::string mask_label(const std::vector<Batch>& batches);
// Where a batch comes from, for messages about its contents: the --batch/--dataset file, or
// the generator options ("--dtype" etc. name themselves).
std::string batch_origin(const BatchSource& src);
// Places `batch` with `method` ("dcp" uses `popts`; baselines cut their own tables).
inline PlacedMethod place_method(const std::string& method, const Batch& batch, const BlockOptions& blocks,
                                 const Cluster& cluster, const PlacementOptions& popts) {
  check_method(method, "--placement");
  return place_by_method(method, batch, blocks, cluster, popts);
}

// The tile budget of one placement. The cutting baselines pair every chunk of every sequence
// (sequences x chunks^2 x head groups tiles), which outgrows memory long before DCP's block
// table does: about 800 bytes per tile of plan, so the default keeps one placement near 2 GB.
inline constexpr int64_t kDefaultMaxTiles = 2'000'000;
void add_max_tiles_option(CLI::App* app, int64_t& max_tiles);
// An upper bound of the tiles `method` makes of `batch`, from sequence lengths and mask kinds
// alone (O(sequences), nothing built).
int64_t estimate_tiles(const std::string& method, const Batch& batch, const BlockOptions& blocks,
                       const Cluster& cluster);
// Empty when `method` fits the budget on every batch; else why it is skipped.
std::string tile_budget_note(const std::string& method, const std::vector<Batch>& batches, const BlockOptions& blocks,
                             const Cluster& cluster, int64_t max_tiles);

double ms_since(std::chrono::steady_clock::time_point t0);

// PlannerOptions::threads for a --search-threads value: as given, or every core for 0 (at most
// 256, at least 1).
int search_thread_count(int requested);

// Kernel routes for the CUDA backend from DCP_ATTN_FORWARD, DCP_ATTN_BACKWARD (auto | mma |
// wgmma | wgmma-basic), DCP_ATTN_BACKWARD_DQ (bulk | atomic), DCP_ATTN_DETERMINISTIC (0 | 1),
// DCP_ATTN_DETERMINISTIC_ONE_PASS (0 | 1: its one-pass method on one device; unset: on),
// DCP_ATTN_DETERMINISTIC_ORDERED (0 | 1: that method over the default work; unset: the library's),
// DCP_ATTN_DETERMINISTIC_UNIT_ROWS (its units; 0: whole key blocks), DCP_ATTN_PARTIAL_CELLS,
// DCP_ATTN_PERSISTENT and DCP_ATTN_WIDE_BACKWARD (0 | 1; unset: on), DCP_ATTN_BACKWARD_RUN_ROWS
// (the wide kernel's runs; 0: none; unset: the library's):
// the command line's way to compare kernels without rebuilding. Unset or empty: auto / bulk /
// off. Throws InvalidInput naming the variable on anything else.
CudaKernelOptions kernel_options_from_environment();

}  // namespace dcp::cli
