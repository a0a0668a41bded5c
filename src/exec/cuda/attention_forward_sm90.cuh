// attention_forward_sm90.cuh — pieces shared by the Hopper (sm_90a) forward kernels
// (attention_forward_sm90.cu: the basic kernel; attention_forward_sm90_ws.cu: the
// warp-specialised one): CTA shape, the basic kernel's shared-memory layout and cp.async tile
// loader, the P V issue, and the TMA parameters of the warp-specialised kernel.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attention_common.cuh"
#include "dcp/attention_cuda.h"
#include "tensor_map.h"
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

// Keeps the packed P registers (the A operand of an in-flight wgmma) alive and unmodified until
// after the wait that ends their read: the compiler sees the issue asm only as a reader.
template <int kN>
__device__ __forceinline__ void fence_regs_u32(uint32_t (&r)[kN][4]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    asm volatile("" : "+r"(r[i][0]), "+r"(r[i][1]), "+r"(r[i][2]), "+r"(r[i][3])::"memory");
  }
}

template <int kD>
__device__ __forceinline__ void issue_pv(float (&o)[kD / 2], const uint32_t (&pa)[kWgKeys / 16][4], uint32_t vb) {
#pragma unroll
  for (int kk = 0; kk < kWgKeys / 16; ++kk) {
    if constexpr (kD == 128) {
      wgmma_m64n128k16_rs(o, pa[kk], desc_mn_major<kWgKeys>(vb, kk));
    } else {
      wgmma_m64n64k16_rs(o, pa[kk], desc_mn_major<kWgKeys>(vb, kk));
    }
  }
  wgmma_commit();
}

// Parameters of the TMA-fed forward kernel (warp-specialised): the caller's, and
// the K and V tensor maps (a __grid_constant__ kernel parameter, so that TMA reads the maps
// from parameter space).
struct FwTmaParams {
  AttnForwardParams p;
  CUtensorMap k_map;  // [kv_rows][num_kv_heads x D] bf16, boxes of 128 rows x 64 columns
  CUtensorMap v_map;
  int32_t tma_kv;     // 1: both maps are valid (AttnForwardParams::kv_rows known)
};

// Host: the maps of `p` (tma_kv = 0 when the rows are unknown or the buffers cannot be mapped).
inline FwTmaParams forward_tma_params(const AttnForwardParams& p, int head_dim, const char* name) {
  FwTmaParams fp{};
  fp.p = p;
  const int64_t row_elems = int64_t{p.shape.num_kv_heads} * head_dim;
  const bool tma = p.kv_rows > 0 &&
                   encode_tensor_map_2d(fp.k_map, name, TensorElem::Bf16, p.k, row_elems, p.kv_rows, 64, kWgKeys) &&
                   encode_tensor_map_2d(fp.v_map, name, TensorElem::Bf16, p.v, row_elems, p.kv_rows, 64, kWgKeys);
  fp.tma_kv = tma ? 1 : 0;
  return fp;
}

}  // namespace dcp::cuda::detail
