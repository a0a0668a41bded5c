// Kernel calibrations of the simulator: checks, JSON files and the measured defaults of presets.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "dcp/cluster.h"
#include "dcp/error.h"
#include "dcp/sim.h"
#include "measured_calibrations.h"

namespace dcp {
namespace {

// JSON field <-> member, with the factor from the file's unit to the member's.
struct NumberField {
  const char* key;
  double scale;
  double Calibration::*member;
};

constexpr NumberField kNumberFields[] = {
    {"attn_fwd_tflops", 1e12, &Calibration::attn_fwd_flops},
    {"attn_bwd_tflops", 1e12, &Calibration::attn_bwd_flops},
    {"tile_overhead_us", 1e-6, &Calibration::tile_overhead_s},
    {"launch_overhead_us", 1e-6, &Calibration::launch_overhead_s},
    {"memory_bw_GBps", 1e9, &Calibration::memory_bw},
    {"fwd_diagonal_efficiency", 1.0, &Calibration::fwd_diagonal_efficiency},
    {"fwd_partial_efficiency", 1.0, &Calibration::fwd_partial_efficiency},
    {"bwd_diagonal_efficiency", 1.0, &Calibration::bwd_diagonal_efficiency},
    {"bwd_partial_efficiency", 1.0, &Calibration::bwd_partial_efficiency},
    {"fwd_diagonal_masked_cost", 1.0, &Calibration::fwd_diagonal_masked_cost},
    {"fwd_partial_masked_cost", 1.0, &Calibration::fwd_partial_masked_cost},
    {"bwd_diagonal_masked_cost", 1.0, &Calibration::bwd_diagonal_masked_cost},
    {"bwd_partial_masked_cost", 1.0, &Calibration::bwd_partial_masked_cost},
    {"fwd_empty_subtile_cost", 1.0, &Calibration::fwd_empty_subtile_cost},
    {"bwd_empty_subtile_cost", 1.0, &Calibration::bwd_empty_subtile_cost},
    {"fwd_work_item_cost", 1.0, &Calibration::fwd_work_item_cost},
    {"bwd_work_item_cost", 1.0, &Calibration::bwd_work_item_cost},
};
// Text fields: documentation for the reader of the file, and the model's name.
constexpr const char* kTextFields[] = {"name", "source", "notes", "attention_cost_model"};

}  // namespace

void Calibration::validate(const std::string& where) const {
  auto require = [&](bool ok, double v, const char* field, const char* rule) {
    if (!ok) raise(ErrorKind::InvalidInput, where + ": " + field + " must be " + rule + " (got " + std::to_string(v) + ")");
  };
  auto positive = [&](double v, const char* field) { require(v > 0 && std::isfinite(v), v, field, "positive"); };
  auto fraction = [&](double v, const char* field) { require(v > 0 && v <= 1, v, field, "in (0, 1]"); };
  auto at_least_one = [&](double v, const char* field) { require(v >= 1 && std::isfinite(v), v, field, ">= 1"); };
  auto non_negative = [&](double v, const char* field) { require(v >= 0 && std::isfinite(v), v, field, ">= 0"); };
  positive(attn_fwd_flops, "attn_fwd_tflops");
  positive(attn_bwd_flops, "attn_bwd_tflops");
  positive(memory_bw, "memory_bw_GBps");
  if (tile_overhead_s < 0 || launch_overhead_s < 0)
    raise(ErrorKind::InvalidInput, where + ": overheads must be >= 0");
  fraction(fwd_diagonal_efficiency, "fwd_diagonal_efficiency");
  fraction(fwd_partial_efficiency, "fwd_partial_efficiency");
  fraction(bwd_diagonal_efficiency, "bwd_diagonal_efficiency");
  fraction(bwd_partial_efficiency, "bwd_partial_efficiency");
  at_least_one(fwd_diagonal_masked_cost, "fwd_diagonal_masked_cost");
  at_least_one(fwd_partial_masked_cost, "fwd_partial_masked_cost");
  at_least_one(bwd_diagonal_masked_cost, "bwd_diagonal_masked_cost");
  at_least_one(bwd_partial_masked_cost, "bwd_partial_masked_cost");
  non_negative(fwd_empty_subtile_cost, "fwd_empty_subtile_cost");
  non_negative(bwd_empty_subtile_cost, "bwd_empty_subtile_cost");
  non_negative(fwd_work_item_cost, "fwd_work_item_cost");
  non_negative(bwd_work_item_cost, "bwd_work_item_cost");
}

Calibration measured_h200_calibration() {
  // The persistent forward over runs of tiles sharing an output, the backward with cell classes of
  // Partial tiles and dK / dV added by TMA, both walking only the spans of allowed pairs, and plans
  // with outputs in place (the file names its sources and fit errors).
  static const Calibration c =
      parse_calibration(sim_detail::kH200MeasuredSubtilesJson, "data/calibration/h200_measured_subtiles.json (built in)");
  return c;
}

Calibration measured_h100_calibration() {
  // The same kernels on an H100 80GB HBM3, with the wide backward kernel for Full tiles. Its
  // backward's masked sub-tiles cost more than the H200 fit's: that fit predates the wide kernel,
  // which runs the full sub-tiles faster and leaves the masked ones as they were.
  static const Calibration c =
      parse_calibration(sim_detail::kH100MeasuredSubtilesJson, "data/calibration/h100_measured_subtiles.json (built in)");
  return c;
}

Calibration calibration_from_cluster(const Cluster& cluster) {
  // The preset's kernel rates mark a cluster that has not set its own: it runs the measured kernels.
  for (const auto& [preset, measured] : {std::pair{"h200-nvl", &measured_h200_calibration},
                                         std::pair{"h100-sxm", &measured_h100_calibration}}) {
    const Cluster p = cluster_preset(preset, 1);
    if (cluster.name == p.name && cluster.attn_fwd_flops == p.attn_fwd_flops &&
        cluster.attn_bwd_flops == p.attn_bwd_flops)
      return measured();
  }
  Calibration c;
  c.name = cluster.name;
  c.attn_fwd_flops = cluster.attn_fwd_flops;
  c.attn_bwd_flops = cluster.attn_bwd_flops;
  return c;
}

Calibration parse_calibration(const std::string& json_text, const std::string& source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {
    raise(ErrorKind::InvalidInput, source + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) raise(ErrorKind::InvalidInput, source + ": expected a JSON object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    // Named variables: lambdas may not capture structured bindings (clang 14 builds the fuzzers).
    const std::string& key = it.key();
    const nlohmann::json& value = it.value();
    const bool number = std::any_of(std::begin(kNumberFields), std::end(kNumberFields),
                                    [&](const NumberField& f) { return key == f.key; });
    const bool text = std::any_of(std::begin(kTextFields), std::end(kTextFields),
                                  [&](const char* k) { return key == k; });
    if (!number && !text) raise(ErrorKind::InvalidInput, source + ": unknown field '" + key + "'");
    if (number && !value.is_number()) raise(ErrorKind::InvalidInput, source + ": " + key + " must be a number");
    if (text && !value.is_string()) raise(ErrorKind::InvalidInput, source + ": " + key + " must be a string");
  }
  Calibration c;
  for (const NumberField& f : kNumberFields)
    if (j.contains(f.key)) c.*f.member = j[f.key].get<double>() * f.scale;
  if (j.contains("name")) c.name = j["name"].get<std::string>();
  if (j.contains("attention_cost_model")) {
    const std::string m = j["attention_cost_model"].get<std::string>();
    if (m != "area" && m != "subtiles")
      raise(ErrorKind::InvalidInput, source + ": attention_cost_model must be \"area\" or \"subtiles\"");
    c.subtile_model = m == "subtiles";
  }
  c.validate(source);
  return c;
}

Calibration load_calibration(const std::string& path) {
  std::ifstream f(path);
  if (!f) raise(ErrorKind::InvalidInput, path + ": cannot open calibration file");
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_calibration(ss.str(), path);
}

}  // namespace dcp
