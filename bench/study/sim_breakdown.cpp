// sim_breakdown: where DCP's simulated time goes on the paper's micro-benchmark setting
// (bench_sim_paper: 4 nodes x 8 A100, 131072 tokens, ldc seed 7, 8 q / 2 KV heads, head dim
// 128), one (mask, scale) cell at a time.
//
// For every planner candidate (B x eps_compute) of every batch, per pass: the pass time (slowest
// device), the perfect-balance compute bound (summed compute-stream time / devices), the busiest
// device's compute, the longest stall and exposed communication, and the compute-stream time
// split into attention FLOPs, per-tile overheads, Attend launches, Merges and Copies (summed
// over devices). The best static baseline is printed beside for reference.
//
// Usage: sim_breakdown [--mask M] [--scale S] [--batches N] [--stages N] [--calibration FILE]
//                      [--blocks 1024,2048] [--eps 0.02,0.05] [--trace PREFIX] (also of the planner's choice) [--baselines 0|1]
//                      [--tail 0|1] [--far-first 0|1] [--relay1 0|1] [--proxy 0|1] [--proxy-slack X] [--last-share X] [--level 0|1]
//                      (ScheduleOptions of every plan) [--split-sink 0|1] (BlockOptions::split_sink)
//                      [--search 0|1] (also the planner's choice with bench_sim_paper's candidates,
//                      its breakdown and the best candidate of each B x split x eps)
//                      [--search-blocks 512,1024,2048,4096] [--search-eps 0.02,0.05,0.1] [--search-stages 4,3] [--tighten-best N] [--search-threads N] (its candidates)
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <variant>
#include <vector>

#include <fmt/core.h>

#include "dcp/baselines.h"
#include "dcp/partition.h"
#include "dcp/plan.h"
#include "dcp/planner.h"
#include "dcp/profiles.h"
#include "dcp/sim.h"
#include "../paper_setting.h"

namespace {

template <typename T>
std::vector<T> parse_list(const std::string& s) {
  std::vector<T> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t comma = s.find(',', pos);
    const std::string item = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (!item.empty()) out.push_back(static_cast<T>(std::stod(item)));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

struct PassSplit {
  double flops_s = 0, tile_overhead_s = 0, launch_s = 0, merge_s = 0, copy_s = 0;
  int64_t tiles = 0, attends = 0, merges = 0;
};

PassSplit split_pass(const dcp::Plan& plan, dcp::Pass pass, const dcp::Calibration& c) {
  PassSplit s;
  for (const dcp::DeviceProgram& dp : plan.devices) {
    const dcp::Program& prog = pass == dcp::Pass::Forward ? dp.fwd : dp.bwd;
    for (const dcp::Instruction& ins : prog.code) {
      const double t = dcp::instruction_time_s(plan, ins, pass, c);
      if (const auto* a = std::get_if<dcp::Attend>(&ins)) {
        const double over = c.tile_overhead_s * static_cast<double>(a->tiles.size());
        s.tile_overhead_s += over;
        s.launch_s += c.launch_overhead_s;
        s.flops_s += t - over - c.launch_overhead_s;
        s.tiles += static_cast<int64_t>(a->tiles.size());
        ++s.attends;
      } else if (std::holds_alternative<dcp::Merge>(ins)) {
        s.merge_s += t;
        ++s.merges;
      } else if (std::holds_alternative<dcp::Copy>(ins)) {
        s.copy_s += t;
      }
    }
  }
  return s;
}

void report(const char* label, const dcp::Plan& plan, const dcp::SimResult& r, const dcp::Calibration& c) {
  const auto n = static_cast<double>(r.devices.size());
  fmt::print("  {} total {:.2f} ms\n", label, r.total_s() * 1e3);
  for (int p = 0; p < 2; ++p) {
    const dcp::Pass pass = p == 0 ? dcp::Pass::Forward : dcp::Pass::Backward;
    double sum_c = 0, max_c = 0, max_stall = 0, max_exp = 0, sum_stall = 0;
    int busiest = 0;
    for (size_t d = 0; d < r.devices.size(); ++d) {
      const dcp::DeviceSim& ds = r.devices[d];
      sum_c += ds.compute_s[p];
      if (ds.compute_s[p] > max_c) {
        max_c = ds.compute_s[p];
        busiest = static_cast<int>(d);
      }
      max_stall = std::max(max_stall, ds.stall_s[p]);
      max_exp = std::max(max_exp, ds.exposed_comm_s[p]);
      sum_stall += ds.stall_s[p];
    }
    const PassSplit s = split_pass(plan, pass, c);
    fmt::print(
        "    {}: {:.3f} ms | bound {:.3f} busiest {:.3f} (dev {}) | stall max {:.3f} mean {:.3f} exposed max {:.3f}"
        " | per device: flops {:.3f} tileovh {:.3f} launch {:.3f} merge {:.3f} copy {:.3f} | tiles {} attends {} "
        "merges {}\n",
        dcp::to_string(pass), (p == 0 ? r.fwd_s : r.bwd_s) * 1e3, sum_c / n * 1e3, max_c * 1e3, busiest,
        max_stall * 1e3, sum_stall / n * 1e3, max_exp * 1e3, s.flops_s / n * 1e3, s.tile_overhead_s / n * 1e3,
        s.launch_s / n * 1e3, s.merge_s / n * 1e3, s.copy_s / n * 1e3, s.tiles, s.attends, s.merges);
  }
  fmt::print("    hidden {:.2f} comm {:.2f} ms exposed {:.2f} ms\n", r.hidden_fraction, r.comm_s * 1e3,
             r.exposed_comm_s * 1e3);
  for (const std::string& step : r.critical_path) fmt::print("    {}\n", step);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace dcp;
  std::string mask = "lambda", calib_path = "data/calibration/a100.json";
  bool tail = true, far_first = false, baselines = true, relay1 = true, level = false, split_sink = false;
  bool proxy = true;
  double proxy_slack = 0.1;
  bool search = false;
  std::vector<double> search_eps{0.02, 0.05, 0.1};
  std::vector<int64_t> search_blocks{512, 1024, 2048, 4096};
  int search_threads = 1;
  std::vector<int> search_stages{4, 3};
  uint64_t search_seed = 1;
  int tighten_best = 2;
  double last_share = 1.0;
  std::string trace_path;  // prefix of Chrome traces of the DCP candidates
  double scale = 4;
  int batches = 1, stages = 4;
  std::vector<int64_t> blocks{1024, 2048, 4096};
  std::vector<double> eps{0.02, 0.05, 0.1};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--mask") mask = v;
    else if (a == "--scale") scale = std::stod(v);
    else if (a == "--batches") batches = std::max(1, std::atoi(v.c_str()));
    else if (a == "--stages") stages = std::max(1, std::atoi(v.c_str()));
    else if (a == "--calibration") calib_path = v;
    else if (a == "--blocks") blocks = parse_list<int64_t>(v);
    else if (a == "--eps") eps = parse_list<double>(v);
    else if (a == "--trace") trace_path = v;
    else if (a == "--tail") tail = v != "0";
    else if (a == "--far-first") far_first = v != "0";
    else if (a == "--baselines") baselines = v != "0";
    else if (a == "--relay1") relay1 = v != "0";
    else if (a == "--proxy") proxy = v != "0";
    else if (a == "--proxy-slack") proxy_slack = std::stod(v);
    else if (a == "--last-share") last_share = std::stod(v);
    else if (a == "--level") level = v != "0";
    else if (a == "--split-sink") split_sink = v != "0";
    else if (a == "--search") search = v != "0";
    else if (a == "--search-threads") search_threads = std::atoi(v.c_str());
    else if (a == "--search-blocks") search_blocks = parse_list<int64_t>(v);
    else if (a == "--search-eps") search_eps = parse_list<double>(v);
    else if (a == "--search-stages") search_stages = parse_list<int>(v);
    else if (a == "--tighten-best") tighten_best = std::atoi(v.c_str());
    else if (a == "--search-seed") search_seed = static_cast<uint64_t>(std::stoull(v));
    else {
      fmt::print(stderr, "unknown option {}\n", a);
      return 2;
    }
  }
  const Cluster cluster = bench::paper_cluster();
  SimOptions so;
  so.calibration = load_calibration(calib_path);
  const ProfileOptions po = bench::paper_profile(scale, mask);
  PlanOptions plan_opts;
  plan_opts.schedule.num_comm_stages = stages;
  plan_opts.schedule.tail_overlaps_final_round = tail;
  plan_opts.schedule.far_outputs_first = far_first;
  plan_opts.schedule.relay_first_round = relay1;
  plan_opts.schedule.proxies = proxy;
  plan_opts.schedule.proxy_slack = proxy_slack;
  plan_opts.schedule.last_round_share = last_share;
  plan_opts.schedule.level_stage_compute = level;
  int b = 0;
  for (const Batch& batch : generate_batches(po, batches)) {
    fmt::print("batch {}: {} sequences, longest {}\n", b++, batch.sequences.size(),
               std::max_element(batch.sequences.begin(), batch.sequences.end(),
                                [](const auto& x, const auto& y) { return x.length < y.length; })
                   ->length);
    for (BaselineKind kind : all_baselines()) {
      if (kind == BaselineKind::Packing || !baselines) continue;
      BlockOptions bo;
      bo.block_size = 1024;
      PlacedBatch pb = make_baseline(kind, batch, bo, cluster);
      const Plan plan = build_plan(pb.table, pb.placement, cluster, plan_opts);
      report(to_string(kind), plan, simulate(plan, cluster, so), so.calibration);
    }
    if (search) {
      PlannerOptions popt;
      popt.block_sizes = search_blocks;
      popt.threads = search_threads;
      popt.eps_compute = search_eps;
      popt.num_comm_stages = search_stages;
      popt.placement.seed = search_seed;
      popt.reseed_best = 1;
      popt.tighten_best = tighten_best;
      popt.plan.schedule = plan_opts.schedule;  // --tail, --relay1, --proxy-slack; the searched fields are the planner's
      popt.calibration = so.calibration;
      popt.static_layouts.clear();  // DCP's own plans: the study breaks down where their time goes
      const PlannedBatch planned = plan_batch(batch, cluster, popt);
      const PlanCandidate& c = planned.chosen;
      const std::string label =
          fmt::format("planner: B={}{} eps={} stages={} far_first={} share={} level={} (search {:.0f} ms)", c.block_size,
                      c.split_sink ? " split" : "", c.eps_compute, c.num_comm_stages, c.choices.far_outputs_first ? 1 : 0,
                      c.choices.last_round_share, c.choices.level_stage_compute ? 1 : 0, planned.search_s * 1e3);
      report(label.c_str(), planned.plan, planned.predicted, so.calibration);
      if (!trace_path.empty()) {
        SimOptions traced = so;
        traced.trace = true;
        std::ofstream(fmt::format("{}_b{}_planner.json", trace_path, b)) << simulate(planned.plan, cluster, traced).trace_json;
      }
      // The best schedule of each placement (B x split x eps), in the order tried.
      for (size_t i = 0; i < planned.candidates.size();) {
        size_t j = i;
        double best_ms = 1e30;
        while (j < planned.candidates.size() && planned.candidates[j].block_size == planned.candidates[i].block_size &&
               planned.candidates[j].split_sink == planned.candidates[i].split_sink &&
               planned.candidates[j].eps_compute == planned.candidates[i].eps_compute) {
          best_ms = std::min(best_ms, planned.candidates[j].predicted_s * 1e3);
          ++j;
        }
        fmt::print("    candidate B={}{} eps={}: best {:.2f} ms{}\n", planned.candidates[i].block_size,
                   planned.candidates[i].split_sink ? " split" : "", planned.candidates[i].eps_compute, best_ms,
                   planned.candidates[i].balanced ? "" : " (unbalanced)");
        i = j;
      }
    }
    for (int64_t block : blocks) {
      BlockOptions bo;
      bo.block_size = block;
      bo.split_sink = split_sink;
      const BlockTable table = build_block_table(batch, bo);
      for (double e : eps) {
        PlacementOptions pl;
        pl.eps_compute = e;
        pl.tile_cost = tile_cost_from(so.calibration);
        const DcpPlacement placed = place_dcp(table, cluster, pl);
        const Plan plan = build_plan(table, placed.placement, cluster, plan_opts);
        const std::string label = fmt::format("dcp B={} eps={} (imb {:.3f}, inter {:.1f} MB, intra {:.1f} MB)", block,
                                              e, placed.report.compute_imbalance,
                                              static_cast<double>(placed.report.inter_bytes) / 1e6,
                                              static_cast<double>(placed.report.intra_bytes) / 1e6);
        SimOptions traced = so;
        traced.trace = !trace_path.empty();
        const SimResult r = simulate(plan, cluster, traced);
        report(label.c_str(), plan, r, so.calibration);
        if (traced.trace) std::ofstream(fmt::format("{}_b{}_B{}_e{}.json", trace_path, b, block, e)) << r.trace_json;
      }
    }
  }
  return 0;
}
