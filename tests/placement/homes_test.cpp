// place_tiles_on_homes: token homes stay where they were put, tiles are balanced on them and the
// refinement never moves more bytes than its start.
#include <gtest/gtest.h>

#include <tuple>

#include "dcp/error.h"
#include "placement/fixtures.h"

namespace dcp {
namespace {

using placement_test::make_cluster;
using placement_test::random_batch;

// Starts for the tiles of `t` on the homes of `lead`: every tile on its query block's home (far
// from balance), or where the lead computes the same tile, else there (what plan_step_kinds does).
Placement tiles_at_query_homes(const BlockTable& t, const Placement& lead) {
  Placement p = lead;
  p.tile_device.assign(t.tiles.size(), 0);
  for (size_t i = 0; i < t.tiles.size(); ++i) p.tile_device[i] = lead.block_home[t.tiles[i].q_block];
  return p;
}
Placement tiles_at_lead_devices(const BlockTable& t, const BlockTable& lead_table, const Placement& lead) {
  Placement p = tiles_at_query_homes(t, lead);
  for (size_t i = 0, j = 0; i < t.tiles.size(); ++i) {
    const Tile& a = t.tiles[i];
    const auto key = [](const Tile& x) { return std::tuple(x.seq, x.head_group, x.q_block, x.kv_block); };
    while (j < lead_table.tiles.size() && key(lead_table.tiles[j]) < key(a)) ++j;
    if (j < lead_table.tiles.size() && key(lead_table.tiles[j]) == key(a)) p.tile_device[i] = lead.tile_device[j];
  }
  return p;
}

TEST(TilesOnHomes, KeepsEveryHomeAndMeetsEveryBound) {
  uint64_t seed = 40;
  for (const auto& [nodes, dpn] : {std::pair{1, 4}, std::pair{2, 4}, std::pair{4, 2}}) {
    const Cluster cluster = make_cluster(nodes, dpn);
    for (Mask mask : {Mask::lambda(16, 256), Mask::causal_blockwise(32, 2, 1), Mask::causal()}) {
      SCOPED_TRACE(std::to_string(nodes) + "x" + std::to_string(dpn) + " mask " + to_string(mask.kind));
      // Homes from a global (causal) layer's placement, the tiles of another kind on them.
      Batch lead = random_batch(++seed, 6000, 4, 2, Mask::causal());
      Batch kind = lead;
      for (Sequence& s : kind.sequences) s.mask = mask;
      BlockOptions bo;
      bo.block_size = 128;
      const BlockTable lead_table = build_block_table(lead, bo);
      const BlockTable table = build_block_table(kind, bo);
      PlacementOptions opts;
      const DcpPlacement homes = place_dcp(lead_table, cluster, opts);
      ASSERT_TRUE(homes.report.balanced());
      const Placement start = tiles_at_lead_devices(table, lead_table, homes.placement);
      const DcpPlacement out = place_tiles_on_homes(table, cluster, opts, start);
      out.placement.validate(table);
      EXPECT_EQ(out.placement.block_home, homes.placement.block_home);
      EXPECT_TRUE(out.report.balanced()) << out.report.violations.front();
      // Deterministic, and a balanced start is only ever improved.
      EXPECT_EQ(place_tiles_on_homes(table, cluster, opts, start).placement.tile_device, out.placement.tile_device);
      const DcpPlacement again = place_tiles_on_homes(table, cluster, opts, out.placement);
      EXPECT_LE(again.report.objective, out.report.objective * (1 + 1e-12));
      // From a start far from balance: compute is repaired first; what full memory still misses
      // is reported, as check_balance finds it.
      const DcpPlacement far = place_tiles_on_homes(table, cluster, opts, tiles_at_query_homes(table, homes.placement));
      EXPECT_EQ(far.placement.block_home, homes.placement.block_home);
      EXPECT_LE(far.report.compute_imbalance, 1 + opts.eps_compute + 1e-9);
      const PlacementHypergraph h = build_placement_hypergraph(table);
      PlacementReport check;
      EXPECT_EQ(check_balance(h, placement_to_parts(h, far.placement), cluster, opts, check), far.report.violations);
    }
  }
}

TEST(HomesForKinds, RefinesEveryKindsBytesTogetherKeepingHomesShared) {
  uint64_t seed = 70;
  for (const auto& [nodes, dpn] : {std::pair{2, 4}, std::pair{4, 2}}) {
    const Cluster cluster = make_cluster(nodes, dpn);
    Batch global = random_batch(++seed, 8000, 4, 2, Mask::causal());
    Batch window = global;
    for (Sequence& s : window.sequences) s.mask = Mask::lambda(16, 256);
    BlockOptions bo;
    bo.block_size = 128;
    const BlockTable tg = build_block_table(global, bo), tw = build_block_table(window, bo);
    PlacementOptions opts;
    const DcpPlacement lead = place_dcp(tg, cluster, opts);
    const DcpPlacement other = place_tiles_on_homes(tw, cluster, opts, tiles_at_lead_devices(tw, tg, lead.placement));
    const std::vector<double> layers = {1, 3};
    const std::vector<Placement> out =
        refine_homes_for_kinds({&tg, &tw}, layers, cluster, opts, {lead.placement, other.placement});
    ASSERT_EQ(out.size(), 2u);
    out[0].validate(tg);
    out[1].validate(tw);
    EXPECT_EQ(out[0].block_home, out[1].block_home);
    const PlacementHypergraph hg = build_placement_hypergraph(tg), hw = build_placement_hypergraph(tw);
    const auto objective = [&](const Placement& g, const Placement& w) {
      return layers[0] * connectivity_bytes(hg, placement_to_parts(hg, g), cluster).objective +
             layers[1] * connectivity_bytes(hw, placement_to_parts(hw, w), cluster).objective;
    };
    EXPECT_LE(objective(out[0], out[1]), objective(lead.placement, other.placement) * (1 + 1e-12));
    // Owned memory (the homes) stays within its bound.
    PlacementReport r;
    check_balance(hg, placement_to_parts(hg, out[0]), cluster, opts, r);
    EXPECT_LE(r.memory_imbalance, 1 + opts.eps_memory + 1e-9);
  }
  EXPECT_THROW(refine_homes_for_kinds({}, {}, make_cluster(1, 2), {}, {}), Error);
}

TEST(TilesOnHomes, BalancedStartOnlyImproves) {
  const Cluster cluster = make_cluster(2, 2);
  const Batch batch = random_batch(7, 5000, 4, 2, Mask::lambda(16, 256));
  BlockOptions bo;
  bo.block_size = 128;
  const BlockTable table = build_block_table(batch, bo);
  PlacementOptions opts;
  const DcpPlacement placed = place_dcp(table, cluster, opts);
  ASSERT_TRUE(placed.report.balanced());
  const DcpPlacement out = place_tiles_on_homes(table, cluster, opts, placed.placement);
  EXPECT_TRUE(out.report.balanced());
  EXPECT_EQ(out.placement.block_home, placed.placement.block_home);
  EXPECT_LE(out.report.objective, placed.report.objective + 1e-6);
}

TEST(TilesOnHomes, RefusesAStartOfAnotherDeviceCount) {
  const Batch batch = random_batch(3, 2000, 4, 2, Mask::causal());
  BlockOptions bo;
  bo.block_size = 128;
  const BlockTable table = build_block_table(batch, bo);
  const DcpPlacement placed = place_dcp(table, make_cluster(1, 2), {});
  try {
    place_tiles_on_homes(table, make_cluster(1, 4), {}, placed.placement);
    FAIL() << "expected InvalidInput";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
    EXPECT_NE(std::string(e.what()).find("2 devices, cluster 4"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dcp
