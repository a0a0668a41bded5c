// bench_cpu_attention: throughput of the CPU attention kernels on full and causal-diagonal tiles
// against the CPU's fp32 peak.
//
// FLOP convention (project-wide): 4 x mask area x head_dim x query heads forward; backward 2.5x.
// Peak estimate: GHz x fp32 FLOP per cycle per core; FLOP per cycle = FMA pipes x fp32 lanes x 2.
// The defaults describe this machine class (AMD Zen 4: two 256-bit FMA pipes, 512-bit ops
// double-pumped -> 2 x 8 x 2 = 32) at the nominal clock read from /proc/cpuinfo; override with
// --ghz and --flops-per-cycle on other CPUs. Prints a table and ends with one RESULT line.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "dcp/detail/attention_cpu.h"

namespace {

double nominal_ghz() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("cpu MHz", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return std::stod(line.substr(colon + 1)) / 1000.0;
    }
  return 0.0;
}

struct Sample {
  double min_s = std::numeric_limits<double>::infinity();
  double avg_s = 0.0;
};

template <class F>
Sample time_it(int reps, F&& f) {
  f();  // warm-up (page faults, clone resolution)
  Sample s;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    s.min_s = std::min(s.min_s, dt);
    s.avg_s += dt / reps;
  }
  return s;
}

std::vector<float> filled(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  uint64_t x = seed;
  for (float& f : v) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;  // LCG: only needs to look random
    f = static_cast<float>(static_cast<double>(x >> 40) / static_cast<double>(1ull << 24) - 0.5);
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"CPU attention kernel throughput vs fp32 peak"};
  double ghz = nominal_ghz();
  double flops_per_cycle = 32.0;
  int reps = 3;
  int q_heads = 4;
  int kv_heads = 1;
  int head_dim = 128;
  std::vector<int64_t> sizes{512, 1024};
  app.add_option("--ghz", ghz, "core clock for the peak estimate (default: /proc/cpuinfo)");
  app.add_option("--flops-per-cycle", flops_per_cycle, "fp32 FLOP per cycle per core (FMA pipes x lanes x 2)");
  app.add_option("--reps", reps, "timed repetitions (after one warm-up)");
  app.add_option("--q-heads", q_heads, "query heads of the head group");
  app.add_option("--kv-heads", kv_heads, "KV heads of the head group");
  app.add_option("--head-dim", head_dim, "head dimension");
  app.add_option("--sizes", sizes, "block sizes B (tiles are B x B)");
  CLI11_PARSE(app, argc, argv);

  const double peak_core = ghz * 1e9 * flops_per_cycle;
  const int max_threads = omp_get_max_threads();
  fmt::print("peak estimate: {:.2f} GHz x {:.0f} FLOP/cycle = {:.1f} GFLOP/s per core; {} threads available\n",
             ghz, flops_per_cycle, peak_core / 1e9, max_threads);
  fmt::print("heads {}q/{}kv, head_dim {}, fp32; FLOPs = 4 x area x head_dim x q_heads (bwd 2.5x)\n\n", q_heads,
             kv_heads, head_dim);
  fmt::print("{:>6} {:>7} {:>5} {:>8} {:>10} {:>12} {:>9}\n", "B", "kind", "pass", "threads", "min ms",
             "GFLOP/s/core", "% peak");

  const dcp::cpu::HeadLayout heads{q_heads, kv_heads, head_dim};
  double best_fwd_fraction = 0.0;
  for (int64_t b : sizes) {
    const auto q = filled(static_cast<size_t>(b * q_heads * head_dim), 1);
    const auto k = filled(static_cast<size_t>(b * kv_heads * head_dim), 2);
    const auto v = filled(static_cast<size_t>(b * kv_heads * head_dim), 3);
    const auto d_o = filled(static_cast<size_t>(b * q_heads * head_dim), 4);
    std::vector<float> o(q.size()), lse(static_cast<size_t>(b * q_heads)), delta(lse.size());
    std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
    for (dcp::TileKind kind : {dcp::TileKind::Full, dcp::TileKind::CausalDiagonal}) {
      const double bd = static_cast<double>(b);
      const double area = kind == dcp::TileKind::Full ? bd * bd : bd * (bd + 1.0) / 2.0;
      const double fwd_flops = 4.0 * area * head_dim * q_heads;
      dcp::cpu::ForwardTile ft;
      ft.num_q = ft.num_kv = b;
      ft.mask.kind = kind;
      ft.q = q.data();
      ft.k = k.data();
      ft.v = v.data();
      ft.o = o.data();
      ft.lse = lse.data();
      dcp::cpu::BackwardTile bt;
      bt.num_q = bt.num_kv = b;
      bt.mask.kind = kind;
      bt.q = q.data();
      bt.k = k.data();
      bt.v = v.data();
      bt.d_o = d_o.data();
      bt.lse = lse.data();
      bt.delta = delta.data();
      bt.dq = dq.data();
      bt.dk = dk.data();
      bt.dv = dv.data();
      std::vector<int> thread_counts{1};
      if (max_threads > 1) thread_counts.push_back(max_threads);
      for (int threads : thread_counts) {
        omp_set_num_threads(threads);
        const Sample fs = time_it(reps, [&] { dcp::cpu::attend_forward(heads, {&ft, 1}); });
        dcp::cpu::compute_delta(d_o.data(), o.data(), b, q_heads, head_dim, delta.data());
        const Sample bs = time_it(reps, [&] { dcp::cpu::attend_backward(heads, {&bt, 1}); });
        const double fwd_core = fwd_flops / fs.min_s / threads;
        const double bwd_core = 2.5 * fwd_flops / bs.min_s / threads;
        if (threads == 1 && kind == dcp::TileKind::Full) best_fwd_fraction = std::max(best_fwd_fraction, fwd_core / peak_core);
        fmt::print("{:>6} {:>7} {:>5} {:>8} {:>10.2f} {:>12.1f} {:>8.1f}%\n", b, dcp::to_string(kind) , "fwd",
                   threads, fs.min_s * 1e3, fwd_core / 1e9, 100.0 * fwd_core / peak_core);
        fmt::print("{:>6} {:>7} {:>5} {:>8} {:>10.2f} {:>12.1f} {:>8.1f}%\n", b, dcp::to_string(kind), "bwd",
                   threads, bs.min_s * 1e3, bwd_core / 1e9, 100.0 * bwd_core / peak_core);
      }
      omp_set_num_threads(max_threads);
    }
  }
  fmt::print("RESULT full_fwd_fraction_of_peak_1core={:.3f}\n", best_fwd_fraction);
  return 0;
}
