// attention_cuda_check.h — GPU-vs-fp64 checks of the CUDA attention kernels, shared by the
// GoogleTest suite and the standalone (nvcc-only) driver used on machines without GoogleTest.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dcp/detail/attention_cuda.h"

namespace dcp::cuda::check {

struct CaseConfig {
  uint64_t seed = 1;
  int num_q_heads = 8;
  int num_kv_heads = 8;
  int head_dim = 128;
  int num_blocks = 5;      // data blocks of one sequence; tile (i, j) for j <= i
  int max_block_len = 160;
  AttnKernelRoute forward_route = AttnKernelRoute::Mma;
  AttnKernelRoute backward_route = AttnKernelRoute::Mma;
  // The deterministic backward (backward_route must be Wgmma): run twice, results compared bit
  // for bit (CaseResult::repeat_bitwise) as well as against fp64.
  bool deterministic_backward = false;
  int det_unit_rows = 0;  // its units (0: whole key blocks; 1: every tile alone)
  bool det_fused = false;  // its one-pass method (AttnBackwardParams::dq_units over every K / V row)
  bool det_ordered = false;  // with det_fused: over the default work in turns (AttnBackwardParams::ordered)
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
  bool repeat_bitwise = true;   // deterministic backward: two runs gave identical dQ, dK, dV
  std::string first_mismatch;   // forward partials: "(tile, row, head, col): expected / got"
  std::string first_bwd_mismatch;  // gradients (tile -1: summed over tiles): beyond the per-element bound
};

bool gpu_available();
CaseResult run_case(const CaseConfig& config);
std::string describe(const CaseConfig& config, const CaseResult& result);
// bf16 tolerance on O and the gradients; LSE and Delta are fp32 sums of exact bf16 products, so
// they get a tighter bound (a wrong softmax denominator shows there first).
inline bool passed(const CaseResult& r, double tol = 2e-2, double fp32_tol = 1e-4) {
  return r.error.empty() && !r.any_nan && r.fwd_empty_rows_ok && r.fwd_o_rel < tol && r.fwd_lse_rel < fp32_tol &&
         r.merge_o_rel < tol && r.merge_o_bf16_rel < tol && r.merge_lse_rel < fp32_tol && r.delta_rel < fp32_tol &&
         r.dq_rel < tol && r.dk_rel < tol && r.dv_rel < tol && r.repeat_bitwise;
}

// ---- Targeted forward checks (attention_forward_check.cpp): one q block against kv blocks,
// each scenario run through a chosen route and compared with fp64 per element.
enum class ForwardScenario { Full, Causal, Partial, MultiTile };
struct ForwardCase {
  uint64_t seed = 1;
  int num_q_heads = 8;
  int num_kv_heads = 8;
  int head_dim = 128;
  ForwardScenario scenario = ForwardScenario::Full;
  int q_len = 300;   // rows of the q block (Causal: also the kv length)
  int kv_len = 333;  // keys of the (first) kv block
  // Pass the K/V buffers' rows (AttnForwardParams::kv_rows): the Wgmma route then loads whole
  // 128-row sub-tiles by TMA; false: every sub-tile by cp.async.
  bool kv_rows_known = true;
  // Give the list the host's cell classes of its Partial tiles (make_partial_cells).
  bool partial_cells = true;
  // Persistent launch (AttnForwardParams::work_counter) of at most this many CTAs (0: one CTA
  // per item), so that CTAs run several items each; the counter must come back zero.
  int persistent_ctas = 0;
  AttnKernelRoute route = AttnKernelRoute::Mma;
};
struct ForwardResult {
  bool ran = false;
  std::string error;
  int num_tiles = 0;
  int num_empty_rows = 0;
  double o_rel = 0, lse_rel = 0;
  int num_bad = 0;           // elements beyond the per-element bounds
  bool empty_rows_ok = true;
  bool any_nan = false;
  std::string first_mismatch;
};
// The targeted list: every scenario at head dims 64 and 128, GQA 1 / 4 / 8, lengths that are
// not multiples of 64 or 128 (and exact ones), for `route`.
std::vector<ForwardCase> forward_cases(AttnKernelRoute route);
ForwardResult run_forward_case(const ForwardCase& c);
std::string describe(const ForwardCase& c, const ForwardResult& r);
inline bool passed(const ForwardResult& r, double tol = 2e-2, double fp32_tol = 1e-4) {
  return r.error.empty() && !r.any_nan && r.empty_rows_ok && r.num_bad == 0 && r.o_rel < tol && r.lse_rel < fp32_tol;
}

// Every route the device has, forward and backward alike: Mma, plus Wgmma and WgmmaBasic on sm_90.
std::vector<AttnKernelRoute> kernel_routes();

// The targeted checks' grid, forward and backward alike: head dims 64 and 128 x GQA 8/8, 8/2,
// 8/1 x nine scenario sizes (q lengths that end the wide backward's steps in every way: 300 =
// 3 x 80 + 60 (a short step), 224 = 2 x 80 + 64, 128 = 2 x 64, 336 = 80 + 4 x 64), seeds 1, 2, ...
// in that order (Case: ForwardCase or BackwardCase, Scenario its enum).
template <class Case, class Scenario>
std::vector<Case> scenario_grid(AttnKernelRoute route) {
  const int shapes[3][2] = {{8, 8}, {8, 2}, {8, 1}};
  const struct {
    Scenario s;
    int q_len, kv_len;
  } scen[] = {{Scenario::Full, 300, 333},       {Scenario::Full, 128, 256},     {Scenario::Full, 224, 256},
              {Scenario::Causal, 300, 300},     {Scenario::Causal, 256, 256},   {Scenario::Partial, 200, 400},
              {Scenario::MultiTile, 190, 129},  {Scenario::MultiTile, 77, 300}, {Scenario::Full, 336, 256}};
  std::vector<Case> out;
  uint64_t seed = 1;
  for (int dim : {64, 128}) {
    for (const auto& sh : shapes) {
      for (const auto& sc : scen) {
        Case c;
        c.seed = seed++;
        c.num_q_heads = sh[0];
        c.num_kv_heads = sh[1];
        c.head_dim = dim;
        c.scenario = sc.s;
        c.q_len = sc.q_len;
        c.kv_len = sc.kv_len;
        c.route = route;
        out.push_back(c);
      }
    }
  }
  return out;
}

// ---- Targeted backward checks (attention_backward_check.cpp): tile lists of one scenario run
// through a chosen backward route, dQ / dK / dV compared with fp64 per element. accumulate: the
// outputs start from random values (the kernels add to them) instead of zeros. Long: tiles of
// q_len = kAttnHeadMajorRows rows (one case of backward_cases), a causal diagonal, a window's lower edge
// and a Full tile, the last two listed kv head by kv head. Runs: Full tiles of three q blocks of
// q_len rows and one of 100 over two key blocks (kv_len keys; 200 keys, whose 72-key rest the
// 64-row kernel takes), q block by q block as a stage lists them, for the wide kernel's runs
// (BackwardCase::run_rows).
enum class BackwardScenario { Full, Causal, Partial, MultiTile, Long, Runs };
struct BackwardCase {
  uint64_t seed = 1;
  int num_q_heads = 8;
  int num_kv_heads = 8;
  int head_dim = 128;
  BackwardScenario scenario = BackwardScenario::Full;
  int q_len = 300;
  int kv_len = 333;
  bool accumulate = false;
  // Pass the dq buffer's rows (AttnBackwardParams::dq_rows): the Wgmma route then adds full
  // 64-row dQ sub-tiles by TMA reductions; false: every sub-tile by atomics.
  bool dq_rows_known = true;
  // Pass the Q and dO buffers' rows (AttnBackwardParams::q_rows, dout_rows): the Wgmma route then
  // loads full 64-row Q / dO sub-tiles by TMA; false: every sub-tile by cp.async.
  bool q_rows_known = true;
  // Give the list the host's cell classes of its Partial tiles (make_partial_cells; the work
  // then leaves out chunks with no allowed pair).
  bool partial_cells = true;
  // Move the items the wide kernel takes to the list's front (partition_backward_work,
  // AttnTileList::num_wide): the Wgmma route at head dim 128 runs them with 80-row q steps.
  bool wide = true;
  // With wide: join the wide items of tiles that share a key block into runs cut at multiples of
  // this many q rows (make_backward_runs); 0: an item per tile. Wgmma route only.
  int run_rows = 0;
  // Run the backward as a CUDA graph captured (global mode) on a stream of a thread of its own,
  // then replayed: a launch that forks a stream of its own (the wide kernel beside the 64-row
  // one) makes that stream inside the capture and joins it back into the graph.
  bool captured = false;
  AttnKernelRoute route = AttnKernelRoute::Mma;
};
struct BackwardResult {
  bool ran = false;
  std::string error;
  int num_tiles = 0;
  int num_empty_rows = 0;    // (row, head) pairs with no allowed key (LSE = -inf)
  double dq_rel = 0, dk_rel = 0, dv_rel = 0;
  int num_bad = 0;           // elements beyond the per-element bound
  bool any_nan = false;
  std::string first_mismatch;
};
// Every scenario at head dims 64 and 128, GQA 1 / 4 / 8, lengths that are not multiples of 64
// or 128 (and exact ones), half of them accumulating, for `route`.
std::vector<BackwardCase> backward_cases(AttnKernelRoute route);
BackwardResult run_backward_case(const BackwardCase& c);
std::string describe(const BackwardCase& c, const BackwardResult& r);
inline bool passed(const BackwardResult& r, double tol = 2e-2) {
  return r.error.empty() && !r.any_nan && r.num_bad == 0 && r.dq_rel < tol && r.dk_rel < tol && r.dv_rel < tol;
}

}  // namespace dcp::cuda::check
