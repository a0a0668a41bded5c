// placement/gain_cache.h — move gains of every (vertex, part) kept up to date move by move, for
// the flat connectivity cost (a net costs its weight per part it touches beyond the first, or per
// part touched when its home lies outside the level).
//
// For vertex v in part a and a target part t:
//   gain(v -> t) = benefit(v) - (total(v) - conn(v, t))
//   benefit(v)  = weight of v's nets where v is the only pin in a (leaving a drops that part)
//   conn(v, t)  = weight of v's nets that already touch t (entering t costs nothing for them)
//   total(v)    = weight of all v's nets
// A move changes these only where a net's pin count in the source part falls to 0 or 1, or in
// the target part rises to 1 or 2, so an update visits the pins of those nets only. Net weights
// are byte counts times integral factors, so the sums stay exact integers in a double and the
// cached gains equal recomputed ones exactly (tested).
//
// The cache also keeps every vertex's best target: the part t != part(v) of the largest conn(v, t)
// (the lowest id among equals), which is v's best move before any capacity check. An update
// raises it in O(1) where conn(u, to) grows; only where the best target's conn falls, or v
// itself moves, is v's row rescanned. FM then finds a vertex's best move without scanning its
// row, unless that target does not fit.
//
// With k <= 64 every vertex also has a bitmask of the parts t with conn(v, t) > 0 (kept with
// every change of its row), so a rescan, and FM's search for another target, visit only the
// parts v's nets touch (a few) instead of all k. With more parts the rows are scanned whole.
#pragma once

#include <bit>
#include <cstdint>
#include <vector>

#include "placement/kway.h"

namespace dcp::placement {

class GainCache {
 public:
  // Pre: k >= 2; `count` holds num_nets x k zeros. Post: count[e * k + p] = pins of net e in
  // part p under `part`, counted in the same walk over the nets (one pass over the pins).
  // The walk over the parts each net touches also gives, where asked for, the level's objective
  // (`objective`) and its full memory per part (`full`, holding each part's owned memory on
  // entry), summed in the order of sub_objective and full_loads, so to the same values.
  void init(const SubHypergraph& s, int k, const std::vector<int32_t>& part,
            std::vector<int32_t>& count, double* objective = nullptr,
            std::vector<double>* full = nullptr) {
    if (objective != nullptr) *objective = 0;
    const bool held = full != nullptr && !s.net_held.empty();
    k_ = k;
    const auto n = static_cast<size_t>(s.num_vertices());
    benefit_.assign(n, 0.0);
    total_.assign(n, 0.0);
    conn_.assign(n * static_cast<size_t>(k), 0.0);
    masked_ = k <= kMaskParts;
    if (masked_) mask_.assign(n, 0);
    else mask_.clear();
    std::vector<int32_t> touched_parts(static_cast<size_t>(k));
    int32_t* const touched = touched_parts.data();  // parts of the current net: num_touched
    // Without the mask, per vertex: 1 when one of its nets touches a part other than its own.
    // Every other vertex has conn(v, t) = 0 for all t != part(v), so its best target is the
    // lowest such part without a scan of its row (what rescan returns on a row of zeros; with
    // the mask, rescan sees that at once).
    std::vector<uint8_t> cut(masked_ ? 0 : n, 0);
    for (int32_t e = 0; e < s.num_nets(); ++e) {
      const double w = s.net_weight[e];
      int32_t* const c = &count[static_cast<size_t>(e) * k];
      const int64_t lo = s.net_begin[e], hi = s.net_begin[e + 1];
      for (int64_t i = lo; i < hi; ++i) ++c[part[s.pins[i]]];
      int32_t num_touched = 0;
      if (hi > lo && c[part[s.pins[lo]]] == hi - lo) {  // every pin in the first pin's part (most nets)
        touched[0] = part[s.pins[lo]];
        num_touched = 1;
      } else {
        for (int t = 0; t < k; ++t) {  // without a branch per part
          touched[num_touched] = t;
          num_touched += c[t] > 0 ? 1 : 0;
        }
      }
      const int32_t* const touched_end = touched + num_touched;
      uint64_t bits = 0;  // the parts of `touched` (k <= 64)
      // conn(u, t) sums weights >= 0: it is > 0 exactly when a net of positive weight touches t.
      if (masked_ && w > 0)
        for (const int32_t* t = touched; t != touched_end; ++t) bits |= uint64_t{1} << *t;
      if (objective != nullptr) {
        const int32_t parts = (s.net_external[e] ? 1 : 0) + num_touched;
        if (parts > 1) *objective += s.net_weight[e] * (parts - 1);
      }
      if (held) {
        const int32_t hp = s.net_home[e] >= 0 ? part[s.net_home[e]] : -1;
        for (const int32_t* t = touched; t != touched_end; ++t)
          if (*t != hp) (*full)[static_cast<size_t>(*t)] += s.net_held[e];
      }
      if (num_touched == 1) {  // inside one part: only conn(u, part(u)) grows
        const int32_t t = touched[0];
        for (int64_t i = lo; i < hi; ++i) {
          const int32_t u = s.pins[i];
          total_[u] += w;
          if (c[t] == 1) benefit_[u] += w;
          conn_[static_cast<size_t>(u) * k + t] += w;
          if (masked_) mask_[u] |= bits;
        }
        continue;
      }
      for (int64_t i = lo; i < hi; ++i) {
        const int32_t u = s.pins[i];
        total_[u] += w;
        if (c[part[u]] == 1) benefit_[u] += w;
        double* cu = &conn_[static_cast<size_t>(u) * k];
        for (const int32_t* t = touched; t != touched_end; ++t) cu[*t] += w;
        if (masked_) mask_[u] |= bits;
        else cut[u] = 1;
      }
    }
    best_.resize(n);
    for (size_t v = 0; v < n; ++v) {
      if (masked_ || cut[v]) rescan(static_cast<int32_t>(v), part[v]);
      else best_[v] = part[v] == 0 ? 1 : 0;
    }
  }

  // After v moved from `from` to `to`: `part` and `count` already describe the new state.
  // Per net, the pin loop runs only for the changes the net has, each in a loop of its own
  // (the connectivity changes of one pin stay in their order: `from` lowered, then `to` raised).
  void update(const SubHypergraph& s, const std::vector<int32_t>& part,
              const std::vector<int32_t>& count, int32_t v, int32_t from, int32_t to) {
    for (int64_t i = s.vertex_begin[v]; i < s.vertex_begin[v + 1]; ++i) {
      const int32_t e = s.vertex_nets[i];
      const double w = s.net_weight[e];
      const int32_t cf = count[static_cast<size_t>(e) * k_ + from];
      const int32_t ct = count[static_cast<size_t>(e) * k_ + to];
      const int32_t* pin = s.pins.data();
      const int64_t lo = s.net_begin[e], hi = s.net_begin[e + 1];
      if (cf == 0 && ct == 1) update_conn<true, true>(pin, lo, hi, part, v, from, to, w);
      else if (cf == 0) update_conn<true, false>(pin, lo, hi, part, v, from, to, w);
      else if (ct == 1) update_conn<false, true>(pin, lo, hi, part, v, from, to, w);
      if (cf == 1 || ct == 2) {
        const int32_t mine = cf == 1 ? from : -1;  // now the last pin in `from`: leaving frees it
        const int32_t theirs = ct == 2 ? to : -1;  // no longer alone in `to`
        for (int64_t j = lo; j < hi; ++j) {
          const int32_t u = pin[j];
          if (u == v) continue;
          const int32_t pu = part[u];
          if (pu == mine) benefit_[u] += w;
          else if (pu == theirs) benefit_[u] -= w;
        }
      }
      // v itself: alone in `from` before (cf == 0 now) -> alone in `to` (ct == 1 now); both or
      // neither leave its benefit as it was (a sum that starts at +0 is never -0: adding +0 is a no-op).
      if (ct == 1 && cf != 0) benefit_[v] += w;
      else if (cf == 0 && ct != 1) benefit_[v] -= w;
    }
    rescan(v, to);
  }

  double gain(int32_t v, int32_t t) const {
    return benefit_[v] - total_[v] + conn_[static_cast<size_t>(v) * k_ + t];
  }
  // gain(v, t) = base(v) + conn(v)[t]; conn(v)[t] > 0 exactly when some net of v touches t.
  double base(int32_t v) const { return benefit_[v] - total_[v]; }
  const double* conn(int32_t v) const { return &conn_[static_cast<size_t>(v) * k_]; }
  // True when some net of v touches part t.
  bool touches(int32_t v, int32_t t) const { return conn_[static_cast<size_t>(v) * k_ + t] > 0; }
  // The part t != part(v) of the largest conn(v, t), the lowest id among equals: v's best target
  // before capacities (conn(v, best) = 0 when no net of v leaves its part).
  int32_t best(int32_t v) const { return best_[v]; }
  // With k <= 64 (masked()): bit t of touched(v) is set exactly when conn(v, t) > 0.
  bool masked() const { return masked_; }
  uint64_t touched(int32_t v) const { return mask_[v]; }

 private:
  // A net no longer touching `from` (kLeft) or newly touching `to` (kJoined): every pin's
  // connectivity to that part changes, and with it possibly its best target.
  template <bool kLeft, bool kJoined>
  void update_conn(const int32_t* pin, int64_t lo, int64_t hi, const std::vector<int32_t>& part,
                   int32_t v, int32_t from, int32_t to, double w) {
    for (int64_t j = lo; j < hi; ++j) {
      const int32_t u = pin[j];
      double* cu = &conn_[static_cast<size_t>(u) * k_];
      if constexpr (kLeft) {
        cu[from] -= w;
        if (masked_ && !(cu[from] > 0)) mask_[u] &= ~(uint64_t{1} << from);
        if (best_[u] == from && u != v) rescan(u, part[u]);
      }
      if constexpr (kJoined) {
        cu[to] += w;
        if (masked_ && cu[to] > 0) mask_[u] |= uint64_t{1} << to;
        const int32_t b = best_[u];
        if (to != part[u] && (cu[to] > cu[b] || (cu[to] == cu[b] && to < b))) best_[u] = to;
      }
    }
  }

  // The parts below `own`, then those above it, ascending: the first largest conn wins. With the
  // mask only the parts of conn > 0 are visited: where there are none, every conn is 0 and the
  // lowest part other than `own` wins, as in the full scan.
  void rescan(int32_t v, int32_t own) {
    const double* cv = &conn_[static_cast<size_t>(v) * k_];
    if (masked_) {
      uint64_t m = mask_[v] & ~(uint64_t{1} << own);
      if (m == 0) {
        best_[v] = own == 0 ? 1 : 0;
        return;
      }
      int32_t b = std::countr_zero(m);
      double best = cv[b];
      for (m &= m - 1; m != 0; m &= m - 1) {
        const int32_t t = std::countr_zero(m);
        if (cv[t] > best) b = t, best = cv[t];
      }
      best_[v] = b;
      return;
    }
    int32_t b = own == 0 ? 1 : 0;
    double best = cv[b];
    for (int t = b + 1; t < own; ++t)
      if (cv[t] > best) b = t, best = cv[t];
    for (int t = own == 0 ? 2 : own + 1; t < k_; ++t)
      if (cv[t] > best) b = t, best = cv[t];
    best_[v] = b;
  }

  static constexpr int kMaskParts = 64;
  int k_ = 0;
  bool masked_ = false;
  std::vector<double> benefit_, total_, conn_;
  std::vector<int32_t> best_;   // per vertex: best target (see best())
  std::vector<uint64_t> mask_;  // per vertex when masked_: the parts t of conn(v, t) > 0
};

}  // namespace dcp::placement
