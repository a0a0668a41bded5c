// k-way FM refinement on the connectivity objective with both capacities.
//
// Each pass moves vertices one at a time, the best exact gain first (negative gains allowed, so
// a pass can climb out of a local minimum), locks each moved vertex, and finally rolls back to
// the best prefix of the pass: the objective never increases. Gains live in a lazy max-heap
// with one entry per vertex: an entry is re-checked when it reaches the top (and lowered to its
// true gain when that is lower), and after a move only the pins of nets whose pin count crossed
// 0/1/2 in the source or target part get renewed entries; under the flat cost without a
// full-memory cap only those whose gain rose (see move_cached). Under the flat cost a vertex's
// best target comes from the gain cache, so only a target that does not fit costs a scan of the
// parts. With a pool, a large level's pass set-up (which reads a fixed state) runs in chunks on
// its threads, joined in order.
// refine_fm_around sets up only the vertices near a given set, a region that grows with the
// moves of every pass: after a repair that moved a few vertices of a large level, the passes
// start where the repair changed the partition instead of at every boundary vertex.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <vector>

#include "placement/gain_cache.h"
#include "placement/kway.h"
#include "core/task_pool.h"

namespace dcp::placement {

namespace {

// The pass's priority queue: at most one entry per vertex (its best move's gain and a seeded
// tie-break), addressable, so that a renewed gain updates the vertex's entry in place instead
// of leaving stale copies behind. The top is the largest (gain, tie). The tie-breaks of one
// pass are distinct (a bijective mix of distinct vertex ids), so the order is total and the
// top does not depend on the heap's shape: a 4-ary heap, half as deep as a binary one, moves
// half as many entries per update.
class GainHeap {
 public:
  void reset(int32_t num_vertices) {
    pos_.assign(static_cast<size_t>(num_vertices), -1);
    items_.clear();
    items_.reserve(static_cast<size_t>(num_vertices));  // at most one entry per vertex: no regrowth
  }
  bool empty() const { return items_.empty(); }
  bool contains(int32_t v) const { return pos_[v] >= 0; }
  // Appends without ordering; heapify() afterwards (linear time for a whole pass's start).
  void append(int32_t v, double gain, uint64_t tie) {
    pos_[v] = static_cast<int32_t>(items_.size());
    items_.push_back({gain, tie, v});
  }
  void heapify() {
    for (size_t i = (items_.size() + kArity - 2) / kArity; i > 0; --i) down(i - 1);
  }
  // Inserts v or changes its key.
  void set(int32_t v, double gain, uint64_t tie) {
    if (pos_[v] < 0) {
      append(v, gain, tie);
      up(items_.size() - 1);
      return;
    }
    const size_t i = static_cast<size_t>(pos_[v]);
    const Item old = items_[i];
    items_[i].gain = gain;
    items_[i].tie = tie;
    if (before(old, items_[i])) up(i);
    else down(i);
  }
  void erase(int32_t v) {
    const int32_t i = pos_[v];
    if (i < 0) return;
    pos_[v] = -1;
    const Item last = items_.back();
    items_.pop_back();
    if (static_cast<size_t>(i) == items_.size()) return;
    place(static_cast<size_t>(i), last);
    up(static_cast<size_t>(i));
    down(static_cast<size_t>(pos_[last.v]));
  }
  int32_t top() const { return items_.front().v; }
  double top_gain() const { return items_.front().gain; }
  void pop() { erase(items_.front().v); }

 private:
  static constexpr size_t kArity = 4;
  struct Item {
    double gain;
    uint64_t tie;
    int32_t v;
  };
  // True when a goes below b (b is larger).
  static bool before(const Item& a, const Item& b) {
    return a.gain < b.gain || (a.gain == b.gain && a.tie < b.tie);
  }
  void place(size_t i, const Item& it) {
    items_[i] = it;
    pos_[it.v] = static_cast<int32_t>(i);
  }
  void up(size_t i) {
    const Item it = items_[i];
    while (i > 0) {
      const size_t parent = (i - 1) / kArity;
      if (!before(items_[parent], it)) break;
      place(i, items_[parent]);
      i = parent;
    }
    place(i, it);
  }
  void down(size_t i) {
    const Item it = items_[i];
    const size_t n = items_.size();
    const Item* items = items_.data();
    for (;;) {
      const size_t first = kArity * i + 1;
      size_t child;
      static_assert(kArity == 4);
      if (first + kArity <= n) {  // all four children: the larger of each pair, then of the two
        const size_t a = before(items[first], items[first + 1]) ? first + 1 : first;
        const size_t b = before(items[first + 2], items[first + 3]) ? first + 3 : first + 2;
        child = before(items[a], items[b]) ? b : a;
      } else {
        if (first >= n) break;
        child = first;
        for (size_t c = first + 1; c < n; ++c)
          if (before(items[child], items[c])) child = c;
      }
      if (!before(it, items[child])) break;
      place(i, items[child]);
      i = child;
    }
    place(i, it);
  }

  std::vector<Item> items_;
  std::vector<int32_t> pos_;  // per vertex: index in items_, -1 when not queued
};

// One net of a vertex whose moves are being evaluated under the hierarchical cost: what every
// candidate target shares, computed once per evaluation.
struct NetTerm {
  const int32_t* c;    // the net's pin counts per part
  double w;            // the net's weight
  double wx;           // w x node_factor: its cost per part on another node than the home's
  double leave;        // not home: the objective that leaving saves (w x f(from, h))
  double held;         // the net's held bytes (0 when not tracked)
  int32_t h;           // part of the net's home (-1: outside the level); unused when home
  int32_t hn;          // node of h (-1 when h is -1)
  int32_t begin, end;  // home: the parts touching the net, in Scratch::parts
  bool home;           // the evaluated vertex is the net's home
  bool leaves;         // not home: leaving `from` drops the part from the net
};

// Candidate scratch of best_move under the hierarchical cost (one per thread).
struct Scratch {
  std::vector<int32_t> cand;      // candidate parts (written by index, grown as needed)
  std::vector<uint32_t> touched;  // per part: the stamp of the last evaluation that saw it
  uint32_t stamp = 0;
  std::vector<NetTerm> terms;     // per net of the evaluated vertex (grown as needed)
  std::vector<int32_t> parts;     // ascending per home net: the parts it touches
};

// A pass's set-up evaluates every boundary vertex; above this much work (vertices, each
// weighted kHierarchicalSetupCost under the hierarchical cost, whose best move evaluates
// several candidate devices net by net) it is split over the pool's threads. Below it the
// hand-over costs more than it saves (a flat evaluation takes about 0.1 us).
constexpr int64_t kParallelSetupWork = 4096;
constexpr int64_t kHierarchicalSetupCost = 8;

class Fm {
 public:
  Fm(const SubHypergraph& s, const PartCaps& caps, std::vector<int32_t>& part)
      : s_(s), caps_(caps), k_(caps.k()), part_(part) {
    count_.assign(static_cast<size_t>(s.num_nets()) * k_, 0);
    cached_ = !s.hierarchical();
    load_c_.assign(k_, 0.0);
    load_m_.assign(k_, 0.0);
    for (int32_t v = 0; v < s.num_vertices(); ++v) {
      load_c_[part[v]] += s.compute[v];
      load_m_[part[v]] += s.memory[v];
    }
    scratch_.touched.assign(static_cast<size_t>(k_), 0);
    locked_.assign(static_cast<size_t>(s.num_vertices()), 0);
    renewed_.assign(static_cast<size_t>(s.num_vertices()), 0);
    queued_.assign(static_cast<size_t>(s.num_vertices()), kNone);
    if (cached_) {
      // The gain cache's set-up counts the pins in its walk over the nets.
      load_f_ = load_m_;  // full_loads: owned memory first, then the held copies net by net
      cache_.init(s, k_, part, count_, &objective_, &load_f_);
    } else {
      int32_t num_nodes = 0;
      for (int b = 0; b < k_; ++b) num_nodes = std::max(num_nodes, s.part_node[b] + 1);
      node_parts_begin_.assign(static_cast<size_t>(num_nodes) + 1, 0);
      for (int b = 0; b < k_; ++b) ++node_parts_begin_[static_cast<size_t>(s.part_node[b]) + 1];
      for (int32_t n = 0; n < num_nodes; ++n) node_parts_begin_[n + 1] += node_parts_begin_[n];
      node_parts_.resize(static_cast<size_t>(k_));
      std::vector<int32_t> fill(node_parts_begin_.begin(), node_parts_begin_.end() - 1);
      for (int b = 0; b < k_; ++b) node_parts_[fill[s.part_node[b]]++] = b;
      words_ = (k_ + 63) / 64;
      touch_.assign(static_cast<size_t>(s.num_nets()) * words_, 0);
      for (int32_t e = 0; e < s.num_nets(); ++e)  // pin counts and touched parts in one walk
        for (int64_t i = s.net_begin[e]; i < s.net_begin[e + 1]; ++i) {
          const int32_t p = part[s.pins[i]];
          ++count_[static_cast<size_t>(e) * k_ + p];
          set_touch(e, p);
        }
      load_f_ = touched_full_loads();
      objective_ = sub_objective(s, part, k_);
    }
  }

  // The objective of the partition the refinement started from (sub_objective).
  double objective() const { return objective_; }

  // Restricts the set-up of every pass to the vertices near `around` (each one and the pins of
  // its nets); every pass widens the region by the vertices it moved.
  void restrict_to(const std::vector<int32_t>& around) {
    active_.assign(static_cast<size_t>(s_.num_vertices()), 0);
    for (int32_t v : around) activate_around(v);
  }

  // Vertices in the set-up region (all when unrestricted).
  int32_t region_size() const {
    if (active_.empty()) return s_.num_vertices();
    return static_cast<int32_t>(std::count(active_.begin(), active_.end(), uint8_t{1}));
  }

  // One pass; returns the objective decrease of its best prefix (>= 0), which rollback() keeps.
  double pass(uint64_t seed, int max_idle, TaskPool* pool) {
    const int32_t n = s_.num_vertices();
    std::fill(locked_.begin(), locked_.end(), 0);
    // Every boundary vertex with its best move, heapified at once (linear time).
    heap_.reset(n);
    std::fill(queued_.begin(), queued_.end(), kNone);
    setup(pool);
    for (const auto& [v, g] : start_) {
      heap_.append(v, g, tie(v, seed));
      queued_[v] = g;
    }
    heap_.heapify();
    moves_.clear();  // (vertex, from)
    double cum = 0, best = 0;
    size_t best_len = 0;
    int idle = 0;
    const double tiny = 1e-9;
    while (!heap_.empty() && idle < max_idle) {
      const int32_t v = heap_.top();
      const double key = heap_.top_gain();
      int32_t target;
      const double g = best_move(v, target);
      if (target < 0) {
        heap_.pop();
        queued_[v] = kNone;
        continue;
      }
      if (g < key - tiny) {  // stale: re-queue with the true gain
        heap_.set(v, g, tie(v, seed));
        queued_[v] = g;
        continue;
      }
      heap_.pop();
      const int32_t from = part_[v];
      locked_[v] = 1;
      move(v, from, target, seed);
      moves_.emplace_back(v, from);
      cum += g;
      if (cum > best + tiny) {
        best = cum;
        best_len = moves_.size();
        idle = 0;
      } else {
        ++idle;
      }
    }
    best_len_ = best_len;
    return best;
  }

  // Undoes the moves of the last pass after its best prefix. With `last` (no pass follows) only
  // the partition is restored: the pin counts, loads and gains it leaves behind are never read
  // again, and their updates were a large share of a refinement's final pass, whose moves after
  // its best prefix are most of its moves.
  void rollback(bool last) {
    for (size_t i = moves_.size(); i > best_len_; --i) {
      const auto [v, from] = moves_[i - 1];
      if (last) part_[v] = from;
      else move_counts(v, part_[v], from);
    }
    if (!last && !active_.empty())
      for (const auto& [v, from] : moves_) activate_around(v);
  }

 private:
  // start_ = (vertex, gain of its best move) of every boundary vertex with a move that fits, in
  // vertex order. The state is read-only here, so on a large level the vertex range is cut
  // into chunks evaluated at the same time, and the chunks are joined in order: the same list
  // as one thread makes.
  void setup(TaskPool* pool) {
    const int32_t n = s_.num_vertices();
    start_.clear();
    start_.reserve(static_cast<size_t>(n));  // at most one entry per vertex: no regrowth
    const int64_t work = static_cast<int64_t>(n) * (cached_ ? 1 : kHierarchicalSetupCost);
    const int chunks = pool == nullptr || work < kParallelSetupWork ? 1 : 2 * pool->threads();
    if (chunks == 1) {
      scan(0, n, scratch_, start_);
      return;
    }
    std::vector<std::vector<std::pair<int32_t, double>>> part(static_cast<size_t>(chunks));
    pool->run(chunks, [&](int c) {
      Scratch scratch;
      scratch.touched.assign(static_cast<size_t>(k_), 0);
      const auto lo = static_cast<int32_t>(static_cast<int64_t>(n) * c / chunks);
      const auto hi = static_cast<int32_t>(static_cast<int64_t>(n) * (c + 1) / chunks);
      scan(lo, hi, scratch, part[static_cast<size_t>(c)]);
    });
    for (const auto& p : part) start_.insert(start_.end(), p.begin(), p.end());
  }

  void activate_around(int32_t v) {
    active_[v] = 1;
    for (int64_t i = s_.vertex_begin[v]; i < s_.vertex_begin[v + 1]; ++i) {
      const int32_t e = s_.vertex_nets[i];
      for (int64_t j = s_.net_begin[e]; j < s_.net_begin[e + 1]; ++j) active_[s_.pins[j]] = 1;
    }
  }

  void scan(int32_t lo, int32_t hi, Scratch& scratch, std::vector<std::pair<int32_t, double>>& out) const {
    for (int32_t v = lo; v < hi; ++v) {
      // Under the flat cost best_move itself rules out a vertex with no cut net in O(1).
      if ((!active_.empty() && !active_[v]) || (!cached_ && !on_boundary(v))) continue;
      int32_t target;
      const double g = best_move(v, target, scratch);
      if (target >= 0) out.emplace_back(v, g);
    }
  }

  bool on_boundary(int32_t v) const {
    for (int64_t i = s_.vertex_begin[v]; i < s_.vertex_begin[v + 1]; ++i) {
      const int32_t e = s_.vertex_nets[i];
      if (s_.net_external[e]) return true;
      if (count_[static_cast<size_t>(e) * k_ + part_[v]] !=
          s_.net_begin[e + 1] - s_.net_begin[e])
        return true;
    }
    // Parts over a capacity need their vertices movable too.
    const int32_t p = part_[v];
    return load_c_[p] > caps_.compute[p] || load_m_[p] > caps_.memory[p] || full_over(p);
  }

  bool full_over(int p) const { return caps_.has_full() && load_f_[p] > caps_.full_memory[p]; }

  // `leave` caches v's full-memory change of its own part across the checks of one evaluation
  // (the state does not change in between): kLeaveUnknown until the first check sets it.
  // The compute and memory checks are inline; the full-memory check (a walk over v's nets) is
  // a call of its own.
  bool fits(int32_t v, int b, double& leave) const {
    return fits_owned(v, b) && (!caps_.has_full() || fits_full(v, b, leave));
  }
  [[gnu::noinline]] bool fits_full(int32_t v, int b, double& leave) const {
    const int32_t from = part_[v];
    double d_from, d_to;
    held_delta_to(s_, count_.data(), k_, part_, v, b, leave, d_from, d_to);
    return (d_to <= 0 || load_f_[b] + d_to <= caps_.full_memory[b]) &&
           (d_from <= 0 || load_f_[from] + d_from <= caps_.full_memory[from]);
  }

  // Best target among the parts v's nets touch (exact gain), -1 if none fits. A vertex in a
  // part over a capacity may also go to any part that fits (run repair_balance first: the
  // gains here are bytes only).
  // The result is the fitting candidate of the highest gain, the lowest part id among equals.
  double best_move(int32_t v, int32_t& target) { return best_move(v, target, scratch_); }
  double best_move(int32_t v, int32_t& target, Scratch& scratch) const {
    if (!cached_) return best_move_hierarchical(v, target, scratch);
    const int32_t from = part_[v];
    const double base = cache_.base(v);
    const double* conn = cache_.conn(v);
    // The cache's best target is the first candidate's loop result: the largest gain among the
    // parts v's nets touch (any part when v's part is over a capacity), the lowest id among
    // equals. The capacity check (held_delta walks v's nets) runs on it alone, which usually
    // fits; only when it does not are the others checked in order.
    const int32_t first = cache_.best(v);
    const bool touching = conn[first] > 0;
    double leave = kLeaveUnknown;
    if (touching || over(v, from)) {
      if (fits(v, first, leave)) {
        target = first;
        return base + conn[first];
      }
    } else {
      target = -1;
      return 0;
    }
    const bool any = touching ? over(v, from) : true;  // over (a part over a cap takes any part)
    target = -1;
    double best = 0;
    if (!any && cache_.masked()) {  // the parts v's nets touch, ascending, as the loop below
      for (uint64_t m = cache_.touched(v) & ~(uint64_t{1} << from) & ~(uint64_t{1} << first); m != 0;
           m &= m - 1) {
        const int32_t b = std::countr_zero(m);
        const double g = base + conn[b];
        if ((target >= 0 && !(g > best)) || !fits(v, b, leave)) continue;
        target = b;
        best = g;
      }
      return best;
    }
    for (int b = 0; b < k_; ++b) {
      if (b == from || b == first || !(conn[b] > 0 || any)) continue;
      const double g = base + conn[b];
      if ((target >= 0 && !(g > best)) || !fits(v, b, leave)) continue;
      target = b;
      best = g;
    }
    return best;
  }

  // True when v's part is over a capacity that v adds to: v may then go to any part that fits.
  bool over(int32_t v, int32_t from) const {
    return (s_.compute[v] > 0 && load_c_[from] > caps_.compute[from]) ||
           (s_.memory[v] > 0 && load_m_[from] > caps_.memory[from]) || full_over(from);
  }

  // Under the hierarchical cost (all devices at once) a vertex may go to the devices of its own
  // node or to the home device of one of its nets (where its data lives); a token block also
  // to any device its nets touch. Gains are evaluated for those candidates only.
  // What does not depend on the target is gathered once per net (NetTerm): the saving of
  // leaving `from`, the home part, the parts touching a net whose home v is, and the full-memory
  // change of `from`; each candidate then replays the per-net terms in net order, the same
  // floating-point operations in the same order as move_gain and held_delta (so the same gains
  // and capacity checks), without their per-target recomputation. The result, the best gain
  // among the candidates that fit and the lowest part among equals, does not depend on the order
  // in which the candidates are visited.
  double best_move_hierarchical(int32_t v, int32_t& target, Scratch& scratch) const {
    const int32_t from = part_[v];
    const int64_t nets_begin = s_.vertex_begin[v];
    const auto degree = static_cast<size_t>(s_.vertex_begin[v + 1] - nets_begin);
    if (scratch.terms.size() < degree) scratch.terms.resize(degree);
    // Candidates: the node's other parts, the homes of v's nets, the parts touching nets whose
    // home v is, and every part when v's part is over a capacity; at most deg + 2k entries.
    if (scratch.cand.size() < degree + 2 * static_cast<size_t>(k_))
      scratch.cand.resize(degree + 2 * static_cast<size_t>(k_));
    NetTerm* const terms = scratch.terms.data();
    int32_t* const cand = scratch.cand.data();
    std::vector<int32_t>& parts = scratch.parts;
    parts.clear();
    size_t num_cand = 0;
    const int32_t node = s_.part_node[from];
    for (int32_t i = node_parts_begin_[node]; i < node_parts_begin_[node + 1]; ++i)
      if (node_parts_[i] != from) cand[num_cand++] = node_parts_[i];
    const double x = s_.node_factor;
    const int32_t* part_node = s_.part_node.data();
    const bool held = !s_.net_held.empty();
    bool any_home = false;
    for (size_t i = 0; i < degree; ++i) {
      const int32_t e = s_.vertex_nets[nets_begin + static_cast<int64_t>(i)];
      const int32_t hv = s_.net_home[e];
      const int32_t* c = &count_[static_cast<size_t>(e) * k_];
      NetTerm& t = terms[i];
      t.w = s_.net_weight[e];
      t.wx = t.w * x;
      t.held = held ? s_.net_held[e] : 0.0;
      t.c = c;
      if (hv != v) {
        t.home = false;
        t.h = hv >= 0 ? part_[hv] : -1;
        t.hn = hv >= 0 ? part_node[t.h] : -1;
        if (hv >= 0) cand[num_cand++] = t.h;
        t.leaves = c[from] == 1 && from != t.h;
        // w x f(from, h): w x 1 is w exactly, so the product needs no multiplication.
        if (t.leaves) t.leave = t.hn < 0 || t.hn == node ? t.w : t.wx;
      } else {
        any_home = true;
        t.home = true;
        t.h = -1;
        t.hn = -1;
        t.begin = static_cast<int32_t>(parts.size());
        const uint64_t* bits = &touch_[static_cast<size_t>(e) * words_];
        for (int w = 0; w < words_; ++w)
          for (uint64_t m = bits[w]; m != 0; m &= m - 1)
            parts.push_back(64 * w + std::countr_zero(m));
        t.end = static_cast<int32_t>(parts.size());
      }
    }
    if (any_home) {
      if (scratch.cand.size() < num_cand + parts.size() + static_cast<size_t>(k_)) {
        // Too small for the home nets' parts: grow it and build the terms again.
        scratch.cand.resize(num_cand + parts.size() + static_cast<size_t>(k_));
        return best_move_hierarchical(v, target, scratch);
      }
      for (int32_t b : parts) cand[num_cand++] = b;
    }
    if (over(v, from))
      for (int b = 0; b < k_; ++b) cand[num_cand++] = b;
    // Full memory of `from` after the move (independent of the target), as held_delta.
    double d_from = -s_.memory[v];
    if (held && caps_.has_full())
      for (size_t i = 0; i < degree; ++i) {
        const NetTerm& t = terms[i];
        if (t.home) {
          if (t.c[from] > 1) d_from += t.held;
        } else if (t.c[from] == 1 && from != t.h) {
          d_from -= t.held;
        }
      }
    const bool from_fits = d_from <= 0 || !caps_.has_full() ||
                           load_f_[from] + d_from <= caps_.full_memory[from];
    // The fitting candidate of the highest gain, the lowest part among equals; the capacity
    // check (a walk over v's nets under a full-memory cap) only for a candidate that would win.
    target = -1;
    double best = 0;
    std::vector<uint32_t>& touched = scratch.touched;
    if (++scratch.stamp == 0) {  // wrapped: no part may carry a current stamp
      std::fill(touched.begin(), touched.end(), 0u);
      scratch.stamp = 1;
    }
    const uint32_t stamp = scratch.stamp;
    touched[from] = stamp;
    for (size_t j = 0; j < num_cand; ++j) {
      const int32_t b = cand[j];
      if (touched[b] == stamp) continue;
      touched[b] = stamp;
      if (!fits_owned(v, b)) continue;
      const double g = any_home ? gain_hierarchical<true>(from, b, terms, degree, parts, x)
                                : gain_hierarchical<false>(from, b, terms, degree, parts, x);
      if (target >= 0 && !(g > best || (g == best && b < target))) continue;
      if (!fits_full_hierarchical(v, b, from_fits, terms, degree)) continue;
      target = b;
      best = g;
    }
    return best;
  }

  // The compute and owned-memory part of fits(v, to).
  bool fits_owned(int32_t v, int32_t to) const {
    return (s_.compute[v] <= 0 || load_c_[to] + s_.compute[v] <= caps_.compute[to]) &&
           (s_.memory[v] <= 0 || load_m_[to] + s_.memory[v] <= caps_.memory[to]);
  }

  // The full-memory part of fits(v, to), with the target-independent part (`from_fits`) given.
  bool fits_full_hierarchical(int32_t v, int32_t to, bool from_fits, const NetTerm* terms,
                              size_t degree) const {
    if (!caps_.has_full()) return true;
    double d_to = s_.memory[v];
    if (!s_.net_held.empty())
      for (size_t i = 0; i < degree; ++i) {
        const NetTerm& t = terms[i];
        if (t.home) {
          if (t.c[to] > 0) d_to -= t.held;
        } else if (t.c[to] == 0 && to != t.h) {
          d_to += t.held;
        }
      }
    return (d_to <= 0 || load_f_[to] + d_to <= caps_.full_memory[to]) && from_fits;
  }

  // move_gain(v, from -> to) under the hierarchical cost from the per-net terms (kHome: some
  // net's home is v). w x f(p, h) is w (f = 1, exact) or the term's w x node_factor.
  template <bool kHome>
  double gain_hierarchical(int32_t from, int32_t to, const NetTerm* terms, size_t degree,
                           const std::vector<int32_t>& parts, double x) const {
    double g = 0;
    const int32_t* part_node = s_.part_node.data();
    const int32_t node_to = part_node[to];
    for (size_t i = 0; i < degree; ++i) {
      const NetTerm& t = terms[i];
      const int32_t* c = t.c;
      if (!kHome || !t.home) {
        if (t.leaves) g += t.leave;
        if (c[to] == 0 && to != t.h) g -= t.hn < 0 || t.hn == node_to ? t.w : t.wx;
        continue;
      }
      // Every part touching the net, ascending; a part touching it neither before nor after
      // the move adds no term.
      const double w = t.w;
      const int32_t node_from = part_node[from];
      for (int32_t j = t.begin; j < t.end; ++j) {
        const int32_t p = parts[j];
        const int32_t after = c[p] - (p == from ? 1 : 0) + (p == to ? 1 : 0);
        if (p != from) g += w * (part_node[p] == node_from ? 1.0 : x);
        if (after > 0 && p != to) g -= w * (part_node[p] == node_to ? 1.0 : x);
      }
    }
    return g;
  }

  // Renews v's entry with its current best move (none when no move fits).
  void push(int32_t v, uint64_t seed) {
    int32_t target;
    const double g = best_move(v, target);
    queued_[v] = target < 0 ? kNone : g;
    if (target < 0) heap_.erase(v);
    else heap_.set(v, g, tie(v, seed));
  }

  // The seeded tie-break of v's entries in a pass (equal gains: a random but fixed order).
  static uint64_t tie(int32_t v, uint64_t seed) {
    uint64_t st = seed ^ (static_cast<uint64_t>(v) * 0x9e3779b97f4a7c15ULL);
    return splitmix64(st);
  }

  void move_counts(int32_t v, int32_t from, int32_t to) {
    if (s_.net_held.empty()) {
      load_f_[from] -= s_.memory[v];
      load_f_[to] += s_.memory[v];
      if (touch_.empty()) update_counts<false, false>(v, from, to);
      else update_counts<false, true>(v, from, to);
    } else if (touch_.empty()) {
      update_counts<true, false>(v, from, to);
    } else {
      update_counts<true, true>(v, from, to);
    }
    load_c_[from] -= s_.compute[v];
    load_m_[from] -= s_.memory[v];
    load_c_[to] += s_.compute[v];
    load_m_[to] += s_.memory[v];
    part_[v] = to;
    if (cached_) cache_.update(s_, part_, count_, v, from, to);
  }

  // The pin counts of v's nets after v moves, in one walk over them; kHeld: with the full-memory
  // change of `from` and `to` (held_delta's terms from each net's counts before its update, in
  // the same order); kTouch: with the touched-parts bitsets.
  template <bool kHeld, bool kTouch>
  void update_counts(int32_t v, int32_t from, int32_t to) {
    double d_from = -s_.memory[v], d_to = s_.memory[v];
    for (int64_t i = s_.vertex_begin[v]; i < s_.vertex_begin[v + 1]; ++i) {
      const int32_t e = s_.vertex_nets[i];
      int32_t* c = &count_[static_cast<size_t>(e) * k_];
      if constexpr (kHeld) {
        const double held = s_.net_held[e];
        const int32_t home = s_.net_home[e];
        if (home == v) {
          if (c[to] > 0) d_to -= held;
          if (c[from] > 1) d_from += held;
        } else {
          const int32_t hp = home >= 0 ? part_[home] : -1;
          if (c[from] == 1 && from != hp) d_from -= held;
          if (c[to] == 0 && to != hp) d_to += held;
        }
      }
      if (--c[from] == 0 && kTouch) clear_touch(e, from);
      if (++c[to] == 1 && kTouch) set_touch(e, to);
    }
    if constexpr (kHeld) {
      load_f_[from] += d_from;
      load_f_[to] += d_to;
    }
  }

  // full_loads from the parts each net touches (the same sums in the same order: per part, the
  // nets in ascending order), without a scan of every (net, part) pair.
  std::vector<double> touched_full_loads() const {
    std::vector<double> f(static_cast<size_t>(k_), 0.0);
    for (int32_t v = 0; v < s_.num_vertices(); ++v) f[part_[v]] += s_.memory[v];
    if (s_.net_held.empty()) return f;
    for (int32_t e = 0; e < s_.num_nets(); ++e) {
      const int32_t hp = s_.net_home[e] >= 0 ? part_[s_.net_home[e]] : -1;
      const uint64_t* bits = &touch_[static_cast<size_t>(e) * words_];
      for (int w = 0; w < words_; ++w)
        for (uint64_t m = bits[w]; m != 0; m &= m - 1) {
          const int p = 64 * w + std::countr_zero(m);
          if (p != hp) f[p] += s_.net_held[e];
        }
    }
    return f;
  }

  void set_touch(int32_t e, int b) {
    touch_[static_cast<size_t>(e) * words_ + b / 64] |= uint64_t{1} << (b % 64);
  }
  void clear_touch(int32_t e, int b) {
    touch_[static_cast<size_t>(e) * words_ + b / 64] &= ~(uint64_t{1} << (b % 64));
  }

  void move(int32_t v, int32_t from, int32_t to, uint64_t seed) {
    move_counts(v, from, to);
    // A pin of several of v's nets is renewed once: nothing a renewal reads changes between
    // them, so a second one would set the same entry again.
    if (++renewal_ == 0) {  // wrapped: no vertex may carry a current stamp
      std::fill(renewed_.begin(), renewed_.end(), 0u);
      renewal_ = 1;
    }
    // Under a full-memory cap a move also changes which moves of the pins of v's nets fit (the
    // copies a part holds), which no gain change shows: their entries are all renewed then.
    // Lazy there, 1M-token batches were left with a violated bound (bench_placement --only
    // large: 3 against 2).
    if (cached_ && !caps_.has_full()) {
      move_cached(v, from, to, seed);
      return;
    }
    for (int64_t i = s_.vertex_begin[v]; i < s_.vertex_begin[v + 1]; ++i) {
      const int32_t e = s_.vertex_nets[i];
      const int32_t cf = count_[static_cast<size_t>(e) * k_ + from];
      const int32_t ct = count_[static_cast<size_t>(e) * k_ + to];
      // Whose gain changed: `from` emptied or `to` newly touched changes every pin's gain
      // towards that part; one pin left in `from` (or a second one in `to`) changes only the
      // leave bonus of the pins in that part.
      // Under the hierarchical cost a moved home changes every pin's gain.
      const bool all = cf == 0 || ct == 1 || (s_.hierarchical() && s_.net_home[e] == v);
      const bool in_from = cf == 1, in_to = ct == 2;
      if (!all && !in_from && !in_to) continue;
      for (int64_t j = s_.net_begin[e]; j < s_.net_begin[e + 1]; ++j) {
        const int32_t u = s_.pins[j];
        if (locked_[u] || u == v || renewed_[u] == renewal_) continue;
        if (!all && !((in_from && part_[u] == from) || (in_to && part_[u] == to))) continue;
        renewed_[u] = renewal_;
        push(u, seed);
      }
    }
  }

  // Flat cost: the heap is lazy for decreases (a popped entry is checked against the vertex's
  // true best gain and re-queued when it was too high), so a move only has to queue the pins
  // whose gain rose. Per net of v, after the move (counts cf in `from`, ct in `to`):
  //   ct == 1: every pin gains conn(u, to) += w: queued when its gain towards `to` now beats
  //            the gain of its queued entry (an O(1) check from the cache; most do not);
  //   cf == 1: the last pin in `from` may now leave it for free: all its gains rise by w;
  //   cf == 0 and ct == 2 only lower gains (leaving `from` no longer joins a part for free; the
  //            pin in `to` is no longer alone), which the lazy check catches on popping.
  void move_cached(int32_t v, int32_t from, int32_t to, uint64_t seed) {
    const double tiny = 1e-9;
    for (int64_t i = s_.vertex_begin[v]; i < s_.vertex_begin[v + 1]; ++i) {
      const int32_t e = s_.vertex_nets[i];
      const int32_t cf = count_[static_cast<size_t>(e) * k_ + from];
      const int32_t ct = count_[static_cast<size_t>(e) * k_ + to];
      if (ct != 1 && cf != 1) continue;
      for (int64_t j = s_.net_begin[e]; j < s_.net_begin[e + 1]; ++j) {
        const int32_t u = s_.pins[j];
        if (locked_[u] || u == v || renewed_[u] == renewal_) continue;
        const bool rose = (cf == 1 && part_[u] == from) ||
                          (ct == 1 && cache_.gain(u, to) > queued_[u] + tiny);
        if (rose) {
          renewed_[u] = renewal_;
          push(u, seed);
        }
      }
    }
  }

  const SubHypergraph& s_;
  const PartCaps& caps_;
  int k_;
  std::vector<int32_t>& part_;
  std::vector<int32_t> count_;
  std::vector<double> load_c_, load_m_, load_f_;
  Scratch scratch_;  // best_move's on the calling thread
  std::vector<std::pair<int32_t, double>> start_;
  // Parts of each node (hierarchical cost), ascending: node_parts_[node_parts_begin_[n] ...].
  std::vector<int32_t> node_parts_, node_parts_begin_;
  // Hierarchical cost: the parts each net touches (count > 0), a bitset of words_ words per net
  // kept with the pin counts, so that a home's move enumerates the parts its nets touch in
  // ascending order without a scan of all k (k is every device there: up to hundreds).
  int words_ = 0;
  std::vector<uint64_t> touch_;
  bool cached_ = false;
  double objective_ = 0;
  GainCache cache_;
  GainHeap heap_;
  std::vector<std::pair<int32_t, int32_t>> moves_;  // of the current pass: (vertex, from)
  size_t best_len_ = 0;                              // its best prefix
  // Gain of each vertex's live heap entry (kNone: none); flat cost only.
  static constexpr double kNone = -1e300;
  std::vector<double> queued_;
  std::vector<uint8_t> locked_;
  std::vector<uint32_t> renewed_;  // per vertex: the move (renewal_) that last renewed its entry
  uint32_t renewal_ = 0;
  std::vector<uint8_t> active_;  // per vertex: in the set-up of a pass (empty: every vertex)
};

void refine(const SubHypergraph& s, const PartCaps& caps, const RefineOptions& opts, uint64_t seed,
            std::vector<int32_t>& part, TaskPool* pool, const std::vector<int32_t>* around) {
  if (caps.k() <= 1 || s.num_vertices() == 0) return;
  Fm fm(s, caps, part);
  if (around != nullptr) fm.restrict_to(*around);
  // Around a vertex set, the idle limit scales with the region first set up, not with the whole
  // level: measured after the cross-node repair (as full_memory.cpp), 4.5 % fewer instructions
  // per placement for the same objective on average (+0.1 %), the same instance-runs above 1.3.
  const int32_t region = around != nullptr ? fm.region_size() : s.num_vertices();
  // FM over all devices (the hierarchical cost) has its own idle limit and threshold
  // (RefineOptions).
  const bool all = s.hierarchical();
  const int idle_min = all ? opts.idle_moves_min_all_devices : opts.idle_moves_min;
  const int max_idle = std::clamp(
      static_cast<int>((all ? opts.idle_moves_share_all_devices : opts.idle_moves_share) * region),
      idle_min, opts.idle_moves_max);
  const double min_gain = all ? opts.min_pass_gain_all_devices : opts.min_pass_gain;
  double objective = fm.objective();
  for (int p = 0; p < opts.passes; ++p) {
    uint64_t st = seed + static_cast<uint64_t>(p);
    const double gain = fm.pass(splitmix64(st), max_idle, pool);
    const bool last = gain <= 0 || gain < min_gain * objective || p + 1 == opts.passes;
    fm.rollback(last);
    if (last) break;
    objective -= gain;
  }
}

}  // namespace

void refine_fm(const SubHypergraph& s, const PartCaps& caps, const RefineOptions& opts, uint64_t seed,
               std::vector<int32_t>& part, TaskPool* pool) {
  refine(s, caps, opts, seed, part, pool, nullptr);
}

void refine_fm_around(const SubHypergraph& s, const PartCaps& caps, const RefineOptions& opts,
                      uint64_t seed, std::vector<int32_t>& part, const std::vector<int32_t>& around,
                      TaskPool* pool) {
  refine(s, caps, opts, seed, part, pool, &around);
}

}  // namespace dcp::placement
