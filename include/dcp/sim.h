// dcp/sim.h — predicts how long a plan's attention takes on a cluster, without GPUs.
//
// Event-driven model, forward then backward (each pass starts with every device idle):
//   * Each device runs its Program in order on one compute stream. Attend costs
//     flops / rate + per-tile overhead + a launch overhead; Merge and Copy cost their bytes
//     (read + write) / memory bandwidth + a launch overhead (rates from a Calibration), except
//     that consecutive Merges share one launch, as the executor batches them.
//   * CommStart posts its transfers as the CUDA executor does: once the host has issued it (the
//     host runs ahead of the compute stream and only blocks in CommWait, until the round is
//     complete) and once the compute it depends on is done (dcp/comm_order.h: the last writer
//     of what it sends, the last reader or writer of what it receives). A transfer is ready
//     once both ends have posted it. It then crosses its resources, each a FIFO server at its
//     own rate, all serving it at once (cut-through): inside a node the sender's egress and
//     the receiver's ingress at intra_bw; across nodes the sender's and receiver's inter-node
//     ports at inter_bw_device and both nodes' NICs at nic_bw_node (shared by the node's
//     devices). It arrives one latency after the slowest resource has served it; transfers
//     sharing a resource are served in order of readiness.
//   * CommWait stalls the compute stream until every transfer of its round has arrived.
// Outputs: per device and pass the finish time, busy compute time and stall time; the pass
// time (slowest device); how much of the communication was hidden behind compute (a stall
// counts as exposed communication only after both ends had posted the transfer); the
// critical path (the slowest device's compute and stalls, with the last transfer it waited
// for); and optionally a Chrome-trace / Perfetto JSON timeline.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dcp/cluster.h"
#include "dcp/plan.h"

namespace dcp {

struct Calibration {
  std::string name = "cluster";
  double attn_fwd_flops = 190e12;   // mask-area FLOPs/s (4 x area x head_dim x q_heads), fwd
  double attn_bwd_flops = 150e12;   // backward (2.5x the forward FLOPs per tile)
  double tile_overhead_s = 1.0e-6;  // per tile inside one Attend (block scheduling, tails)
  double launch_overhead_s = 5e-6;  // per Attend / Merge / Copy instruction
  double memory_bw = 1.5e12;        // B/s for Merge / Copy (read + write counted)
  // Fraction of the full-tile rate that causal-diagonal and partial tiles reach (masking,
  // skipped sub-tiles and short rows cost time the mask-area FLOPs do not count), per pass.
  double fwd_diagonal_efficiency = 1.0, fwd_partial_efficiency = 1.0;
  double bwd_diagonal_efficiency = 1.0, bwd_partial_efficiency = 1.0;
  // Sub-tile model instead (src/sim/kernel_cost.h): every 128 x 128 (forward) / 64 x 128
  // (backward) sub-tile holding an allowed pair costs its dense FLOPs at the full rate, times
  // the masked cost (>= 1) of its mask path (diagonal: causal-diagonal tiles and the short last
  // keys of a Full tile; partial: Partial tiles) when it also holds a masked pair; the
  // efficiencies above are then unused. JSON: "attention_cost_model": "subtiles" (default "area").
  // All costs below are in full sub-tiles.
  bool subtile_model = false;
  double fwd_diagonal_masked_cost = 1.0, fwd_partial_masked_cost = 1.0;
  double bwd_diagonal_masked_cost = 1.0, bwd_partial_masked_cost = 1.0;
  // A Partial tile's sub-tile without an allowed pair is still walked and classified before it
  // is skipped (>= 0).
  double fwd_empty_subtile_cost = 0.0, bwd_empty_subtile_cost = 0.0;
  // Fixed cost of one CTA work item (prologue, pipeline fill, output; >= 0). Forward items are
  // 128 query rows of one output (the tiles writing it run back to back); backward items are
  // 128 keys of one tile.
  double fwd_work_item_cost = 0.0, bwd_work_item_cost = 0.0;
  void validate(const std::string& where) const;  // throws InvalidInput naming the field
};

// The simulator's default for a cluster. A preset whose kernels were measured carries that
// measurement (h200-nvl: measured_h200_calibration(), h100-sxm: measured_h100_calibration()) as
// long as the cluster keeps the preset's kernel rates; any other cluster gets its own rates with
// default overheads.
Calibration calibration_from_cluster(const Cluster& cluster);
// The tile-list kernels of this repository on one H200 (subtiles model; 32 query / 8 KV heads,
// head dim 128, bf16), fitted to the kernel benchmark and the one-GPU whole plans recorded in
// bench/results (refit: bench/fit_calibration.cpp): data/calibration/h200_measured_subtiles.json,
// embedded in the library when it is configured.
Calibration measured_h200_calibration();
// The same kernels on one H100 80GB HBM3, fitted the same way:
// data/calibration/h100_measured_subtiles.json, embedded likewise.
Calibration measured_h100_calibration();
// JSON file {"name":..., "attn_fwd_tflops":..., "attn_bwd_tflops":..., "tile_overhead_us":...,
// "launch_overhead_us":..., "memory_bw_GBps":..., (fwd|bwd)_(diagonal|partial)_efficiency in
// (0, 1], "attention_cost_model": "area"|"subtiles", (fwd|bwd)_(diagonal|partial)_masked_cost
// >= 1, (fwd|bwd)_(empty_subtile|work_item)_cost >= 0}; missing fields keep the defaults.
Calibration parse_calibration(const std::string& json_text, const std::string& source);
Calibration load_calibration(const std::string& path);

// Compute-stream time of one instruction of `pass` run alone (0 for CommStart / CommWait).
double instruction_time_s(const Plan& plan, const Instruction& ins, Pass pass, const Calibration& calib);

// What the simulator's kernel model reads of one block table (sub-tile counts per tile geometry),
// kept across simulations: a planner simulates many plans over one table (placements, schedules)
// and the counts depend on the table alone. One cache serves one table (a plan's table is a copy
// of it); a table of another shape is refused. A simulation fills it as it goes, so it is not
// thread-safe, unless fill() counted every tile first: simulations then only read it and may
// share it across threads.
class SimTableCache {
 public:
  // Binds the cache to `table` and counts every tile of it now. Throws InvalidInput if the
  // cache holds another table's counts.
  void fill(const BlockTable& table);
  SimTableCache();
  ~SimTableCache();
  SimTableCache(SimTableCache&&) noexcept;
  SimTableCache& operator=(SimTableCache&&) noexcept;
  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

struct SimOptions {
  Calibration calibration;
  bool trace = false;  // fill SimResult::trace_json
  SimTableCache* table_cache = nullptr;  // shared with other simulations of plans over the same table
};

struct DeviceSim {
  double finish_s[2] = {0, 0};    // [fwd, bwd]: when the device's program ends
  double compute_s[2] = {0, 0};   // busy time of the compute stream
  double stall_s[2] = {0, 0};     // time blocked in CommWait
  double exposed_comm_s[2] = {0, 0};  // part of the stalls after the data was ready to move
  double comm_in_s[2] = {0, 0};   // summed durations of transfers it received
};

struct SimResult {
  std::vector<DeviceSim> devices;
  double fwd_s = 0;   // slowest device, forward
  double bwd_s = 0;   // slowest device, backward
  double total_s() const { return fwd_s + bwd_s; }
  double comm_s = 0;           // summed transfer durations (both passes)
  double exposed_comm_s = 0;   // summed DeviceSim::exposed_comm_s
  double hidden_fraction = 1;  // 1 - exposed / comm (1 when nothing moves)
  std::vector<std::string> critical_path;  // human-readable steps of the slowest device
  std::string trace_json;                  // Chrome trace (when SimOptions::trace)
};

// Pre: plan valid (validate_plan), cluster.num_devices() == plan.header.world_size.
SimResult simulate(const Plan& plan, const Cluster& cluster, const SimOptions& opts);

}  // namespace dcp
