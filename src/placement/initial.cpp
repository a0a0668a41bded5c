// Structured initial placement of one level: pack whole sequences, split only those that fit
// nowhere, and split them the cheapest of a few geometric ways (measured exactly).
//
// Why these cuts: a tile reads one Q-side and one KV-side data group, and the Q side carries
// about three times the bytes of the KV side (Q, O, dO, dQ, LSE, Delta against KV, dKV). So a
// split along query rows (tiles stay with their queries' home; only KV travels) is the cheap
// cut across nodes, and a causal band [a, b) pays for the a key blocks above it: the top band
// (light rows) goes to the part with the least room, which keeps every band start low. Inside
// a node, a piece that reads data homed on another node should not be cut into row bands (each
// device would fetch the same remote KV again); cutting it by head group instead costs only
// intra-node Q traffic, since head groups share no KV set. The candidates are costed on the
// sequence's own nets (nets never cross sequences), so trying several is cheap and exact.
#include <algorithm>
#include <limits>
#include <numeric>

#include "placement/kway.h"

namespace dcp::placement {

namespace {

struct Loads {
  std::vector<double> c, m;
};

bool fits(const SubHypergraph& s, int32_t v, int p, const Loads& l, const PartCaps& caps) {
  return (s.compute[v] <= 0 || l.c[p] + s.compute[v] <= caps.compute[p]) &&
         (s.memory[v] <= 0 || l.m[p] + s.memory[v] <= caps.memory[p]);
}

void put(const SubHypergraph& s, int32_t v, int p, Loads& l, std::vector<int32_t>& part) {
  l.c[p] += s.compute[v];
  l.m[p] += s.memory[v];
  part[v] = p;
}

// Room of part p as the fraction of (c, m) it can still take; resources the item does not use
// do not limit it.
double room_fraction(int p, double c, double m, const Loads& l, const PartCaps& caps) {
  double f = 1e300;
  if (c > 0) f = std::min(f, std::max(0.0, caps.compute[p] - l.c[p]) / c);
  if (m > 0) f = std::min(f, std::max(0.0, caps.memory[p] - l.m[p]) / m);
  return f;
}

// Share of the items still to come (totals c_r, m_r) that part p could still take if they were
// fluid: the capacity the rest of the batch needs, which a placement should spend last.
double rest_capacity(double room_c, double room_m, double c_r, double m_r) {
  double y = 1e300;
  if (c_r > 0) y = std::min(y, std::max(0.0, room_c) / c_r);
  if (m_r > 0) y = std::min(y, std::max(0.0, room_m) / m_r);
  return y;
}

struct Scratch {
  std::vector<int32_t> net_stamp;   // per net: last sequence that listed it
  std::vector<int32_t> part_stamp;  // per part: last net counted
  int32_t net_counter = 0;
};

// Objective of `nets` under `part` (nets never span sequences, so this is the sequence's
// whole contribution).
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

// Fills `parts` in order with `verts` in order: a vertex goes to the current part while it
// fits, else the cut moves on to the next part; the last part takes what remains.
void fill(const SubHypergraph& s, const std::vector<int32_t>& verts, const std::vector<int>& parts,
          const PartCaps& caps, Loads& l, std::vector<int32_t>& part) {
  size_t j = 0;
  for (int32_t v : verts) {
    while (j + 1 < parts.size() && !fits(s, v, parts[j], l, caps)) ++j;
    put(s, v, parts[j], l, part);
  }
}

// Band ends (one past each part's last row) of the cheapest row bands: the cut points, one band
// per part in order (a band may be empty), that fit every part's room and minimise the summed
// cut cost, by dynamic programming over (part, end row). The summed cut cost is the exact cost of
// the bands when every net's readers form a run of rows (causal, answer and question KV), so
// this sees what the greedy cut cannot: on a shared-question sequence an early cheap cut in one
// answer pushes the next bands off the answer boundaries, and the answers then span three parts
// each instead of two (dryrun scale 4: 13 answer key blocks crossing per answer instead of 7).
// Returns false when no cut points fit.
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

// Row bands with chosen cut points: part j (in order) ends its band at the row, among those it
// can hold and that leave the later parts room for the rest, where the fewest net bytes cross
// the cut (key blocks above it still read below it); ties go to the later row. On a
// shared-question sequence those cuts are the answer boundaries, where only the question's KV
// crosses; on a causal one the choice leans to earlier cuts. With `cheapest`, the cut points
// are chosen together instead (cheapest_band_ends) where they fit. Rows are the runs of `verts`
// given by `row_starts`; cut_cost[r] is the cost of cutting after row r.
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

// Bands shared by several parts ("split the bottom bands by key block"): tiles in row-major order
// are cut top to bottom into runs, run u filling the compute room of sizes[u] consecutive parts
// of `parts`; a run of several parts is ordered by key block and cut among them, so they share
// its query rows (each extra part pays the Q side of a row once) but read each key block once.
// Why: a compute-balanced row band near the bottom of a causal triangle has few rows and reads
// almost every key block; two such bands merged and cut by column read about half as many
// remote key blocks for a few extra rows' Q side (bench/results/placement.md, round 5: about
// 14 % fewer bytes for one causal sequence over 8 nodes). Homes are placed afterwards.
void fill_shared_bands(const SubHypergraph& s, const std::vector<int32_t>& tiles,
                       const std::vector<int>& sizes, const std::vector<int>& parts,
                       const PartCaps& caps, Loads& l, std::vector<int32_t>& part,
                       std::vector<int32_t>& run) {
  size_t i = 0, first = 0;
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
    if (unit.size() > 1)
      std::stable_sort(run.begin(), run.end(), [&](int32_t a, int32_t b) {
        if (s.col[a] != s.col[b]) return s.col[a] < s.col[b];
        return s.row[a] < s.row[b];
      });
    fill(s, run, unit, caps, l, part);
  }
  // Whatever no part could hold goes to the last part (callers repair).
  for (; i < tiles.size(); ++i) put(s, tiles[i], parts.back(), l, part);
}

// Shared prefix spread ("question rows fill the gaps"): the rows after the prefix are cut into
// row bands that take a compute share of each part (answer bands), then every prefix row (home
// and tiles together) goes to the part with the most room left, heaviest row first. Why: on a
// shared-question sequence every part computing answer rows reads the whole question's KV
// anyway, so a question row costs nothing extra wherever it lands, while question rows are light
// in compute and full in memory: plain row bands put them all on the first parts, whose memory
// then fills long before their compute (dryrun: 8 blocks per node), and the answer rows pushed
// on pay their Q side remote. Spreading the prefix gives every part the mix of light and heavy
// rows that meets both caps with homes next to their tiles. With `cheapest` the answer bands are
// cut together against the full caps (cheapest_band_ends): the compute share leaves too little
// slack for rows of 1-2 % of the batch each to be cut at all, and what the bands leave is room
// the light prefix rows fill well.
void fill_prefix_spread(const SubHypergraph& s, const std::vector<int32_t>& verts,
                        const std::vector<size_t>& row_starts, const std::vector<double>& cut_cost,
                        size_t prefix_rows, const std::vector<int>& parts, const PartCaps& caps,
                        bool cheapest, Loads& l, std::vector<int32_t>& part, std::vector<int32_t>& rest,
                        std::vector<size_t>& rest_starts, std::vector<double>& rest_cut) {
  const size_t num_rows = row_starts.size() - 1;
  const size_t split = row_starts[prefix_rows];
  double pre_c = 0, rest_c = 0, room = 0;
  for (size_t i = 0; i < verts.size(); ++i) (i < split ? pre_c : rest_c) += s.compute[verts[i]];
  for (int p : parts) room += std::max(0.0, caps.compute[p] - l.c[p]);
  // The bands get their compute share plus half the slack; the prefix fills the rest.
  const double share =
      room > 0 ? std::min(1.0, (rest_c + 0.5 * std::max(0.0, room - rest_c - pre_c)) / room) : 1.0;
  PartCaps band = caps;
  for (int p : parts) band.compute[p] = l.c[p] + std::max(0.0, caps.compute[p] - l.c[p]) * share;
  rest.assign(verts.begin() + static_cast<std::ptrdiff_t>(split), verts.end());
  rest_starts.clear();
  rest_cut.clear();
  for (size_t r = prefix_rows; r <= num_rows; ++r) rest_starts.push_back(row_starts[r] - split);
  for (size_t r = prefix_rows; r < num_rows; ++r) rest_cut.push_back(cut_cost[r]);
  fill_bands(s, rest, rest_starts, rest_cut, parts, cheapest ? caps : band, cheapest, l, part);
  for (size_t r = prefix_rows; r-- > 0;) {
    double c = 0, m = 0;
    for (size_t i = row_starts[r]; i < row_starts[r + 1]; ++i) {
      c += s.compute[verts[i]];
      m += s.memory[verts[i]];
    }
    int best = -1;
    bool best_fits = false;
    double best_room = 0;
    for (int p : parts) {
      const bool ok = (c <= 0 || l.c[p] + c <= caps.compute[p]) && (m <= 0 || l.m[p] + m <= caps.memory[p]);
      const double f = room_fraction(p, c, m, l, caps);
      if (best < 0 || (ok && !best_fits) || (ok == best_fits && f > best_room)) {
        best = p;
        best_fits = ok;
        best_room = f;
      }
    }
    for (size_t i = row_starts[r]; i < row_starts[r + 1]; ++i) put(s, verts[i], best, l, part);
  }
}

// Corner split ("the top rows' nodes take the bottom-left corner"). Parts `bottom`, in order,
// take the last rows, bottom up, as many as their memory holds (homes inline), and of those rows
// the tiles right of the key block where their compute room ends (the same key block for all
// rows of a part); the tiles left of it form the corner. Parts `top` take the remaining top
// rows whole in zigzag order (a light and a heavy row each, homes inline) as far as memory
// allows, then the corner's tiles row by row while their compute allows; the last top part
// takes what is left (callers repair). Why: when a causal sequence spans many nodes, memory
// fixes each node's home share (dryrun, one sequence of 64 blocks: exactly 8 per node), so row
// bands must home the heavy bottom rows away from the big top band, and the node-level zigzag
// (a2a_p2p's layout) has every node read nearly all key blocks up to its last row. Here the
// bottom bands do not read the first key blocks, and the top nodes read mostly key blocks their
// own rows need anyway, for one Q side per corner row they take. Round 11 (bench/causal_layouts,
// one causal sequence of 32 or 64 blocks over 8 nodes x 2): place_dcp with this start pays 0.89
// of a2a_p2p's inter-node bytes (1.00 before), the best row bands 0.99-1.08; annealing finds
// layouts of this shape at 0.81.
void fill_corner(const SubHypergraph& s, const std::vector<int32_t>& verts,
                 const std::vector<size_t>& row_starts, const std::vector<int32_t>& row_of,
                 const std::vector<int>& top, const std::vector<int>& bottom, bool zigzag_head,
                 const PartCaps& caps, Loads& l, std::vector<int32_t>& part, std::vector<int32_t>& head,
                 std::vector<int32_t>& corner, std::vector<double>& col_c) {
  const size_t num_rows = row_starts.size() - 1;
  head.clear(), corner.clear();
  size_t end = num_rows;  // rows [end, num_rows) are placed
  for (size_t j = 0; j < bottom.size() && end > 0; ++j) {
    const int p = bottom[j];
    const size_t stop = end;
    // Homes first, bottom up (a row's run starts with its token block).
    while (end > 0 && fits(s, verts[row_starts[end - 1]], p, l, caps)) put(s, verts[row_starts[--end]], p, l, part);
    // The key block where the part's compute room ends: the rows' tiles right of it fit.
    col_c.assign(num_rows, 0.0);
    for (size_t i = row_starts[end]; i < row_starts[stop]; ++i)
      if (s.group[verts[i]] >= 0) col_c[static_cast<size_t>(row_of[static_cast<size_t>(s.col[verts[i]])])] += s.compute[verts[i]];
    double room = std::max(0.0, caps.compute[p] - l.c[p]);
    size_t cut = num_rows;
    while (cut > 0 && col_c[cut - 1] <= room) room -= col_c[--cut];
    for (size_t r = end; r < stop; ++r)
      for (size_t i = row_starts[r]; i < row_starts[r + 1]; ++i) {
        const int32_t v = verts[i];
        if (s.group[v] < 0) continue;
        if (static_cast<size_t>(row_of[static_cast<size_t>(s.col[v])]) >= cut) put(s, v, p, l, part);
        else corner.push_back(v);
      }
  }
  for (size_t a = 0, b = end; a < b;) {
    head.insert(head.end(), verts.begin() + static_cast<std::ptrdiff_t>(row_starts[a]),
                verts.begin() + static_cast<std::ptrdiff_t>(row_starts[a + 1]));
    if (++a < b && zigzag_head) {
      --b;
      head.insert(head.end(), verts.begin() + static_cast<std::ptrdiff_t>(row_starts[b]),
                  verts.begin() + static_cast<std::ptrdiff_t>(row_starts[b + 1]));
    }
  }
  size_t h = 0, c = 0;
  for (size_t j = 0; j < top.size(); ++j) {
    const int p = top[j];
    const bool last = j + 1 == top.size();
    for (; h < head.size() && (last || fits(s, head[h], p, l, caps)); ++h) put(s, head[h], p, l, part);
    for (; c < corner.size() && (last || fits(s, corner[c], p, l, caps)); ++c) put(s, corner[c], p, l, part);
  }
}

// Tiles (not token blocks) among `verts`.
size_t count_tiles(const SubHypergraph& s, const std::vector<int32_t>& verts) {
  return static_cast<size_t>(std::count_if(verts.begin(), verts.end(), [&](int32_t v) { return s.group[v] >= 0; }));
}

// Homes after their tiles: each token block goes where most of its nets' bytes already are,
// among the parts with memory room (the most room on ties), else to the part with most room.
void place_homes(const SubHypergraph& s, const std::vector<int32_t>& homes,
                 const std::vector<int>& parts, const PartCaps& caps, Loads& l,
                 std::vector<int32_t>& part, std::vector<double>& score) {
  for (int32_t h : homes) {
    // Bytes saved by p: the weights of the nets that already touch p.
    for (int p : parts) score[p] = 0;
    for (int64_t i = s.vertex_begin[h]; i < s.vertex_begin[h + 1]; ++i) {
      const int32_t e = s.vertex_nets[i];
      for (int p : parts) {
        for (int64_t k = s.net_begin[e]; k < s.net_begin[e + 1]; ++k) {
          const int32_t u = s.pins[k];
          if (u != h && part[u] == p) {
            score[p] += s.net_weight[e];
            break;
          }
        }
      }
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

}  // namespace

std::vector<int32_t> structured_initial(const SubHypergraph& s, const PartCaps& caps,
                                        InitialStrategy strategy) {
  const int k = caps.k();
  const int32_t n = s.num_vertices();
  std::vector<int32_t> part(static_cast<size_t>(n), -1);
  if (k <= 1) {
    std::fill(part.begin(), part.end(), 0);
    return part;
  }
  if (strategy == InitialStrategy::GroupSplit) {
    // Head group g's tiles on part g * k / G, homes where their nets already are.
    int32_t num_groups = 0;
    for (int32_t v = 0; v < n; ++v) num_groups = std::max(num_groups, s.group[v] + 1);
    Loads l{std::vector<double>(static_cast<size_t>(k), 0.0), std::vector<double>(static_cast<size_t>(k), 0.0)};
    std::vector<int32_t> homes;
    for (int32_t v = 0; v < n; ++v) {
      if (s.group[v] < 0) homes.push_back(v);
      else put(s, v, static_cast<int>(static_cast<int64_t>(s.group[v]) * k / num_groups), l, part);
    }
    // Heaviest first, so the coarse blocks that fill a part's memory are placed while it has room.
    std::stable_sort(homes.begin(), homes.end(),
                     [&](int32_t a, int32_t b) { return s.memory[a] > s.memory[b]; });
    std::vector<int> all(static_cast<size_t>(k));
    std::iota(all.begin(), all.end(), 0);
    std::vector<double> score(static_cast<size_t>(k), 0.0);
    place_homes(s, homes, all, caps, l, part, score);
    return part;
  }
  // Vertices by (sequence, query row, token block before tiles, head group, key block).
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    if (s.seq[a] != s.seq[b]) return s.seq[a] < s.seq[b];
    if (s.row[a] != s.row[b]) return s.row[a] < s.row[b];
    if (s.group[a] != s.group[b]) return s.group[a] < s.group[b];
    if (s.col[a] != s.col[b]) return s.col[a] < s.col[b];
    return a < b;
  });
  struct Seq {
    size_t begin, end;
    double c = 0, m = 0;
  };
  std::vector<Seq> seqs;
  for (size_t i = 0; i < order.size();) {
    Seq q{i, i};
    while (q.end < order.size() && s.seq[order[q.end]] == s.seq[order[i]]) {
      q.c += s.compute[order[q.end]];
      q.m += s.memory[order[q.end]];
      ++q.end;
    }
    seqs.push_back(q);
    i = q.end;
  }
  double total_c = 0, total_m = 0;
  for (const Seq& q : seqs) {
    total_c += q.c;
    total_m += q.m;
  }
  auto size_of = [&](const Seq& q) {
    return std::max(total_c > 0 ? q.c / total_c : 0.0, total_m > 0 ? q.m / total_m : 0.0);
  };
  std::vector<size_t> seq_order(seqs.size());
  std::iota(seq_order.begin(), seq_order.end(), size_t{0});
  std::stable_sort(seq_order.begin(), seq_order.end(),
                   [&](size_t a, size_t b) { return size_of(seqs[a]) > size_of(seqs[b]); });

  Loads l{std::vector<double>(static_cast<size_t>(k), 0.0), std::vector<double>(static_cast<size_t>(k), 0.0)};
  Scratch sc;
  sc.net_stamp.assign(static_cast<size_t>(s.num_nets()), -1);
  sc.part_stamp.assign(static_cast<size_t>(k), 0);
  std::vector<double> score(static_cast<size_t>(k), 0.0);
  std::vector<int32_t> nets, tiles_row, tiles_group, tiles_zigzag, tiles_plain, homes, run_scratch,
      prefix_rest, corner_head, corner_tiles;
  std::vector<int> corner_top, corner_bottom;
  std::vector<double> corner_cols;
  bool corner_zigzag = true;
  std::vector<int> band_sizes;
  std::vector<size_t> row_starts;
  std::vector<double> cut_cost, rest_cut;
  std::vector<size_t> rest_starts;
  size_t prefix_rows = 0;
  // Token block id -> row index inside the sequence being cut (rows are token blocks).
  std::vector<int32_t> row_index(
      static_cast<size_t>(n == 0 ? 0 : *std::max_element(s.row.begin(), s.row.end()) + 1), -1);
  // Totals of the sequences placed after position i of the order.
  std::vector<double> rest_c(seqs.size() + 1, 0.0), rest_m(seqs.size() + 1, 0.0);
  for (size_t i = seqs.size(); i-- > 1;) {
    rest_c[i - 1] = rest_c[i] + seqs[seq_order[i]].c;
    rest_m[i - 1] = rest_m[i] + seqs[seq_order[i]].m;
  }
  for (size_t pos = 0; pos < seq_order.size(); ++pos) {
    const size_t qi = seq_order[pos];
    const Seq& q = seqs[qi];
    const double c_r = rest_c[pos], m_r = rest_m[pos];
    // Whole, where it fits both caps and costs the rest of the batch the least capacity (two
    // resources: a dense sequence belongs where memory, not compute, limits the rest); then the
    // most room left.
    int best = -1;
    double best_loss = 0, best_slack = 0;
    for (int p = 0; p < k; ++p) {
      const double rc = caps.compute[p] - l.c[p], rm = caps.memory[p] - l.m[p];
      if ((q.c > 0 && rc < q.c) || (q.m > 0 && rm < q.m)) continue;
      const double y0 = rest_capacity(rc, rm, c_r, m_r);
      const double loss = y0 >= 1e299 ? 0.0 : y0 - rest_capacity(rc - q.c, rm - q.m, c_r, m_r);
      const double slack = std::min(caps.compute[p] > 0 ? (rc - q.c) / caps.compute[p] : 0.0,
                                    caps.memory[p] > 0 ? (rm - q.m) / caps.memory[p] : 0.0);
      if (best < 0 || loss < best_loss - 1e-12 ||
          (loss <= best_loss + 1e-12 && slack > best_slack)) {
        best = p;
        best_loss = loss;
        best_slack = slack;
      }
    }
    if (best >= 0) {
      for (size_t i = q.begin; i < q.end; ++i) put(s, order[i], best, l, part);
      continue;
    }
    // Split over the fewest parts (most room first) that hold the sequence while keeping room
    // for the rest: the rest goes first to the parts left out, and what they cannot take is
    // reserved on the chosen parts in proportion to their capacity for it.
    std::vector<int> by_room(static_cast<size_t>(k));
    std::iota(by_room.begin(), by_room.end(), 0);
    std::vector<double> frac(static_cast<size_t>(k)), y0(static_cast<size_t>(k));
    for (int p = 0; p < k; ++p) {
      frac[p] = room_fraction(p, q.c, q.m, l, caps);
      y0[p] = rest_capacity(caps.compute[p] - l.c[p], caps.memory[p] - l.m[p], c_r, m_r);
    }
    std::stable_sort(by_room.begin(), by_room.end(), [&](int a, int b) { return frac[a] > frac[b]; });
    const bool has_rest = c_r > 0 || m_r > 0;
    PartCaps lim = caps;
    std::vector<int> chosen;
    for (int j = 1; j <= k; ++j) {
      double outside = 0, inside = 0;
      for (int i = 0; i < k; ++i) (i < j ? inside : outside) += has_rest ? y0[by_room[i]] : 0.0;
      const double rest_share = has_rest ? std::max(0.0, 1.0 - outside) : 0.0;
      double room_c = 0, room_m = 0;
      for (int i = 0; i < j; ++i) {
        const int p = by_room[i];
        const double share = inside > 0 ? rest_share * y0[p] / inside : 0.0;
        lim.compute[p] = std::max(l.c[p], caps.compute[p] - share * c_r);
        lim.memory[p] = std::max(l.m[p], caps.memory[p] - share * m_r);
        room_c += lim.compute[p] - l.c[p];
        room_m += lim.memory[p] - l.m[p];
      }
      if ((room_c >= q.c && room_m >= q.m) || j == k) {
        chosen.assign(by_room.begin(), by_room.begin() + j);
        if (j == k && (room_c < q.c || room_m < q.m)) lim = caps;  // the rest must split too
        break;
      }
      lim = caps;
    }
    // Nets of the sequence, for costing the candidates.
    nets.clear();
    const int32_t stamp = static_cast<int32_t>(qi);
    for (size_t i = q.begin; i < q.end; ++i) {
      const int32_t v = order[i];
      for (int64_t j = s.vertex_begin[v]; j < s.vertex_begin[v + 1]; ++j) {
        const int32_t e = s.vertex_nets[j];
        if (sc.net_stamp[e] != stamp) {
          sc.net_stamp[e] = stamp;
          nets.push_back(e);
        }
      }
    }
    // Candidate orders: row-major with homes inline (bands; memory counted as they fill), and
    // group-major tiles with homes placed afterwards.
    tiles_row.assign(order.begin() + static_cast<std::ptrdiff_t>(q.begin),
                     order.begin() + static_cast<std::ptrdiff_t>(q.end));
    tiles_group.clear();
    homes.clear();
    for (int32_t v : tiles_row) (s.group[v] < 0 ? homes : tiles_group).push_back(v);
    std::stable_sort(tiles_group.begin(), tiles_group.end(),
                     [&](int32_t a, int32_t b) { return s.group[a] < s.group[b]; });
    const bool several_groups =
        !tiles_group.empty() && s.group[tiles_group.front()] != s.group[tiles_group.back()];
    // Zigzag rows (first, last, second, second last, ...): each part gets a light and a heavy
    // run of a causal sequence, so compute and memory stay proportional when memory binds.
    row_starts.clear();
    for (size_t i = 0; i < tiles_row.size(); ++i)
      if (i == 0 || s.row[tiles_row[i]] != s.row[tiles_row[i - 1]]) row_starts.push_back(i);
    row_starts.push_back(tiles_row.size());
    tiles_zigzag.clear();
    const size_t num_rows = row_starts.size() - 1;
    for (size_t a = 0, b = num_rows; a < b;) {
      for (size_t i = row_starts[a]; i < row_starts[a + 1]; ++i) tiles_zigzag.push_back(tiles_row[i]);
      ++a;
      if (a < b) {
        --b;
        for (size_t i = row_starts[b]; i < row_starts[b + 1]; ++i) tiles_zigzag.push_back(tiles_row[i]);
      }
    }

    std::vector<int> ascending = chosen;
    std::reverse(ascending.begin(), ascending.end());
    double best_cost = 0, best_over = 0;
    std::vector<int32_t> best_part;
    Loads best_l;
    auto consider = [&](int variant, const std::vector<int>& parts, bool cheapest = false) {
      Loads trial = l;
      if (variant == 0) {
        fill(s, tiles_row, parts, lim, trial, part);
      } else if (variant == 1) {
        fill(s, tiles_group, parts, lim, trial, part);
        place_homes(s, homes, parts, lim, trial, part, score);
      } else if (variant == 2) {
        fill(s, tiles_zigzag, parts, lim, trial, part);
      } else if (variant == 3) {
        fill_bands(s, tiles_row, row_starts, cut_cost, parts, lim, false, trial, part);
      } else if (variant == 5) {
        fill_prefix_spread(s, tiles_row, row_starts, cut_cost, prefix_rows, parts, lim, cheapest, trial, part,
                           prefix_rest, rest_starts, rest_cut);
      } else if (variant == 6) {
        fill_corner(s, tiles_row, row_starts, row_index, corner_top, corner_bottom, corner_zigzag, lim, trial, part,
                    corner_head, corner_tiles, corner_cols);
      } else {
        fill_shared_bands(s, tiles_plain, band_sizes, parts, lim, trial, part, run_scratch);
        place_homes(s, homes, parts, lim, trial, part, score);
      }
      const double cost = nets_cost(s, nets, part, sc);
      // Overflow beyond the limits must be repaired later at a cost not counted here, so a
      // cut that fits wins over a cheaper one that does not.
      double over = 0;
      for (int p : parts) {
        over += std::max(0.0, trial.c[p] - lim.compute[p]) / std::max(1e-300, caps.compute[p]);
        over += std::max(0.0, trial.m[p] - lim.memory[p]) / std::max(1e-300, caps.memory[p]);
      }
      const bool better = best_part.empty() || over < best_over - 1e-3 ||
                          (over <= best_over + 1e-3 && cost < best_cost);
      if (better) {
        best_cost = cost;
        best_over = over;
        best_part.assign(tiles_row.size(), 0);
        for (size_t i = 0; i < tiles_row.size(); ++i) best_part[i] = part[tiles_row[i]];
        best_l = trial;
      }
      for (int32_t v : tiles_row) part[v] = -1;
    };
    // A strategy other than Best tries only its own cut where it applies (row bands otherwise).
    const bool group_ok = several_groups && (s.sub_parts <= 1 || strategy == InitialStrategy::GroupFirst);
    const bool best_like = strategy == InitialStrategy::Best || strategy == InitialStrategy::SharedBands;
    const bool use_rows = best_like ||
                          (strategy == InitialStrategy::GroupFirst && !group_ok) ||
                          (strategy == InitialStrategy::Zigzag && num_rows <= 2);
    if (use_rows) {
      consider(0, ascending);
      consider(0, chosen);
    }
    if (group_ok && strategy != InitialStrategy::Zigzag) {
      consider(1, ascending);
      consider(1, chosen);
    }
    if (num_rows > 2 && strategy != InitialStrategy::GroupFirst) consider(2, chosen);
    if (num_rows > 2 && chosen.size() > 1 && best_like) {
      // Cost of a cut after each row: nets whose rows span it (a KV block read further down).
      for (size_t r = 0; r < num_rows; ++r)
        row_index[static_cast<size_t>(s.row[tiles_row[row_starts[r]]])] = static_cast<int32_t>(r);
      cut_cost.assign(num_rows, 0.0);
      std::vector<double> diff(num_rows + 1, 0.0);
      for (int32_t e : nets) {
        int32_t lo = -1, hi = -1;
        for (int64_t i = s.net_begin[e]; i < s.net_begin[e + 1]; ++i) {
          const int32_t r = row_index[static_cast<size_t>(s.row[s.pins[i]])];
          lo = lo < 0 ? r : std::min(lo, r);
          hi = std::max(hi, r);
        }
        if (hi > lo) {
          diff[static_cast<size_t>(lo)] += s.net_weight[e];
          diff[static_cast<size_t>(hi)] -= s.net_weight[e];
        }
      }
      double run = 0;
      for (size_t r = 0; r < num_rows; ++r) cut_cost[r] = (run += diff[r]);
      consider(3, ascending);
      consider(3, chosen);
      // Corner splits, at a node level of 2 devices per node (see fill_corner), of a full causal
      // triangle (row r reads key blocks 0..r): parts from the front of `chosen` or of
      // `ascending` take the top rows and the corner, 2 fewer to 2 more than half of them, with
      // the top rows in zigzag or in plain order. On lambda, causal-blockwise and shared-question
      // sequences it was chosen by its initial cost but ended worse after refinement (dryrun ldc
      // sparse 0.314 -> 0.325), so it is not tried there.
      const size_t groups_per_row = row_starts[1] - row_starts[0] - 1;  // row 0: home + (0, 0) per group
      const bool full_causal = count_tiles(s, tiles_row) == groups_per_row * num_rows * (num_rows + 1) / 2;
      if (s.sub_parts == 2 && chosen.size() >= 5 && full_causal) {
        const size_t m = chosen.size();
        for (size_t m1 = std::max<size_t>(1, m / 2 - 2); m1 <= std::min(m - 1, m / 2 + 2); ++m1)
          for (const auto* order_parts : {&chosen, &ascending}) {
            corner_top.assign(order_parts->begin(), order_parts->begin() + static_cast<std::ptrdiff_t>(m1));
            corner_bottom.assign(order_parts->begin() + static_cast<std::ptrdiff_t>(m1), order_parts->end());
            for (const bool zz : {true, false}) {
              corner_zigzag = zz;
              consider(6, chosen);
            }
          }
      }
      // A shared prefix: the key blocks that rows read before a gap in their key blocks (a
      // shared question; a sink block of lambda / causal-blockwise, too short to try).
      int32_t prefix_end = std::numeric_limits<int32_t>::max();
      for (size_t r = 0; r < num_rows; ++r) {
        int32_t g = -1, prev = -1;
        for (size_t i = row_starts[r]; i < row_starts[r + 1]; ++i) {
          const int32_t v = tiles_row[i];
          if (s.group[v] < 0) continue;
          if (g < 0) g = s.group[v];
          if (s.group[v] != g) break;
          if (prev >= 0 && s.col[v] != prev + 1) {
            prefix_end = std::min(prefix_end, prev + 1);
            break;
          }
          prev = s.col[v];
        }
      }
      prefix_rows = 0;
      while (prefix_rows < num_rows && s.row[tiles_row[row_starts[prefix_rows]]] < prefix_end) ++prefix_rows;
      if (prefix_rows >= 2 && prefix_rows < num_rows) {
        consider(5, ascending);
        consider(5, chosen);
        // The answer bands cut together (cheapest_band_ends), where each node's two devices
        // split it by head group (round 10: dryrun ldc shared question 31.0 -> 25.9 GB). With 8
        // devices per node (micro) it changed bytes by under 1 % and left one more batch over
        // the full-memory bound, so it is not tried there.
        if (s.sub_parts == 2) consider(5, ascending, true);
      }
    }
    // Bands shared by 2 or 3 parts at the bottom (light single bands on top), every mix of
    // pairs and triples: they pay off from about 5 parts (fewer: plain row bands win).
    if (num_rows > 2 && chosen.size() >= 5 && strategy == InitialStrategy::SharedBands) {
      tiles_plain.clear();
      for (int32_t v : tiles_row)
        if (s.group[v] >= 0) tiles_plain.push_back(v);
      const int m = static_cast<int>(chosen.size());
      for (int triples = 0; 3 * triples <= m; ++triples)
        for (int pairs = 0; 3 * triples + 2 * pairs <= m; ++pairs) {
          if (triples + pairs == 0) continue;
          band_sizes.assign(static_cast<size_t>(m - 3 * triples - 2 * pairs), 1);
          band_sizes.insert(band_sizes.end(), static_cast<size_t>(pairs), 2);
          band_sizes.insert(band_sizes.end(), static_cast<size_t>(triples), 3);
          consider(4, ascending);
        }
    }
    for (size_t i = 0; i < tiles_row.size(); ++i) part[tiles_row[i]] = best_part[i];
    l = best_l;
  }
  return part;
}

}  // namespace dcp::placement
