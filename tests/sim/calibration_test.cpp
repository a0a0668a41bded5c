// The simulator's default calibration against measurements: with no calibration given, the
// h200-nvl and h100-sxm presets predict every one-GPU whole plan recorded on their card within
// 10 % (forward and backward), and their built-in values are those of their calibration files
// as they are now (embedded when the library is configured).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "dcp/blocks.h"
#include "dcp/cluster.h"
#include "dcp/error.h"
#include "dcp/io.h"
#include "dcp/partition.h"
#include "dcp/plan.h"
#include "dcp/sim.h"

namespace dcp {
namespace {

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << path;
  return nlohmann::json::parse(f);
}

// A Hopper preset, its built-in measured calibration, the file that holds the same values, and
// one-GPU whole plans measured on that card with the current kernels (the points file names its
// device call: the four masks of the benchmark's one-GPU plans at four block sizes).
struct MeasuredCard {
  const char* preset;
  Calibration (*built_in)();
  const char* calibration_file;
  const char* points_file;
};

const MeasuredCard kCards[] = {
    {"h200-nvl", &measured_h200_calibration, DCP_SOURCE_DIR "/data/calibration/h200_measured_subtiles.json",
     DCP_SOURCE_DIR "/tests/sim/data/h200_one_gpu_plans.json"},
    {"h100-sxm", &measured_h100_calibration, DCP_SOURCE_DIR "/data/calibration/h100_measured_subtiles.json",
     DCP_SOURCE_DIR "/tests/sim/data/h100_one_gpu_plans.json"},
};

// Each plan built as `dcp bench` builds it: DCP's placement on the preset, simulated with the
// calibration the preset gets when none is given.
TEST(SimCalibration, DefaultPredictsEveryMeasuredOneGpuPlanWithinTenPercent) {
  for (const MeasuredCard& card : kCards) {
    SCOPED_TRACE(card.preset);
    const nlohmann::json points = read_json(card.points_file);
    ASSERT_GE(points.at("plans").size(), 12u);
    Cluster cluster = cluster_preset(card.preset, 1);
    cluster.devices_per_node = 1;
    SimOptions so;
    so.calibration = calibration_from_cluster(cluster);  // the default path: no calibration given
    EXPECT_EQ(so.calibration.name, card.built_in().name);
    for (const nlohmann::json& p : points.at("plans")) {
      const std::string name = p.at("name").get<std::string>();
      const Batch batch = parse_batch(p.at("batch").dump(), name);
      BlockOptions bo;
      bo.block_size = p.at("block").get<int64_t>();
      const BlockTable table = build_block_table(batch, bo);
      PlanOptions po;
      po.schedule.num_comm_stages = p.at("stages").get<int>();
      po.outputs_in_place = p.value("outputs_in_place", false);
      const Plan plan = build_plan(table, place_dcp(table, cluster, {}).placement, cluster, po);
      const SimResult r = simulate(plan, cluster, so);
      const double fwd_ms = p.at("fwd_ms").get<double>(), bwd_ms = p.at("bwd_ms").get<double>();
      EXPECT_NEAR(r.fwd_s * 1e3 / fwd_ms, 1.0, 0.10) << name << ": forward " << r.fwd_s * 1e3 << " ms simulated, "
                                                     << fwd_ms << " ms measured";
      EXPECT_NEAR(r.bwd_s * 1e3 / bwd_ms, 1.0, 0.10) << name << ": backward " << r.bwd_s * 1e3 << " ms simulated, "
                                                     << bwd_ms << " ms measured";
    }
  }
}

TEST(SimCalibration, BuiltInIsItsCalibrationFile) {
  for (const MeasuredCard& card : kCards) {
    SCOPED_TRACE(card.preset);
    const Calibration file = load_calibration(card.calibration_file);
    const Calibration built = card.built_in();
    EXPECT_EQ(file.name, built.name);
    EXPECT_EQ(file.subtile_model, built.subtile_model);
    const double Calibration::*fields[] = {
        &Calibration::attn_fwd_flops,           &Calibration::attn_bwd_flops,
        &Calibration::tile_overhead_s,          &Calibration::launch_overhead_s,
        &Calibration::memory_bw,                &Calibration::fwd_diagonal_masked_cost,
        &Calibration::fwd_partial_masked_cost,  &Calibration::bwd_diagonal_masked_cost,
        &Calibration::bwd_partial_masked_cost,  &Calibration::fwd_empty_subtile_cost,
        &Calibration::bwd_empty_subtile_cost,   &Calibration::fwd_work_item_cost,
        &Calibration::bwd_work_item_cost};
    for (size_t i = 0; i < std::size(fields); ++i)
      EXPECT_DOUBLE_EQ(file.*fields[i], built.*fields[i]) << "field " << i << " of the list above";
  }
}

// The two cards' calibrations are their own: a preset never gets the other card's.
TEST(SimCalibration, EachHopperPresetGetsItsOwnCard) {
  EXPECT_EQ(calibration_from_cluster(cluster_preset("h100-sxm", 2)).name, measured_h100_calibration().name);
  EXPECT_EQ(calibration_from_cluster(cluster_preset("h200-nvl", 2)).name, measured_h200_calibration().name);
  EXPECT_NE(measured_h100_calibration().name, measured_h200_calibration().name);
}

// Only the preset's own kernel rates mark the measured kernels: a cluster that sets its rates,
// or another preset, keeps them.
TEST(SimCalibration, ClustersWithTheirOwnRatesKeepThem) {
  Cluster own = cluster_preset("h200-nvl", 1);
  own.attn_fwd_flops = 300e12;
  const Calibration c = calibration_from_cluster(own);
  EXPECT_FALSE(c.subtile_model);
  EXPECT_DOUBLE_EQ(c.attn_fwd_flops, 300e12);
  Cluster own_h100 = cluster_preset("h100-sxm", 1);
  own_h100.attn_bwd_flops = 400e12;
  EXPECT_FALSE(calibration_from_cluster(own_h100).subtile_model);
  const Calibration a100 = calibration_from_cluster(cluster_preset("a100-p4d", 1));
  EXPECT_FALSE(a100.subtile_model);
  EXPECT_DOUBLE_EQ(a100.attn_fwd_flops, cluster_preset("a100-p4d", 1).attn_fwd_flops);
}

TEST(SimCalibration, WorkItemCostsParseAndAreChecked) {
  const Calibration c = parse_calibration(R"({"fwd_work_item_cost":2.5,"bwd_work_item_cost":0})", "x.json");
  EXPECT_DOUBLE_EQ(c.fwd_work_item_cost, 2.5);
  EXPECT_THROW(parse_calibration(R"({"bwd_work_item_cost":-1})", "x.json"), Error);
  EXPECT_THROW(parse_calibration(R"({"fwd_work_item_cost":"2"})", "x.json"), Error);
  EXPECT_THROW(parse_calibration(R"({"name":3})", "x.json"), Error);
}

}  // namespace
}  // namespace dcp
