// dcp/comm_order.h — what each CommStart must wait for on the compute stream (executor and
// simulator share it: the simulator posts a round when its dependencies are done, as the CUDA
// executor does).
//
// A device comm runs its rounds on a stream of its own. Ordering a round after everything the
// compute stream has queued is always correct but can serialise what the schedule overlaps: a
// round that only sends inputs (Q, KV, dO owned since the pass began) would wait for a long
// stage it has nothing to do with. The exact condition is per buffer:
//   send    reads its buffer:  it must follow the last compute instruction that WRITES it;
//   receive overwrites it:     it must follow the last compute instruction that READS OR
//                              WRITES it (a reused slot's previous content must be dead).
// Compute instructions are Attend, Merge and Copy. Transfers need no order among themselves:
// the comm stream runs rounds in program order. Work queued before the pass (uploads, Delta,
// the previous layer) is covered by the pass-start point. Buffers are compared by
// (space, kind, index): a Local block stands for all its head groups (conservative).
#pragma once

#include <cstdint>
#include <vector>

#include "dcp/plan.h"

namespace dcp {

inline constexpr int32_t kPassStartPoint = -1;

struct CommOrder {
  // after[i], for a CommStart at i: the instruction index it must follow, or kPassStartPoint.
  // Unused (kPassStartPoint) for other instructions.
  std::vector<int32_t> after;
  // mark_after[i]: some CommStart depends on instruction i, so its end must be noted.
  std::vector<uint8_t> mark_after;
};

CommOrder comm_order(const Program& program);

}  // namespace dcp
