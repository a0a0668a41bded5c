// attention_backward_sm90.cuh — pieces shared by the Hopper (sm_90a) backward kernels
// (attention_backward_sm90.cu: basic; attention_backward_sm90_pipe.cu: pipelined;
// attention_backward_sm90_ws.cu: warp-specialised): CTA shape and the dQ tile row pitch.
#pragma once

#include <cuda_runtime.h>

#include "attention_common.cuh"
#include "dcp/attention_cuda.h"

namespace dcp::cuda::detail {

inline constexpr int kBwKeys = kAttnBackwardChunkRows;  // keys per CTA (2 warpgroups x 64)
inline constexpr int kBwRows = kRows;                   // q rows per sub-tile (64)
static_assert(kBwKeys == 128 && kBwRows == 64, "2 warpgroups x 64 keys, 64-row q sub-tiles");

// dQ tile of one warpgroup (bulk route): 64 q rows x 64 fp32 columns, rows padded by 32 bytes so
// that a warp's float2 stores touch every bank exactly twice (the minimum for 256 bytes).
inline constexpr int kDqRowBytes = 64 * 4 + 32;

template <int kN>
__device__ __forceinline__ void zero(float (&r)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) r[i] = 0.0F;
}

}  // namespace dcp::cuda::detail
