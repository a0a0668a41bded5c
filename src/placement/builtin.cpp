// The built-in backend: a portfolio of starts for one level, each refined, the best kept.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "placement/kway.h"
#include "placement/memo.h"
#include "placement/multilevel.h"
#include "core/task_pool.h"

namespace dcp::placement {

namespace {

// True when the head groups of s's tiles divide evenly over k parts: GroupSplit then gives each
// part the same compute.
bool splits_by_group(const SubHypergraph& s, int k) {
  int32_t num_groups = 0;
  for (int32_t g : s.group) num_groups = std::max(num_groups, g + 1);
  return num_groups >= k && num_groups % k == 0;
}

struct Result {
  std::vector<int32_t> part;
  double objective = 0;
  CapExcess excess;  // over the capacities: none when every one holds
  // The smaller excess over the capacities first, then the lower objective; ties keep the
  // earlier result.
  bool better_than(const Result& o) const {
    if (o.part.empty()) return true;
    if (!excess.same(o.excess)) return excess.less(o.excess);
    return objective < o.objective * (1 - 1e-12);
  }
};

class BuiltinPartitioner final : public Partitioner {
 public:
  BuiltinPartitioner(int starts, const MultilevelOptions& ml, bool light, TaskPool* pool)
      : starts_(std::clamp(starts, 1, 3)), ml_(ml), light_(light), pool_(pool) {}

  std::vector<int32_t> partition(const SubHypergraph& s, const PartCaps& caps, uint64_t seed,
                                 const RefineOptions& refine) const override {
    std::vector<std::vector<int32_t>> c = candidates(s, caps, seed, refine);
    return std::move(c.front());
  }

  // The best structured start and the multilevel start, best first.
  //
  // Structured starts (initial.cpp) know the geometry of attention tiles; each goes through
  // repair and refinement, and the lowest objective among those that meet every capacity wins.
  // At a level whose parts are devices the portfolio is Best, then Zigzag and GroupFirst with
  // more starts, plus GroupSplit where the head groups divide evenly over the devices (every
  // remote net is then read by one device of the node). At a level whose parts are split again
  // (nodes) it is Best and SharedBands: both keep each node's tiles in whole (row, head group)
  // runs that the next level splits by head group for free, so the node objective ranks them as
  // the final bytes do; zigzag and group-major starts were measured worse there (the node
  // objective cannot see what the device level pays for them). A light backend
  // (PlacementOptions::large_vertices) runs Best alone at such a level.
  //
  // Refinement is a V-cycle (refine_multilevel): moves of whole clusters on the coarse levels
  // restructure what single-tile FM moves cannot. The multilevel start (partition_multilevel)
  // ignores the geometry and finds different optima, better on masks whose structured cuts are
  // not the cheapest (lambda windows, shared-question answers). At a level whose parts are
  // split again it also tries a coarser hierarchy (MultilevelOptions::node_deeper_vertices_per_part).
  std::vector<std::vector<int32_t>> candidates(const SubHypergraph& s, const PartCaps& caps,
                                               uint64_t seed, const RefineOptions& refine) const override {
    if (caps.k() <= 1) return {structured_initial(s, caps)};
    const int k = caps.k();
    const bool upper = s.sub_parts > 1;
    const bool light = upper && light_;
    // A device level too small to coarsen (at most vertices_per_part per part) gets nothing from
    // the multilevel start that a flat start would not find, and its refinement is cheap: there
    // the three device starts run whatever starts_ says, for the spread of the structured cuts.
    const bool flat_level = s.num_vertices() <= static_cast<int64_t>(ml_.vertices_per_part) * k;
    const int starts = light ? 1 : upper ? 2 : flat_level ? 3 : starts_;
    const InitialStrategy device_order[] = {InitialStrategy::Best, InitialStrategy::Zigzag,
                                            InitialStrategy::GroupFirst};
    const InitialStrategy node_order[] = {InitialStrategy::Best, InitialStrategy::SharedBands};
    const bool group_split = !upper && splits_by_group(s, k);
    // The multilevel start and the structured ones are independent: they run at the same time
    // on the pool, the multilevel start (the longest piece) from the beginning, beside the
    // structured starts' construction (cheap, but serial) and then their refinements, each its
    // own piece.
    std::vector<Result> results;
    Result multilevel;
    bool deeper_won = false;
    const bool with_multilevel = ml_.enabled && !light;
    auto run_multilevel = [&] {
      multilevel.part = partition_multilevel(s, caps, ml_, refine, seed, pool_,
                                             upper ? ml_.node_deeper_vertices_per_part : 0, &deeper_won,
                                             &memo_);
      repair_balance(s, caps, multilevel.part);
      refine_fm(s, caps, refine, seed, multilevel.part, pool_);
      multilevel.objective = sub_objective(s, multilevel.part, k);
      multilevel.excess = cap_excess(s, caps, multilevel.part);
    };
    auto run_structured = [&] {
      // Whether the Best start (i = 0) cut a sequence where SharedBands tries shared bands (over
      // kSharedBandsMinParts or more parts, so never on fewer parts): where it did not,
      // SharedBands would make the same placement, so it is not built.
      bool shared_bands_apply = true;
      // Where both Best and SharedBands run, they are built together (they share every cut up
      // to the first sequence a shared band wins).
      const bool both = upper && starts >= 2;
      std::vector<int32_t> shared;
      for (int i = 0; i < starts + (group_split ? 1 : 0); ++i) {
        if (i > 0 && upper && node_order[i] == InitialStrategy::SharedBands && !shared_bands_apply) continue;
        Result r;
        if (both && i == 0) r.part = memo_.best_and_shared(s, caps, shared, &shared_bands_apply);
        else if (both && i == 1) r.part = std::move(shared);
        else
          r.part = memo_.structured(
              s, caps, i == starts ? InitialStrategy::GroupSplit : upper ? node_order[i] : device_order[i],
              i == 0 ? &shared_bands_apply : nullptr);
        // SharedBands equals Best where its shared bands lost on every sequence: skip the rerun.
        if (i > 0 && upper && r.part == results.front().part) continue;
        results.push_back(std::move(r));
      }
      run_each(pool_, static_cast<int>(results.size()), [&](int i) {
        Result& r = results[static_cast<size_t>(i)];
        repair_balance(s, caps, r.part);
        if (ml_.enabled) refine_multilevel(s, caps, ml_, refine, seed, r.part, pool_);
        else refine_fm(s, caps, refine, seed, r.part, pool_);
        r.objective = sub_objective(s, r.part, k);
        r.excess = cap_excess(s, caps, r.part);
      });
    };
    if (with_multilevel) run_both(pool_, run_multilevel, run_structured);
    else run_structured();
    Result structured;
    for (Result& r : results)
      if (r.better_than(structured)) structured = std::move(r);
    if (!with_multilevel) return {std::move(structured.part)};
    // A multilevel partition from the deeper hierarchy goes on only as the best one: where it
    // loses to the structured start, it was carried through the device level for nothing
    // (MultilevelOptions::node_deeper_vertices_per_part).
    if (deeper_won && !multilevel.better_than(structured)) return {std::move(structured.part)};
    if (multilevel.better_than(structured)) return {std::move(multilevel.part), std::move(structured.part)};
    return {std::move(structured.part), std::move(multilevel.part)};
  }

 private:
  int starts_;
  MultilevelOptions ml_;
  bool light_;
  TaskPool* pool_;
  // The full-memory repair's fresh partition of a node repeats the device level's call on the
  // same hypergraph: its coarsening and structured starts are kept here (memo.h).
  mutable PortfolioMemo memo_;
};

}  // namespace

std::unique_ptr<Partitioner> make_builtin_partitioner(int starts, const MultilevelOptions& ml,
                                                      bool light, TaskPool* pool) {
  return std::make_unique<BuiltinPartitioner>(starts, ml, light, pool);
}

}  // namespace dcp::placement
