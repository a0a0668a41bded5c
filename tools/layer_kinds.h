// tools/layer_kinds.h — `dcp simulate --layer-masks`: a model whose layers attend with several
// masks, every kind planned on one token placement (plan_step_kinds), predicted per method.
#pragma once

#include <string>
#include <vector>

#include "dcp/plan.h"
#include "dcp/sim.h"
#include "sweep.h"

namespace dcp::cli {

// "lambda*3+causal": kinds joined by '+', each repeated by '*N' (its layers); the same spelling
// as examples/train.py's --mask. Throws InvalidInput naming --layer-masks.
struct LayerPattern {
  std::vector<std::string> kinds;  // mask kinds (dcp simulate --mask names, "mixed" excepted)
  std::vector<double> layers;      // layers of each kind
};
LayerPattern parse_layer_pattern(const std::string& spelling);

struct LayerKindsInputs {
  SweepInputs in;
  LayerPattern pattern;
  std::vector<std::string> methods;  // empty: every placement method
  PlanOptions plan;
  Calibration calibration;
  bool search = false;  // DCP: the planner's search, the block size chosen for all layers at once
  std::vector<int64_t> search_blocks;
  std::vector<double> search_eps;
  int search_reseed = 0;   // PlannerOptions::reseed_best
  int search_tighten = 0;  // PlannerOptions::tighten_best
  int search_threads = 1;  // PlannerOptions::threads
  bool dcp_only = false;
  bool finer_blocks = true;  // StepPlanOptions::kinds_finer_blocks
};

// Per method: each kind's predicted forward + backward time, the step's attention time (each
// kind's times its layers) and inter-node bytes, beside "dcp (each kind alone)": every kind
// planned by itself, tokens placed differently per kind (what sharing one placement costs).
int run_layer_kinds(const LayerKindsInputs& inputs);

}  // namespace dcp::cli
