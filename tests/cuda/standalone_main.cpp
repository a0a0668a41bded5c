// Standalone driver of the GPU checks for machines without GoogleTest/CMake dependencies
// (bench/run_cuda_device.sh builds it with plain nvcc). Runs the random tile-list cases and the
// targeted forward and backward cases through every route the device has (mma; on sm_90 wgmma
// and wgmma-basic);
// a failing case prints its first mismatching (tile, row, head, col) with expected / actual.
// Usage: dcp_check [max_random_cases_per_route] [forward_only]
// Exit code 0 when every case passes (or when there is no GPU: prints SKIP), 1 otherwise.
#include <cstdio>
#include <cstdlib>

#include "attention_cuda_check.h"

int main(int argc, char** argv) {
  const int max_cases = argc > 1 ? std::atoi(argv[1]) : 1000;  // first N random cases per route
  const bool forward_only = argc > 2 && std::atoi(argv[2]) != 0;
  namespace chk = dcp::cuda::check;
  if (!chk::gpu_available()) {
    std::printf("SKIP: no CUDA GPU on this machine\n");
    return 0;
  }
  int failures = 0;
  int total = 0;
  if (!forward_only) {
    for (const dcp::cuda::AttnKernelRoute route : chk::kernel_routes()) {
      for (const chk::BackwardCase& c : chk::backward_cases(route)) {
        const auto r = chk::run_backward_case(c);
        const bool ok = chk::passed(r);
        failures += ok ? 0 : 1;
        ++total;
        std::printf("%s %s\n", ok ? "PASS" : "FAIL", chk::describe(c, r).c_str());
        std::fflush(stdout);
      }
    }
  }
  for (const dcp::cuda::AttnKernelRoute route : chk::kernel_routes()) {
    // Targeted forward cases first: they are the quickest way to localise a kernel bug.
    for (const chk::ForwardCase& c : chk::forward_cases(route)) {
      const auto r = chk::run_forward_case(c);
      const bool ok = chk::passed(r);
      failures += ok ? 0 : 1;
      ++total;
      std::printf("%s %s\n", ok ? "PASS" : "FAIL", chk::describe(c, r).c_str());
      std::fflush(stdout);
    }
    if (forward_only) continue;
    const int shapes[6][3] = {{8, 8, 64}, {8, 2, 64}, {8, 1, 64}, {8, 8, 128}, {8, 2, 128}, {8, 1, 128}};
    int cases = 0;
    for (const auto& s : shapes) {
      for (unsigned long long seed = 1; seed <= 3 && cases < max_cases; ++seed, ++cases) {
        chk::CaseConfig cfg;
        cfg.seed = seed * 1000 + static_cast<unsigned long long>(s[1] * 10 + s[2]);
        cfg.num_q_heads = s[0];
        cfg.num_kv_heads = s[1];
        cfg.head_dim = s[2];
        cfg.forward_route = route;
        // The same route on both sides: mma, wgmma-basic or wgmma.
        cfg.backward_route = route;
        const auto r = chk::run_case(cfg);
        const bool ok = chk::passed(r) && r.num_empty_rows > 0;
        failures += ok ? 0 : 1;
        ++total;
        std::printf("%s %s\n", ok ? "PASS" : "FAIL", chk::describe(cfg, r).c_str());
        std::fflush(stdout);
      }
    }
  }
  std::printf("%s: %d failing case(s) of %d\n", failures == 0 ? "ALL PASS" : "FAILED", failures, total);
  return failures == 0 ? 0 : 1;
}
