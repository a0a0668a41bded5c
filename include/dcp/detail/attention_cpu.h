// dcp/attention_cpu.h — blockwise attention on the CPU: the kernels of the CPU backend.
//
// Independent of plans: every call takes raw pointers to data blocks plus a small description of
// each tile, so the executor, the tests and the benchmarks call the same code.
//
// Layout (every tensor fp32, row-major, contiguous):
//   Q, O, dO, dQ   [tokens][q_heads][head_dim]
//   K, V, dK, dV   [tokens][kv_heads][head_dim]
//   LSE, Delta     [tokens][q_heads]
// q head h reads kv head h / (q_heads / kv_heads) (GQA). One call covers one head group: the
// pointers of a tile point at the first token of its q block and of its kv block, and at the
// group's first head. Rows may be further apart than heads x head_dim (a head group sliced out
// of a tensor of all heads): each tile names the row stride of each tensor (RowStrides).
//
// Math (scale = 1/sqrt(head_dim), S = scale * Q K^T restricted to the allowed keys of each row):
//   forward   O = softmax(S) V, LSE = log(sum_j exp(S_ij)) (natural log); rows with no allowed
//             key give O = 0 and LSE = -inf.
//   backward  P = exp(S - LSE), dV += P^T dO, dP = dO V^T, dS = P * (dP - Delta),
//             dQ += scale * dS K, dK += scale * dS^T Q, with Delta = rowsum(dO * O) of the final O
//             and LSE the final merged LSE. Rows with LSE = -inf contribute nothing.
// FLOPs (project convention): 4 * area * head_dim * q_heads forward, 2.5x that backward.
// Full tiles run blocked micro-kernels (64x64 sub-blocks); sub-blocks of partial and
// causal-diagonal tiles that the mask fully hides are skipped, mixed ones are masked per element.
// Results do not depend on the number of OpenMP threads (fixed work splits, fixed reduction order).
#pragma once

#include <cstdint>
#include <span>

#include "dcp/blocks.h"
#include "dcp/mask.h"

namespace dcp::cpu {

struct HeadLayout {
  int q_heads = 0;   // query heads per token in the blocks passed
  int kv_heads = 0;  // KV heads per token; q_heads is a multiple of kv_heads
  int head_dim = 0;  // a multiple of 16, at most 256
  // Throws InvalidInput / Unsupported naming the field at fault.
  void validate() const;
  int gqa_ratio() const { return q_heads / kv_heads; }
};

// Which (row, key) pairs of a tile are allowed, in tile-local coordinates (row in [0, num_q),
// key in [0, num_kv)).
struct TileMaskView {
  TileKind kind = TileKind::Full;
  // Partial only: the ranges of row r are ranges[row_offsets[r] .. row_offsets[r+1]), sorted,
  // disjoint, inside [0, num_kv). Any number of ranges per row, including none.
  std::span<const int64_t> row_offsets;
  std::span<const Range> ranges;
};

// Distance between consecutive tokens of each tensor, in floats. 0 = dense: heads x head_dim
// for token tensors (q_heads or kv_heads of the HeadLayout), q_heads for LSE and Delta.
struct RowStrides {
  int64_t q = 0;      // Q
  int64_t kv = 0;     // K and V
  int64_t o = 0;      // O
  int64_t lse = 0;    // LSE
  int64_t d_o = 0;    // dO
  int64_t delta = 0;  // Delta
  int64_t dq = 0;     // dQ
  int64_t dkv = 0;    // dK and dV
  // The strides with every 0 replaced by its dense value.
  RowStrides resolved(const HeadLayout& heads) const;
};

struct ForwardTile {
  int64_t num_q = 0;   // query rows (tokens) of the tile
  int64_t num_kv = 0;  // keys of the tile; CausalDiagonal needs num_q == num_kv (key j <= row j)
  TileMaskView mask;
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  float* o = nullptr;
  float* lse = nullptr;
  RowStrides ld;  // q, kv, o, lse
  // false: (o, lse) receive this tile's partial. true: the partial is LSE-merged into the (o, lse)
  // already there (start from O = 0, LSE = -inf), which saves a partial buffer.
  bool accumulate = false;
};

struct BackwardTile {
  int64_t num_q = 0;
  int64_t num_kv = 0;
  TileMaskView mask;
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  const float* d_o = nullptr;
  const float* lse = nullptr;    // final (merged) LSE of the q rows
  const float* delta = nullptr;  // rowsum(dO * O) of the final O
  float* dq = nullptr;           // accumulated (+=)
  float* dk = nullptr;           // accumulated (+=)
  float* dv = nullptr;           // accumulated (+=)
  RowStrides ld;                 // q, kv, d_o, lse, delta, dq, dkv
};

// Forward over a list of tiles, in order (tiles with accumulate = true may share outputs).
// Pre: heads valid; every tile's pointers cover its rows/keys; Partial row ranges well formed
// (checked: InvalidInput). Post: see the math above.
void attend_forward(const HeadLayout& heads, std::span<const ForwardTile> tiles);

// Backward over a list of tiles, in order (tiles may share dq/dk/dv outputs).
void attend_backward(const HeadLayout& heads, std::span<const BackwardTile> tiles);

// delta[t][h] = sum_d d_o[t][h][d] * o[t][h][d] (accumulated in fp64, stored fp32).
void compute_delta(const float* d_o, const float* o, int64_t num_rows, int q_heads, int head_dim,
                   float* delta);

// (o, lse) <- LSE-merge of (o, lse) and (o_part, lse_part), in fp32, rows = tokens * q_heads.
// A -inf side is the identity: merging it with a real partial gives that partial bit for bit;
// two -inf sides give O = 0, LSE = -inf.
void merge_into(float* o, float* lse, const float* o_part, const float* lse_part, int64_t num_rows,
                int head_dim);

struct PartialView {
  const float* o = nullptr;    // [num_rows][head_dim]
  const float* lse = nullptr;  // [num_rows]
};
// (o, lse) <- merge of all parts in one pass (o and lse are written, not read).
void merge_partials(std::span<const PartialView> parts, float* o, float* lse, int64_t num_rows,
                    int head_dim);

// dst[i] += src[i] (dQ / dKV partial sums).
void sum_into(float* dst, const float* src, int64_t n);

// Each value rounded to the nearest bf16 (dcp::round_to_bf16: nearest even; NaN and inf stay).
void round_to_bf16(std::span<float> values);

}  // namespace dcp::cpu
