// Plan build time (schedule + programs, validator off) for the 65536-token / 16-device instance
// (8 nodes x 2 devices, the paper's dry-run cluster), per placement and block size; the
// validator's time is reported beside it. Usage: bench_plan [repeats]
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <vector>

#include "dcp/baselines.h"
#include "dcp/partition.h"
#include "dcp/plan.h"
#include "dcp/profiles.h"
#include "dcp/validate.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  using namespace dcp;
  const int repeats = argc > 1 ? std::max(1, std::atoi(argv[1])) : 5;
  ProfileOptions po;
  po.profile = Profile::Ldc;
  po.token_budget = 65536;
  po.seed = 1;
  po.shape.q_heads = 8;
  po.shape.kv_heads = 2;
  const Batch batch = generate_batches(po, 1).front();
  Cluster cluster = cluster_preset("a100-p4d", 8);
  cluster.devices_per_node = 2;
  fmt::print("batch: {} sequences, {} tokens; cluster 8 nodes x 2 devices; {} repeats (median)\n",
             batch.sequences.size(), batch.total_tokens(), repeats);
  fmt::print("{:>8} {:>6} {:>7} {:>9} {:>12} {:>12}\n", "method", "B", "tiles", "instrs", "build_ms", "validate_ms");
  double worst_ms = 0;
  for (int64_t block : {1024, 512}) {
    for (int method = 0; method < 3; ++method) {
      BlockOptions bo;
      bo.block_size = block;
      PlacedBatch pb;
      std::string name = "dcp";
      if (method == 0) {
        pb.table = build_block_table(batch, bo);
        pb.placement = place_dcp(pb.table, cluster).placement;
      } else {
        const BaselineKind kind = method == 1 ? BaselineKind::Zigzag : BaselineKind::A2AP2P;
        pb = make_baseline(kind, batch, bo, cluster);
        name = to_string(kind);
      }
      std::vector<double> build_s, check_s;
      size_t instrs = 0;
      for (int r = 0; r < repeats; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        Plan plan = build_plan(pb.table, pb.placement, cluster, PlanOptions{});
        build_s.push_back(seconds_since(t0));
        t0 = std::chrono::steady_clock::now();
        const bool ok = validate_plan(plan).empty();
        check_s.push_back(seconds_since(t0));
        if (!ok) fmt::print("INVALID PLAN for {} B={}\n", name, block);
        instrs = 0;
        for (const DeviceProgram& dp : plan.devices) instrs += dp.fwd.code.size() + dp.bwd.code.size();
      }
      std::sort(build_s.begin(), build_s.end());
      std::sort(check_s.begin(), check_s.end());
      const double ms = build_s[build_s.size() / 2] * 1e3;
      worst_ms = std::max(worst_ms, ms);
      fmt::print("{:>8} {:>6} {:>7} {:>9} {:>12.2f} {:>12.2f}\n", name, block, pb.table.tiles.size(),
                 instrs, ms, check_s[check_s.size() / 2] * 1e3);
    }
  }
  fmt::print("RESULT plan_build_ms_max={:.2f}\n", worst_ms);
  return 0;
}
