// The portfolio's memo (memo.h).
#include "placement/memo.h"

#include <utility>

namespace dcp::placement {

namespace {

// Every field, the incidence included: equal hypergraphs give equal coarsenings and starts.
bool same_hypergraph(const SubHypergraph& a, const SubHypergraph& b) {
  return a.global == b.global && a.compute == b.compute && a.memory == b.memory &&
         a.anchor == b.anchor && a.seq == b.seq && a.group == b.group && a.row == b.row &&
         a.col == b.col && a.sub_parts == b.sub_parts && a.net_begin == b.net_begin &&
         a.pins == b.pins && a.net_weight == b.net_weight && a.net_external == b.net_external &&
         a.net_held == b.net_held && a.net_home == b.net_home && a.vertex_begin == b.vertex_begin &&
         a.vertex_nets == b.vertex_nets && a.vertex_pin == b.vertex_pin &&
         a.part_node == b.part_node && a.node_factor == b.node_factor;
}

// The options coarsen() reads.
bool same_coarsening(const MultilevelOptions& a, const MultilevelOptions& b) {
  return a.vertices_per_part == b.vertices_per_part &&
         a.cluster_compute_share == b.cluster_compute_share &&
         a.cluster_memory_share == b.cluster_memory_share && a.min_shrink == b.min_shrink &&
         a.max_shrink == b.max_shrink && a.max_rated_net_pins == b.max_rated_net_pins &&
         a.max_levels == b.max_levels;
}

// The start of `strategy` under caps' compute and memory bounds in memo entry e, or null.
template <typename Entry>
auto find_start(const Entry& e, InitialStrategy strategy, const PartCaps& caps) {
  for (const auto& st : e.starts)
    if (st.strategy == strategy && st.compute == caps.compute && st.memory == caps.memory) return &st;
  return static_cast<decltype(&e.starts.front())>(nullptr);
}

}  // namespace

struct PortfolioMemo::Entry {
  SubHypergraph input;
  struct Coarsening {
    std::vector<double> compute, memory;  // the caps (coarsen reads their smallest values)
    MultilevelOptions opts;
    uint64_t seed;
    std::shared_ptr<const std::vector<CoarseLevel>> levels;
  };
  struct Start {
    std::vector<double> compute, memory;
    InitialStrategy strategy;
    std::vector<int32_t> part;
    bool shared_bands_apply;
  };
  std::vector<Coarsening> coarsenings;
  std::vector<Start> starts;
};

PortfolioMemo::PortfolioMemo() = default;
PortfolioMemo::~PortfolioMemo() = default;

PortfolioMemo::Entry& PortfolioMemo::entry(const SubHypergraph& s) {
  for (const std::unique_ptr<Entry>& e : entries_)
    if (same_hypergraph(e->input, s)) return *e;
  entries_.push_back(std::make_unique<Entry>());
  entries_.back()->input = s;
  return *entries_.back();
}

std::shared_ptr<const std::vector<CoarseLevel>> PortfolioMemo::coarsening(const SubHypergraph& s,
                                                                          const PartCaps& caps,
                                                                          const MultilevelOptions& opts,
                                                                          uint64_t seed) {
  auto find = [&](Entry& e) -> std::shared_ptr<const std::vector<CoarseLevel>> {
    for (const Entry::Coarsening& c : e.coarsenings)
      if (c.seed == seed && c.compute == caps.compute && c.memory == caps.memory &&
          same_coarsening(c.opts, opts))
        return c.levels;
    return nullptr;
  };
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto levels = find(entry(s))) return levels;
  }
  auto levels = std::make_shared<const std::vector<CoarseLevel>>(coarsen(s, caps, nullptr, opts, seed));
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = entry(s);
  if (auto built = find(e)) return built;  // another thread built the same levels meanwhile
  e.coarsenings.push_back({caps.compute, caps.memory, opts, seed, levels});
  return levels;
}

std::vector<int32_t> PortfolioMemo::structured(const SubHypergraph& s, const PartCaps& caps,
                                               InitialStrategy strategy, bool* shared_bands_apply) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (const Entry::Start* st = find_start(entry(s), strategy, caps)) {
      if (shared_bands_apply != nullptr) *shared_bands_apply = st->shared_bands_apply;
      return st->part;
    }
  }
  bool apply = false;
  std::vector<int32_t> part = structured_initial(s, caps, strategy, &apply);
  if (shared_bands_apply != nullptr) *shared_bands_apply = apply;
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = entry(s);
  if (find_start(e, strategy, caps) == nullptr) e.starts.push_back({caps.compute, caps.memory, strategy, part, apply});
  return part;
}

std::vector<int32_t> PortfolioMemo::best_and_shared(const SubHypergraph& s, const PartCaps& caps,
                                                    std::vector<int32_t>& shared, bool* best_apply) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const Entry& e = entry(s);
    const Entry::Start* best = find_start(e, InitialStrategy::Best, caps);
    const Entry::Start* other = find_start(e, InitialStrategy::SharedBands, caps);
    if (best != nullptr && other != nullptr) {
      if (best_apply != nullptr) *best_apply = best->shared_bands_apply;
      shared = other->part;
      return best->part;
    }
  }
  bool apply_best = false, apply_shared = false;
  std::vector<int32_t> part = structured_best_and_shared(s, caps, shared, &apply_best, &apply_shared);
  if (best_apply != nullptr) *best_apply = apply_best;
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = entry(s);
  if (find_start(e, InitialStrategy::Best, caps) == nullptr)
    e.starts.push_back({caps.compute, caps.memory, InitialStrategy::Best, part, apply_best});
  if (find_start(e, InitialStrategy::SharedBands, caps) == nullptr)
    e.starts.push_back({caps.compute, caps.memory, InitialStrategy::SharedBands, shared, apply_shared});
  return part;
}

}  // namespace dcp::placement
