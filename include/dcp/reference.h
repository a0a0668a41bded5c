// dcp/reference.h — dense fp64 attention, forward and backward: the numeric counterpart of the
// symbolic validator (validate.h). What the kernels, the executor and `dcp run` are judged
// against; it shares no code with any of them.
//
// One problem is num_q query rows against num_kv key rows with a per-row mask given as key
// ranges. For query row i, query head h (kv head g = h / (q_heads / kv_heads)) and the allowed
// keys j of row i, with scale c = 1 / sqrt(head_dim):
//
//   S_ij  = c * <Q_ih, K_jg>                 LSE_ih = log sum_j exp(S_ij)
//   P_ij  = exp(S_ij - LSE_ih)               O_ih   = sum_j P_ij V_jg
//   Delta_ih = <dO_ih, O_ih>                 dP_ij  = <dO_ih, V_jg>
//   dS_ij = P_ij (dP_ij - Delta_ih)
//   dQ_ih = c sum_j dS_ij K_jg     dK_jg = c sum_{i,h in g} dS_ij Q_ih     dV_jg = sum_{i,h in g} P_ij dO_ih
//
// Delta is the row sum of dO * O, which equals sum_j P_ij dP_ij, so dS is the softmax Jacobian
// applied to dP. Everything is computed in fp64 from the fp32 inputs (the maximum score is
// subtracted before exponentiating). A row with no allowed key has O = 0, LSE = -inf, Delta = 0
// and contributes no gradient.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "dcp/mask.h"

namespace dcp {

// The allowed keys of one query row: fills `out`, passed empty, with sorted, disjoint,
// half-open key ranges inside [0, num_kv); ranges may touch or be empty. Called once per row, in
// row order, from the calling thread.
using RowKeys = std::function<void(int64_t row, std::vector<Range>& out)>;

struct ReferenceProblem {
  int64_t num_q = 0;   // query rows
  int64_t num_kv = 0;  // key rows
  int q_heads = 1;
  int kv_heads = 1;    // divides q_heads
  int head_dim = 0;
  const float* q = nullptr;    // [num_q][q_heads][head_dim]
  const float* k = nullptr;    // [num_kv][kv_heads][head_dim]
  const float* v = nullptr;    // [num_kv][kv_heads][head_dim]
  const float* d_o = nullptr;  // [num_q][q_heads][head_dim]; null: forward only
  RowKeys row_keys;
  // Optional, both or neither, backward only, [num_q][q_heads]: the statistics the backward
  // uses instead of this problem's own LSE and Delta (P = exp(S - backward_lse), dS = P (dP -
  // backward_delta)). The backward kernels take LSE and Delta as inputs; with these the
  // reference computes exactly what such a kernel is asked to, even for statistics that do not
  // come from this forward. Finite wherever the row has an allowed key.
  const float* backward_lse = nullptr;
  const float* backward_delta = nullptr;
};

struct ReferenceResult {
  std::vector<double> o;      // [num_q][q_heads][head_dim]
  std::vector<double> lse;    // [num_q][q_heads], natural log
  std::vector<double> delta;  // [num_q][q_heads]; with d_o only (always this forward's Delta)
  std::vector<double> dq;     // [num_q][q_heads][head_dim]; with d_o only
  std::vector<double> dk;     // [num_kv][kv_heads][head_dim]; with d_o only
  std::vector<double> dv;     // [num_kv][kv_heads][head_dim]; with d_o only
};

// Solves every problem. Work is split into (problem, kv head) jobs over OpenMP threads; a job
// owns its rows of every output and sums in a fixed order, so the results do not depend on the
// number of threads. Cost: allowed (row, key) pairs x q_heads x head_dim, about 3x that with
// d_o; memory: an fp64 copy of the inputs.
// Throws InvalidInput for a malformed problem (shape, missing tensor, ranges not sorted,
// overlapping or outside [0, num_kv), a non-finite backward_lse or backward_delta on a row with
// keys).
std::vector<ReferenceResult> reference_attention(std::span<const ReferenceProblem> problems);
ReferenceResult reference_attention(const ReferenceProblem& problem);

}  // namespace dcp
