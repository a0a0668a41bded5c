// Row-band cuts of one sequence: filling parts in order, the cheapest band ends by dynamic
// programming, bands shared by several parts, and the homes placed after their tiles.
#include <algorithm>
#include <limits>

#include "placement/initial_internal.h"

namespace dcp::placement::initial {

double nets_cost(const SubHypergraph& s, const std::vector<int32_t>& nets,
                 const std::vector<int32_t>& part, Scratch& sc) {
  double total = 0;
  for (int32_t e : nets) {
    const int32_t stamp = ++sc.net_counter;
    int32_t parts = s.net_external[e] ? 1 : 0;
    for (int64_t i = s.net_begin[e]; i < s.net_begin[e + 1]; ++i) {
      int32_t& mark = sc.part_stamp[part[s.pins[i]]];
      if (mark != stamp) {
        mark = stamp;
        ++parts;
      }
    }
    if (parts > 1) total += s.net_weight[e] * (parts - 1);
  }
  return total;
}

void fill(const SubHypergraph& s, const std::vector<int32_t>& verts, const std::vector<int>& parts,
          const PartCaps& caps, Loads& l, std::vector<int32_t>& part) {
  size_t j = 0;
  for (int32_t v : verts) {
    while (j + 1 < parts.size() && !fits(s, v, parts[j], l, caps)) ++j;
    put(s, v, parts[j], l, part);
  }
}

bool cheapest_band_ends(const std::vector<double>& rc, const std::vector<double>& rm,
                        const std::vector<double>& cut_cost, const std::vector<int>& parts,
                        const PartCaps& caps, const Loads& l, std::vector<size_t>& ends) {
  const size_t num_rows = rc.size(), k = parts.size();
  constexpr double kNone = std::numeric_limits<double>::infinity();
  // cost[j * (R + 1) + e]: cheapest placement of rows [0, e) in the first j parts; from: where
  // part j's band starts (e itself when it is empty).
  std::vector<double> cost((k + 1) * (num_rows + 1), kNone);
  std::vector<size_t> from((k + 1) * (num_rows + 1), 0);
  cost[0] = 0;
  for (size_t j = 1; j <= k; ++j) {
    const int p = parts[j - 1];
    const double room_c = caps.compute[p] - l.c[p], room_m = caps.memory[p] - l.m[p];
    const double* prev = &cost[(j - 1) * (num_rows + 1)];
    double* cur = &cost[j * (num_rows + 1)];
    size_t* arg = &from[j * (num_rows + 1)];
    for (size_t e = 0; e <= num_rows; ++e) {
      cur[e] = prev[e];
      arg[e] = e;
      double c = 0, m = 0;
      for (size_t b = e; b-- > 0;) {
        c += rc[b];
        m += rm[b];
        if ((rc[b] > 0 && c > room_c) || (rm[b] > 0 && m > room_m)) break;
        const double v = prev[b] + (b > 0 ? cut_cost[b - 1] : 0.0);
        if (v < cur[e] - 1e-9) {
          cur[e] = v;
          arg[e] = b;
        }
      }
    }
  }
  if (cost[k * (num_rows + 1) + num_rows] == kNone) return false;
  ends.assign(k, 0);
  for (size_t j = k, e = num_rows; j > 0; --j) {
    ends[j - 1] = e;
    e = from[j * (num_rows + 1) + e];
  }
  return true;
}

void fill_bands(const SubHypergraph& s, const std::vector<int32_t>& verts,
                const std::vector<size_t>& row_starts, const std::vector<double>& cut_cost,
                const std::vector<int>& parts, const PartCaps& caps, bool cheapest, Loads& l,
                std::vector<int32_t>& part) {
  const size_t num_rows = row_starts.size() - 1;
  std::vector<double> rc(num_rows, 0.0), rm(num_rows, 0.0);
  for (size_t r = 0; r < num_rows; ++r)
    for (size_t i = row_starts[r]; i < row_starts[r + 1]; ++i) {
      rc[r] += s.compute[verts[i]];
      rm[r] += s.memory[verts[i]];
    }
  // Suffix sums: load of rows r.. end.
  std::vector<double> suf_c(num_rows + 1, 0.0), suf_m(num_rows + 1, 0.0);
  for (size_t r = num_rows; r-- > 0;) {
    suf_c[r] = suf_c[r + 1] + rc[r];
    suf_m[r] = suf_m[r + 1] + rm[r];
  }
  size_t start = 0;  // first row not yet placed
  std::vector<size_t> ends;
  if (cheapest && cheapest_band_ends(rc, rm, cut_cost, parts, caps, l, ends)) {
    for (size_t j = 0; j < parts.size(); ++j) {
      for (size_t r = start; r < ends[j]; ++r)
        for (size_t i = row_starts[r]; i < row_starts[r + 1]; ++i) put(s, verts[i], parts[j], l, part);
      start = ends[j];
    }
    return;
  }
  for (size_t j = 0; j < parts.size() && start < num_rows; ++j) {
    const int p = parts[j];
    size_t end = num_rows;  // one past the band's last row
    if (j + 1 < parts.size()) {
      double later_c = 0, later_m = 0;
      for (size_t i = j + 1; i < parts.size(); ++i) {
        later_c += std::max(0.0, caps.compute[parts[i]] - l.c[parts[i]]);
        later_m += std::max(0.0, caps.memory[parts[i]] - l.m[parts[i]]);
      }
      // Largest end that fits p.
      size_t e_max = start;
      double c = l.c[p], m = l.m[p];
      while (e_max < num_rows && c + rc[e_max] <= caps.compute[p] && m + rm[e_max] <= caps.memory[p]) {
        c += rc[e_max];
        m += rm[e_max];
        ++e_max;
      }
      // Smallest end that leaves the rest within the later parts' room.
      size_t e_min = start;
      while (e_min < num_rows && (suf_c[e_min] > later_c || suf_m[e_min] > later_m)) ++e_min;
      end = e_max;
      if (e_min < e_max) {
        double best = 1e300;
        for (size_t e = e_max; e >= e_min && e > start; --e) {
          const double cost = e >= num_rows ? 0.0 : cut_cost[e - 1];
          if (cost < best - 1e-9) {
            best = cost;
            end = e;
          }
          if (e == e_min) break;
        }
      }
    }
    for (size_t r = start; r < end; ++r)
      for (size_t i = row_starts[r]; i < row_starts[r + 1]; ++i) put(s, verts[i], p, l, part);
    start = end;
  }
  // Whatever no part could hold goes to the last part (callers repair).
  for (size_t r = start; r < num_rows; ++r)
    for (size_t i = row_starts[r]; i < row_starts[r + 1]; ++i) put(s, verts[i], parts.back(), l, part);
}

void fill_shared_bands(const SubHypergraph& s, const std::vector<int32_t>& tiles,
                       const std::vector<int>& sizes, const std::vector<int>& parts,
                       const PartCaps& caps, Loads& l, std::vector<int32_t>& part,
                       std::vector<int32_t>& run) {
  size_t i = 0, first = 0;
  std::vector<int32_t> at, by_col;  // the counting sort's bucket starts and output
  for (size_t u = 0; u < sizes.size() && i < tiles.size(); ++u) {
    const std::vector<int> unit(parts.begin() + static_cast<std::ptrdiff_t>(first),
                                parts.begin() + static_cast<std::ptrdiff_t>(first) + sizes[u]);
    first += static_cast<size_t>(sizes[u]);
    double room = 0;
    for (int p : unit) room += std::max(0.0, caps.compute[p] - l.c[p]);
    run.clear();
    const bool last = u + 1 == sizes.size();
    for (double acc = 0; i < tiles.size() && (last || acc + s.compute[tiles[i]] <= room); ++i) {
      acc += s.compute[tiles[i]];
      run.push_back(tiles[i]);
    }
    if (unit.size() > 1 && !run.empty()) {
      // Column-major inside a shared band: by (key block, row), ties in tile order. `tiles` is
      // in (row, head group, key block) order, so a stable counting sort by key block alone
      // gives exactly that order, in linear time (the key blocks are few).
      int32_t lo = s.col[run.front()], hi = lo;
      for (int32_t v : run) {
        lo = std::min(lo, s.col[v]);
        hi = std::max(hi, s.col[v]);
      }
      at.assign(static_cast<size_t>(hi - lo) + 2, 0);
      for (int32_t v : run) ++at[static_cast<size_t>(s.col[v] - lo) + 1];
      for (size_t c = 1; c < at.size(); ++c) at[c] += at[c - 1];
      by_col.resize(run.size());
      for (int32_t v : run) by_col[static_cast<size_t>(at[static_cast<size_t>(s.col[v] - lo)]++)] = v;
      run.swap(by_col);
    }
    fill(s, run, unit, caps, l, part);
  }
  // Whatever no part could hold goes to the last part (callers repair).
  for (; i < tiles.size(); ++i) put(s, tiles[i], parts.back(), l, part);
}

size_t count_tiles(const SubHypergraph& s, const std::vector<int32_t>& verts) {
  return static_cast<size_t>(std::count_if(verts.begin(), verts.end(), [&](int32_t v) { return s.group[v] >= 0; }));
}

void place_homes(const SubHypergraph& s, const std::vector<int32_t>& homes,
                 const std::vector<int>& parts, const PartCaps& caps, Loads& l,
                 std::vector<int32_t>& part, std::vector<double>& score) {
  // Per net of a home: the parts its other pins are in, marked with the net's visit number, in
  // one walk over the pins (not one per part of `parts`).
  std::vector<int64_t> seen(static_cast<size_t>(caps.k()), -1);
  int64_t visit = 0;
  for (int32_t h : homes) {
    // Bytes saved by p: the weights of the nets that already touch p, summed in net order.
    for (int p : parts) score[p] = 0;
    for (int64_t i = s.vertex_begin[h]; i < s.vertex_begin[h + 1]; ++i, ++visit) {
      const int32_t e = s.vertex_nets[i];
      for (int64_t k = s.net_begin[e]; k < s.net_begin[e + 1]; ++k) {
        const int32_t u = s.pins[k];
        if (u != h && part[u] >= 0) seen[static_cast<size_t>(part[u])] = visit;
      }
      for (int p : parts)
        if (seen[static_cast<size_t>(p)] == visit) score[p] += s.net_weight[e];
    }
    int best = -1;
    for (int p : parts) {
      if (!fits(s, h, p, l, caps)) continue;
      if (best < 0 || score[p] > score[best] ||
          (score[p] == score[best] && caps.memory[p] - l.m[p] > caps.memory[best] - l.m[best]))
        best = p;
    }
    if (best < 0) {
      for (int p = 0; p < caps.k(); ++p)
        if (best < 0 || caps.memory[p] - l.m[p] > caps.memory[best] - l.m[best]) best = p;
    }
    put(s, h, best, l, part);
  }
}

}  // namespace dcp::placement::initial
