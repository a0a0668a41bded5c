// The multilevel driver: the V-cycle that refines a partition on every level of a hierarchy
// built inside its parts, and the full cycle from no partition (coarsen, partition the coarsest
// level, refine on the way back up).
#include "placement/multilevel.h"

#include <algorithm>
#include <memory>

#include "placement/coarsen.h"
#include "placement/memo.h"
#include "core/task_pool.h"

namespace dcp::placement {

void refine_multilevel(const SubHypergraph& s, const PartCaps& caps, const MultilevelOptions& opts,
                       const RefineOptions& refine, uint64_t seed, std::vector<int32_t>& part,
                       TaskPool* pool) {
  if (caps.k() <= 1 || s.num_vertices() == 0) return;
  const std::vector<CoarseLevel> levels = coarsen(s, caps, &part, opts, seed, pool);
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
                                          TaskPool* pool, int deeper_vertices_per_part, bool* deeper_won,
                                          PortfolioMemo* memo) {
  const int k = caps.k();
  if (deeper_won != nullptr) *deeper_won = false;
  if (k <= 1) return std::vector<int32_t>(static_cast<size_t>(s.num_vertices()), 0);
  const bool deeper = deeper_vertices_per_part > 0 && deeper_vertices_per_part < opts.vertices_per_part;
  MultilevelOptions coarsen_opts = opts;
  if (deeper) coarsen_opts.vertices_per_part = deeper_vertices_per_part;
  const std::shared_ptr<const std::vector<CoarseLevel>> built =
      memo != nullptr ? memo->coarsening(s, caps, coarsen_opts, seed)
                      : std::make_shared<const std::vector<CoarseLevel>>(coarsen(s, caps, nullptr, coarsen_opts, seed));
  const std::vector<CoarseLevel>& levels = *built;
  auto graph = [&](size_t i) -> const SubHypergraph& { return i == 0 ? s : levels[i - 1].graph; };
  // Coarsening is the same up to the first level within vertices_per_part (each level's
  // clustering depends on its seed and the level above only), so that level is the coarsest
  // one of the start without `deeper_vertices_per_part`.
  const int64_t limit = static_cast<int64_t>(opts.vertices_per_part) * k;
  size_t top = levels.size();
  for (size_t i = 0; i < levels.size(); ++i) {
    if (levels[i].graph.num_vertices() <= limit) {
      top = i + 1;
      break;
    }
  }
  const SubHypergraph& coarsest = graph(top);
  auto project = [&](size_t i, std::vector<int32_t>& part) {  // level i -> level i - 1
    const std::vector<int32_t>& map = levels[i - 1].cluster_of;
    std::vector<int32_t> finer(map.size());
    for (size_t v = 0; v < map.size(); ++v) finer[v] = part[map[v]];
    part = std::move(finer);
  };
  // Two independent chains, run at the same time on the pool:
  // - the flat starts on `coarsest`, each repaired first (one whose repair meets the capacities
  //   beats every one whose repair does not, whatever FM does to either: FM keeps the capacities
  //   that hold and fixes no others, so only the starts that can still win are refined, each on
  //   its own), the best of them projected and refined on every level down to `meet`;
  // - with deeper levels, the rows flat start on the deepest one, refined on every level back
  //   up to `meet`, the level above s (the finest level's FM, the most expensive, runs once),
  //   where the one with less excess over the capacities, or as little and a lower objective,
  //   goes on.
  const bool with_deeper = deeper && levels.size() > top;
  const size_t meet = with_deeper ? std::min<size_t>(top, 1) : top;
  std::vector<int32_t> best, deep;
  auto flat_chain = [&] {
    const FlatStart kinds[] = {FlatStart::Rows, FlatStart::Columns, FlatStart::ZigzagRows};
    constexpr int kKinds = 3;
    std::vector<std::vector<int32_t>> starts(kKinds);
    std::vector<uint8_t> ok(kKinds);
    for (int i = 0; i < kKinds; ++i) {
      starts[i] = flat_initial(coarsest, caps, kinds[i]);
      ok[i] = repair_balance(coarsest, caps, starts[i]) ? 1 : 0;
    }
    const bool any_ok = std::find(ok.begin(), ok.end(), 1) != ok.end();
    std::vector<double> obj(kKinds, 0.0);
    run_each(pool, kKinds, [&](int i) {
      if (any_ok && !ok[i]) return;
      refine_fm(coarsest, caps, refine, seed, starts[i]);
      obj[i] = sub_objective(coarsest, starts[i], k);
    });
    double best_obj = 0;
    for (int i = 0; i < kKinds; ++i) {
      if (any_ok && !ok[i]) continue;
      if (best.empty() || obj[i] < best_obj * (1 - 1e-12)) {
        best = std::move(starts[i]);
        best_obj = obj[i];
      }
    }
    for (size_t at = top; at > meet; --at) {
      project(at, best);
      refine_fm(graph(at - 1), caps, refine, seed + at, best, pool);
    }
  };
  auto deeper_chain = [&] {
    deep = flat_initial(graph(levels.size()), caps, FlatStart::Rows);
    repair_balance(graph(levels.size()), caps, deep);
    refine_fm(graph(levels.size()), caps, refine, seed, deep);
    for (size_t i = levels.size(); i > meet; --i) {
      project(i, deep);
      refine_fm(graph(i - 1), caps, refine, seed + i, deep, pool);
    }
  };
  if (with_deeper) run_both(pool, deeper_chain, flat_chain);
  else flat_chain();
  if (with_deeper) {
    const SubHypergraph& g = graph(meet);
    const CapExcess excess = cap_excess(g, caps, deep), best_excess = cap_excess(g, caps, best);
    if (excess.less(best_excess) ||
        (excess.same(best_excess) && sub_objective(g, deep, k) < sub_objective(g, best, k) * (1 - 1e-12)))
    {
      best = std::move(deep);
      if (deeper_won != nullptr) *deeper_won = true;
    }
  }
  for (size_t i = meet; i > 0; --i) {
    project(i, best);
    refine_fm(graph(i - 1), caps, refine, seed + i, best, pool);
  }
  return best;
}

}  // namespace dcp::placement
