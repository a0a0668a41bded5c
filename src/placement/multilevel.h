// placement/multilevel.h — the multilevel partitioner's driver (coarsen.h builds the levels,
// initial_flat.cpp partitions the coarsest one, fm.cpp refines every level).
#pragma once

#include <cstdint>
#include <vector>

#include "placement/kway.h"

namespace dcp::placement {
class PortfolioMemo;
}

namespace dcp::placement {

// The V-cycle: coarsens s inside the parts of `part`, projects `part` onto the coarsest level,
// and runs k-way FM on every level from the coarsest back to s itself. FM never increases the
// objective and keeps every capacity that holds, and projection preserves both exactly, so
// neither does the V-cycle.
// `pool` (may be null): as refine_fm's.
void refine_multilevel(const SubHypergraph& s, const PartCaps& caps, const MultilevelOptions& opts,
                       const RefineOptions& refine, uint64_t seed, std::vector<int32_t>& part,
                       TaskPool* pool = nullptr);

// The full cycle from no partition: coarsens s freely, partitions the coarsest level (the best
// of the flat starts, each repaired and refined there), then projects and refines with FM on
// every level back up. Returns a partition of s; callers repair. With deeper_vertices_per_part
// (below opts.vertices_per_part; 0 = none) coarsening goes on to that many vertices per part,
// and a second start from there competes with the first on the level above s
// (MultilevelOptions::node_deeper_vertices_per_part); `deeper_won` (may be null) is set when
// the second start's partition went on. `memo` (may be null) keeps the free coarsening for a
// later call on the same hypergraph (memo.h); the result does not depend on it.
std::vector<int32_t> partition_multilevel(const SubHypergraph& s, const PartCaps& caps,
                                          const MultilevelOptions& opts,
                                          const RefineOptions& refine, uint64_t seed,
                                          TaskPool* pool = nullptr,
                                          int deeper_vertices_per_part = 0,
                                          bool* deeper_won = nullptr, PortfolioMemo* memo = nullptr);

// Flat starts for a small (coarsest) hypergraph, which has lost the tile geometry but keeps each
// cluster's first member's sequence, query row and key block: vertices in order of (sequence,
// row, key block), (sequence, key block, row) or zigzag rows (per sequence: first row, last,
// second, second last, ...), dealt to the parts in order, each filled to its share of the total
// compute in proportion to its cap (the last takes the rest).
enum class FlatStart { Rows, Columns, ZigzagRows };
std::vector<int32_t> flat_initial(const SubHypergraph& s, const PartCaps& caps, FlatStart kind);

}  // namespace dcp::placement
