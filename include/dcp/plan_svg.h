// dcp/plan_svg.h — pictures of a plan for people (`dcp plan --svg`).
//
// Top: per sequence and head group, the tile grid (rows = query blocks, columns = key blocks)
// with every tile coloured by the device computing it (partial tiles lighter, causal-diagonal
// tiles as triangles), and the home device of every token block as a strip left of the rows
// and above the columns. Bottom: per device, a memory bar (owned tensors, forward slots,
// backward slots; from plan_memory, the executor's sizing) and a compute bar (forward FLOPs),
// plus the simulated forward + backward time when a SimResult is given.
#pragma once

#include <string>

#include "dcp/plan.h"
#include "dcp/sim.h"

namespace dcp {

struct SvgOptions {
  int max_sequences = 12;        // longest sequences first; the rest are summarised in a line
  bool all_head_groups = false;  // false: head group 0 only (groups share the geometry)
  int grid_px = 220;             // side of the largest grid
};

// Self-contained SVG text. `sim` may be null.
std::string plan_to_svg(const Plan& plan, const SvgOptions& opts, const SimResult* sim = nullptr);
// Writes plan_to_svg to `path`; throws System if the file cannot be written.
void write_svg(const Plan& plan, const std::string& path, const SvgOptions& opts = {},
               const SimResult* sim = nullptr);

}  // namespace dcp
