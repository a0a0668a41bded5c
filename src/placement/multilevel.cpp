// The multilevel driver: the V-cycle that refines a partition on every level of a hierarchy
// built inside its parts, and the full cycle from no partition (coarsen, partition the coarsest
// level, refine on the way back up).
#include "placement/multilevel.h"

#include <algorithm>

#include "placement/coarsen.h"

namespace dcp::placement {

void refine_multilevel(const SubHypergraph& s, const PartCaps& caps, const MultilevelOptions& opts,
                       const RefineOptions& refine, uint64_t seed, std::vector<int32_t>& part,
                       TaskPool* pool) {
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
    refine_fm(levels[i - 1].graph, caps, refine, seed + i, parts[i], pool);
    for (size_t v = 0; v < parts[i - 1].size(); ++v) parts[i - 1][v] = parts[i][levels[i - 1].cluster_of[v]];
  }
  refine_fm(s, caps, refine, seed, parts[0], pool);
  part = std::move(parts[0]);
}

std::vector<int32_t> partition_multilevel(const SubHypergraph& s, const PartCaps& caps,
                                          const MultilevelOptions& opts,
                                          const RefineOptions& refine, uint64_t seed,
                                          TaskPool* pool) {
  const int k = caps.k();
  if (k <= 1) return std::vector<int32_t>(static_cast<size_t>(s.num_vertices()), 0);
  const std::vector<CoarseLevel> levels = coarsen(s, caps, nullptr, opts, seed);
  const SubHypergraph& coarsest = levels.empty() ? s : levels.back().graph;
  // Every flat start repaired first: one whose repair meets the capacities beats every one whose
  // repair does not, whatever FM does to either (FM keeps the capacities that hold and fixes no
  // others), so only the starts that can still win are refined.
  const FlatStart kinds[] = {FlatStart::Rows, FlatStart::Columns, FlatStart::ZigzagRows};
  std::vector<std::vector<int32_t>> starts;
  std::vector<uint8_t> ok;
  for (FlatStart kind : kinds) {
    starts.push_back(flat_initial(coarsest, caps, kind));
    ok.push_back(repair_balance(coarsest, caps, starts.back()) ? 1 : 0);
  }
  const bool any_ok = std::find(ok.begin(), ok.end(), 1) != ok.end();
  std::vector<int32_t> best;
  double best_obj = 0;
  for (size_t i = 0; i < starts.size(); ++i) {
    if (any_ok && !ok[i]) continue;
    refine_fm(coarsest, caps, refine, seed, starts[i]);
    const double obj = sub_objective(coarsest, starts[i], k);
    if (best.empty() || obj < best_obj * (1 - 1e-12)) {
      best = std::move(starts[i]);
      best_obj = obj;
    }
  }
  for (size_t i = levels.size(); i > 0; --i) {
    const std::vector<int32_t>& map = levels[i - 1].cluster_of;
    std::vector<int32_t> finer(map.size());
    for (size_t v = 0; v < map.size(); ++v) finer[v] = best[map[v]];
    best = std::move(finer);
    refine_fm(i > 1 ? levels[i - 2].graph : s, caps, refine, seed + i, best, pool);
  }
  return best;
}

}  // namespace dcp::placement
