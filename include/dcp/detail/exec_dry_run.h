// dcp/exec_dry_run.h — interpret every program of a plan without computing or moving anything.
//
// Each device's forward and backward program runs through the real Executor (the one
// instruction walker every backend shares) over a backend that keeps no memory and computes
// nothing and a comm that only checks and records its rounds. So every operand is resolved to
// array rows and bounds-checked, every Partial tile's row ranges are derived from its mask, every
// Merge is batched and every round is started and waited exactly as a real run would, in time
// proportional to the plan's instructions and tile rows, not to its FLOPs. A plan the dry run
// accepts can be executed by the CPU and CUDA backends without an out-of-range access; what it
// computes is the validator's business (validate.h).
#pragma once

#include <cstdint>

#include "dcp/plan.h"

namespace dcp {

struct DryRunOptions {
  // Refuse (InvalidInput) a device whose arrays would exceed this many bytes with fp32 storage:
  // a dry run must stay cheap even for plans no machine could run.
  int64_t max_device_bytes = int64_t{64} << 30;
};

struct DryRunReport {
  int64_t max_device_bytes = 0;  // largest per-device allocation of the run (fp32 storage)
  int64_t instructions = 0;      // instructions interpreted, all devices and both passes
  int64_t comm_rounds = 0;       // rounds started (and waited), all devices and both passes
};

// Throws what the executor throws on a plan it cannot run (InvalidPlan), or InvalidInput when a
// device is over the byte limit. Pre: check_plan_structure(plan) holds (every loaded plan).
DryRunReport dry_run_plan(const Plan& plan, const DryRunOptions& options = {});

}  // namespace dcp
