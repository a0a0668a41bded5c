// bench_metrics — cost of building each static baseline and of compute_metrics at scale.
//
// Default: one causal sequence of 256K tokens, B = 1024, 32 query / 8 KV heads (8 head groups),
// 4 nodes x 8 devices. The uniform table then holds 263K tiles; "scatter" places its blocks and
// tiles on pseudo-random devices, the worst case for the (block, device) deduplication.
// Usage: bench_metrics [tokens] [nodes] [devices_per_node] [block_size]
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "dcp/baselines.h"
#include "dcp/metrics.h"
#include "dcp/detail/rng.h"

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void report(const char* method, const dcp::BlockTable& table, const dcp::PlacementMetrics& m,
            double build_ms, double metrics_ms) {
  std::printf("%-8s %8zu %10.1f %10.2f %8.3f %8.3f %10.3f %10.3f %12.0f\n", method,
              table.tiles.size(), build_ms, metrics_ms, m.compute_imbalance, m.memory_imbalance,
              static_cast<double>(m.intra_bytes()) / 1e9,
              static_cast<double>(m.inter_bytes()) / 1e9, m.bytes_per_token());
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t tokens = argc > 1 ? std::atoll(argv[1]) : 256 * 1024;
  dcp::Cluster cluster;
  cluster.nodes = argc > 2 ? std::atoi(argv[2]) : 4;
  cluster.devices_per_node = argc > 3 ? std::atoi(argv[3]) : 8;
  dcp::BlockOptions opts;
  opts.block_size = argc > 4 ? std::atoll(argv[4]) : 1024;

  dcp::Batch batch;
  batch.shape = {.q_heads = 32, .kv_heads = 8, .head_dim = 128, .dtype = dcp::DType::BF16};
  dcp::Sequence seq;
  seq.length = tokens;
  seq.mask = dcp::Mask::causal();
  batch.sequences.push_back(seq);

  std::printf("tokens %lld, %d x %d devices, B %lld, causal\n", static_cast<long long>(tokens),
              cluster.nodes, cluster.devices_per_node, static_cast<long long>(opts.block_size));
  std::printf("%-8s %8s %10s %10s %8s %8s %10s %10s %12s\n", "method", "tiles", "build_ms",
              "metric_ms", "comp_imb", "mem_imb", "intra_GB", "inter_GB", "bytes/token");
  double scatter_ms = 0;
  for (dcp::BaselineKind kind : dcp::all_baselines()) {
    auto t0 = std::chrono::steady_clock::now();
    dcp::PlacedBatch pb = dcp::make_baseline(kind, batch, opts, cluster);
    const double build_ms = ms_since(t0);
    t0 = std::chrono::steady_clock::now();
    const dcp::PlacementMetrics m = dcp::compute_metrics(pb.table, pb.placement, cluster);
    report(dcp::to_string(kind), pb.table, m, build_ms, ms_since(t0));

    if (kind == dcp::BaselineKind::Packing) {  // uniform table: reuse it for the scatter case
      dcp::SplitMix64 rng(1);
      const auto num_devices = static_cast<uint64_t>(cluster.num_devices());
      for (auto& h : pb.placement.block_home) h = static_cast<int32_t>(rng.below(num_devices));
      for (auto& d : pb.placement.tile_device) d = static_cast<int32_t>(rng.below(num_devices));
      t0 = std::chrono::steady_clock::now();
      const dcp::PlacementMetrics ms = dcp::compute_metrics(pb.table, pb.placement, cluster);
      scatter_ms = ms_since(t0);
      report("scatter", pb.table, ms, 0.0, scatter_ms);
    }
  }
  std::printf("RESULT scatter_metrics_ms=%.2f\n", scatter_ms);
  return 0;
}
