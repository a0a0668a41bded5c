// causal_layouts: how few inter-node bytes one long causal sequence can cost on the dry-run
// cluster (8 nodes x 2 devices) under the placement's balance bounds (issue 3, round 11 study).
//
// Node-level model: each node's 2 devices take one head group each (the device level then cuts
// nothing), so a layout is one head group's causal triangle of n token blocks split over the
// nodes (tile -> node) plus a home node per token block. Per head group, a row costs its Q-side
// net bytes q once per node other than its home computing a tile of it, a column its KV-side
// net bytes kv likewise. Bounds: every node's tiles within (1 + eps) of the mean (diagonal tiles
// count half, as in the block table), and every node homes at most 2 x floor(1.2 x n / 16)
// blocks (eps_memory 0.2 on owned memory with equal blocks: n/8 per node when n/16 < 5). Every
// layout is mapped back to a full placement and costed by compute_metrics, whose inter bytes
// are printed (with its compute and full-memory imbalance: full memory is reported, not bounded).
//
// Layouts: (a) row bands (the tiles in row-major order cut into one chunk per node), by dynamic
// programming over the chunk ends: exact without the memory bound, and with it a lower bound of
// every such layout plus the best one found; (b) the static baselines a2a_p2p and zigzag as the
// bench builds them, and place_dcp on the sequence alone; (c) 2-D layouts: the best of a
// simulated annealing over tile runs, home moves and home swaps under both bounds, started from
// (a), from the node-level zigzag and from the previous size's result scaled up; and the round-4
// relaxation bound (no memory bound, so loose).
//
// Usage: causal_layouts [--blocks N,N,...] [--eps E] [--iters M]   (defaults 32,64; 0.075; 20 M)
// (sizes in doubling order let the scaled-up start apply, e.g. --blocks 16,32,64)
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "dcp/baselines.h"
#include "dcp/blocks.h"
#include "dcp/metrics.h"
#include "dcp/partition.h"
#include "dcp/detail/rng.h"

namespace {

struct Model {
  int n = 0, k = 0, home_cap = 0;
  double q = 0, kv = 0, cap = 0;  // net bytes per block (one head group); compute cap per node
  std::vector<double> w;          // w[i * n + j]: flops of tile (i, j), j <= i, one head group
  std::vector<char> ex;           // ex[i * n + j]: the mask has tile (i, j)
  std::vector<std::pair<int, int>> tiles;  // the tiles, row-major
  bool has(int i, int j) const { return j >= 0 && j <= i && i < n && ex[static_cast<size_t>(i * n + j)] != 0; }
};

// One head group's layout: tile (i, j) -> node and token block -> home node.
struct Layout {
  std::vector<int> tile;  // i * n + j
  std::vector<int> home;
};

// Model cost (one head group) of a layout; the exact figure comes from compute_metrics.
double model_cost(const Model& m, const Layout& l) {
  double c = 0;
  std::vector<char> r(static_cast<size_t>(m.k)), col(static_cast<size_t>(m.k));
  for (int b = 0; b < m.n; ++b) {
    std::fill(r.begin(), r.end(), 0), std::fill(col.begin(), col.end(), 0);
    for (int j = 0; j <= b; ++j)
      if (m.has(b, j)) r[static_cast<size_t>(l.tile[static_cast<size_t>(b * m.n + j)])] = 1;
    for (int i = b; i < m.n; ++i)
      if (m.has(i, b)) col[static_cast<size_t>(l.tile[static_cast<size_t>(i * m.n + b)])] = 1;
    for (int p = 0; p < m.k; ++p)
      if (p != l.home[static_cast<size_t>(b)]) c += m.q * r[static_cast<size_t>(p)] + m.kv * col[static_cast<size_t>(p)];
  }
  return c;
}

struct Measured {
  double inter_gb = 0, compute_imb = 0, full_mem_imb = 0;
};

// The layout for every head group (group g on device 2 node + g), homes spread over the node's
// devices in turn, costed by compute_metrics.
Measured measure(const dcp::BlockTable& t, const dcp::Cluster& c, const Model& m, const Layout& l) {
  dcp::Placement p;
  p.method = "layout";
  p.num_devices = c.num_devices();
  p.tile_device.resize(t.tiles.size());
  for (size_t x = 0; x < t.tiles.size(); ++x) {
    const dcp::Tile& tl = t.tiles[x];
    p.tile_device[x] = l.tile[static_cast<size_t>(tl.q_block * m.n + tl.kv_block)] * c.devices_per_node +
                       tl.head_group % c.devices_per_node;
  }
  std::vector<int> turn(static_cast<size_t>(m.k), 0);
  p.block_home.resize(static_cast<size_t>(m.n));
  for (int b = 0; b < m.n; ++b) {
    const int node = l.home[static_cast<size_t>(b)];
    p.block_home[static_cast<size_t>(b)] = node * c.devices_per_node + turn[static_cast<size_t>(node)]++ % c.devices_per_node;
  }
  const dcp::PlacementMetrics pm = dcp::compute_metrics(t, p, c);
  return {static_cast<double>(pm.inter_bytes()) / 1e9, pm.compute_imbalance, pm.memory_imbalance};
}

// (a) Best row bands, exactly: the tiles in row-major order cut into k contiguous chunks (a
// chunk may end inside a row, which then costs one more Q side but lets the chunks meet the
// compute cap; whole-row bands cannot at B = 1024: a bottom row is ~half a node's share), chunk
// p on node p, by dynamic programming over the chunk ends. A chunk costs q per row and kv per
// column it touches; a block homed on the node of its diagonal tile saves q + kv, and a node
// over its home cap homes the rest elsewhere at `overflow` more each. The true extra is kv (on
// the node holding the first part of a split row) or q (a later node, which reads the column)
// or more, so the DP with overflow = kv is a lower bound of every row-chunk layout under the
// home cap, and with overflow = q it picks cut points whose homes `anneal` (tiles fixed) then
// places, an upper bound of the best.
Layout best_row_chunks(const Model& m, double overflow, double* cost_out) {
  const int n = m.n;
  std::vector<int> ri, cj;  // row-major position -> (i, j), the mask's tiles only
  for (const auto& [i, j] : m.tiles) ri.push_back(i), cj.push_back(j);
  const int total = static_cast<int>(ri.size());
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(static_cast<size_t>(m.k) + 1, std::vector<double>(static_cast<size_t>(total) + 1, inf));
  std::vector<std::vector<int>> from(best.size(), std::vector<int>(static_cast<size_t>(total) + 1, -1));
  best[0][0] = 0;
  // A chunk [s, e) costs q per row and kv per column it touches (every row between its first and
  // last has its diagonal tile, so rows are i1 - i0 + 1), minus q + kv per diagonal tile held
  // (homed there), plus `overflow` per diagonal over the home cap; columns counted as e grows.
  std::vector<int> stamp(static_cast<size_t>(n), -1);
  for (int p = 0; p < m.k; ++p)
    for (int s = 0; s < total; ++s) {
      const double base = best[static_cast<size_t>(p)][static_cast<size_t>(s)];
      if (base == inf) continue;
      int cols = 0, diag = 0;
      double load = 0;
      const int stamp_id = p * total + s;
      for (int e = s + 1; e <= total; ++e) {
        const size_t x = static_cast<size_t>(e - 1);
        load += m.w[static_cast<size_t>(ri[x] * n + cj[x])];
        if (load > m.cap) break;
        if (stamp[static_cast<size_t>(cj[x])] != stamp_id) stamp[static_cast<size_t>(cj[x])] = stamp_id, ++cols;
        diag += ri[x] == cj[x];
        const int rows = ri[x] - ri[static_cast<size_t>(s)] + 1;
        const double c = base + m.q * rows + m.kv * cols - (m.q + m.kv) * diag + overflow * std::max(0, diag - m.home_cap);
        if (c < best[static_cast<size_t>(p) + 1][static_cast<size_t>(e)])
          best[static_cast<size_t>(p) + 1][static_cast<size_t>(e)] = c, from[static_cast<size_t>(p) + 1][static_cast<size_t>(e)] = s;
      }
    }
  *cost_out = best[static_cast<size_t>(m.k)][static_cast<size_t>(total)];
  if (*cost_out == inf) return {};
  Layout l;
  l.tile.assign(static_cast<size_t>(n * n), 0);
  l.home.assign(static_cast<size_t>(n), -1);
  std::vector<int> used(static_cast<size_t>(m.k), 0);
  for (int p = m.k, e = total; p > 0; --p) {
    const int s = from[static_cast<size_t>(p)][static_cast<size_t>(e)];
    for (int x = s; x < e; ++x) l.tile[static_cast<size_t>(ri[static_cast<size_t>(x)] * n + cj[static_cast<size_t>(x)])] = p - 1;
    e = s;
  }
  // Homes on the diagonal tile's node while it has room (bottom rows first: they are the dearer
  // to move), the rest on any node with room; `anneal` with fixed tiles then places them well.
  for (int b = n - 1; b >= 0; --b) {
    const int p = l.tile[static_cast<size_t>(b * n + b)];
    if (used[static_cast<size_t>(p)] < m.home_cap) l.home[static_cast<size_t>(b)] = p, ++used[static_cast<size_t>(p)];
  }
  for (int b = 0; b < n; ++b)
    for (int p = 0; l.home[static_cast<size_t>(b)] < 0; ++p)
      if (used[static_cast<size_t>(p)] < m.home_cap) l.home[static_cast<size_t>(b)] = p, ++used[static_cast<size_t>(p)];
  return l;
}

// Node-level zigzag: 2k chunks of rows, node p computes chunks p and 2k - 1 - p whole and homes
// them (a2a_p2p's layout across nodes).
Layout zigzag_nodes(const Model& m) {
  Layout l;
  l.tile.assign(static_cast<size_t>(m.n * m.n), 0);
  l.home.resize(static_cast<size_t>(m.n));
  for (int i = 0; i < m.n; ++i) {
    const int chunk = i * 2 * m.k / m.n;
    const int p = chunk < m.k ? chunk : 2 * m.k - 1 - chunk;
    l.home[static_cast<size_t>(i)] = p;
    for (int j = 0; j <= i; ++j) l.tile[static_cast<size_t>(i * m.n + j)] = p;
  }
  return l;
}

// (c) Simulated annealing from `start` under both bounds: a tile, or a run of up to 8 tiles of
// one node along a row or a column, moves to a node (mostly one already on its row or column), a home moves to a node with room or swaps with a block homed
// there (only homes move with `homes_only`). The temperature falls linearly from 2 kv (a new
// node on a row and a column costs q + kv = 4.5 kv). Deterministic; returns the best layout
// visited.
Layout anneal(const Model& m, const Layout& start, int64_t iters, uint64_t seed, bool homes_only = false) {
  const int n = m.n, k = m.k;
  Layout l = start, best_l = start;
  std::vector<int> rc(static_cast<size_t>(n * k), 0), cc(static_cast<size_t>(n * k), 0), homes(static_cast<size_t>(k), 0);
  std::vector<double> load(static_cast<size_t>(k), 0);
  for (const auto& [i, j] : m.tiles) {
    const int p = l.tile[static_cast<size_t>(i * n + j)];
    ++rc[static_cast<size_t>(i * k + p)], ++cc[static_cast<size_t>(j * k + p)];
    load[static_cast<size_t>(p)] += m.w[static_cast<size_t>(i * n + j)];
  }
  for (int b = 0; b < n; ++b) ++homes[static_cast<size_t>(l.home[static_cast<size_t>(b)])];
  // Cost of block b's two nets (rows and columns touched by nodes other than its home).
  auto block_cost = [&](int b, int home) {
    double c = 0;
    for (int p = 0; p < k; ++p)
      if (p != home) c += m.q * (rc[static_cast<size_t>(b * k + p)] > 0) + m.kv * (cc[static_cast<size_t>(b * k + p)] > 0);
    return c;
  };
  double cost = model_cost(m, l), best = cost;
  dcp::SplitMix64 rng(seed);
  auto rnd = [&]() { return rng.next(); };
  auto accept = [&](double d, double temp) {
    return d <= 0 || std::exp(-d / temp) * 4294967296.0 > static_cast<double>(rnd() & 0xFFFFFFFFull);
  };
  for (int64_t it = 0; it < iters; ++it) {
    const double temp = 0.5 * m.kv * (1.0 - static_cast<double>(it) / static_cast<double>(iters)) + 1e-9;
    const uint64_t r = rnd();
    if (homes_only || r % 16 == 0) {  // home move or swap
      const int b = static_cast<int>((r >> 8) % static_cast<uint64_t>(n));
      const int from = l.home[static_cast<size_t>(b)];
      const int to = static_cast<int>((r >> 24) % static_cast<uint64_t>(k));
      if (to == from) continue;
      if (homes[static_cast<size_t>(to)] < m.home_cap) {
        const double d = block_cost(b, to) - block_cost(b, from);
        if (!accept(d, temp)) continue;
        l.home[static_cast<size_t>(b)] = to, --homes[static_cast<size_t>(from)], ++homes[static_cast<size_t>(to)];
        cost += d;
      } else {
        const int o = static_cast<int>((r >> 40) % static_cast<uint64_t>(n));
        if (l.home[static_cast<size_t>(o)] != to) continue;
        const double d = block_cost(b, to) - block_cost(b, from) + block_cost(o, from) - block_cost(o, to);
        if (!accept(d, temp)) continue;
        l.home[static_cast<size_t>(b)] = to, l.home[static_cast<size_t>(o)] = from;
        cost += d;
      }
    } else {  // a run of tiles on one node moves: 1 tile, or up to 8 along its row or column
      const auto [i, j] = m.tiles[static_cast<size_t>((r >> 8) % m.tiles.size())];
      const int from = l.tile[static_cast<size_t>(i * n + j)];
      const uint64_t s = rnd();
      int to;
      if (s % 4 == 0) {
        to = static_cast<int>((s >> 8) % static_cast<uint64_t>(k));
      } else {  // the node of another tile of the row or the column (the mask may lack it)
        const int oi = s % 4 == 1 ? i : j + static_cast<int>((s >> 8) % static_cast<uint64_t>(n - j));
        const int oj = s % 4 == 1 ? static_cast<int>((s >> 8) % static_cast<uint64_t>(i + 1)) : j;
        if (!m.has(oi, oj)) continue;
        to = l.tile[static_cast<size_t>(oi * n + oj)];
      }
      if (to == from) continue;
      const int shape = static_cast<int>((s >> 40) % 3), len = 1 + static_cast<int>((s >> 48) % 8);
      std::vector<std::pair<int, int>> run;
      for (int step = 0; step < (shape == 0 ? 1 : len); ++step) {
        const int ti = shape == 2 ? i + step : i, tj = shape == 1 ? j + step : j;
        if (!m.has(ti, tj) || l.tile[static_cast<size_t>(ti * n + tj)] != from) break;
        run.push_back({ti, tj});
      }
      double w = 0;
      for (const auto& [ti, tj] : run) w += m.w[static_cast<size_t>(ti * n + tj)];
      if (load[static_cast<size_t>(to)] + w > m.cap) continue;
      // Apply tile by tile (each step's delta is exact given the previous ones); undo if refused.
      auto shift = [&](int ti, int tj, int a, int b) {
        const size_t ri = static_cast<size_t>(ti * k), ci = static_cast<size_t>(tj * k);
        const int hi = l.home[static_cast<size_t>(ti)], hj = l.home[static_cast<size_t>(tj)];
        double d = 0;
        if (rc[ri + static_cast<size_t>(a)] == 1 && a != hi) d -= m.q;
        if (cc[ci + static_cast<size_t>(a)] == 1 && a != hj) d -= m.kv;
        if (rc[ri + static_cast<size_t>(b)] == 0 && b != hi) d += m.q;
        if (cc[ci + static_cast<size_t>(b)] == 0 && b != hj) d += m.kv;
        --rc[ri + static_cast<size_t>(a)], --cc[ci + static_cast<size_t>(a)];
        ++rc[ri + static_cast<size_t>(b)], ++cc[ci + static_cast<size_t>(b)];
        l.tile[static_cast<size_t>(ti * n + tj)] = b;
        return d;
      };
      double d = 0;
      for (const auto& [ti, tj] : run) d += shift(ti, tj, from, to);
      if (!accept(d, temp)) {
        for (const auto& [ti, tj] : run) shift(ti, tj, to, from);
        continue;
      }
      load[static_cast<size_t>(from)] -= w, load[static_cast<size_t>(to)] += w;
      cost += d;
    }
    if (cost < best - 1e-6) best = cost, best_l = l;
  }
  return best_l;
}

// Both bounds of the search: node compute within the cap, homes within the home cap.
bool feasible(const Model& m, const Layout& l) {
  if (l.tile.empty()) return false;
  std::vector<double> load(static_cast<size_t>(m.k), 0);
  std::vector<int> homes(static_cast<size_t>(m.k), 0);
  for (const auto& [i, j] : m.tiles) load[static_cast<size_t>(l.tile[static_cast<size_t>(i * m.n + j)])] += m.w[static_cast<size_t>(i * m.n + j)];
  for (const int h : l.home) ++homes[static_cast<size_t>(h)];
  for (int p = 0; p < m.k; ++p)
    if (load[static_cast<size_t>(p)] > m.cap * (1 + 1e-12) || homes[static_cast<size_t>(p)] > m.home_cap) return false;
  return true;
}

// (d) Home-cap bound of every layout (compute bound ignored, so valid for any tile placement).
// Take a tile (r, c) whose blocks have different homes, computed on node x: if x = home(r), x
// reads column c (pair (c, x), kv); else x reads row r (pair (r, x), x != home(r), q). Charge
// the tile to node home(r): its charges are column pairs (c, home(r)) and row pairs of its own
// rows, so charges of different nodes never coincide, and node p pays at least the minimum
// weighted vertex cover of the bipartite graph (rows homed on p, q each) x (columns homed
// elsewhere, kv each) with an edge per tile. The bound is the sum over nodes, minimized over
// home assignments within the home cap; with n <= 64 and <= 8 rows per node, the cover is exact
// by enumerating the covered row subsets. `cols[r]`: columns of row r's tiles as a bit set.
double node_cover(const Model& m, const std::vector<uint64_t>& cols, uint64_t homed, const std::vector<int>& rows) {
  const int h = static_cast<int>(rows.size());
  double best = std::numeric_limits<double>::infinity();
  for (uint32_t sub = 0; sub < (1u << h); ++sub) {  // rows in `sub` covered by their Q side
    uint64_t need = 0;
    for (int x = 0; x < h; ++x)
      if (!(sub >> x & 1u)) need |= cols[static_cast<size_t>(rows[static_cast<size_t>(x)])] & ~homed;
    best = std::min(best, m.q * std::popcount(sub) + m.kv * std::popcount(need));
  }
  return best;
}

double node_bound(const Model& m, const std::vector<uint64_t>& cols, const std::vector<int>& home, int p) {
  uint64_t homed = 0;
  std::vector<int> rows;
  for (int b = 0; b < m.n; ++b)
    if (home[static_cast<size_t>(b)] == p) homed |= uint64_t{1} << b, rows.push_back(b);
  return node_cover(m, cols, homed, rows);
}

double home_bound(const Model& m, const std::vector<uint64_t>& cols, const std::vector<int>& home) {
  double total = 0;
  for (int p = 0; p < m.k; ++p) total += node_bound(m, cols, home, p);
  return total;
}

// The smallest home bound found: annealing over home moves (within the cap) and swaps from
// `start`. A search, so the minimum over homes is not proved, only not beaten.
std::vector<int> min_home_bound(const Model& m, const std::vector<uint64_t>& cols, std::vector<int> home, int64_t iters,
                                uint64_t seed, double* out) {
  std::vector<int> count(static_cast<size_t>(m.k), 0);
  std::vector<double> node(static_cast<size_t>(m.k));
  for (const int h : home) ++count[static_cast<size_t>(h)];
  for (int p = 0; p < m.k; ++p) node[static_cast<size_t>(p)] = node_bound(m, cols, home, p);
  double cost = home_bound(m, cols, home), best = cost;
  std::vector<int> best_home = home;
  dcp::SplitMix64 rng(seed);
  auto rnd = [&]() { return rng.next(); };
  for (int64_t it = 0; it < iters; ++it) {
    const double temp = 0.5 * m.kv * (1.0 - static_cast<double>(it) / static_cast<double>(iters)) + 1e-9;
    const uint64_t r = rnd();
    const int b = static_cast<int>((r >> 8) % static_cast<uint64_t>(m.n));
    const int o = static_cast<int>((r >> 24) % static_cast<uint64_t>(m.n));
    const int to = static_cast<int>((r >> 40) % static_cast<uint64_t>(m.k));
    const int from = home[static_cast<size_t>(b)];
    int other;
    const bool swap = !(count[static_cast<size_t>(to)] < m.home_cap && to != from);
    if (!swap) {
      other = to, home[static_cast<size_t>(b)] = to;
    } else {
      other = home[static_cast<size_t>(o)];
      if (other == from) continue;
      std::swap(home[static_cast<size_t>(b)], home[static_cast<size_t>(o)]);
    }
    const double a = node_bound(m, cols, home, from), c = node_bound(m, cols, home, other);
    const double d = a + c - node[static_cast<size_t>(from)] - node[static_cast<size_t>(other)];
    if (d > 0 && std::exp(-d / temp) * 4294967296.0 <= static_cast<double>(rnd() & 0xFFFFFFFFull)) {
      if (swap) std::swap(home[static_cast<size_t>(b)], home[static_cast<size_t>(o)]);
      else home[static_cast<size_t>(b)] = from;
      continue;
    }
    if (!swap) --count[static_cast<size_t>(from)], ++count[static_cast<size_t>(to)];
    cost += d;
    node[static_cast<size_t>(from)] = a, node[static_cast<size_t>(other)] = c;
    if (cost < best - 1e-6) best = cost, best_home = home;
  }
  *out = best;
  return best_home;
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');) out.push_back(std::stoi(x));
  return out;
}

dcp::Mask mask_named(const std::string& name, int64_t length) {
  if (name == "lambda") return dcp::Mask::lambda();
  if (name == "causal_blockwise") return dcp::Mask::causal_blockwise();
  if (name == "shared_question") return dcp::Mask::shared_question_for(length);
  return dcp::Mask::causal();
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> sizes = {32, 64};
  double eps = 0.075;  // the node-level compute target on dryrun (0.75 x eps_compute)
  int64_t iters = 20000000;
  std::string mask_name = "causal";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--blocks") sizes = parse_list(argv[i + 1]);
    else if (a == "--eps") eps = std::stod(argv[i + 1]);
    else if (a == "--iters") iters = std::stoll(argv[i + 1]);
    else if (a == "--mask") mask_name = argv[i + 1];
  }
  dcp::Cluster c = dcp::cluster_preset("a100-p4d", 8);
  c.devices_per_node = 2;
  const dcp::BlockOptions bo{.block_size = 1024, .q_heads_per_group = 0};
  // The best annealed layout of the previous size: single-tile annealing stalls on 64 blocks
  // (~2000 tiles) where it finds much on 32, so a layout of n / 2 blocks scaled up (tile (i, j)
  // on the node of (i / 2, j / 2), same cost ratio for causal) is one more start (when feasible).
  Layout prev;
  int prev_n = 0;
  for (const int n : sizes) {
    if (n > 64) {
      fmt::print("skipping {} blocks: the home bound works on 64-bit block sets\n", n);
      continue;
    }
    dcp::Batch batch;
    batch.shape = {.q_heads = 8, .kv_heads = 2, .head_dim = 128, .dtype = dcp::DType::BF16};
    const int64_t length = int64_t{n} * bo.block_size;
    batch.sequences = {{.length = length, .mask = mask_named(mask_name, length), .id = ""}};
    const dcp::BlockTable t = dcp::build_block_table(batch, bo);
    const auto h = dcp::build_placement_hypergraph(t);
    Model m;
    m.n = n, m.k = c.nodes;
    m.q = static_cast<double>(h.net_bytes[0]);
    m.kv = static_cast<double>(h.net_bytes[static_cast<size_t>(h.num_head_groups)]);
    m.home_cap = c.devices_per_node * static_cast<int>(std::floor(1.2 * n / c.num_devices() + 1e-9));
    m.w.assign(static_cast<size_t>(n * n), 0);
    m.ex.assign(static_cast<size_t>(n * n), 0);
    std::vector<uint64_t> cols(static_cast<size_t>(n), 0);
    double total = 0;
    for (size_t x = 0; x < t.tiles.size(); ++x)
      if (t.tiles[x].head_group == 0) {
        const int i = t.tiles[x].q_block, j = t.tiles[x].kv_block;
        m.w[static_cast<size_t>(i * n + j)] = h.compute_flops[x];
        m.ex[static_cast<size_t>(i * n + j)] = 1;
        cols[static_cast<size_t>(i)] |= uint64_t{1} << j;
        total += h.compute_flops[x];
      }
    for (int i = 0; i < n; ++i)
      for (int j = 0; j <= i; ++j)
        if (m.has(i, j)) m.tiles.push_back({i, j});
    m.cap = (1 + eps) * total / m.k;
    const double groups = h.num_head_groups;
    fmt::print("\n== one {} sequence of {} blocks (B = {}, {} tiles per head group), {} nodes x {}, node compute <= {:.3f} x mean, "
               "<= {} homes per node; q = {:.2f} MB, kv = {:.2f} MB per block and head group ==\n",
               mask_name, n, bo.block_size, m.tiles.size(), c.nodes, c.devices_per_node, 1 + eps, m.home_cap, m.q / 1e6,
               m.kv / 1e6);
    fmt::print("{:<62} {:>9} {:>9} {:>8} {:>8}\n", "layout", "inter GB", "/ a2a", "c_imb", "fmem_imb");
    double a2a = 0;
    std::vector<std::pair<std::string, Measured>> rows;
    for (const auto kind : {dcp::BaselineKind::A2AP2P, dcp::BaselineKind::Zigzag}) {
      const dcp::PlacedBatch pb = dcp::make_baseline(kind, batch, bo, c);
      const auto pm = dcp::compute_metrics(pb.table, pb.placement, c);
      const double gb = static_cast<double>(pm.inter_bytes()) / 1e9;
      if (kind == dcp::BaselineKind::A2AP2P) a2a = gb;
      rows.push_back({std::string("(b) ") + dcp::to_string(kind), {gb, pm.compute_imbalance, pm.memory_imbalance}});
    }
    const dcp::DcpPlacement d = dcp::place_dcp(t, c, dcp::PlacementOptions{});
    rows.push_back({"(b) place_dcp on the sequence alone",
                    {static_cast<double>(d.report.inter_bytes) / 1e9, d.report.compute_imbalance,
                     d.report.full_memory_imbalance}});
    const Layout zz = zigzag_nodes(m);
    rows.push_back({std::string("    node-level zigzag, head group per device") + (feasible(m, zz) ? "" : " (over a cap)"),
                    measure(t, c, m, zz)});
    double dp_cost = 0, dp_low = 0;
    const Layout chunks = best_row_chunks(m, m.q, &dp_cost);
    best_row_chunks(m, m.kv, &dp_low);
    Layout bands;
    if (!chunks.tile.empty()) {
      bands = anneal(m, chunks, 2000000, 7, true);
      rows.push_back({"(a) row bands (row-major chunks by DP), homes placed", measure(t, c, m, bands)});
      rows.push_back({"(a) lower bound of any row bands under the home cap (DP)", {groups * dp_low / 1e9, 0, 0}});
    } else {
      fmt::print("    (no row-band split meets the compute cap)\n");
    }
    Model free_mem = m;
    free_mem.home_cap = n;
    double dp_free = 0;
    const Layout chunks_free = best_row_chunks(free_mem, 0, &dp_free);
    if (!chunks_free.tile.empty())
      rows.push_back({"(a) best row bands, no memory bound (exact)", measure(t, c, free_mem, chunks_free)});
    Layout up;
    if (prev_n * 2 == n) {
      up.tile.assign(static_cast<size_t>(n * n), 0);
      up.home.resize(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) {
        up.home[static_cast<size_t>(i)] = prev.home[static_cast<size_t>(i / 2)];
        for (int j = 0; j <= i; ++j) up.tile[static_cast<size_t>(i * n + j)] = prev.tile[static_cast<size_t>(i / 2 * prev_n + j / 2)];
      }
    }
    Layout best_annealed;
    double best_annealed_cost = 0;
    for (const auto& [name, start] : {std::pair<const char*, const Layout*>{"(c) annealed from the best row bands", &bands},
                                      {"(c) annealed from node-level zigzag", &zz},
                                      {"(c) annealed from the n/2 annealed layout scaled up", &up}}) {
      if (!feasible(m, *start)) continue;
      const Layout a = anneal(m, *start, iters, 7);
      rows.push_back({name, measure(t, c, m, a)});
      const double cost = model_cost(m, a);
      if (best_annealed.tile.empty() || cost < best_annealed_cost) best_annealed = a, best_annealed_cost = cost;
      if (n <= 32) {  // the annealed layout, for reading its structure ('.': no tile)
        fmt::print("    {} (row i: node of tile (i, j), home node after '|'):\n", name);
        for (int i = 0; i < n; ++i) {
          std::string str;
          for (int j = 0; j <= i; ++j) str += m.has(i, j) ? static_cast<char>('0' + a.tile[static_cast<size_t>(i * n + j)]) : '.';
          fmt::print("      {:>2} {:<{}} | {}\n", i, str, n, a.home[static_cast<size_t>(i)]);
        }
      }
    }
    prev = best_annealed, prev_n = n;
    // (d) Home-cap bound: contiguous homes (n / k blocks per node in order), then the smallest
    // found by annealing the homes from those, from the node-level zigzag's and from the best
    // annealed layout's homes.
    std::vector<int> contiguous(static_cast<size_t>(n));
    for (int b = 0; b < n; ++b) contiguous[static_cast<size_t>(b)] = std::min(m.k - 1, b / std::max(1, n / m.k));
    const double contiguous_bound = home_bound(m, cols, contiguous);
    double home_min = contiguous_bound;
    std::vector<std::vector<int>> starts = {contiguous, zz.home};
    if (!best_annealed.home.empty()) starts.push_back(best_annealed.home);
    for (const auto& st : starts) {
      double v = 0;
      min_home_bound(m, cols, st, 200000, 11, &v);
      home_min = std::min({home_min, v, home_bound(m, cols, st)});
    }
    rows.push_back({"(d) home-cap bound, contiguous homes", {groups * contiguous_bound / 1e9, 0, 0}});
    rows.push_back({"(d) home-cap bound, smallest over homes found (any layout)", {groups * home_min / 1e9, 0, 0}});
    if (mask_name == "causal") {
      // Round-4 relaxation bound (no memory bound; see diagnose_placement).
      const double k = m.k, area = 0.5 * n * n;
      const double r = std::max(n / k, std::sqrt(m.kv * area / k / m.q));
      const double relax = groups * std::max(0.0, k * (m.q * r + m.kv * area / (k * r)) - (m.q + m.kv) * n) / 1e9;
      rows.push_back({"    relaxation lower bound (no memory bound)", {relax, 0, 0}});
    }
    for (const auto& [name, v] : rows)
      fmt::print("{:<62} {:>9.3f} {:>9.3f} {:>8.3f} {:>8.3f}\n", name, v.inter_gb, v.inter_gb / a2a, v.compute_imb,
                 v.full_mem_imb);
  }
  return 0;
}
