// fit_calibration — fits the simulator's sub-tile kernel model (src/sim/kernel_cost.h) to
// measured times: whole one-GPU plans (`dcp bench` on one GPU) and the kernel benchmark's tile
// lists (bench_cuda_attention). Prints every point's error and the fitted calibration as JSON;
// bench/README.md says how a refit lands in data/calibration/ and in the simulator's default.
//
// Model, per pass: time = fixed + units x (one full sub-tile's FLOPs) / rate, where fixed is the
// launch overheads, merges and copies (priced as the simulator does) and
//   units = full + m_diag x diagonal-masked + m_part x partial-masked + e x empty + c x items
// (AttendWork). In seconds per unit that is linear in (u_full, u_diag, u_part, u_empty, u_item),
// so the fit is a weighted linear least squares on relative errors: each point weighs
// 1 / measured^2, a whole plan --plan-weight times more than a kernel list, since whole plans are
// what the simulator predicts. Bounds (masked costs >= 1, empty and item costs >= 0) are kept by
// fixing a violating parameter at its bound and refitting the others; --pin fixes one by hand.
//
// Inputs:
//   --plans FILE    {"plans": [{"name", "block", "stages", "outputs_in_place", "fwd_ms", "bwd_ms",
//                   "batch": {batch JSON}}]}
//                   (tests/sim/data/h200_one_gpu_plans.json; bench/calibration_points.py writes it)
//   --kernels FILE  bench_cuda_attention JSON ({"q_heads", "kv_heads", "head_dim", "rows": [{"seq",
//                   "block", "list", "fwd_<route>_ms", "bwd_<route>_ms"}]}); lists rebuilt as that
//                   benchmark builds them: one causal sequence of `seq` tokens cut into blocks, every
//                   tile its own output
//   --cluster NAME  the preset the plans are built on and whose measured calibration is the
//                   default base: h200-nvl (default) or h100-sxm, the card the points ran on
//   --base FILE     calibration whose other fields (launch overhead, memory bandwidth) are kept
//                   (default: the cluster's built-in measured calibration)
//   --route NAME    the benchmark's column to fit (default wgmma-runs: the lists issued as runs of
//                   tiles sharing q rows, as the CUDA backend issues plans whose outputs accumulate
//                   in place; wgmma-persistent: every tile its own output)
//   --plan-weight W weight of a whole plan against one kernel list (default 8)
//   --pin fwd_work_item_cost=0   keeps one cost of one pass out of the fit (repeatable)
//   --work          also prints what each point asks of the kernels
// Usage: fit_calibration --plans FILE [--kernels FILE] [--cluster NAME] [--route NAME] [--base FILE]
//        [--plan-weight W] [--pin K=V] [--work]
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "dcp/blocks.h"
#include "dcp/cluster.h"
#include "dcp/error.h"
#include "dcp/io.h"
#include "dcp/partition.h"
#include "dcp/plan.h"
#include "dcp/sim.h"
#include "sim/kernel_cost.h"

namespace {

using dcp::Pass;
using dcp::sim_detail::AttendWork;

// Columns of the fit: the full sub-tile (the rate), then the costs in full sub-tiles.
constexpr size_t kParams = 5;
using Vec = std::array<double, kParams>;
constexpr const char* kCostNames[kParams] = {nullptr, "diagonal_masked_cost", "partial_masked_cost",
                                             "empty_subtile_cost", "work_item_cost"};
constexpr double kLowerBound[kParams] = {0.0, 1.0, 1.0, 0.0, 0.0};  // of the cost (u_k / u_full)

Vec columns(const AttendWork& w) { return {w.full, w.diagonal_masked, w.partial_masked, w.empty, w.items}; }

struct Point {
  std::string name;
  bool plan = false;         // a whole plan (else a kernel list)
  Vec x[2]{};                // work per pass (forward, backward)
  double fixed_s[2] = {0, 0};  // what the fit does not touch: launch overheads, merges, copies
  double measured_s[2] = {0, 0};
  double flops_per_unit[2] = {0, 0};  // one full sub-tile, this shape
};

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  if (!f) dcp::raise(dcp::ErrorKind::InvalidInput, path + ": cannot open");
  try {
    return nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    dcp::raise(dcp::ErrorKind::InvalidInput, path + ": not valid JSON (" + e.what() + ")");
  }
}

// Work and fixed time of a one-device program, per pass, priced as the simulator prices them.
void add_program(const dcp::Plan& plan, const dcp::Calibration& base, Point& p) {
  dcp::sim_detail::AttendCost cost(plan.table, base);
  for (int pi = 0; pi < 2; ++pi) {
    const Pass pass = pi == 0 ? Pass::Forward : Pass::Backward;
    const dcp::Program& program = pi == 0 ? plan.devices[0].fwd : plan.devices[0].bwd;
    AttendWork total;
    for (size_t pc = 0; pc < program.code.size(); ++pc) {
      if (const auto* a = std::get_if<dcp::Attend>(&program.code[pc])) {
        total += cost.work(*a, pass);
        p.fixed_s[pi] += base.launch_overhead_s + base.tile_overhead_s * static_cast<double>(a->tiles.size());
      } else {
        p.fixed_s[pi] += dcp::instruction_time_s(plan, program.code[pc], pass, base) -
                         (dcp::sim_detail::joins_merge_batch(program, pc) ? base.launch_overhead_s : 0.0);
      }
    }
    p.x[pi] = columns(total);
    p.flops_per_unit[pi] = dcp::sim_detail::subtile_flops(plan.table, pass);
  }
}

// A whole plan as `dcp bench` builds it on one GPU: DCP's placement on the cluster's preset.
Point plan_point(const nlohmann::json& j, const std::string& preset, const dcp::Calibration& base) {
  Point p;
  p.name = j.at("name").get<std::string>();
  p.plan = true;
  const dcp::Batch batch = dcp::parse_batch(j.at("batch").dump(), p.name);
  dcp::BlockOptions bo;
  bo.block_size = j.at("block").get<int64_t>();
  const dcp::BlockTable table = dcp::build_block_table(batch, bo);
  dcp::Cluster cluster = dcp::cluster_preset(preset, 1);
  cluster.devices_per_node = 1;
  dcp::PlanOptions po;
  po.schedule.num_comm_stages = j.at("stages").get<int>();
  po.outputs_in_place = j.value("outputs_in_place", false);
  const dcp::Plan plan = dcp::build_plan(table, dcp::place_dcp(table, cluster, {}).placement, cluster, po);
  add_program(plan, base, p);
  p.measured_s[0] = j.at("fwd_ms").get<double>() * 1e-3;
  p.measured_s[1] = j.at("bwd_ms").get<double>() * 1e-3;
  return p;
}

// A kernel-benchmark list as one Attend, issued as the route issues it: under wgmma-runs the tiles
// of one q block write one output (one forward run per q block, as the backend issues a list whose
// outputs accumulate in place), under the other routes each tile its own. The `partial` and
// `window` lists run every tile through the general mask path.
Point kernel_point(const nlohmann::json& row, const dcp::AttentionShape& shape, const dcp::Calibration& base,
                   const std::string& route) {
  const int64_t seq = row.at("seq").get<int64_t>(), block = row.at("block").get<int64_t>();
  const std::string list = row.at("list").get<std::string>();
  constexpr int64_t kWindow = 4096;  // bench_cuda_attention's window list
  dcp::Batch batch;
  batch.shape = shape;
  batch.sequences.push_back({seq, list == "window" ? dcp::Mask::lambda(0, kWindow) : dcp::Mask::causal(), ""});
  dcp::BlockOptions bo;
  bo.block_size = block;
  dcp::BlockTable table = dcp::build_block_table(batch, bo);
  dcp::Attend attend;
  for (size_t i = 0; i < table.tiles.size(); ++i) {
    dcp::Tile& t = table.tiles[i];
    const bool diagonal = t.q_block == t.kv_block;
    if ((list == "full" && diagonal) || ((list == "causal" || list == "partial") && !diagonal)) continue;
    if (list == "partial" || list == "window") t.kind = dcp::TileKind::Partial;
    dcp::TileOp op;
    op.tile = static_cast<int32_t>(i);
    const auto out = route == "wgmma-runs" ? t.q_block : static_cast<int32_t>(attend.tiles.size());
    op.out = {dcp::Space::Slot, dcp::DataKind::O, out};
    attend.tiles.push_back(op);
  }
  Point p;
  p.name = fmt::format("kernels S={} B={} {}", seq, block, list);
  dcp::sim_detail::AttendCost cost(table, base);
  for (int pi = 0; pi < 2; ++pi) {
    const Pass pass = pi == 0 ? Pass::Forward : Pass::Backward;
    p.x[pi] = columns(cost.work(attend, pass));
    p.fixed_s[pi] = base.launch_overhead_s;
    p.flops_per_unit[pi] = dcp::sim_detail::subtile_flops(table, pass);
    const std::string key = (pi == 0 ? "fwd_" : "bwd_") + route + "_ms";
    if (!row.contains(key)) dcp::raise(dcp::ErrorKind::InvalidInput, p.name + ": no '" + key + "' (see --route)");
    p.measured_s[pi] = row.at(key).get<double>() * 1e-3;
  }
  return p;
}

// Solves the small dense system a x = b (Gaussian elimination with partial pivoting).
std::vector<double> solve(std::vector<std::vector<double>> a, std::vector<double> b) {
  const size_t n = b.size();
  for (size_t c = 0; c < n; ++c) {
    size_t pivot = c;
    for (size_t r = c + 1; r < n; ++r)
      if (std::abs(a[r][c]) > std::abs(a[pivot][c])) pivot = r;
    std::swap(a[c], a[pivot]);
    std::swap(b[c], b[pivot]);
    if (a[c][c] == 0) dcp::raise(dcp::ErrorKind::InvalidInput, "fit: the points do not determine every parameter");
    for (size_t r = 0; r < n; ++r) {
      if (r == c) continue;
      const double f = a[r][c] / a[c][c];
      for (size_t k = c; k < n; ++k) a[r][k] -= f * a[c][k];
      b[r] -= f * b[c];
    }
  }
  for (size_t c = 0; c < n; ++c) b[c] /= a[c][c];
  return b;
}

// Seconds per unit of each column for one pass. A cost held at a value v (by --pin, or at its
// bound after the unconstrained fit crossed it) folds its column into the full sub-tile's with
// weight v; the others are solved for. Returns u (u[0]: seconds per full sub-tile).
Vec fit_pass(const std::vector<Point>& pts, int pi, double plan_weight, Vec held) {
  for (;;) {
    std::vector<size_t> free{0};
    for (size_t k = 1; k < kParams; ++k)
      if (std::isnan(held[k])) free.push_back(k);
    const size_t n = free.size();
    std::vector<std::vector<double>> a(n, std::vector<double>(n, 0.0));
    std::vector<double> b(n, 0.0);
    for (const Point& p : pts) {
      const double m = p.measured_s[pi];
      const double w = (p.plan ? plan_weight : 1.0) / (m * m);
      std::vector<double> row(n, 0.0);
      row[0] = p.x[pi][0];
      for (size_t k = 1; k < kParams; ++k) {
        if (std::isnan(held[k])) row[static_cast<size_t>(std::find(free.begin(), free.end(), k) - free.begin())] = p.x[pi][k];
        else row[0] += held[k] * p.x[pi][k];
      }
      for (size_t r = 0; r < n; ++r) {
        b[r] += w * row[r] * (m - p.fixed_s[pi]);
        for (size_t c = 0; c < n; ++c) a[r][c] += w * row[r] * row[c];
      }
    }
    const std::vector<double> sol = solve(a, b);
    Vec u{};
    u[0] = sol[0];
    for (size_t k = 1; k < kParams; ++k)
      u[k] = std::isnan(held[k]) ? sol[static_cast<size_t>(std::find(free.begin(), free.end(), k) - free.begin())]
                                 : held[k] * sol[0];
    bool changed = false;
    for (size_t k = 1; k < kParams; ++k)
      if (std::isnan(held[k]) && u[k] < kLowerBound[k] * u[0]) held[k] = kLowerBound[k], changed = true;
    if (!changed) return u;
  }
}

double predict(const Point& p, int pi, const Vec& u) {
  double s = p.fixed_s[pi];
  for (size_t k = 0; k < kParams; ++k) s += p.x[pi][k] * u[k];
  return s;
}

// --pin fwd_work_item_cost=0: keeps one cost of one pass out of the fit.
void pin(const std::string& arg, Vec (&held)[2]) {
  const size_t eq = arg.find('=');
  for (int pi = 0; pi < 2 && eq != std::string::npos; ++pi)
    for (size_t k = 1; k < kParams; ++k)
      if (arg.substr(0, eq) == std::string(pi == 0 ? "fwd_" : "bwd_") + kCostNames[k]) {
        held[pi][k] = std::max(kLowerBound[k], std::stod(arg.substr(eq + 1)));
        return;
      }
  dcp::raise(dcp::ErrorKind::InvalidInput, "--pin " + arg + ": expected (fwd|bwd)_<cost>=<value>, <cost> one of "
                                           "diagonal_masked_cost, partial_masked_cost, empty_subtile_cost, work_item_cost");
}

int run(int argc, char** argv) {
  std::string plans_path, kernels_path, base_path, preset = "h200-nvl", route = "wgmma-runs";
  double plan_weight = 8.0;
  bool show_work = false;
  Vec held[2];
  held[0].fill(std::nan(""));
  held[1].fill(std::nan(""));
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) dcp::raise(dcp::ErrorKind::InvalidInput, a + ": needs a value");
      return argv[++i];
    };
    if (a == "--plans") plans_path = value();
    else if (a == "--kernels") kernels_path = value();
    else if (a == "--base") base_path = value();
    else if (a == "--cluster") preset = value();
    else if (a == "--route") route = value();
    else if (a == "--plan-weight") plan_weight = std::stod(value());
    else if (a == "--pin") pin(value(), held);
    else if (a == "--work") show_work = true;
    else dcp::raise(dcp::ErrorKind::InvalidInput, "unknown argument '" + a + "' (see the header of bench/fit_calibration.cpp)");
  }
  if (plans_path.empty()) dcp::raise(dcp::ErrorKind::InvalidInput, "--plans FILE is required");
  dcp::Calibration base = base_path.empty() ? dcp::calibration_from_cluster(dcp::cluster_preset(preset, 1))
                                            : dcp::load_calibration(base_path);
  base.subtile_model = true;

  std::vector<Point> pts;
  const nlohmann::json plans = read_json(plans_path);
  for (const nlohmann::json& j : plans.at("plans")) pts.push_back(plan_point(j, preset, base));
  if (!kernels_path.empty()) {
    const nlohmann::json k = read_json(kernels_path);
    const dcp::AttentionShape shape{.q_heads = k.at("q_heads").get<int>(), .kv_heads = k.at("kv_heads").get<int>(),
                                    .head_dim = k.at("head_dim").get<int>(), .dtype = dcp::DType::BF16};
    for (const nlohmann::json& row : k.at("rows")) pts.push_back(kernel_point(row, shape, base, route));
  }
  // One full sub-tile is the fit's unit, so every point must have the first one's shape.
  for (const Point& p : pts)
    for (int pi = 0; pi < 2; ++pi)
      if (p.flops_per_unit[pi] != pts.front().flops_per_unit[pi])
        dcp::raise(dcp::ErrorKind::InvalidInput, p.name + ": another attention shape than " + pts.front().name);

  if (show_work) {
    std::printf("| point | pass | full | diagonal masked | partial masked | empty | items | fixed ms |\n"
                "|---|---|---|---|---|---|---|---|\n");
    for (const Point& p : pts)
      for (int pi = 0; pi < 2; ++pi)
        std::printf("| %s | %s | %.0f | %.0f | %.0f | %.0f | %.0f | %.3f |\n", p.name.c_str(), pi == 0 ? "fwd" : "bwd",
                    p.x[pi][0], p.x[pi][1], p.x[pi][2], p.x[pi][3], p.x[pi][4], p.fixed_s[pi] * 1e3);
    std::printf("\n");
  }
  Vec u[2];
  for (int pi = 0; pi < 2; ++pi) u[pi] = fit_pass(pts, pi, plan_weight, held[pi]);

  std::printf("| point | measured fwd / bwd ms | fitted fwd / bwd ms | error fwd / bwd |\n|---|---|---|---|\n");
  double worst[2][2] = {{0, 0}, {0, 0}};  // [plan?][pass]
  for (const Point& p : pts) {
    double t[2], e[2];
    for (int pi = 0; pi < 2; ++pi) {
      t[pi] = predict(p, pi, u[pi]);
      e[pi] = t[pi] / p.measured_s[pi] - 1;
      worst[p.plan ? 1 : 0][pi] = std::max(worst[p.plan ? 1 : 0][pi], std::abs(e[pi]));
    }
    std::printf("| %s | %.2f / %.2f | %.2f / %.2f | %+.1f%% / %+.1f%% |\n", p.name.c_str(), p.measured_s[0] * 1e3,
                p.measured_s[1] * 1e3, t[0] * 1e3, t[1] * 1e3, 100 * e[0], 100 * e[1]);
  }
  std::printf("\nworst error: whole plans forward %.1f%%, backward %.1f%%; kernel lists forward %.1f%%, backward %.1f%%\n\n",
              100 * worst[1][0], 100 * worst[1][1], 100 * worst[0][0], 100 * worst[0][1]);

  nlohmann::ordered_json out;
  out["name"] = base.name;
  out["attention_cost_model"] = "subtiles";
  for (int pi = 0; pi < 2; ++pi) {
    const std::string pass = pi == 0 ? "fwd" : "bwd";
    out["attn_" + pass + "_tflops"] = std::round(pts.front().flops_per_unit[pi] / u[pi][0] / 1e11) / 10;
    for (size_t k = 1; k < kParams; ++k) out[pass + "_" + kCostNames[k]] = std::round(u[pi][k] / u[pi][0] * 1000) / 1000;
  }
  out["tile_overhead_us"] = base.tile_overhead_s * 1e6;
  out["launch_overhead_us"] = base.launch_overhead_s * 1e6;
  out["memory_bw_GBps"] = base.memory_bw / 1e9;
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fit_calibration: %s\n", e.what());
    return 1;
  }
}
