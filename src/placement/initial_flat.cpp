// Flat starts for the coarsest level of the multilevel cycle.
#include <algorithm>
#include <numeric>
#include <utility>

#include "placement/multilevel.h"

namespace dcp::placement {

std::vector<int32_t> flat_initial(const SubHypergraph& s, const PartCaps& caps, FlatStart kind) {
  const int k = caps.k();
  const int32_t n = s.num_vertices();
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    if (s.seq[a] != s.seq[b]) return s.seq[a] < s.seq[b];
    if (kind == FlatStart::Columns) {
      if (s.col[a] != s.col[b]) return s.col[a] < s.col[b];
      return s.row[a] < s.row[b];
    }
    if (s.row[a] != s.row[b]) return s.row[a] < s.row[b];
    return s.col[a] < s.col[b];
  });
  if (kind == FlatStart::ZigzagRows) {
    // Per sequence: its first row run, its last, its second, its second last, ...
    std::vector<int32_t> out;
    out.reserve(order.size());
    for (size_t i = 0; i < order.size();) {
      size_t j = i;
      while (j < order.size() && s.seq[order[j]] == s.seq[order[i]]) ++j;
      std::vector<std::pair<size_t, size_t>> runs;
      for (size_t a = i; a < j;) {
        size_t b = a;
        while (b < j && s.row[order[b]] == s.row[order[a]]) ++b;
        runs.emplace_back(a, b);
        a = b;
      }
      for (size_t lo = 0, hi = runs.size(); lo < hi;) {
        for (size_t x = runs[lo].first; x < runs[lo].second; ++x) out.push_back(order[x]);
        if (++lo < hi) {
          --hi;
          for (size_t x = runs[hi].first; x < runs[hi].second; ++x) out.push_back(order[x]);
        }
      }
      i = j;
    }
    order = std::move(out);
  }
  const double total = std::accumulate(s.compute.begin(), s.compute.end(), 0.0);
  double cap_total = 0;
  for (int p = 0; p < k; ++p) cap_total += caps.compute[p];
  std::vector<int32_t> part(static_cast<size_t>(n), k - 1);
  double acc = 0, bound = 0;
  int p = 0;
  bound = total * caps.compute[0] / std::max(cap_total, 1e-300);
  for (int32_t v : order) {
    while (p + 1 < k && acc + 0.5 * s.compute[v] > bound) {
      ++p;
      bound += total * caps.compute[p] / std::max(cap_total, 1e-300);
    }
    part[v] = p;
    acc += s.compute[v];
  }
  return part;
}

}  // namespace dcp::placement
