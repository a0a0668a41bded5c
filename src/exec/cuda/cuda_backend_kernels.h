// cuda_backend_kernels.h — launchers of the CUDA backend's small kernels.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dcp::cuda {

struct ZeroRange {
  float* ptr = nullptr;  // 16-byte aligned
  int64_t count = 0;     // floats, a multiple of 4
};

// delta[rh] = sum_d dout[rh][d] * out[rh][d] for rh < num_row_heads (dout bf16, out fp32); where
// norm2 is given, also norm2[rh] = sum_d dout[rh][d]^2 (the one-pass deterministic backward's
// |dO|_2^2, deterministic_dq_units_from_norms), from the same loads.
void delta_bf16_f32(const void* dout, const float* out, float* delta, float* norm2, int64_t num_row_heads,
                    int head_dim, cudaStream_t stream);
// n values in [-amplitude, amplitude] from a hash of (seed, index); bf16 or fp32.
void fill_random(void* p, bool bf16, int64_t n, uint64_t seed, float amplitude, cudaStream_t stream);
// Zeroes every range (device array of num_ranges ZeroRange).
void zero_ranges(const ZeroRange* ranges, int num_ranges, cudaStream_t stream);
// Whether this build holds code the current device can run (machine code for its architecture, or
// PTX it can compile): false where every kernel launch would fail with "no kernel image".
bool build_runs_on_current_device();

// One move between group-major array rows and a caller's strided tensor of all heads (see
// dcp::LocalExchange): element (g, r, h, d) of the array is array[((g * num_rows + r) *
// heads_per_group + h) * head_dim + d]; of the tensor, tensor[r * row_stride + (g *
// heads_per_group + h) * head_stride + d]. Types: 0 fp32, 1 bf16.
struct ExchangeMove {
  void* tensor = nullptr;
  void* array = nullptr;
  int64_t row_stride = 0;
  int64_t head_stride = 0;
  int64_t num_rows = 0;
  int32_t heads_per_group = 0;
  int32_t head_dim = 0;
  int32_t num_groups = 0;
  int32_t tensor_bf16 = 0;
  int32_t array_bf16 = 0;
  int32_t import = 1;  // 1: tensor -> array; 0: array -> tensor
  int32_t vector = 0;  // 1: 8 consecutive elements per access (16-byte aligned on both sides)
  int32_t pad_ = 0;
  // Export only: the fp32 array rows hold int32 counts of these units (the one-pass deterministic
  // backward's dQ; units[(g * num_rows + r) * heads_per_group + h], biased exponents), converted
  // on the way out (dcp/detail/dq_units.h). Null: plain values.
  const int32_t* units = nullptr;
};
inline constexpr int kMaxExchangeMoves = 8;
struct ExchangeBatch {
  ExchangeMove moves[kMaxExchangeMoves];
  int32_t num_moves = 0;
};
void exchange_rows(const ExchangeBatch& batch, cudaStream_t stream);

// delta[(g * num_rows + r) * heads_per_group + h] = sum_d dO[r, g * hpg + h, d] * O[r, ...]
// from strided caller tensors (fp32 or bf16 each); one warp per (row, head).
struct DeltaFromParams {
  const void* d_o = nullptr;
  const void* o = nullptr;
  float* delta = nullptr;
  float* norm2 = nullptr;  // optional: |dO|_2^2 per (row, head), indexed like delta
  int64_t do_row_stride = 0, do_head_stride = 0;
  int64_t o_row_stride = 0, o_head_stride = 0;
  int64_t num_rows = 0;
  int32_t heads_per_group = 0;
  int32_t num_groups = 0;
  int32_t head_dim = 0;
  int32_t do_bf16 = 1;
  int32_t o_bf16 = 1;
  // Optional: Delta -= d_lse[r * dlse_row_stride + head * dlse_head_stride] (fp32; the gradient
  // of lse, AttentionBackwardArgs::d_lse).
  const float* d_lse = nullptr;
  int64_t dlse_row_stride = 0, dlse_head_stride = 0;
  // Optional with d_lse: |d_lse| per (row, head), indexed like delta (the one-pass deterministic
  // backward's units bound it, dq_units.h).
  float* dlse_abs = nullptr;
};
void delta_from_tensors(const DeltaFromParams& p, cudaStream_t stream);

}  // namespace dcp::cuda
