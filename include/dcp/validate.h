// dcp/validate.h — proves a plan computes exactly the masked attention without running it.
//
// Symbolic execution of every Program (forward, then backward) of every device: buffers hold
// symbolic contents (which data block, or which set of tiles a partial has accumulated), and
// communication is matched between devices with NCCL's in-order semantics (a device's comm
// groups complete in posting order; the k-th send from a to b matches the k-th receive on b
// from a). Checks: every send has exactly one matching receive (same round, kind, block,
// group, bytes); no device can deadlock; every Attend reads the right Q/KV (dO/LSE/Delta)
// blocks and writes partials of its own output; every tile is computed exactly once; every
// owned output block is merged exactly once, from exactly the tiles of its rows; no buffer is
// overwritten while a transfer uses it or while it holds an unconsumed partial; slot and local
// indices are in range. It shares no code with the builder.
#pragma once

#include <string>
#include <vector>

#include "dcp/plan.h"

namespace dcp {

struct PlanViolation {
  int device = -1;         // -1: not tied to one device
  Pass pass = Pass::Forward;
  int instruction = -1;    // index in the program's code, -1 if none
  std::string what;
  std::string to_string() const;  // "device 3 fwd #17: ..."
};

// All violations found (stops collecting after max_violations). Empty = the plan is valid.
std::vector<PlanViolation> validate_plan(const Plan& plan, size_t max_violations = 64);

// Throws InvalidPlan listing the first violations (at most 5) if any.
void check_plan(const Plan& plan);

}  // namespace dcp
