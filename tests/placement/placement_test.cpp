// Properties of the DCP placement against brute-force references.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <numeric>
#include <set>
#include <sstream>

#include "dcp/baselines.h"
#include "dcp/error.h"
#include "dcp/metrics.h"
#include "dcp/partition.h"
#include "placement/kway.h"
#include "placement/fixtures.h"

namespace dcp {
namespace {

using namespace placement_test;

// Independent recount: per (block, group) and (block, KV set) the set of devices touching it.
ConnectivityBytes brute_bytes(const BlockTable& t, const Placement& p, const Cluster& c) {
  std::map<std::pair<int, int>, std::set<int>> q_side, kv_side;
  for (size_t i = 0; i < t.tiles.size(); ++i) {
    const Tile& x = t.tiles[i];
    q_side[{x.q_block, x.head_group}].insert(p.tile_device[i]);
    kv_side[{x.kv_block, t.groups.kv_set(x.head_group)}].insert(p.tile_device[i]);
  }
  ConnectivityBytes out;
  auto count = [&](const auto& nets, bool q) {
    for (const auto& [key, devs] : nets) {
      const int64_t n = t.token_blocks[key.first].length;
      const int64_t bytes =
          q ? 2 * t.data_bytes(DataKind::Q, n) + t.partial_bytes(DataKind::O, n) +
                  2 * t.data_bytes(DataKind::LSE, n) + t.data_bytes(DataKind::dO, n) +
                  t.data_bytes(DataKind::Delta, n) + t.partial_bytes(DataKind::dQ, n)
            : 2 * t.data_bytes(DataKind::KV, n) + t.partial_bytes(DataKind::dKV, n);
      const int home = p.block_home[key.first];
      for (int d : devs) {
        if (d == home) continue;
        (c.node_of(d) == c.node_of(home) ? out.intra_bytes : out.inter_bytes) += bytes;
      }
    }
  };
  count(q_side, true);
  count(kv_side, false);
  return out;
}

struct Case {
  int nodes, dpn;
  int64_t tokens, block;
};

const Case kCases[] = {{1, 1, 2000, 64}, {1, 3, 3000, 64}, {2, 1, 3000, 64},
                       {3, 2, 6000, 128}, {2, 4, 8000, 128}, {4, 2, 8000, 64}};

TEST(Placement, EveryVertexPlacedOnceAndBytesMatchRecount) {
  uint64_t seed = 3;
  for (const Case& cs : kCases) {
    for (Mask mask : {Mask::causal(), Mask::full(), Mask::lambda(16, 256),
                      Mask::causal_blockwise(32, 2, 1)}) {
      const Batch batch = random_batch(++seed, cs.tokens, 4, 2, mask);
      const BlockTable table = build_block_table(batch, BlockOptions{.block_size = cs.block});
      const Cluster cluster = make_cluster(cs.nodes, cs.dpn);
      const DcpPlacement r = place_dcp(table, cluster);
      const Placement& p = r.placement;
      ASSERT_EQ(p.method, "dcp");
      ASSERT_EQ(p.tile_device.size(), table.tiles.size());
      ASSERT_EQ(p.block_home.size(), table.token_blocks.size());
      p.validate(table);
      const ConnectivityBytes b = brute_bytes(table, p, cluster);
      EXPECT_EQ(r.report.intra_bytes, b.intra_bytes);
      EXPECT_EQ(r.report.inter_bytes, b.inter_bytes);
      const PlacementMetrics m = compute_metrics(table, p, cluster);
      EXPECT_EQ(m.intra_bytes(), r.report.intra_bytes);
      EXPECT_EQ(m.inter_bytes(), r.report.inter_bytes);
      if (cs.nodes * cs.dpn == 1) {
        EXPECT_EQ(b.intra_bytes + b.inter_bytes, 0);
      }
    }
  }
}

TEST(Placement, SharedQuestionBytesMatchMetrics) {
  // Per-sequence masks (shared question needs the length), with both backends.
  uint64_t seed = 40;
  for (const Case& cs : kCases) {
    Batch batch = random_batch(++seed, cs.tokens, 4, 2, Mask::causal());
    for (Sequence& q : batch.sequences)
      if (q.length >= 5) q.mask = Mask::shared_question_for(q.length);
    const BlockTable table = build_block_table(batch, BlockOptions{.block_size = cs.block});
    const Cluster cluster = make_cluster(cs.nodes, cs.dpn);
    for (PartitionerKind kind : available_partitioners()) {
      PlacementOptions opts;
      opts.partitioner = kind;
      const DcpPlacement r = place_dcp(table, cluster, opts);
      r.placement.validate(table);
      const PlacementMetrics m = compute_metrics(table, r.placement, cluster);
      EXPECT_EQ(m.intra_bytes(), r.report.intra_bytes) << to_string(kind);
      EXPECT_EQ(m.inter_bytes(), r.report.inter_bytes) << to_string(kind);
    }
  }
}

TEST(Placement, FmAroundAVertexSetNeverWorsensAndStaysLocal) {
  // refine_fm_around: around every vertex it is refine_fm; around none it moves nothing; around
  // a few vertices it never worsens the objective and keeps the caps that hold.
  uint64_t seed = 90;
  for (int k : {2, 4}) {
    const Level level = whole_level_with_caps(random_batch(++seed, 5000, 4, 2, Mask::causal()), k, 1.1, 1.3);
    const placement::SubHypergraph& s = level.s;
    const placement::PartCaps& caps = level.caps;
    std::vector<int32_t> start(static_cast<size_t>(s.num_vertices()));
    uint64_t r = seed;
    for (int32_t& p : start) p = static_cast<int32_t>(next(r) % static_cast<uint64_t>(k));
    const bool fits = placement::repair_balance(s, caps, start);
    const double before = placement::sub_objective(s, start, k);
    std::vector<int32_t> all(static_cast<size_t>(s.num_vertices()));
    std::iota(all.begin(), all.end(), 0);
    std::vector<int32_t> everywhere = start, around_all = start, around_none = start, around_few = start;
    placement::refine_fm(s, caps, RefineOptions{}, seed, everywhere);
    placement::refine_fm_around(s, caps, RefineOptions{}, seed, around_all, all);
    EXPECT_EQ(around_all, everywhere) << "k=" << k;
    placement::refine_fm_around(s, caps, RefineOptions{}, seed, around_none, {});
    EXPECT_EQ(around_none, start) << "k=" << k;
    const std::vector<int32_t> few{0, s.num_vertices() / 2, s.num_vertices() - 1};
    placement::refine_fm_around(s, caps, RefineOptions{}, seed, around_few, few);
    EXPECT_LE(placement::sub_objective(s, around_few, k), before * (1 + 1e-12)) << "k=" << k;
    if (fits) {
      const PartLoads l = part_loads(s, around_few, k);
      for (int p = 0; p < k; ++p) {
        EXPECT_LE(l.c[p], caps.compute[p] * (1 + 1e-12));
        EXPECT_LE(l.m[p], caps.memory[p] * (1 + 1e-12));
      }
    }
  }
}

TEST(Placement, FmNeverWorsensAndKeepsCaps) {
  uint64_t seed = 70;
  for (int k : {2, 3, 5}) {
    for (Mask mask : {Mask::causal(), Mask::lambda(16, 256)}) {
      const Level level = whole_level_with_caps(random_batch(++seed, 5000, 4, 2, mask), k, 1.1, 1.3);
      const placement::SubHypergraph& s = level.s;
      const placement::PartCaps& caps = level.caps;
      // From the structured start and from a random one.
      for (int start = 0; start < 2; ++start) {
        std::vector<int32_t> part = placement::structured_initial(s, caps);
        if (start == 1) {
          uint64_t r = seed;
          for (int32_t& p : part) p = static_cast<int32_t>(next(r) % static_cast<uint64_t>(k));
        }
        for (int32_t p : part) ASSERT_TRUE(p >= 0 && p < k);
        const bool fits = placement::repair_balance(s, caps, part);
        const double before = placement::sub_objective(s, part, k);
        placement::refine_fm(s, caps, RefineOptions{.passes = 8}, seed, part);
        const double after = placement::sub_objective(s, part, k);
        EXPECT_LE(after, before * (1 + 1e-12)) << "k=" << k << " start=" << start;
        if (fits) {
          const PartLoads l = part_loads(s, part, k);
          for (int p = 0; p < k; ++p) {
            EXPECT_LE(l.c[p], caps.compute[p] * (1 + 1e-12));
            EXPECT_LE(l.m[p], caps.memory[p] * (1 + 1e-12));
          }
        }
      }
    }
  }
}

TEST(Placement, BalanceHoldsOrIsReported) {
  uint64_t seed = 11;
  for (const Case& cs : kCases) {
    const Batch batch = random_batch(++seed, cs.tokens, 4, 1, Mask::causal());
    const BlockTable table = build_block_table(batch, BlockOptions{.block_size = cs.block});
    const Cluster cluster = make_cluster(cs.nodes, cs.dpn);
    PlacementOptions opts;
    const DcpPlacement r = place_dcp(table, cluster, opts);
    const PlacementHypergraph h = build_placement_hypergraph(table);
    const int nd = cluster.num_devices();
    std::vector<double> c(nd, 0), m(nd, 0);
    double tc = 0, tm = 0;
    for (size_t i = 0; i < table.tiles.size(); ++i) {
      const double f = table.tile_flops_fwd(table.tiles[i]) * 3.5;
      c[r.placement.tile_device[i]] += f;
      tc += f;
    }
    for (int b = 0; b < table.num_token_blocks(); ++b) {
      const double x = static_cast<double>(h.memory_bytes[h.block_vertex(b)]);
      m[r.placement.block_home[b]] += x;
      tm += x;
    }
    // Everything a device holds, by compute_metrics (owned + received copies + partials).
    const PlacementMetrics pm = compute_metrics(table, r.placement, cluster);
    EXPECT_NEAR(r.report.full_memory_imbalance, pm.memory_imbalance, 1e-9);
    double tf = 0;
    for (const DeviceLoad& dl : pm.devices) tf += static_cast<double>(dl.memory_bytes);
    int violated = 0;
    for (int d = 0; d < nd; ++d) {
      violated += c[d] > (1 + opts.eps_compute) * tc / nd * (1 + 1e-9);
      violated += m[d] > (1 + opts.eps_memory) * tm / nd * (1 + 1e-9);
      violated += static_cast<double>(pm.devices[d].memory_bytes) >
                  (1 + opts.eps_memory) * tf / nd * (1 + 1e-9);
    }
    EXPECT_EQ(violated > 0, !r.report.balanced()) << r.placement.note;
    if (violated > 0) {
      EXPECT_NE(r.placement.note.find("VIOLATED"), std::string::npos);
    }
    // No node holds more token-block memory than its devices may hold together.
    if (r.report.balanced()) {
      for (int n = 0; n < cluster.nodes; ++n) {
        double node_m = 0;
        for (int d = n * cs.dpn; d < (n + 1) * cs.dpn; ++d) node_m += m[d];
        EXPECT_LE(node_m, cs.dpn * (1 + opts.eps_memory) * tm / nd * (1 + 1e-9));
      }
    }
  }
}

TEST(Placement, Deterministic) {
  const Batch batch = random_batch(5, 6000, 4, 2, Mask::causal());
  const BlockTable table = build_block_table(batch, BlockOptions{.block_size = 64});
  const Cluster cluster = make_cluster(2, 3);
  const DcpPlacement a = place_dcp(table, cluster), b = place_dcp(table, cluster);
  EXPECT_EQ(a.placement.tile_device, b.placement.tile_device);
  EXPECT_EQ(a.placement.block_home, b.placement.block_home);
}

// Exhaustive optimum over all balanced assignments of a tiny instance.
double enumerate_optimum(const PlacementHypergraph& h, const Cluster& c, const PlacementOptions& o) {
  const int nv = h.num_vertices(), k = c.num_devices();
  double tc = 0, tm = 0;
  for (int v = 0; v < nv; ++v) {
    tc += h.compute_flops[v];
    tm += static_cast<double>(h.memory_bytes[v]);
  }
  std::vector<int32_t> parts(nv, 0);
  double best = -1;
  int64_t total = 1;
  for (int v = 0; v < nv; ++v) total *= k;
  for (int64_t code = 0; code < total; ++code) {
    int64_t x = code;
    std::vector<double> lc(k, 0), lm(k, 0);
    for (int v = 0; v < nv; ++v) {
      parts[v] = static_cast<int32_t>(x % k);
      x /= k;
      lc[parts[v]] += h.compute_flops[v];
      lm[parts[v]] += static_cast<double>(h.memory_bytes[v]);
    }
    bool ok = true;
    for (int d = 0; d < k; ++d)
      ok = ok && lc[d] <= (1 + o.eps_compute) * tc / k * (1 + 1e-9) &&
           lm[d] <= (1 + o.eps_memory) * tm / k * (1 + 1e-9);
    if (!ok) continue;
    const double obj = connectivity_bytes(h, parts, c).objective;
    if (best < 0 || obj < best) best = obj;
  }
  return best;
}

TEST(Placement, TinyInstancesNearEnumeratedOptimum) {
  // Bound stated in the header of the test: within 1.5x of the optimum (equal in most cases).
  struct Tiny {
    std::vector<int64_t> lengths;
    int devices;
  };
  const Tiny tinies[] = {{{32, 32}, 2}, {{64}, 2}, {{16, 16, 32}, 2}, {{48}, 3}, {{16, 16, 16}, 3}};
  for (const Tiny& t : tinies) {
    Batch b;
    b.shape.q_heads = 1;
    b.shape.kv_heads = 1;
    b.shape.head_dim = 16;
    for (int64_t len : t.lengths) b.sequences.push_back(Sequence{len, Mask::causal(), ""});
    const BlockTable table = build_block_table(b, BlockOptions{.block_size = 16});
    const PlacementHypergraph h = build_placement_hypergraph(table);
    const Cluster cluster = make_cluster(1, t.devices);
    ASSERT_LE(std::pow(t.devices, h.num_vertices()), 2e5);
    PlacementOptions opts;
    opts.eps_compute = 0.5;
    opts.eps_memory = 0.5;
    const double opt = enumerate_optimum(h, cluster, opts);
    const DcpPlacement r = place_dcp(table, cluster, opts);
    if (opt < 0) continue;  // nothing balanced exists
    EXPECT_TRUE(r.report.balanced()) << r.placement.note;
    EXPECT_LE(r.report.objective, 1.5 * opt + 1e-6)
        << "optimum " << opt << ", " << t.lengths.size() << " sequences on " << t.devices;
  }
}

TEST(Placement, HgrRoundTrip) {
  const Batch batch = random_batch(9, 1500, 4, 2, Mask::causal());
  const BlockTable table = build_block_table(batch, BlockOptions{.block_size = 64});
  const Cluster cluster = make_cluster(2, 2);
  const DcpPlacement r = place_dcp(table, cluster);
  const PlacementHypergraph h = build_placement_hypergraph(table);
  std::stringstream hgr;
  write_hgr(h, HgrOptions{}, hgr);
  int64_t nets = 0, verts = 0, fmt_code = 0;
  hgr >> nets >> verts >> fmt_code;
  EXPECT_EQ(nets, h.num_nets());
  EXPECT_EQ(verts, h.num_vertices());
  EXPECT_EQ(fmt_code, 11);
  int lines = 0;
  std::string line;
  std::getline(hgr, line);
  while (std::getline(hgr, line)) ++lines;
  EXPECT_EQ(lines, h.num_nets() + h.num_vertices());

  const std::string path = ::testing::TempDir() + "dcp_placement_roundtrip.part";
  {
    std::ofstream out(path);
    write_partition(placement_to_parts(h, r.placement), out);
  }
  const Placement back = import_partition(table, path, cluster.num_devices());
  EXPECT_EQ(back.tile_device, r.placement.tile_device);
  EXPECT_EQ(back.block_home, r.placement.block_home);
  std::remove(path.c_str());
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return {};
}

TEST(Placement, BadInput) {
  const Batch batch = random_batch(2, 500, 2, 1, Mask::causal());
  const BlockTable table = build_block_table(batch, BlockOptions{.block_size = 64});
  PlacementOptions bad;
  bad.eps_compute = -0.1;
  EXPECT_NE(error_of([&] { place_dcp(table, make_cluster(1, 2), bad); }).find("eps_compute"),
            std::string::npos);
  bad = {};
  bad.eps_memory = -1;
  EXPECT_NE(error_of([&] { place_dcp(table, make_cluster(1, 2), bad); }).find("eps_memory"),
            std::string::npos);
  bad = {};
  bad.node_compute_eps_factor = -1;
  EXPECT_NE(error_of([&] { place_dcp(table, make_cluster(1, 2), bad); }).find("node_compute_eps_factor"),
            std::string::npos);
  bad = {};
  bad.candidate_refine_margin = std::nan("");
  EXPECT_NE(error_of([&] { place_dcp(table, make_cluster(1, 2), bad); }).find("candidate_refine_margin"),
            std::string::npos);
  bad = {};
  bad.initial_starts = 4;
  EXPECT_NE(error_of([&] { place_dcp(table, make_cluster(1, 2), bad); }).find("initial_starts"),
            std::string::npos);
  EXPECT_FALSE(error_of([&] { place_dcp(table, make_cluster(4, 0)); }).empty());
  EXPECT_NE(error_of([] { parse_partitioner("kahypar"); }).find("kahypar"), std::string::npos);

  std::istringstream short_file("0\n1\n");
  EXPECT_NE(error_of([&] { read_partition(short_file, "p.part", 3, 2); }).find("p.part:2"),
            std::string::npos);
  std::istringstream out_of_range("0\n5\n1\n");
  EXPECT_NE(error_of([&] { read_partition(out_of_range, "p.part", 3, 2); }).find("p.part:2: part id 5"),
            std::string::npos);
  std::istringstream junk("0\nx\n1\n");
  EXPECT_NE(error_of([&] { read_partition(junk, "p.part", 3, 2); }).find("p.part:2"),
            std::string::npos);
  std::istringstream too_many("0\n1\n1\n0\n");
  EXPECT_NE(error_of([&] { read_partition(too_many, "p.part", 3, 2); }).find("p.part:4"),
            std::string::npos);
}

TEST(Placement, MetisBackendValidAndMeasured) {
  const Batch batch = random_batch(4, 6000, 4, 2, Mask::causal());
  const BlockTable table = build_block_table(batch, BlockOptions{.block_size = 128});
  for (auto [nodes, dpn] : {std::pair{1, 1}, {1, 3}, {2, 2}, {3, 1}}) {
    const Cluster cluster = make_cluster(nodes, dpn);
    PlacementOptions opts;
    opts.partitioner = PartitionerKind::Metis;
    const DcpPlacement r = place_dcp(table, cluster, opts);
    r.placement.validate(table);
    const ConnectivityBytes b = brute_bytes(table, r.placement, cluster);
    EXPECT_EQ(r.report.intra_bytes, b.intra_bytes);
    EXPECT_EQ(r.report.inter_bytes, b.inter_bytes);
    EXPECT_EQ(r.report.partitioner, "metis");
  }
}

TEST(Placement, ZoltanBackendValidAndMeasured) {
  const auto avail = available_partitioners();
  const bool built = std::find(avail.begin(), avail.end(), PartitionerKind::Zoltan) != avail.end();
  const Batch batch = random_batch(5, 6000, 4, 2, Mask::causal());
  const BlockTable table = build_block_table(batch, BlockOptions{.block_size = 128});
  PlacementOptions opts;
  opts.partitioner = PartitionerKind::Zoltan;
  if (!built) {
    EXPECT_THROW(place_dcp(table, make_cluster(2, 2), opts), Error);
    GTEST_SKIP() << "this build has no Zoltan";
  }
  for (auto [nodes, dpn] : {std::pair{1, 1}, {1, 3}, {2, 2}, {3, 1}, {2, 3}}) {
    const Cluster cluster = make_cluster(nodes, dpn);
    const DcpPlacement r = place_dcp(table, cluster, opts);
    r.placement.validate(table);
    const ConnectivityBytes b = brute_bytes(table, r.placement, cluster);
    EXPECT_EQ(r.report.intra_bytes, b.intra_bytes);
    EXPECT_EQ(r.report.inter_bytes, b.inter_bytes);
    const PlacementMetrics m = compute_metrics(table, r.placement, cluster);
    EXPECT_EQ(m.intra_bytes(), r.report.intra_bytes);
    EXPECT_EQ(m.inter_bytes(), r.report.inter_bytes);
    EXPECT_EQ(r.report.partitioner, "zoltan");
    // Deterministic: a second run gives the same placement.
    const DcpPlacement again = place_dcp(table, cluster, opts);
    EXPECT_EQ(again.placement.tile_device, r.placement.tile_device);
    EXPECT_EQ(again.placement.block_home, r.placement.block_home);
  }
}

TEST(Placement, FullMemoryMatchesMetricsAndHolds) {
  // full_memory_bytes equals compute_metrics' per-device memory for any placement (here: DCP
  // with each backend and a random one), and DCP keeps it within (1 + eps_memory) x mean.
  uint64_t seed = 90;
  int balanced = 0, total = 0;
  for (const Case& cs : kCases) {
    for (Mask mask : {Mask::causal(), Mask::lambda(16, 256)}) {
      const Batch batch = random_batch(++seed, cs.tokens, 4, 2, mask);
      const BlockTable table = build_block_table(batch, BlockOptions{.block_size = cs.block});
      const Cluster cluster = make_cluster(cs.nodes, cs.dpn);
      const PlacementHypergraph h = build_placement_hypergraph(table);
      std::vector<int32_t> random_parts(static_cast<size_t>(h.num_vertices()));
      uint64_t st = seed;
      for (auto& p : random_parts) p = static_cast<int32_t>(next(st) % cluster.num_devices());
      const Placement rnd = parts_to_placement(h, random_parts, cluster.num_devices(), "random");
      const PlacementMetrics mr = compute_metrics(table, rnd, cluster);
      const std::vector<int64_t> fr = full_memory_bytes(h, random_parts, cluster.num_devices());
      for (int d = 0; d < cluster.num_devices(); ++d) EXPECT_EQ(fr[d], mr.devices[d].memory_bytes);
      for (PartitionerKind kind : available_partitioners()) {
        PlacementOptions opts;
        opts.partitioner = kind;
        const DcpPlacement r = place_dcp(table, cluster, opts);
        const PlacementMetrics m = compute_metrics(table, r.placement, cluster);
        const std::vector<int64_t> f =
            full_memory_bytes(h, placement_to_parts(h, r.placement), cluster.num_devices());
        for (int d = 0; d < cluster.num_devices(); ++d) EXPECT_EQ(f[d], m.devices[d].memory_bytes);
        EXPECT_NEAR(r.report.full_memory_imbalance, m.memory_imbalance, 1e-9);
        const bool full_ok = m.memory_imbalance <= 1 + opts.eps_memory + 1e-9;
        if (!full_ok) {
          bool listed = false;
          for (const auto& v : r.report.violations)
            listed = listed || v.find("received copies") != std::string::npos;
          EXPECT_TRUE(listed) << to_string(kind);
        }
        if (kind == PartitionerKind::Builtin) {
          ++total;
          balanced += full_ok ? 1 : 0;
        }
      }
    }
  }
  // The built-in partitioner meets the full-memory bound on most of these small instances
  // (a few have too few token blocks per device for any placement to).
  EXPECT_GE(balanced * 4, total * 3) << balanced << " of " << total;
}

TEST(Placement, HeldDeltaMatchesRecount) {
  // The incremental full-memory change of a move equals recounting before and after.
  const Batch batch = random_batch(17, 3000, 4, 2, Mask::causal());
  const BlockTable table = build_block_table(batch, BlockOptions{.block_size = 64});
  const PlacementHypergraph h = build_placement_hypergraph(table);
  placement::SubHypergraph s = whole_level(table, h);
  for (int32_t e = 0; e < h.num_nets(); ++e) {
    s.net_held.push_back(static_cast<double>(h.held_bwd_bytes[e]));
    // Every third net pretends its home is outside the level.
    s.net_home.push_back(e % 3 == 0 ? -1 : h.pins[h.net_begin[e]]);
  }
  const int k = 4;
  uint64_t st = 5;
  std::vector<int32_t> part(static_cast<size_t>(s.num_vertices()));
  for (auto& p : part) p = static_cast<int32_t>(next(st) % k);
  auto counts = [&] {
    std::vector<int32_t> c(static_cast<size_t>(s.num_nets()) * k, 0);
    for (int32_t e = 0; e < s.num_nets(); ++e)
      for (int64_t i = s.net_begin[e]; i < s.net_begin[e + 1]; ++i)
        ++c[static_cast<size_t>(e) * k + part[s.pins[i]]];
    return c;
  };
  for (int trial = 0; trial < 300; ++trial) {
    const auto v = static_cast<int32_t>(next(st) % static_cast<uint64_t>(s.num_vertices()));
    const int32_t from = part[v];
    const auto to = static_cast<int32_t>((from + 1 + static_cast<int32_t>(next(st) % (k - 1))) % k);
    const std::vector<int32_t> c = counts();
    const std::vector<double> before = placement::full_loads(s, c, k, part);
    double d_from = 0, d_to = 0;
    placement::held_delta(s, c.data(), k, part, v, from, to, d_from, d_to);
    part[v] = to;
    const std::vector<double> after = placement::full_loads(s, counts(), k, part);
    EXPECT_NEAR(after[from] - before[from], d_from, 1e-6);
    EXPECT_NEAR(after[to] - before[to], d_to, 1e-6);
  }
}

TEST(Placement, PortfolioNeverWorseThanOneStart) {
  // More starts keep the best refined one, so a level's objective never grows (when both meet
  // the capacities), and every capacity still holds.
  uint64_t seed = 120;
  for (int k : {2, 3, 4}) {
    for (Mask mask : {Mask::causal(), Mask::lambda(16, 256), Mask::causal_blockwise(32, 2, 1)}) {
      const Level level = whole_level_with_caps(random_batch(++seed, 5000, 4, 2, mask), k, 1.1, 1.2);
      const placement::SubHypergraph& s = level.s;
      const placement::PartCaps& caps = level.caps;
      const auto one = placement::make_builtin_partitioner(1, MultilevelOptions{})->partition(s, caps, 1, RefineOptions{});
      const auto three = placement::make_builtin_partitioner(3, MultilevelOptions{})->partition(s, caps, 1, RefineOptions{});
      const bool one_ok = within_caps(part_loads(s, one, k), caps);
      const bool three_ok = within_caps(part_loads(s, three, k), caps);
      EXPECT_TRUE(three_ok || !one_ok);
      if (three_ok == one_ok) {
        EXPECT_LE(placement::sub_objective(s, three, k), placement::sub_objective(s, one, k) * (1 + 1e-9));
      }
    }
  }
}

TEST(Placement, GroupSplitPutsEachHeadGroupOnItsPart) {
  // Two head groups over two parts: every tile lands on its group's part, so the compute splits
  // in exact halves and no KV net is read by both parts; every token block gets one part.
  Batch batch;
  batch.shape.q_heads = 4;
  batch.shape.kv_heads = 2;
  batch.shape.head_dim = 64;
  batch.sequences.push_back(Sequence{.length = 2000, .mask = Mask::shared_question_for(2000), .id = ""});
  batch.sequences.push_back(Sequence{.length = 700, .mask = Mask::causal(), .id = ""});
  const Level level = whole_level_with_caps(batch, 2, 1.1, 1.2);
  const placement::SubHypergraph& s = level.s;
  const double tc = level.total_compute;
  const auto part = placement::structured_initial(s, level.caps, placement::InitialStrategy::GroupSplit);
  ASSERT_EQ(part.size(), static_cast<size_t>(s.num_vertices()));
  double c0 = 0;
  for (int32_t v = 0; v < s.num_vertices(); ++v) {
    ASSERT_TRUE(part[v] == 0 || part[v] == 1);
    if (s.group[v] >= 0) {
      EXPECT_EQ(part[v], s.group[v]);
    }
    if (part[v] == 0) c0 += s.compute[v];
  }
  EXPECT_NEAR(c0, tc / 2, 1e-9 * tc);
}

TEST(Placement, SharedBandsCandidateOnOneLongSequence) {
  // One causal sequence cut over 5..8 parts (where bands shared by 2-3 parts are tried): every
  // vertex gets one part in range, the start is never costlier than Best's (a superset of its
  // candidates, costed exactly), and the node-level portfolio (Best and SharedBands, each
  // repaired and refined) meets the capacities and is never worse than Best alone.
  for (int k : {5, 6, 8}) {
    Batch batch;
    batch.shape.q_heads = 4;
    batch.shape.kv_heads = 2;
    batch.shape.head_dim = 64;
    batch.sequences.push_back(Sequence{.length = 3000 + 200 * k, .mask = Mask::causal(), .id = ""});
    const Level level = whole_level_with_caps(batch, k, 1.1, 1.5, 2);
    const placement::SubHypergraph& s = level.s;
    const placement::PartCaps& caps = level.caps;
    const auto best = placement::structured_initial(s, caps, placement::InitialStrategy::Best);
    const auto shared = placement::structured_initial(s, caps, placement::InitialStrategy::SharedBands);
    ASSERT_EQ(shared.size(), static_cast<size_t>(s.num_vertices()));
    for (int32_t p : shared) ASSERT_TRUE(p >= 0 && p < k);
    EXPECT_LE(placement::sub_objective(s, shared, k), placement::sub_objective(s, best, k) * (1 + 1e-9))
        << "k=" << k;
    // Best alone, repaired and refined, against the portfolio the built-in runs at this level.
    std::vector<int32_t> alone = best;
    const bool alone_ok = placement::repair_balance(s, caps, alone);
    placement::refine_fm(s, caps, RefineOptions{}, 1, alone);
    const auto port = placement::make_builtin_partitioner(2, MultilevelOptions{})->partition(s, caps, 1, RefineOptions{});
    const bool ok = within_caps(part_loads(s, port, k), caps, 1e-12);
    EXPECT_TRUE(ok || !alone_ok) << "k=" << k;
    if (ok && alone_ok) {
      EXPECT_LE(placement::sub_objective(s, port, k), placement::sub_objective(s, alone, k) * (1 + 1e-9));
    }
  }
}

TEST(Placement, SharedBandsEqualsBestWhereBestReportsNoWideCut) {
  // Best reports whether it cut a sequence over kSharedBandsMinParts or more parts in more than
  // two rows (where SharedBands tries shared bands; the portfolio builds SharedBands only then):
  // one long causal sequence over 2..8 parts is such a cut exactly from 5 parts on, and where
  // Best reports none, SharedBands makes the same placement; a batch of short sequences that
  // fit whole is never cut.
  for (int k = 2; k <= 8; ++k) {
    for (const bool short_ones : {false, true}) {
      Batch batch;
      batch.shape.q_heads = 4;
      batch.shape.kv_heads = 2;
      batch.shape.head_dim = 64;
      if (short_ones) {
        for (int i = 0; i < 4 * k; ++i)
          batch.sequences.push_back(Sequence{.length = 300, .mask = Mask::causal(), .id = ""});
      } else {
        batch.sequences.push_back(Sequence{.length = 3000 + 200 * k, .mask = Mask::causal(), .id = ""});
      }
      const Level level = whole_level_with_caps(batch, k, 1.1, 1.5, 2);
      bool apply = !short_ones && k < placement::kSharedBandsMinParts;  // set to the opposite of the expectation
      const auto best = placement::structured_initial(level.s, level.caps, placement::InitialStrategy::Best, &apply);
      EXPECT_EQ(apply, !short_ones && k >= placement::kSharedBandsMinParts) << "k=" << k << " short=" << short_ones;
      if (!apply) {
        EXPECT_EQ(placement::structured_initial(level.s, level.caps, placement::InitialStrategy::SharedBands), best)
            << "k=" << k << " short=" << short_ones;
      }
    }
  }
}

TEST(Placement, BestAndSharedBandsBuiltTogetherEqualTheirOwnRuns) {
  // structured_best_and_shared shares Best's cuts with SharedBands up to the first sequence a
  // shared band wins, then runs each on its own: both placements and both shared-bands flags
  // equal separate structured_initial calls, on batches where a long sequence is cut over many
  // parts (a shared band can win there) followed by shorter ones.
  int diverged = 0;
  for (int k : {2, 5, 6, 8}) {
    for (uint64_t seed : {3u, 4u}) {
      Batch batch = random_batch(seed, 1500 * static_cast<int64_t>(k), 4, 2, Mask::causal());
      batch.sequences.insert(batch.sequences.begin(),
                             Sequence{.length = 3000 + 200 * k, .mask = Mask::causal(), .id = ""});
      const Level level = whole_level_with_caps(batch, k, 1.1, 1.5, 2);
      bool apply_best = false, apply_shared = false;
      const auto best = placement::structured_initial(level.s, level.caps, placement::InitialStrategy::Best, &apply_best);
      const auto shared =
          placement::structured_initial(level.s, level.caps, placement::InitialStrategy::SharedBands, &apply_shared);
      std::vector<int32_t> shared_together;
      bool together_best = !apply_best, together_shared = !apply_shared;
      const auto best_together = placement::structured_best_and_shared(level.s, level.caps, shared_together,
                                                                       &together_best, &together_shared);
      EXPECT_EQ(best_together, best) << "k=" << k << " seed=" << seed;
      EXPECT_EQ(shared_together, shared) << "k=" << k << " seed=" << seed;
      EXPECT_EQ(together_best, apply_best) << "k=" << k << " seed=" << seed;
      EXPECT_EQ(together_shared, apply_shared) << "k=" << k << " seed=" << seed;
      diverged += best != shared ? 1 : 0;
    }
  }
  EXPECT_GT(diverged, 0);  // some batch took the path where the two go on apart
}

TEST(Placement, EightNodesOneLongSequencePlacedOnceBalancedAndCounted) {
  // The dry-run shape in small: 8 nodes x 2 devices, one long causal sequence and a few short
  // ones; the node level tries shared bands (8 parts) and the auto node compute factor (0.75).
  for (uint64_t seed : {5u, 6u}) {
    Batch batch = random_batch(seed, 3000, 4, 2, Mask::causal());
    batch.sequences.push_back(Sequence{.length = 6000, .mask = Mask::causal(), .id = ""});
    const BlockTable table = build_block_table(batch, BlockOptions{.block_size = 64});
    const Cluster cluster = make_cluster(8, 2);
    const DcpPlacement r = place_dcp(table, cluster);
    r.placement.validate(table);
    ASSERT_EQ(r.placement.tile_device.size(), table.tiles.size());
    ASSERT_EQ(r.placement.block_home.size(), table.token_blocks.size());
    const ConnectivityBytes b = brute_bytes(table, r.placement, cluster);
    EXPECT_EQ(r.report.intra_bytes, b.intra_bytes);
    EXPECT_EQ(r.report.inter_bytes, b.inter_bytes);
    EXPECT_TRUE(r.report.balanced()) << r.report.violations.front();
    EXPECT_LE(r.report.compute_imbalance, 1.1 + 1e-9);
    EXPECT_LE(r.report.memory_imbalance, 1.2 + 1e-9);
    EXPECT_LE(r.report.full_memory_imbalance, 1.2 + 1e-9);
  }
}

TEST(Placement, CornerSplitBeatsNodeZigzagOnOneCausalSequence) {
  // The hard dry-run batch: one causal sequence of 64 token blocks over 8 nodes x 2, where memory
  // fixes every node's home share (8 blocks) and a2a_p2p's node-level zigzag was what the
  // partitioner found (round 5). The corner split (round 11) places it under every bound at about
  // 0.89 of a2a_p2p's inter-node bytes (bench/causal_layouts).
  for (const int blocks : {32, 64}) {
    Batch batch;
    batch.shape = {.q_heads = 8, .kv_heads = 2, .head_dim = 128, .dtype = DType::BF16};
    batch.sequences.push_back(Sequence{.length = int64_t{blocks} * 1024, .mask = Mask::causal(), .id = ""});
    const BlockOptions bo{.block_size = 1024};
    const BlockTable table = build_block_table(batch, bo);
    const Cluster cluster = make_cluster(8, 2);
    const DcpPlacement r = place_dcp(table, cluster);
    r.placement.validate(table);
    EXPECT_TRUE(r.report.balanced()) << r.report.violations.front();
    EXPECT_LE(r.report.compute_imbalance, 1.1 + 1e-9);
    EXPECT_LE(r.report.full_memory_imbalance, 1.2 + 1e-9);
    EXPECT_EQ(r.report.inter_bytes, compute_metrics(table, r.placement, cluster).inter_bytes());
    const PlacedBatch a2a = make_baseline(BaselineKind::A2AP2P, batch, bo, cluster);
    const int64_t static_bytes = compute_metrics(a2a.table, a2a.placement, cluster).inter_bytes();
    EXPECT_LT(static_cast<double>(r.report.inter_bytes), 0.95 * static_cast<double>(static_bytes))
        << "blocks=" << blocks;
  }
}

TEST(Placement, SharedQuestionPrefixSpreadMeetsCapsWithHomesByTheirRows) {
  // One shared-question sequence (question 20 %, 4 answers) cut over 8 parts. With the device
  // tolerances (compute 1.1, memory 1.2 x mean) the Best start (which includes the prefix spread)
  // fits both caps. With the dry-run node-level ones (compute 1.075, memory 1.1: exactly 8 token
  // blocks per part) plain row bands put the light question rows together and overflow memory on
  // the last part; the start must now keep memory (compute may overflow by row granularity;
  // repair and FM fix that). Every question row is computed where its token block lives.
  struct Tol {
    int64_t length;
    double compute, memory;
    bool check_compute;
  };
  for (const Tol tol : {Tol{3840, 1.1, 1.2, true}, Tol{4096, 1.075, 1.1, false}}) {
    const int64_t length = tol.length;
    Batch batch;
    batch.shape.q_heads = 4;
    batch.shape.kv_heads = 2;
    batch.shape.head_dim = 64;
    batch.sequences.push_back(
        Sequence{.length = length, .mask = Mask::shared_question_for(length), .id = ""});
    const int k = 8;
    const Level level = whole_level_with_caps(batch, k, tol.compute, tol.memory, 2);
    const BlockTable& table = level.table;
    const placement::SubHypergraph& s = level.s;
    const placement::PartCaps& caps = level.caps;
    const auto part = placement::structured_initial(s, caps, placement::InitialStrategy::Best);
    ASSERT_EQ(part.size(), static_cast<size_t>(s.num_vertices()));
    for (int32_t v = 0; v < s.num_vertices(); ++v) ASSERT_TRUE(part[v] >= 0 && part[v] < k);
    const PartLoads l = part_loads(s, part, k);
    for (int p = 0; p < k; ++p) {
      if (tol.check_compute) {
        EXPECT_LE(l.c[p], caps.compute[p] * (1 + 1e-12)) << "length " << length << " part " << p;
      }
      EXPECT_LE(l.m[p], caps.memory[p] * (1 + 1e-12)) << "length " << length << " part " << p;
    }
    // Question rows (token blocks wholly inside the question) sit with their home.
    const int64_t question = batch.sequences[0].mask.question;
    std::map<int32_t, int32_t> home_part;
    for (int32_t v = 0; v < s.num_vertices(); ++v)
      if (s.group[v] < 0) home_part[s.row[v]] = part[v];
    for (int32_t v = 0; v < s.num_vertices(); ++v) {
      if (s.group[v] < 0) continue;
      const TokenBlock& b = table.token_blocks[static_cast<size_t>(s.row[v])];
      if (b.begin + b.length <= question) {
        EXPECT_EQ(part[v], home_part[s.row[v]]) << "row " << s.row[v];
      }
    }
  }
  // The whole driver on the dry-run shape: placed once, bytes equal the brute recount, balanced.
  Batch batch = random_batch(9, 2000, 4, 2, Mask::full());
  for (Sequence& q : batch.sequences) q.mask = Mask::shared_question_for(q.length);
  batch.sequences.push_back(Sequence{.length = 6000, .mask = Mask::shared_question_for(6000), .id = ""});
  const BlockTable table = build_block_table(batch, BlockOptions{.block_size = 64});
  const Cluster cluster = make_cluster(8, 2);
  const DcpPlacement r = place_dcp(table, cluster);
  r.placement.validate(table);
  const ConnectivityBytes b = brute_bytes(table, r.placement, cluster);
  EXPECT_EQ(r.report.inter_bytes, b.inter_bytes);
  EXPECT_EQ(r.report.intra_bytes, b.intra_bytes);
  EXPECT_TRUE(r.report.balanced()) << r.report.violations.front();
}

}  // namespace
}  // namespace dcp
