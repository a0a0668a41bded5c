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
#pragma once

#include <cstdint>
#include <vector>

#include "placement/kway.h"

namespace dcp::placement {

class GainCache {
 public:
  // Pre: count[e * k + p] = pins of net e in part p under `part`.
  void init(const SubHypergraph& s, int k, const std::vector<int32_t>& part,
            const std::vector<int32_t>& count) {
    k_ = k;
    const auto n = static_cast<size_t>(s.num_vertices());
    benefit_.assign(n, 0.0);
    total_.assign(n, 0.0);
    conn_.assign(n * static_cast<size_t>(k), 0.0);
    for (int32_t e = 0; e < s.num_nets(); ++e) {
      const double w = s.net_weight[e];
      const int32_t* c = &count[static_cast<size_t>(e) * k];
      for (int64_t i = s.net_begin[e]; i < s.net_begin[e + 1]; ++i) {
        const int32_t u = s.pins[i];
        total_[u] += w;
        if (c[part[u]] == 1) benefit_[u] += w;
        double* cu = &conn_[static_cast<size_t>(u) * k];
        for (int t = 0; t < k; ++t)
          if (c[t] > 0) cu[t] += w;
      }
    }
  }

  // After v moved from `from` to `to`: `part` and `count` already describe the new state.
  void update(const SubHypergraph& s, const std::vector<int32_t>& part,
              const std::vector<int32_t>& count, int32_t v, int32_t from, int32_t to) {
    for (int64_t i = s.vertex_begin[v]; i < s.vertex_begin[v + 1]; ++i) {
      const int32_t e = s.vertex_nets[i];
      const double w = s.net_weight[e];
      const int32_t cf = count[static_cast<size_t>(e) * k_ + from];
      const int32_t ct = count[static_cast<size_t>(e) * k_ + to];
      if (cf == 0 || ct == 1 || cf == 1 || ct == 2) {
        for (int64_t j = s.net_begin[e]; j < s.net_begin[e + 1]; ++j) {
          const int32_t u = s.pins[j];
          double* cu = &conn_[static_cast<size_t>(u) * k_];
          if (cf == 0) cu[from] -= w;
          if (ct == 1) cu[to] += w;
          if (u == v) continue;
          if (cf == 1 && part[u] == from) benefit_[u] += w;  // now the last pin in `from`
          if (ct == 2 && part[u] == to) benefit_[u] -= w;    // no longer alone in `to`
        }
      }
      // v itself: alone in `from` before (cf == 0 now) -> alone in `to` (ct == 1 now).
      benefit_[v] += (ct == 1 ? w : 0.0) - (cf == 0 ? w : 0.0);
    }
  }

  double gain(int32_t v, int32_t t) const {
    return benefit_[v] - total_[v] + conn_[static_cast<size_t>(v) * k_ + t];
  }
  // gain(v, t) = base(v) + conn(v)[t]; conn(v)[t] > 0 exactly when some net of v touches t.
  double base(int32_t v) const { return benefit_[v] - total_[v]; }
  const double* conn(int32_t v) const { return &conn_[static_cast<size_t>(v) * k_]; }
  // True when some net of v touches part t.
  bool touches(int32_t v, int32_t t) const { return conn_[static_cast<size_t>(v) * k_ + t] > 0; }

 private:
  int k_ = 0;
  std::vector<double> benefit_, total_, conn_;
};

}  // namespace dcp::placement
