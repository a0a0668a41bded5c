// Coarsening: heavy-edge clustering and contraction, level by level.
#include "placement/coarsen.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "dcp/error.h"
#include "core/task_pool.h"

namespace dcp::placement {

namespace {

// Inside the parts of a partition, a clustering pass of at least this many vertices runs its
// parts at the same time on the pool; below it the hand-over costs more than it saves.
constexpr int32_t kParallelClusterVertices = 512;

// Cluster id of every vertex after one clustering pass; returns the number of clusters.
// `rep[v]` is the representative (a vertex) of v's cluster; ids are dense in order of first
// appearance, so the result depends only on the order and the ratings. kInParts: only vertices
// of the same part of `part` cluster (the rating loop, the hot loop of coarsening, is compiled
// once with and once without that test).
//
// kInParts with a pool: a vertex reads and writes only the clusters of its own part, so the
// parts are clustered at the same time, each visiting its vertices in the pass's order, which
// is the sequential pass exactly, as long as the pass cannot stop on the cluster count
// (n / max_shrink) part-way: each visit joins at most one vertex, so that holds for the first
// n - floor positions of the order (all of them by default); the rest runs in order.
template <bool kInParts>
int32_t cluster_pass(const SubHypergraph& s, const std::vector<int32_t>* part, double max_c,
                     double max_m, const MultilevelOptions& opts, uint64_t seed, TaskPool* pool,
                     std::vector<int32_t>& cluster_id) {
  const int32_t n = s.num_vertices();
  std::vector<int32_t> rep(static_cast<size_t>(n));
  std::iota(rep.begin(), rep.end(), 0);
  std::vector<int32_t> size(static_cast<size_t>(n), 1);
  std::vector<double> wc(s.compute.begin(), s.compute.end()), wm(s.memory.begin(), s.memory.end());
  std::vector<double> score(static_cast<size_t>(n), 0.0);
  const int32_t* in_part = kInParts ? part->data() : nullptr;
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  uint64_t rng = seed;
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[splitmix64(rng) % i]);
  // Visits u: joins it to the best neighbouring cluster, if any; returns whether it joined.
  // `touched` holds the clusters rated for u (each once: its score was 0 before).
  auto visit = [&](int32_t u, int32_t* touched) {
    // Plain local pointers, which the loops below keep in registers (the hot loops of coarsening).
    const int32_t* const pin = s.pins.data();
    const int64_t* const net_begin = s.net_begin.data();
    const int32_t* const in_p = in_part;
    int32_t* const rep_of = rep.data();
    int32_t* const size_of = size.data();
    double* const sc_of = score.data();
    double* const wc_of = wc.data();
    double* const wm_of = wm.data();
    if (rep_of[u] != u || size_of[u] > 1) return false;  // already clustered: only singletons move
    size_t num_touched = 0;
    const int32_t part_u = kInParts ? in_p[u] : -1;
    for (int64_t i = s.vertex_begin[u]; i < s.vertex_begin[u + 1]; ++i) {
      const int32_t e = s.vertex_nets[i];
      const int64_t pins = net_begin[e + 1] - net_begin[e];
      if (pins < 2) continue;
      const double r = s.net_weight[e] / static_cast<double>(pins - 1);
      // A large net is rated only against the pins near u in its pin order (table order: the
      // neighbours of a tile in its row or column), which bounds the work per vertex.
      const int64_t at = s.vertex_pin[i];  // u's own pin (a net holds a vertex once): skipped
      int64_t lo = net_begin[e], hi = net_begin[e + 1];
      if (pins > opts.max_rated_net_pins) {
        const int64_t half = opts.max_rated_net_pins / 2;
        lo = std::max(lo, at - half);
        hi = std::min(hi, at + half + 1);
      }
      auto rate = [&](int64_t from, int64_t to) {
        for (int64_t j = from; j < to; ++j) {
          const int32_t v = pin[j];
          if constexpr (kInParts)
            if (in_p[v] != part_u) continue;
          const int32_t c = rep_of[v];
          if (sc_of[c] == 0) touched[num_touched++] = c;
          sc_of[c] += r;
        }
      };
      rate(lo, at);
      rate(at + 1, hi);
    }
    int32_t best = -1;
    double best_score = 0;
    // A rating beats the best one above `above`, ties it from `tied` on (relative 1e-12).
    double above = 0, tied = 0;
    bool best_single = false;
    for (size_t t = 0; t < num_touched; ++t) {
      const int32_t c = touched[t];
      const double sc = sc_of[c];
      sc_of[c] = 0;
      if (c == u) continue;
      // Ties: a singleton first (it keeps clusters even), then the lower representative. The
      // weight bounds are checked only for a candidate that would win.
      const bool single = size_of[c] == 1;
      const bool better = best < 0 || sc > above ||
                          (sc >= tied && (single > best_single || (single == best_single && c < best)));
      if (!better) continue;
      if (wc_of[c] + wc_of[u] > max_c && wc_of[u] > 0 && wc_of[c] > 0) continue;
      if (wm_of[c] + wm_of[u] > max_m && wm_of[u] > 0 && wm_of[c] > 0) continue;
      best = c;
      best_score = sc;
      above = best_score * (1 + 1e-12);
      tied = best_score * (1 - 1e-12);
      best_single = single;
    }
    if (best < 0) return false;
    rep_of[u] = best;
    ++size_of[best];
    wc_of[best] += wc_of[u];
    wm_of[best] += wm_of[u];
    return true;
  };
  // A pass stops joining once the clusters are few enough: n / max_shrink (each level then
  // shrinks by a bounded factor, so every level's refinement moves clusters of a size between
  // the levels above and below it).
  int32_t clusters = n;
  const int32_t floor_clusters = static_cast<int32_t>(n / std::max(1.0, opts.max_shrink));
  size_t next_pos = 0;
  if constexpr (kInParts) {
    int k = 0;
    for (int32_t v = 0; v < n; ++v) k = std::max(k, in_part[v] + 1);
    std::vector<int32_t> part_size(static_cast<size_t>(k), 0);  // bounds the clusters a part rates
    for (int32_t v = 0; v < n; ++v) ++part_size[in_part[v]];
    if (pool != nullptr && pool->threads() > 1 && n >= kParallelClusterVertices && k > 1) {
      const auto ahead = static_cast<size_t>(n - floor_clusters);  // visited by any order
      // The vertices of each part in the order of the pass (a counting sort by part).
      std::vector<int32_t> begin(static_cast<size_t>(k) + 1, 0);
      for (size_t i = 0; i < ahead; ++i) ++begin[static_cast<size_t>(in_part[order[i]]) + 1];
      for (int p = 0; p < k; ++p) begin[p + 1] += begin[p];
      std::vector<int32_t> by_part(ahead);
      std::vector<int32_t> fill(begin.begin(), begin.end() - 1);
      for (size_t i = 0; i < ahead; ++i) by_part[fill[in_part[order[i]]]++] = order[i];
      // Pieces of whole parts with about the same number of vertices each.
      const int num_pieces = std::min(k, 4 * pool->threads());
      std::vector<int> piece_begin{0};
      for (int p = 1; p < k; ++p)
        if (static_cast<int64_t>(begin[p]) * num_pieces >=
            static_cast<int64_t>(ahead) * static_cast<int64_t>(piece_begin.size()))
          piece_begin.push_back(p);
      piece_begin.push_back(k);
      std::vector<int32_t> joined(piece_begin.size() - 1, 0);
      pool->run(static_cast<int>(joined.size()), [&](int i) {
        const int32_t lo = begin[piece_begin[i]], hi = begin[piece_begin[i + 1]];
        std::vector<int32_t> touched(static_cast<size_t>(std::accumulate(
            part_size.begin() + piece_begin[i], part_size.begin() + piece_begin[i + 1], int32_t{0})));
        for (int32_t j = lo; j < hi; ++j) joined[i] += visit(by_part[j], touched.data()) ? 1 : 0;
      });
      for (int32_t j : joined) clusters -= j;
      next_pos = ahead;
    }
  }
  std::vector<int32_t> touched(static_cast<size_t>(n));
  for (size_t i = next_pos; i < order.size(); ++i) {
    if (clusters <= floor_clusters) break;
    if (visit(order[i], touched.data())) --clusters;
  }
  cluster_id.assign(static_cast<size_t>(n), -1);
  std::vector<int32_t> id_of_rep(static_cast<size_t>(n), -1);
  int32_t next = 0;
  for (int32_t v = 0; v < n; ++v) {
    int32_t& id = id_of_rep[rep[v]];
    if (id < 0) id = next++;
    cluster_id[v] = id;
  }
  return next;
}

SubHypergraph contract(const SubHypergraph& s, const std::vector<int32_t>& cluster_id,
                       int32_t num_clusters) {
  SubHypergraph c;
  const auto nc = static_cast<size_t>(num_clusters);
  c.global.assign(nc, -1);
  c.compute.assign(nc, 0.0);
  c.memory.assign(nc, 0.0);
  c.anchor.assign(nc, -1);
  c.seq.assign(nc, -1);
  c.group.assign(nc, -1);
  c.row.assign(nc, -1);
  c.col.assign(nc, -1);
  c.sub_parts = s.sub_parts;
  c.part_node = s.part_node;
  c.node_factor = s.node_factor;
  for (int32_t v = 0; v < s.num_vertices(); ++v) {
    const int32_t x = cluster_id[v];
    c.compute[x] += s.compute[v];
    c.memory[x] += s.memory[v];
    if (c.global[x] < 0) {  // geometry of the first member
      c.global[x] = s.global.empty() ? v : s.global[v];
      c.seq[x] = s.seq.empty() ? -1 : s.seq[v];
      c.group[x] = s.group.empty() ? -1 : s.group[v];
      c.row[x] = s.row.empty() ? -1 : s.row[v];
      c.col[x] = s.col.empty() ? -1 : s.col[v];
    }
  }
  const bool held = !s.net_held.empty();
  std::vector<int32_t> stamp(nc, -1);
  // At most the finer level's nets and pins.
  c.net_begin.reserve(static_cast<size_t>(s.num_nets()) + 1);
  c.pins.reserve(s.pins.size());
  c.net_weight.reserve(static_cast<size_t>(s.num_nets()));
  c.net_external.reserve(static_cast<size_t>(s.num_nets()));
  if (held) {
    c.net_held.reserve(static_cast<size_t>(s.num_nets()));
    c.net_home.reserve(static_cast<size_t>(s.num_nets()));
  }
  c.net_begin.push_back(0);
  for (int32_t e = 0; e < s.num_nets(); ++e) {
    const size_t first = c.pins.size();
    for (int64_t i = s.net_begin[e]; i < s.net_begin[e + 1]; ++i) {
      const int32_t x = cluster_id[s.pins[i]];
      if (stamp[x] == e) continue;
      stamp[x] = e;
      c.pins.push_back(x);
    }
    if (c.pins.size() - first < 2 && !s.net_external[e]) {
      c.pins.resize(first);
      continue;
    }
    c.net_begin.push_back(static_cast<int64_t>(c.pins.size()));
    c.net_weight.push_back(s.net_weight[e]);
    c.net_external.push_back(s.net_external[e]);
    if (held) {
      c.net_held.push_back(s.net_held[e]);
      c.net_home.push_back(s.net_home[e] >= 0 ? cluster_id[s.net_home[e]] : -1);
    }
  }
  c.finish_incidence();
  return c;
}

}  // namespace

std::vector<CoarseLevel> coarsen(const SubHypergraph& s, const PartCaps& caps,
                                 const std::vector<int32_t>* part, const MultilevelOptions& opts,
                                 uint64_t seed, TaskPool* pool) {
  std::vector<CoarseLevel> levels;
  const int k = std::max(1, caps.k());
  double cap_c = std::numeric_limits<double>::infinity(), cap_m = cap_c;
  for (int p = 0; p < caps.k(); ++p) {
    cap_c = std::min(cap_c, caps.compute[p]);
    cap_m = std::min(cap_m, caps.memory[p]);
  }
  const double max_c = opts.cluster_compute_share * cap_c, max_m = opts.cluster_memory_share * cap_m;
  const int64_t limit = static_cast<int64_t>(opts.vertices_per_part) * k;
  const SubHypergraph* cur = &s;
  std::vector<int32_t> cur_part;
  if (part != nullptr) cur_part = *part;
  std::vector<int32_t> ids;
  for (int level = 0; level < opts.max_levels && cur->num_vertices() > limit; ++level) {
    uint64_t st = seed + static_cast<uint64_t>(level);
    const int32_t n = cur->num_vertices();
    const int32_t nc = part != nullptr
                           ? cluster_pass<true>(*cur, &cur_part, max_c, max_m, opts, splitmix64(st), pool, ids)
                           : cluster_pass<false>(*cur, nullptr, max_c, max_m, opts, splitmix64(st), nullptr, ids);
    if (static_cast<double>(n - nc) < opts.min_shrink * n) break;
    CoarseLevel next;
    next.graph = contract(*cur, ids, nc);
    next.cluster_of = ids;
    if (part != nullptr) {
      std::vector<int32_t> coarse_part(static_cast<size_t>(nc), 0);
      for (int32_t v = 0; v < n; ++v) coarse_part[ids[v]] = cur_part[v];
      cur_part = std::move(coarse_part);
    }
    levels.push_back(std::move(next));
    cur = &levels.back().graph;
  }
  return levels;
}

}  // namespace dcp::placement
