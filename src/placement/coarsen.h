// placement/coarsen.h — the coarsening phase of the multilevel partitioner: heavy-edge clustering
// of a level's hypergraph into a hierarchy of ever smaller hypergraphs.
#pragma once

#include <cstdint>
#include <vector>

#include "placement/kway.h"

namespace dcp {
class TaskPool;  // core/task_pool.h
}

namespace dcp::placement {

// One coarser level: its hypergraph and the cluster (a vertex of `graph`) of every vertex of the
// level below it.
struct CoarseLevel {
  SubHypergraph graph;
  std::vector<int32_t> cluster_of;
};

// Heavy-edge clustering, repeated until a stop rule of `opts` holds (few enough vertices per part,
// a pass that shrinks too little, max_levels). Every vertex, in a seeded random order, joins the
// neighbouring cluster it shares the most net weight with, each net weighted 1 / (pins - 1)
// (heavy-edge rating), among the clusters that stay within the weight bounds; singletons are
// preferred on ties. With `part`, only vertices of the same part cluster (a V-cycle: the
// partition projects exactly onto every level). Nets never span sequences, so clusters never do
// either. Coarse nets keep one pin per cluster; nets left with one pin are dropped unless they
// are external (their cost and held bytes still depend on that pin's part). Coarse vertices keep
// the sequence, head group, row and key block of their first member. Deterministic for a seed.
// `pool` (may be null): with `part`, the parts of a large level are clustered at the same time;
// the levels do not depend on it.
std::vector<CoarseLevel> coarsen(const SubHypergraph& s, const PartCaps& caps,
                                 const std::vector<int32_t>* part, const MultilevelOptions& opts,
                                 uint64_t seed, TaskPool* pool = nullptr);

}  // namespace dcp::placement
