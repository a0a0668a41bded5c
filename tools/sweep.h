// tools/sweep.h — `dcp simulate --sweep`: the paper's dry-run studies, printed as tables and
// optionally drawn as SVG line charts.
//   block : DCP inter-node volume and planning time vs block size (512..4096), one series per
//           mask kind;
//   mask  : inter-node volume of every method vs the lambda mask's window (sparser to the left);
//   eps   : DCP inter-node volume (and achieved compute imbalance) vs the imbalance tolerance
//           eps (eps_compute = eps, eps_memory = 2 eps), one series per mask kind.
// Volumes are the placement model's (metrics.h), mean per batch over --batches batches.
#pragma once

#include <string>

#include "common.h"

namespace dcp::cli {

struct SweepInputs {
  BatchSource batch;
  ClusterSource cluster;
  BlockOptions blocks;
  PlacementOptions placement;
  int batches = 4;
  std::string sweep;  // "", "block", "mask", "eps"
  std::string svg;
  bool json = false;
  bool progress = false;  // progress lines on stderr (a TTY)
};

int run_sweep(const SweepInputs& in);

// One-line progress on stderr, overwritten in place; no-ops when disabled.
struct Progress {
  static void show(bool enabled, const std::string& what);
  static void clear(bool enabled);
};

}  // namespace dcp::cli
