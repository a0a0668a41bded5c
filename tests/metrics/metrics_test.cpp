// compute_metrics against a brute-force recomputation with std::set of (block, device) uses.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <tuple>

#include "baselines/random_cases.h"
#include "dcp/baselines.h"
#include "dcp/error.h"
#include "dcp/metrics.h"

namespace dcp {
namespace {

using test::Rng;

// The model of metrics.h, written tile by tile with ordered sets.
PlacementMetrics brute_force(const BlockTable& table, const Placement& pl, const Cluster& cl) {
  const int P = pl.num_devices;
  const HeadGroups& hg = table.groups;
  const int64_t hd = table.shape.head_dim;
  const int64_t kv_heads_per_set = table.shape.kv_heads / hg.num_kv_sets();
  PlacementMetrics m;
  m.devices.resize(P);
  m.total_tokens = table.total_tokens();
  auto bytes = [&](DataKind k, int64_t n) { return table.data_bytes(k, n); };
  for (int b = 0; b < table.num_token_blocks(); ++b) {
    const int64_t n = table.token_blocks[b].length;
    DeviceLoad& d = m.devices[pl.block_home[b]];
    d.tokens += n;
    for (DataKind k : {DataKind::Q, DataKind::O, DataKind::LSE, DataKind::dO, DataKind::dQ,
                       DataKind::Delta}) {
      d.owned_bytes += hg.num_groups * bytes(k, n);
    }
    for (DataKind k : {DataKind::KV, DataKind::dKV}) d.owned_bytes += hg.num_kv_sets() * bytes(k, n);
  }
  std::set<std::tuple<int, int, int>> q_uses, kv_uses;  // (block, group or set, device)
  for (size_t i = 0; i < table.tiles.size(); ++i) {
    const Tile& t = table.tiles[i];
    const int dev = pl.tile_device[i];
    DeviceLoad& d = m.devices[dev];
    ++d.num_tiles;
    const double fwd = 4.0 * static_cast<double>(t.area) * static_cast<double>(hd) *
                       hg.q_heads_per_group;
    d.fwd_flops += fwd;
    d.bwd_flops += 2.5 * fwd;
    if (pl.block_home[t.q_block] != dev) q_uses.insert({t.q_block, t.head_group, dev});
    if (pl.block_home[t.kv_block] != dev) kv_uses.insert({t.kv_block, hg.kv_set(t.head_group), dev});
  }
  auto move = [&](int src, int dst, int64_t n, bool fwd) {
    m.devices[src].send_bytes += n;
    m.devices[dst].recv_bytes += n;
    const bool intra = cl.node_of(src) == cl.node_of(dst);
    (fwd ? (intra ? m.intra_bytes_fwd : m.inter_bytes_fwd)
         : (intra ? m.intra_bytes_bwd : m.inter_bytes_bwd)) += n;
  };
  for (const auto& [blk, g, dev] : q_uses) {
    const int64_t n = table.token_blocks[blk].length;
    const int home = pl.block_home[blk];
    const int64_t o32 = n * hg.q_heads_per_group * hd * 4;
    const int64_t cf = bytes(DataKind::Q, n);
    const int64_t cb = bytes(DataKind::Q, n) + bytes(DataKind::dO, n) + bytes(DataKind::LSE, n) +
                       bytes(DataKind::Delta, n);
    const int64_t pf = o32 + bytes(DataKind::LSE, n);
    const int64_t pb = o32;  // dQ has the shape of Q
    DeviceLoad& d = m.devices[dev];
    d.recv_copy_bytes_fwd += cf;
    d.recv_copy_bytes_bwd += cb;
    d.partial_bytes_fwd += pf;
    d.partial_bytes_bwd += pb;
    move(home, dev, cf, true);
    move(dev, home, pf, true);
    move(home, dev, cb, false);
    move(dev, home, pb, false);
  }
  for (const auto& [blk, set, dev] : kv_uses) {
    const int64_t n = table.token_blocks[blk].length;
    const int home = pl.block_home[blk];
    const int64_t c = bytes(DataKind::KV, n);
    const int64_t dkv32 = 2 * n * kv_heads_per_set * hd * 4;
    DeviceLoad& d = m.devices[dev];
    d.recv_copy_bytes_fwd += c;
    d.recv_copy_bytes_bwd += c;
    d.partial_bytes_bwd += dkv32;
    move(home, dev, c, true);
    move(home, dev, c, false);
    move(dev, home, dkv32, false);
  }
  double sum_c = 0, max_c = 0, sum_m = 0, max_m = 0;
  for (DeviceLoad& d : m.devices) {
    d.memory_fwd_bytes = d.owned_bytes + d.recv_copy_bytes_fwd + d.partial_bytes_fwd;
    d.memory_bwd_bytes = d.owned_bytes + d.recv_copy_bytes_bwd + d.partial_bytes_bwd;
    d.memory_bytes = std::max(d.memory_fwd_bytes, d.memory_bwd_bytes);
    sum_c += d.fwd_flops + d.bwd_flops;
    max_c = std::max(max_c, d.fwd_flops + d.bwd_flops);
    sum_m += static_cast<double>(d.memory_bytes);
    max_m = std::max(max_m, static_cast<double>(d.memory_bytes));
  }
  m.compute_imbalance = sum_c > 0 ? max_c / (sum_c / P) : 1.0;
  m.memory_imbalance = sum_m > 0 ? max_m / (sum_m / P) : 1.0;
  return m;
}

void expect_same(const PlacementMetrics& got, const PlacementMetrics& want) {
  ASSERT_EQ(got.devices.size(), want.devices.size());
  for (size_t d = 0; d < got.devices.size(); ++d) {
    SCOPED_TRACE("device " + std::to_string(d));
    const DeviceLoad& a = got.devices[d];
    const DeviceLoad& b = want.devices[d];
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(a.num_tiles, b.num_tiles);
    EXPECT_NEAR(a.fwd_flops, b.fwd_flops, 1e-12 * b.fwd_flops);
    EXPECT_NEAR(a.bwd_flops, b.bwd_flops, 1e-12 * b.bwd_flops);
    EXPECT_EQ(a.owned_bytes, b.owned_bytes);
    EXPECT_EQ(a.recv_copy_bytes_fwd, b.recv_copy_bytes_fwd);
    EXPECT_EQ(a.recv_copy_bytes_bwd, b.recv_copy_bytes_bwd);
    EXPECT_EQ(a.partial_bytes_fwd, b.partial_bytes_fwd);
    EXPECT_EQ(a.partial_bytes_bwd, b.partial_bytes_bwd);
    EXPECT_EQ(a.memory_fwd_bytes, b.memory_fwd_bytes);
    EXPECT_EQ(a.memory_bwd_bytes, b.memory_bwd_bytes);
    EXPECT_EQ(a.memory_bytes, b.memory_bytes);
    EXPECT_EQ(a.send_bytes, b.send_bytes);
    EXPECT_EQ(a.recv_bytes, b.recv_bytes);
  }
  EXPECT_EQ(got.intra_bytes_fwd, want.intra_bytes_fwd);
  EXPECT_EQ(got.inter_bytes_fwd, want.inter_bytes_fwd);
  EXPECT_EQ(got.intra_bytes_bwd, want.intra_bytes_bwd);
  EXPECT_EQ(got.inter_bytes_bwd, want.inter_bytes_bwd);
  EXPECT_EQ(got.total_tokens, want.total_tokens);
  EXPECT_NEAR(got.compute_imbalance, want.compute_imbalance, 1e-9);
  EXPECT_NEAR(got.memory_imbalance, want.memory_imbalance, 1e-9);
}

void expect_conservation(const PlacementMetrics& m) {
  int64_t send = 0, recv = 0;
  for (const DeviceLoad& d : m.devices) {
    send += d.send_bytes;
    recv += d.recv_bytes;
  }
  EXPECT_EQ(m.intra_bytes() + m.inter_bytes(), send);
  EXPECT_EQ(send, recv);
}

TEST(Metrics, MatchesBruteForceOnRandomBaselines) {
  Rng rng(77001);
  for (int iter = 0; iter < 150; ++iter) {
    const test::Case c = test::random_case(rng);
    for (BaselineKind kind : all_baselines()) {
      SCOPED_TRACE(std::string(to_string(kind)) + " iter " + std::to_string(iter));
      const PlacedBatch pb = make_baseline(kind, c.batch, c.opts, c.cluster);
      const PlacementMetrics m = compute_metrics(pb.table, pb.placement, c.cluster);
      expect_same(m, brute_force(pb.table, pb.placement, c.cluster));
      expect_conservation(m);
      EXPECT_EQ(m.total_tokens, c.batch.total_tokens());
      double fwd = 0;
      for (const DeviceLoad& d : m.devices) fwd += d.fwd_flops;
      EXPECT_NEAR(fwd, c.batch.forward_flops(), 1e-9 * c.batch.forward_flops());
    }
  }
}

// Arbitrary placements (blocks and tiles on random devices) exercise remote Q and partials.
TEST(Metrics, MatchesBruteForceOnRandomPlacements) {
  Rng rng(9102);
  for (int iter = 0; iter < 150; ++iter) {
    const test::Case c = test::random_case(rng);
    PlacedBatch pb = make_baseline(BaselineKind::Packing, c.batch, c.opts, c.cluster);
    const int P = c.cluster.num_devices();
    for (auto& h : pb.placement.block_home) h = static_cast<int32_t>(rng.uniform(0, P - 1));
    for (auto& d : pb.placement.tile_device) d = static_cast<int32_t>(rng.uniform(0, P - 1));
    const PlacementMetrics m = compute_metrics(pb.table, pb.placement, c.cluster);
    expect_same(m, brute_force(pb.table, pb.placement, c.cluster));
    expect_conservation(m);
  }
}

TEST(Metrics, OneDeviceMovesNothing) {
  Rng rng(5);
  for (int iter = 0; iter < 10; ++iter) {
    test::Case c = test::random_case(rng);
    c.cluster.nodes = 1;
    c.cluster.devices_per_node = 1;
    for (BaselineKind kind : all_baselines()) {
      const PlacedBatch pb = make_baseline(kind, c.batch, c.opts, c.cluster);
      const PlacementMetrics m = compute_metrics(pb.table, pb.placement, c.cluster);
      EXPECT_EQ(m.intra_bytes() + m.inter_bytes(), 0);
      EXPECT_EQ(m.bytes_per_token(), 0.0);
      const DeviceLoad& d = m.devices[0];
      EXPECT_EQ(d.memory_bytes, d.owned_bytes);
      EXPECT_EQ(d.partial_bytes_fwd + d.partial_bytes_bwd, 0);
      EXPECT_DOUBLE_EQ(m.compute_imbalance, 1.0);
      EXPECT_DOUBLE_EQ(m.memory_imbalance, 1.0);
    }
  }
}

// Ring on one causal sequence of L = P * c tokens: device d keeps its queries and reads the KV
// of every earlier chunk j < d, so P(P-1)/2 (chunk, device) KV copies, each carrying K and V of
// all KV heads: 2 * c * kv_heads * head_dim * element bytes. Forward moves only those copies;
// backward moves them again plus fp32 dKV partials (2 * c * kv_heads * head_dim * 4) back. A pair
// (j, d) is inter-node when j and d sit on different nodes: with n nodes of k devices,
// n * k(k-1)/2 of the pairs are intra-node.
TEST(Metrics, RingCausalKvVolumeFormula) {
  for (auto [nodes, per_node] : {std::pair{1, 4}, std::pair{2, 4}, std::pair{3, 1}, std::pair{2, 3}}) {
    const int64_t P = nodes * per_node;
    const int64_t c = 48;
    const int64_t kv_heads = 4, head_dim = 32, elem = 2;
    Batch batch;
    batch.shape = {.q_heads = 8, .kv_heads = 4, .head_dim = 32, .dtype = DType::BF16};
    batch.sequences.push_back({.length = P * c, .mask = Mask::causal(), .id = ""});
    BlockOptions opts;
    opts.block_size = 16;
    Cluster cluster;
    cluster.nodes = nodes;
    cluster.devices_per_node = per_node;
    const PlacedBatch pb = make_baseline(BaselineKind::Ring, batch, opts, cluster);
    const PlacementMetrics m = compute_metrics(pb.table, pb.placement, cluster);
    const int64_t pairs = P * (P - 1) / 2;
    const int64_t intra_pairs = nodes * per_node * (per_node - 1) / 2;
    const int64_t kv_copy = 2 * c * kv_heads * head_dim * elem;
    const int64_t dkv_partial = 2 * c * kv_heads * head_dim * 4;
    SCOPED_TRACE("nodes " + std::to_string(nodes) + " x " + std::to_string(per_node));
    EXPECT_EQ(m.intra_bytes_fwd, intra_pairs * kv_copy);
    EXPECT_EQ(m.inter_bytes_fwd, (pairs - intra_pairs) * kv_copy);
    EXPECT_EQ(m.intra_bytes_bwd, intra_pairs * (kv_copy + dkv_partial));
    EXPECT_EQ(m.inter_bytes_bwd, (pairs - intra_pairs) * (kv_copy + dkv_partial));
    // Device d receives d KV chunks in forward.
    for (int d = 0; d < P; ++d) EXPECT_EQ(m.devices[d].recv_copy_bytes_fwd, d * kv_copy);
    EXPECT_DOUBLE_EQ(m.bytes_per_token(),
                     static_cast<double>(pairs * (2 * kv_copy + dkv_partial)) /
                         static_cast<double>(P * c));
    // Ring compute: device d has d full c x c tiles and one diagonal; the last one is busiest.
    const double total = static_cast<double>(P * c * (P * c + 1) / 2);
    const double last = static_cast<double>((P - 1) * c * c + c * (c + 1) / 2);
    EXPECT_NEAR(m.compute_imbalance, last / (total / static_cast<double>(P)), 1e-12);

    // Zigzag balances causal compute exactly when 2P divides L.
    const PlacedBatch zz = make_baseline(BaselineKind::Zigzag, batch, opts, cluster);
    EXPECT_NEAR(compute_metrics(zz.table, zz.placement, cluster).compute_imbalance, 1.0, 1e-12);
  }
}

TEST(Metrics, RejectsClusterOfAnotherSize) {
  const test::Case c = test::one_causal_case(4);
  const Cluster& cluster = c.cluster;
  const PlacedBatch pb = make_baseline(BaselineKind::Ring, c.batch, c.opts, cluster);
  Cluster other = cluster;
  other.devices_per_node = 2;
  EXPECT_THROW(compute_metrics(pb.table, pb.placement, other), Error);
}

}  // namespace
}  // namespace dcp
