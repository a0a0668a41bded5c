// Simulated attention time (forward + backward) on the paper's micro-benchmark setting:
// 4 nodes x 8 A100 (a100-p4d), 131072 tokens per batch, LongDataCollections-like lengths scaled
// by 0.5..4, GQA 8 query / 2 KV heads, head dim 128; DCP (the planner's choice among
// B in {512, 1024, 2048, 4096} (within the planner's tile budget; on sink masks each also with
// the sink in a block of its own) x eps_compute in {0.02, 0.05, 0.1}, each with the planner's
// default schedule candidates at 4 and at 3 communication stages, the best placement again
// with a second seed, and the two best placements tightened to eps 0.07 / 0.05 / 0.03 with their
// homes kept, by simulated time: planner.h)
// against every static baseline (default schedule, the better of 4 and 3 communication stages),
// same simulator and calibration.
// Proxies (ScheduleOptions::proxies) on and off: DCP's chosen placement is planned with both (the
// planner's retry_proxies), every static layout keeps the best of both at each stage count;
// with no-proxies as the fourth argument, neither has any. The fifth is the search's threads
// (PlannerOptions::threads, default 1: the search ms column is then one core's).
// Usage: bench_sim_paper [batches per scale] [calibration.json] [out.json] [proxies|no-proxies] [threads]
#include <fmt/core.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

#include "dcp/baselines.h"
#include "dcp/partition.h"
#include "dcp/plan.h"
#include "dcp/planner.h"
#include "dcp/profiles.h"
#include "dcp/sim.h"
#include "paper_setting.h"

int main(int argc, char** argv) {
  using namespace dcp;
  const int batches = argc > 1 ? std::max(1, std::atoi(argv[1])) : 2;
  const bool proxies = !(argc > 4 && std::string(argv[4]) == "no-proxies");
  const int threads = argc > 5 ? std::clamp(std::atoi(argv[5]), 1, 256) : 1;
  const Cluster cluster = bench::paper_cluster();
  SimOptions so;
  so.calibration = argc > 2 && argv[2][0] != 0 ? load_calibration(argv[2]) : calibration_from_cluster(cluster);
  nlohmann::json out = nlohmann::json::array();
  fmt::print("cluster {} x {} ({}), calibration {}, {} batches per scale; times are fwd+bwd ms (mean)\n",
             cluster.nodes, cluster.devices_per_node, cluster.name, so.calibration.name, batches);
  fmt::print("{:>17} {:>5} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>7} {:>9}\n", "mask", "scale", "dcp", "ring",
             "zigzag", "ulysses", "a2a_p2p", "packing", "speedup", "hidden", "search ms");
  for (const char* mask : {"causal", "lambda", "causal_blockwise", "shared_question"}) {
    for (double scale : {0.5, 1.0, 2.0, 4.0}) {
      const ProfileOptions po = bench::paper_profile(scale, mask);
      std::map<std::string, double> sum;
      double hidden = 0;
      double search_s = 0;
      for (const Batch& batch : generate_batches(po, batches)) {
        PlannerOptions popt;
        popt.block_sizes = {512, 1024, 2048, 4096};
        popt.eps_compute = {0.02, 0.05, 0.1};
        popt.num_comm_stages = {4, 3};
        popt.plan.schedule.proxies = proxies;
        popt.retry_proxies = proxies;
        popt.reseed_best = 1;
        popt.tighten_best = 2;
        popt.threads = threads;
        popt.calibration = so.calibration;
        // DCP's own placements only: the table compares them with the static layouts.
        popt.static_layouts.clear();
        const PlannedBatch planned = plan_batch(batch, cluster, popt);
        const double best = planned.predicted.total_s();
        const double best_hidden = planned.predicted.hidden_fraction;
        search_s += planned.search_s;
        sum["dcp"] += best;
        hidden += best_hidden;
        // Each static layout gets the same stage counts as DCP's search and keeps its best.
        for (BaselineKind kind : all_baselines()) {
          BlockOptions bo;
          bo.block_size = 1024;
          PlacedBatch pb = make_baseline(kind, batch, bo, cluster);
          double t = 1e30;
          for (bool proxy : proxies ? std::vector<bool>{true, false} : std::vector<bool>{false})
            for (int stages : popt.num_comm_stages) {
              PlanOptions plan_opts;
              plan_opts.schedule.num_comm_stages = stages;
              plan_opts.schedule.proxies = proxy;
              t = std::min(t, simulate(build_plan(pb.table, pb.placement, cluster, plan_opts), cluster, so).total_s());
            }
          sum[to_string(kind)] += t;
        }
      }
      double best_static = 1e30;
      for (auto& [name, s] : sum) {
        s = s / batches * 1e3;
        if (name != "dcp" && name != "packing") best_static = std::min(best_static, s);
      }
      const double speedup = best_static / sum["dcp"];
      fmt::print("{:>17} {:>5.1f} {:>9.2f} {:>9.2f} {:>9.2f} {:>9.2f} {:>9.2f} {:>9.2f} {:>7.2f}x {:>7.2f} {:>9.1f}\n", mask,
                 scale, sum["dcp"], sum["ring"], sum["zigzag"], sum["ulysses"], sum["a2a_p2p"], sum["packing"],
                 speedup, hidden / batches, search_s / batches * 1e3);
      out.push_back({{"mask", mask}, {"scale", scale}, {"ms", sum}, {"speedup_vs_best_cp", speedup},
                     {"dcp_hidden_fraction", hidden / batches}, {"search_ms", search_s / batches * 1e3}});
    }
  }
  if (argc > 3) std::ofstream(argv[3]) << out.dump(2) << "\n";
  return 0;
}
