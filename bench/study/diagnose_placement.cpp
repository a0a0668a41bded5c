// diagnose_placement: where DCP's inter-node bytes come from on the dry-run setting, and how far
// below them one long causal sequence can go (issue 3, round 4 study).
//
// Part A (whole batches, ldc causal, dryrun 8 nodes x 2): inter-node bytes of DCP, a2a_p2p and
// zigzag split into "long" sequences (more tokens than one device's share of the batch) and the
// rest, by the hypergraph model (equal to compute_metrics' inter bytes; checked per batch).
// Part B (the longest sequence of each batch, alone on the same cluster): inter-node bytes of
// simple structured layouts (Q-stationary row bands, zigzag rows, node-level bands with head
// groups split over a node's devices, recursive square/triangle bisection), of place_dcp on the
// sequence alone with and without the memory bound, and a relaxation lower bound.
//
// Usage: diagnose_placement [--batches N] [--scale S] [--mask M] [--anneal (causal only)]
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "dcp/detail/rng.h"
#include "dcp/baselines.h"
#include "dcp/blocks.h"
#include "dcp/metrics.h"
#include "dcp/partition.h"
#include "dcp/profiles.h"

namespace {

dcp::AttentionShape shape() {
  return {.q_heads = 8, .kv_heads = 2, .head_dim = 128, .dtype = dcp::DType::BF16};
}

// Inter-node bytes per sequence: a net costs its bytes once per device outside its home's node
// that touches it (the compute_metrics model).
std::vector<double> inter_per_sequence(const dcp::BlockTable& t, const dcp::PlacementHypergraph& h,
                                       const std::vector<int32_t>& parts, const dcp::Cluster& c) {
  std::vector<double> out(static_cast<size_t>(t.num_sequences()), 0.0);
  std::vector<int32_t> stamp(static_cast<size_t>(c.num_devices()), -1);
  for (int32_t e = 0; e < h.num_nets(); ++e) {
    const int32_t home = parts[static_cast<size_t>(h.pins[static_cast<size_t>(h.net_begin[e])])];
    stamp[static_cast<size_t>(home)] = e;
    int64_t remote = 0;
    for (int64_t p = h.net_begin[e] + 1; p < h.net_begin[e + 1]; ++p) {
      const int32_t d = parts[static_cast<size_t>(h.pins[static_cast<size_t>(p)])];
      if (stamp[static_cast<size_t>(d)] == e) continue;
      stamp[static_cast<size_t>(d)] = e;
      remote += c.node_of(d) != c.node_of(home);
    }
    const int32_t seq = t.token_blocks[static_cast<size_t>(e / h.nets_per_block)].seq;
    out[static_cast<size_t>(seq)] += static_cast<double>(remote * h.net_bytes[static_cast<size_t>(e)]);
  }
  return out;
}

// Tiles -> device from a rule; each token block homed on the node whose devices touch its nets
// with the most bytes, on that node's device touching them most.
std::vector<int32_t> layout(const dcp::BlockTable& t, const dcp::PlacementHypergraph& h,
                            const dcp::Cluster& c,
                            const std::function<int32_t(const dcp::Tile&)>& device_of) {
  std::vector<int32_t> parts(static_cast<size_t>(h.num_vertices()), 0);
  for (size_t i = 0; i < t.tiles.size(); ++i) parts[i] = device_of(t.tiles[i]);
  const int nd = c.num_devices();
  for (int32_t b = 0; b < h.num_token_blocks; ++b) {
    std::vector<double> dev(static_cast<size_t>(nd), 0.0);
    for (int32_t k = 0; k < h.nets_per_block; ++k) {
      const int32_t e = b * h.nets_per_block + k;
      std::vector<char> seen(static_cast<size_t>(nd), 0);
      for (int64_t p = h.net_begin[e] + 1; p < h.net_begin[e + 1]; ++p) {
        const int32_t d = parts[static_cast<size_t>(h.pins[static_cast<size_t>(p)])];
        if (!seen[static_cast<size_t>(d)]) dev[static_cast<size_t>(d)] += static_cast<double>(h.net_bytes[static_cast<size_t>(e)]);
        seen[static_cast<size_t>(d)] = 1;
      }
    }
    int best_node = 0;
    double best_w = -1;
    for (int n = 0; n < c.nodes; ++n) {
      double w = 0;
      for (int d = n * c.devices_per_node; d < (n + 1) * c.devices_per_node; ++d) w += dev[static_cast<size_t>(d)];
      if (w > best_w) best_w = w, best_node = n;
    }
    int best_dev = best_node * c.devices_per_node;
    for (int d = best_dev; d < (best_node + 1) * c.devices_per_node; ++d)
      if (dev[static_cast<size_t>(d)] > dev[static_cast<size_t>(best_dev)]) best_dev = d;
    parts[static_cast<size_t>(h.block_vertex(b))] = best_dev;
  }
  return parts;
}

// Row owner for compute-balanced contiguous row bands (per head group) over `k` parts.
std::vector<int32_t> band_rows(int n, int k) {
  std::vector<int32_t> own(static_cast<size_t>(n));
  const double total = 0.5 * n * (n + 1);
  double acc = 0;
  for (int i = 0; i < n; ++i) {
    acc += i + 0.5;  // this row's tiles, the diagonal one half full
    own[static_cast<size_t>(i)] = std::min(k - 1, static_cast<int>(acc / total * k));
  }
  return own;
}
std::vector<int32_t> zigzag_rows(int n, int k) {
  std::vector<int32_t> own(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const int chunk = static_cast<int>(static_cast<int64_t>(i) * 2 * k / n);
    own[static_cast<size_t>(i)] = chunk < k ? chunk : 2 * k - 1 - chunk;
  }
  return own;
}
// Recursive bisection of the triangle rows/cols [a, b) over parts [p0, p0 + np): the square
// (rows [m, b) x cols [a, m)) goes to half the parts as row bands, each triangle to a quarter.
int32_t bisect_part(int a, int b, int p0, int np, int row, int col) {
  if (np == 1 || b - a <= 1) return p0;
  const int m = (a + b) / 2;
  if (np == 2) return row >= m && col < m ? p0 : p0 + 1;
  const int half = np / 2, quarter = np / 4;
  if (row >= m && col < m) return p0 + std::min(half - 1, (row - m) * half / std::max(1, b - m));
  if (row < m) return bisect_part(a, m, p0 + half, quarter, row, col);
  return bisect_part(m, b, p0 + half + quarter, np - half - quarter, row, col);
}

// Simulated annealing on one head group's causal triangle of n blocks over k nodes: tiles move
// between nodes, each node's compute (diagonal tiles count half) stays <= (1 + eps) x mean, and
// every token block is homed on a node touching it, so a net costs its bytes x (nodes - 1).
// An estimate of the best node-level layout (memory ignored), not a proof. Deterministic.
double anneal_triangle(int n, int k, double q, double kv, double eps, uint64_t seed) {
  struct T { int i, j; double w; };
  std::vector<T> tiles;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j <= i; ++j) tiles.push_back({i, j, i == j ? 0.5 : 1.0});
  const double cap = (1 + eps) * 0.5 * n * n / k;
  std::vector<int> part(tiles.size());
  std::vector<int> rc(static_cast<size_t>(n * k), 0), cc(static_cast<size_t>(n * k), 0);
  std::vector<double> load(static_cast<size_t>(k), 0.0);
  // Start from compute-balanced row bands (the best structured layout found).
  const auto bands = band_rows(n, k);
  for (size_t t = 0; t < tiles.size(); ++t) part[t] = bands[static_cast<size_t>(tiles[t].i)];
  // Tile index of (i, j) for neighbour-driven moves.
  auto index_of = [](int i, int j) { return static_cast<size_t>(i) * static_cast<size_t>(i + 1) / 2 + static_cast<size_t>(j); };
  double cost = 0;
  for (size_t t = 0; t < tiles.size(); ++t) {
    const int p = part[t];
    if (rc[static_cast<size_t>(tiles[t].i * k + p)]++ == 0) cost += q;
    if (cc[static_cast<size_t>(tiles[t].j * k + p)]++ == 0) cost += kv;
    load[static_cast<size_t>(p)] += tiles[t].w;
  }
  dcp::SplitMix64 rng(seed);
  auto rnd = [&]() { return rng.next(); };
  double best = cost;
  const int64_t iters = 30000000;
  for (int64_t it = 0; it < iters; ++it) {
    const double temp = 0.5 * kv * (1.0 - static_cast<double>(it) / static_cast<double>(iters)) + 1e-9;
    const size_t t = rnd() % tiles.size();
    const int from = part[t];
    // Move toward a node already touching this tile's row or column most of the time.
    const uint64_t r = rnd();
    int to;
    if ((r & 3) == 0) {
      to = static_cast<int>((r >> 8) % static_cast<uint64_t>(k));
    } else if ((r & 3) == 1) {  // a node computing another tile of this row
      to = part[index_of(tiles[t].i, static_cast<int>((r >> 8) % static_cast<uint64_t>(tiles[t].i + 1)))];
    } else {  // a node computing another tile of this column
      const int i = tiles[t].j + static_cast<int>((r >> 8) % static_cast<uint64_t>(n - tiles[t].j));
      to = part[index_of(i, tiles[t].j)];
    }
    if (to == from || load[static_cast<size_t>(to)] + tiles[t].w > cap) continue;
    const size_t ri = static_cast<size_t>(tiles[t].i * k), ci = static_cast<size_t>(tiles[t].j * k);
    double d = 0;
    if (rc[ri + static_cast<size_t>(from)] == 1) d -= q;
    if (cc[ci + static_cast<size_t>(from)] == 1) d -= kv;
    if (rc[ri + static_cast<size_t>(to)] == 0) d += q;
    if (cc[ci + static_cast<size_t>(to)] == 0) d += kv;
    if (d > 0 && std::exp(-d / temp) * 4294967296.0 < static_cast<double>(rnd() & 0xFFFFFFFFull)) continue;
    --rc[ri + static_cast<size_t>(from)], --cc[ci + static_cast<size_t>(from)];
    ++rc[ri + static_cast<size_t>(to)], ++cc[ci + static_cast<size_t>(to)];
    load[static_cast<size_t>(from)] -= tiles[t].w, load[static_cast<size_t>(to)] += tiles[t].w;
    part[t] = to;
    cost += d;
    best = std::min(best, cost);
  }
  return best - (q + kv) * n;
}

struct Sums {
  double dcp_long = 0, dcp_short = 0, a2a_long = 0, a2a_short = 0, zz_long = 0, zz_short = 0;
};

}  // namespace

int main(int argc, char** argv) {
  int count = 20;
  bool anneal = false;
  std::string mask = "causal";
  std::vector<double> scales = {0.5, 1.0, 2.0, 4.0};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--batches" && i + 1 < argc) count = std::stoi(argv[++i]);
    else if (a == "--anneal") anneal = true;
    else if (a == "--mask" && i + 1 < argc) mask = argv[++i];
    else if (a == "--scale" && i + 1 < argc) scales = {std::stod(argv[++i])};
  }
  dcp::Cluster c = dcp::cluster_preset("a100-p4d", 8);
  c.devices_per_node = 2;
  const int64_t tokens = 65536;
  const dcp::BlockOptions bo{.block_size = 1024, .q_heads_per_group = 0};
  const dcp::PlacementOptions po;
  for (const double scale : scales) {
    dcp::ProfileOptions pf;
    pf.profile = dcp::parse_profile("ldc");
    pf.seed = 20251129;
    pf.token_budget = tokens;
    pf.scale = scale;
    pf.mask = mask;
    pf.shape = shape();
    const auto batches = dcp::generate_batches(pf, count);
    Sums s;
    // Part B sums over the longest sequence of each batch (GB).
    std::vector<std::string> names = {"in batch: dcp", "in batch: a2a_p2p", "in batch: zigzag",
                                      "alone: dcp (memory bound)", "alone: dcp (no memory bound)",
                                      "alone: row bands, 16 devices", "alone: zigzag rows, 16 devices",
                                      "alone: row bands over nodes, head group per device",
                                      "alone: zigzag rows over nodes, head group per device",
                                      "alone: recursive bisection, 16 devices",
                                      "alone: recursive bisection over nodes, head group per device",
                                      "alone: annealed node layout x groups (no memory bound)",
                                      "relaxation lower bound"};
    std::vector<double> alone(names.size(), 0.0);
    double long_tokens = 0;
    for (const dcp::Batch& b : batches) {
      const dcp::BlockTable t = dcp::build_block_table(b, bo);
      const auto h = dcp::build_placement_hypergraph(t);
      const dcp::DcpPlacement d = dcp::place_dcp(t, c, po);
      const auto dcp_seq = inter_per_sequence(t, h, dcp::placement_to_parts(h, d.placement), c);
      const int64_t long_len = tokens / c.num_devices();
      int longest = 0;
      for (int q = 0; q < t.num_sequences(); ++q)
        if (t.seq_length[static_cast<size_t>(q)] > t.seq_length[static_cast<size_t>(longest)]) longest = q;
      auto add = [&](const std::vector<double>& v, double& lo, double& sh) {
        for (int q = 0; q < t.num_sequences(); ++q)
          (t.seq_length[static_cast<size_t>(q)] > long_len ? lo : sh) += v[static_cast<size_t>(q)];
      };
      add(dcp_seq, s.dcp_long, s.dcp_short);
      alone[0] += dcp_seq[static_cast<size_t>(longest)];
      int slot = 1;
      for (const auto kind : {dcp::BaselineKind::A2AP2P, dcp::BaselineKind::Zigzag}) {
        const dcp::PlacedBatch pb = dcp::make_baseline(kind, b, bo, c);
        const auto hb = dcp::build_placement_hypergraph(pb.table);
        const auto v = inter_per_sequence(pb.table, hb, dcp::placement_to_parts(hb, pb.placement), c);
        double total = 0;
        for (double x : v) total += x;
        const double check = static_cast<double>(dcp::compute_metrics(pb.table, pb.placement, c).inter_bytes());
        if (std::abs(total - check) > 1) fmt::print("warning: per-sequence sum {} != metrics {}\n", total, check);
        if (kind == dcp::BaselineKind::A2AP2P) add(v, s.a2a_long, s.a2a_short);
        else add(v, s.zz_long, s.zz_short);
        alone[static_cast<size_t>(slot++)] += v[static_cast<size_t>(longest)];
      }
      // The longest sequence alone.
      dcp::Batch one;
      one.shape = b.shape;
      one.sequences = {b.sequences[static_cast<size_t>(longest)]};
      long_tokens += static_cast<double>(one.sequences[0].length);
      const dcp::BlockTable t1 = dcp::build_block_table(one, bo);
      const auto h1 = dcp::build_placement_hypergraph(t1);
      alone[3] += static_cast<double>(dcp::place_dcp(t1, c, po).report.inter_bytes);
      dcp::PlacementOptions free_mem = po;
      free_mem.eps_memory = 100;
      alone[4] += static_cast<double>(dcp::place_dcp(t1, c, free_mem).report.inter_bytes);
      const int n = t1.num_token_blocks(), nd = c.num_devices(), dpn = c.devices_per_node;
      const auto bands16 = band_rows(n, nd), zz16 = zigzag_rows(n, nd);
      const auto bands8 = band_rows(n, c.nodes), zz8 = zigzag_rows(n, c.nodes);
      auto cost = [&](const std::function<int32_t(const dcp::Tile&)>& f) {
        return static_cast<double>(dcp::connectivity_bytes(h1, layout(t1, h1, c, f), c).inter_bytes);
      };
      alone[5] += cost([&](const dcp::Tile& x) { return bands16[static_cast<size_t>(x.q_block)]; });
      alone[6] += cost([&](const dcp::Tile& x) { return zz16[static_cast<size_t>(x.q_block)]; });
      alone[7] += cost([&](const dcp::Tile& x) { return bands8[static_cast<size_t>(x.q_block)] * dpn + x.head_group % dpn; });
      alone[8] += cost([&](const dcp::Tile& x) { return zz8[static_cast<size_t>(x.q_block)] * dpn + x.head_group % dpn; });
      alone[9] += cost([&](const dcp::Tile& x) { return bisect_part(0, n, 0, nd, x.q_block, x.kv_block); });
      alone[10] += cost([&](const dcp::Tile& x) { return bisect_part(0, n, 0, c.nodes, x.q_block, x.kv_block) * dpn + x.head_group % dpn; });
      const double q = static_cast<double>(h1.net_bytes[0]);
      const double kv = static_cast<double>(h1.net_bytes[static_cast<size_t>(h1.num_head_groups)]);
      if (anneal && mask == "causal") alone[11] += t1.groups.num_groups * anneal_triangle(n, c.nodes, q, kv, po.eps_compute, 7);
      // Relaxation (per head group; k = nodes; Q-side net bytes q, KV-side kv per token block):
      // node p computing T_p tiles of the triangle (area A = n^2/2) needs r_p rows and c_p columns
      // with r_p c_p >= T_p, and every row and column needs >= 1 node: the inter cost is at least
      // sum_p (q r_p + kv c_p) - (q + kv) n. With sum T_p = A, convexity gives equal parts and the
      // minimum of k (q r + kv A / (k r)) - (q + kv) n over r >= n / k.
      const double k = c.nodes, area = 0.5 * n * n;
      const double r = std::max(static_cast<double>(n) / k, std::sqrt(kv * area / k / q));
      alone[12] += t1.groups.num_groups * std::max(0.0, k * (q * r + kv * area / (k * r)) - (q + kv) * n);
    }
    fmt::print("\n== dryrun ldc {}, scale {}, {} batches (inter-node GB, summed) ==\n", mask, scale, count);
    fmt::print("long = more than {} tokens; longest sequences: {:.0f} tokens on average\n",
               tokens / c.num_devices(), long_tokens / count);
    fmt::print("{:<12} {:>10} {:>10} {:>10}\n", "method", "long", "short", "total");
    auto line = [](const char* m, double lo, double sh) {
      fmt::print("{:<12} {:>10.2f} {:>10.2f} {:>10.2f}\n", m, lo / 1e9, sh / 1e9, (lo + sh) / 1e9);
    };
    line("dcp", s.dcp_long, s.dcp_short);
    line("a2a_p2p", s.a2a_long, s.a2a_short);
    line("zigzag", s.zz_long, s.zz_short);
    fmt::print("longest sequence of each batch:\n");
    for (size_t i = 0; i < names.size(); ++i) fmt::print("  {:<55} {:>8.2f} GB\n", names[i], alone[i] / 1e9);
  }
  return 0;
}
