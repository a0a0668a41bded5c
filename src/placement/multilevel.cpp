// The multilevel driver: the V-cycle that refines a partition on every level of a hierarchy
// built inside its parts, and the full cycle from no partition (coarsen, partition the coarsest
// level, refine on the way back up).
#include "placement/multilevel.h"

#include "placement/coarsen.h"

namespace dcp::placement {

void refine_multilevel(const SubHypergraph& s, const PartCaps& caps, const MultilevelOptions& opts,
                       const RefineOptions& refine, uint64_t seed, std::vector<int32_t>& part) {
  if (caps.k() <= 1 || s.num_vertices() == 0) return;
  const std::vector<CoarseLevel> levels = coarsen(s, caps, &part, opts, seed);
  // The partition on every level, finest first (exact: clusters never span parts).
  std::vector<std::vector<int32_t>> parts(levels.size() + 1);
  parts[0] = part;
  for (size_t i = 0; i < levels.size(); ++i) {
    parts[i + 1].assign(static_cast<size_t>(levels[i].graph.num_vertices()), 0);
    for (size_t v = 0; v < parts[i].size(); ++v) parts[i + 1][levels[i].cluster_of[v]] = parts[i][v];
  }
  for (size_t i = levels.size(); i > 0; --i) {
    refine_fm(levels[i - 1].graph, caps, refine, seed + i, parts[i]);
    for (size_t v = 0; v < parts[i - 1].size(); ++v) parts[i - 1][v] = parts[i][levels[i - 1].cluster_of[v]];
  }
  refine_fm(s, caps, refine, seed, parts[0]);
  part = std::move(parts[0]);
}

std::vector<int32_t> partition_multilevel(const SubHypergraph& s, const PartCaps& caps,
                                          const MultilevelOptions& opts,
                                          const RefineOptions& refine, uint64_t seed) {
  const int k = caps.k();
  if (k <= 1) return std::vector<int32_t>(static_cast<size_t>(s.num_vertices()), 0);
  const std::vector<CoarseLevel> levels = coarsen(s, caps, nullptr, opts, seed);
  const SubHypergraph& coarsest = levels.empty() ? s : levels.back().graph;
  std::vector<int32_t> best;
  double best_obj = 0;
  bool best_ok = false;
  for (FlatStart kind : {FlatStart::Rows, FlatStart::Columns, FlatStart::ZigzagRows}) {
    std::vector<int32_t> part = flat_initial(coarsest, caps, kind);
    const bool ok = repair_balance(coarsest, caps, part);
    refine_fm(coarsest, caps, refine, seed, part);
    const double obj = sub_objective(coarsest, part, k);
    if (best.empty() || (ok && !best_ok) || (ok == best_ok && obj < best_obj * (1 - 1e-12))) {
      best = std::move(part);
      best_obj = obj;
      best_ok = ok;
    }
  }
  for (size_t i = levels.size(); i > 0; --i) {
    const std::vector<int32_t>& map = levels[i - 1].cluster_of;
    std::vector<int32_t> finer(map.size());
    for (size_t v = 0; v < map.size(); ++v) finer[v] = best[map[v]];
    best = std::move(finer);
    refine_fm(i > 1 ? levels[i - 2].graph : s, caps, refine, seed + i, best);
  }
  return best;
}

}  // namespace dcp::placement
