// attention_forward_sm90.cuh — pieces shared by the Hopper (sm_90a) forward kernels
// (attention_forward_sm90.cu: the basic kernel; attention_forward_sm90_pipe.cu: the pipelined
// one): CTA shape, shared-memory layout and the cp.async tile loader. Both kernels use the same
// layout (Q, double-buffered K and V sub-tiles, double-buffered Partial masks).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attention_common.cuh"
#include "dcp/attention_cuda.h"
#include "wgmma_sm90.cuh"

namespace dcp::cuda::detail {

inline constexpr int kWgThreads = 256;                 // 2 warpgroups
inline constexpr int kWgRows = kAttnForwardChunkRows;  // q rows per CTA
inline constexpr int kWgKeys = 128;                    // keys per sub-tile
inline constexpr int kMaskWords = kWgKeys / 64;        // uint64 mask words per row and sub-tile
static_assert(kWgRows == 128 && kWgThreads == kWgRows * kMaskWords, "one thread per (row, mask word)");

template <int kD>
struct WgSmem {
  static constexpr int kQBytes = kWgRows * kD * 2;
  static constexpr int kKvBytes = kWgKeys * kD * 2;   // one K or V sub-tile
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kQBytes;             // 2 buffers
  static constexpr int kV = kK + 2 * kKvBytes;        // 2 buffers
  static constexpr int kMask = kV + 2 * kKvBytes;     // [buffer][word][row] uint64
  static constexpr int kBytes = kMask + 2 * kMaskWords * kWgRows * 8;
  static constexpr int kAlloc = kBytes + kSw128AtomBytes;  // slack to align the base to 1024
  static_assert(kQBytes % kSw128AtomBytes == 0 && kKvBytes % kSw128AtomBytes == 0, "tiles stay atom aligned");
};

// Loads 128 rows of a [tokens][heads][kD] bf16 buffer (row stride `stride` elements; rows at or
// past `valid_rows` are zero-filled) into a swizzled 128-row tile; 256 threads, 16 bytes each.
template <int kD>
__device__ __forceinline__ void load_tile_sw128(uint32_t tile, const __nv_bfloat16* src, int64_t stride,
                                                int valid_rows) {
  constexpr int kChunks = kD / 8;
  constexpr int kPerThread = 128 * kChunks / kWgThreads;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int idx = static_cast<int>(threadIdx.x) + i * kWgThreads;
    const int row = idx / kChunks;
    const int col = (idx % kChunks) * 8;
    const bool valid = row < valid_rows;
    cp_async16(tile + sw128_offset<128>(row, col), src + (valid ? row * stride + col : 0), valid);
  }
}

}  // namespace dcp::cuda::detail
