// tools/dense_reference.h — what `dcp run` checks the distributed result against: dense fp64
// attention (forward and backward) of a whole batch with its exact per-token masks, and the
// error statistics it reports. The math is the library's fp64 reference (dcp/reference.h), which
// shares no code with the kernels it judges.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "dcp/batch.h"
#include "dcp/mask.h"

namespace dcp::cli {

// Global (packed) layouts: row = token of the batch, sequences one after the other.
// q, o, d_o, dq: [tokens][q_heads][head_dim]; k, v, dk, dv: [tokens][kv_heads][head_dim];
// lse: [tokens][q_heads].
struct AttentionInputs {
  std::vector<float> q, k, v, d_o;
};

struct ReferenceOutputs {
  std::vector<double> o, lse, dq, dk, dv;
};

// Deterministic inputs: every element a function of (seed, tensor, index) only (counter-based
// splitmix64), so any rank can make the same tensors; Q and K in [-2, 2), V and dO in [-1, 1).
AttentionInputs make_inputs(const AttentionShape& shape, int64_t total_tokens, uint64_t seed);

// Softmax attention with scale 1/sqrt(head_dim); rows without an allowed key give O = 0,
// LSE = -inf and no gradient. dcp::reference_attention (dcp/reference.h) with one problem per
// sequence, its rows' keys from Mask::row_ranges: cost O(allowed pairs x head_dim), threads over
// (sequence, KV head).
ReferenceOutputs dense_reference(const AttentionShape& shape, const std::vector<int64_t>& lengths,
                                 const std::vector<Mask>& masks, const AttentionInputs& in);

struct ErrorStats {
  double max_rel = 0;   // max |got - want| / max(max |want|, floor)
  double mean_rel = 0;  // sum |got - want| / max(sum |want|, n x floor), n elements
};
// -inf in `want` must be -inf in `got`; a NaN, or a mismatched infinity, gives infinite error.
// `floor` is the magnitude below which a reference counts as zero: errors are relative to the
// larger of the reference and the floor, so a tensor that is exactly 0 (dQ and dK when every
// query sees one key) is judged by its absolute error against the scale its inputs give it
// instead of dividing by 0.
ErrorStats compare(const std::vector<float>& got, const std::vector<double>& want, double floor);

// The floors of O, LSE, dQ, dK, dV: the magnitude each output has when its inputs are as large
// as they are here (products of the inputs' largest absolute values; LSE: 1). Softmax scaling
// by 1/sqrt(head_dim) offsets the sqrt(head_dim) growth of the dot products, so no head_dim
// factor appears.
std::array<double, 5> error_floors(const AttentionInputs& in);

}  // namespace dcp::cli
