// dcp/planner.h — the whole planning pipeline for one batch, with a cost-model search.
//
// Batch -> BlockTable -> DCP Placement -> Plan for each candidate (block size B, compute
// tolerance eps_c); every candidate plan is simulated (sim.h) and the fastest predicted one
// (forward + backward) is kept. The search is what a data loader would run ahead of training:
// each candidate costs a few milliseconds, so a 3 x 3 grid stays well under a second.
// Deterministic: candidates are tried in a fixed order and ties keep the earlier one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dcp/partition.h"
#include "dcp/plan.h"
#include "dcp/sim.h"

namespace dcp {

struct PlannerOptions {
  std::vector<int64_t> block_sizes{1024};  // candidates for B (multiples of 16)
  std::vector<double> eps_compute{0.1};    // candidates for the per-device compute tolerance
  int q_heads_per_group = 0;               // BlockOptions::q_heads_per_group
  PlacementOptions placement;              // eps_compute is overridden by the candidates
  PlanOptions plan;
  Calibration calibration;
  // Balance predicted kernel time instead of FLOPs: when placement.tile_cost is the default,
  // the candidates' placements weigh tiles by tile_cost_from(calibration).
  bool balance_time = true;
  // Throws InvalidInput naming the option (empty candidate lists, bad B or eps).
  void validate() const;
};

struct PlanCandidate {
  int64_t block_size = 0;
  double eps_compute = 0;
  double predicted_s = 0;   // simulated forward + backward
  bool balanced = true;     // the placement met every bound
  double planning_s = 0;    // block table + placement + plan (simulation excluded)
};

struct PlannedBatch {
  BlockTable table;
  DcpPlacement placement;
  Plan plan;
  SimResult predicted;
  PlanCandidate chosen;
  std::vector<PlanCandidate> candidates;  // in the order tried
  double search_s = 0;                    // whole search, simulations included
};

// Tile weights in full-forward-rate equivalents: a tile's weight over the calibration's forward
// rate is its predicted Attend time (fwd + bwd) under the simulator's model (sim.h).
TileCost tile_cost_from(const Calibration& calibration);

// Pre: batch.validate() and cluster.validate() pass. Candidates whose placement violates a
// balance bound are kept only if no candidate is balanced.
PlannedBatch plan_batch(const Batch& batch, const Cluster& cluster, const PlannerOptions& opts);

}  // namespace dcp
