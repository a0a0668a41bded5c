// attention_cuda_check.h — GPU-vs-fp64 checks of the CUDA attention kernels, shared by the
// GoogleTest suite and the standalone (nvcc-only) driver used on machines without GoogleTest.
#pragma once

#include <cstdint>
#include <string>

namespace dcp::cuda::check {

struct CaseConfig {
  uint64_t seed = 1;
  int num_q_heads = 8;
  int num_kv_heads = 8;
  int head_dim = 128;
  int num_blocks = 5;      // data blocks of one sequence; tile (i, j) for j <= i
  int max_block_len = 160;
};

struct CaseResult {
  bool ran = false;             // false: no GPU
  std::string error;            // non-empty: a CUDA / API failure
  int num_tiles = 0;
  int num_empty_rows = 0;       // (row, head) pairs of partial outputs with no allowed key
  double fwd_o_rel = 0, fwd_lse_rel = 0;    // per-tile partials vs fp64
  bool fwd_empty_rows_ok = true;          // O == 0 and LSE == -inf exactly there
  double merge_o_rel = 0, merge_o_bf16_rel = 0, merge_lse_rel = 0;
  double delta_rel = 0;
  double dq_rel = 0, dk_rel = 0, dv_rel = 0;
  bool any_nan = false;
};

bool gpu_available();
CaseResult run_case(const CaseConfig& config);
std::string describe(const CaseConfig& config, const CaseResult& result);
// bf16 tolerance on O and the gradients; LSE and Delta are fp32 sums of exact bf16 products, so
// they get a tighter bound (a wrong softmax denominator shows there first).
inline bool passed(const CaseResult& r, double tol = 2e-2, double fp32_tol = 1e-4) {
  return r.error.empty() && !r.any_nan && r.fwd_empty_rows_ok && r.fwd_o_rel < tol && r.fwd_lse_rel < fp32_tol &&
         r.merge_o_rel < tol && r.merge_o_bf16_rel < tol && r.merge_lse_rel < fp32_tol && r.delta_rel < fp32_tol &&
         r.dq_rel < tol && r.dk_rel < tol && r.dv_rel < tol;
}

}  // namespace dcp::cuda::check
