// attention_backward_sm90.cuh — pieces shared by the Hopper (sm_90a) backward kernels
// (attention_backward_sm90.cu: basic; attention_backward_sm90_ws.cu: warp-specialised): CTA shape, the dQ tile row pitch, and the
// per-q-sub-tile math of the basic and warp-specialised kernels (one warpgroup = 64 keys of the
// CTA, transposed products: accumulator rows are its keys, columns the sub-tile's 64 q rows).
//
// Accumulator fragments (m64nN f32, wgmma_sm90.cuh): acc[4 j + e] = element
// (16 warp_in_wg + g + 8 (e >> 1), 8 j + 2 tq + (e & 1)) of the warpgroup's result, so
// key_lo = 64 wg + 16 warp_in_wg + g and key_lo + 8 are a thread's two keys.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attention_common.cuh"
#include "dcp/detail/attention_cuda.h"
#include "wgmma_sm90.cuh"
#include "wgmma_sm90_bwd.cuh"

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

// S^T = K Q^T and dP^T = V dO^T for warpgroup wg's keys (both operands K-major from shared
// memory); two commit groups, S^T first, so that P^T is computed while dP^T runs.
template <int kD>
__device__ __forceinline__ void bw_issue_st_dpt(float (&st)[32], float (&dpt)[32], uint32_t s_k, uint32_t s_v, uint32_t qb,
                                                uint32_t dob, int wg) {
  zero(st);
  zero(dpt);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    wgmma_m64n64k16_ss(st, desc_k_major<kBwKeys>(s_k, wg * 64, kk), desc_k_major<kBwRows>(qb, 0, kk), kk > 0 ? 1 : 0);
  }
  wgmma_commit();
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    wgmma_m64n64k16_ss(dpt, desc_k_major<kBwKeys>(s_v, wg * 64, kk), desc_k_major<kBwRows>(dob, 0, kk), kk > 0 ? 1 : 0);
  }
  wgmma_commit();
}

// st (S^T) becomes P^T = exp2(S^T scale log2e - LSE log2e) (columns are q rows: `lse2` holds
// LSE log2e per column). cls == kMasked: zero for keys at or past `keys`, for Partial keys whose
// bit in masks[key half * kBwRows + column] is clear, and for causal-diagonal keys past the row.
// Two loop bodies, chosen once per step: a full step is one FFMA and one MUFU.EX2 per element,
// with no per-element test (a per-element `cls` test compiled to a branch per element).
template <bool kMaskedStep>
__device__ __forceinline__ void bw_probabilities_step(float (&st)[32], const float2 (&lse2)[8], const uint64_t* masks,
                                                      TileKind kind, int keys, int c0, int rq0, int key_lo, int tq,
                                                      float scale_log2) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float2 l2 = lse2[j];
    // A thread's two keys, key_lo and key_lo + 8, lie in one 64-key word (key_lo % 64 < 56): one
    // load per column, shifted so that bit 0 is key_lo's and bit 8 key_lo + 8's.
    uint32_t bits[2] = {~0U, ~0U};
    if constexpr (kMaskedStep) {
      if (kind == TileKind::Partial) {
#pragma unroll
        for (int b = 0; b < 2; ++b) {
          bits[b] = static_cast<uint32_t>(masks[(key_lo >> 6) * kBwRows + 8 * j + 2 * tq + b] >> (key_lo & 63));
        }
      }
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float pv = exp2_ftz(fmaf(st[4 * j + e], scale_log2, -((e & 1) != 0 ? l2.y : l2.x)));
      if constexpr (kMaskedStep) {
        const int key = key_lo + 8 * (e >> 1);
        const int col = 8 * j + 2 * tq + (e & 1);
        bool ok = key < keys && ((bits[e & 1] >> (8 * (e >> 1))) & 1U) != 0;
        if (kind == TileKind::CausalDiagonal) ok = ok && c0 + key <= rq0 + col;
        pv = ok ? pv : 0.0F;
      }
      st[4 * j + e] = pv;
    }
  }
}

__device__ __forceinline__ void bw_probabilities(float (&st)[32], const float2 (&lse2)[8], const uint64_t* masks, int cls,
                                                 TileKind kind, int keys, int c0, int rq0, int key_lo, int tq,
                                                 float scale_log2) {
  if (cls == kMasked) {
    bw_probabilities_step<true>(st, lse2, masks, kind, keys, c0, rq0, key_lo, tq, scale_log2);
  } else {
    bw_probabilities_step<false>(st, lse2, masks, kind, keys, c0, rq0, key_lo, tq, scale_log2);
  }
}

// A thread's 16 per-column values (columns 8 j + 2 tq, + 1) of a sub-tile's 64 (LSE log2e or
// Delta, in shared memory). The kernels load them before they wait for the product that needs them,
// so that the shared-memory latency (long while the tensor cores stream their operands from the
// same memory) runs under the product rather than after it.
__device__ __forceinline__ void bw_load_cols(const float* v, int tq, float2 (&out)[8]) {
#pragma unroll
  for (int j = 0; j < 8; ++j) out[j] = *reinterpret_cast<const float2*>(v + 8 * j + 2 * tq);
}

// dpt (dP^T) becomes dS^T = P^T (dP^T - Delta), Delta per column (bw_load_cols).
__device__ __forceinline__ void bw_ds(float (&dpt)[32], const float (&pt)[32], const float2 (&delta)[8]) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float2 d2 = delta[j];
#pragma unroll
    for (int e = 0; e < 4; ++e) dpt[4 * j + e] = pt[4 * j + e] * (dpt[4 * j + e] - ((e & 1) != 0 ? d2.y : d2.x));
  }
}

// A fragments of m64k16 (k step kk = q columns 16 kk .. + 15) of an accumulator tile (P^T or
// dS^T): accumulator blocks 2 kk and 2 kk + 1, in order (as P in the forward).
__device__ __forceinline__ void bw_pack_fragment(uint32_t (&a)[4][4], const float (&acc)[32]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
    for (int i = 0; i < 4; ++i) a[kk][i] = pack_bf16(acc[8 * kk + 2 * i], acc[8 * kk + 2 * i + 1]);
  }
}

// dS^T fragments (keys x q, bf16) to the swizzled shared tile `ds` (kBwKeys rows) that dQ reads:
// da[kk][2 h] = (key_lo, 16 kk + 8 h + 2 tq ..+1), da[kk][2 h + 1] = (key_lo + 8, same columns).
__device__ __forceinline__ void bw_store_ds(unsigned char* ds, const uint32_t (&da)[4][4], int key_lo, int tq) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int col = 16 * kk + 8 * h + 2 * tq;
      *reinterpret_cast<uint32_t*>(ds + sw128_offset<kBwKeys>(key_lo, col)) = da[kk][2 * h];
      *reinterpret_cast<uint32_t*>(ds + sw128_offset<kBwKeys>(key_lo + 8, col)) = da[kk][2 * h + 1];
    }
  }
}

// acc += A B for one q sub-tile, A (keys x 64 q rows, bf16) from registers, B the sub-tile's
// [q][d] tile in shared memory (q = K rows, d contiguous -> MN-major): dV += P^T dO (B = dO) and
// dK += dS^T Q (B = Q). One commit group.
template <int kD>
__device__ __forceinline__ void bw_issue_rs(float (&acc)[kD / 2], const uint32_t (&a)[4][4], uint32_t b) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    if constexpr (kD == 128) {
      wgmma_m64n128k16_rs(acc, a[kk], desc_mn_major<kBwRows>(b, kk));
    } else {
      wgmma_m64n64k16_rs(acc, a[kk], desc_mn_major<kBwRows>(b, kk));
    }
  }
  wgmma_commit();
}

// The products of one q sub-tile up to dV and dK (the basic kernel): S^T and dP^T issued, P^T
// (masked as `cls` says), dS^T = P^T (dP^T - Delta) (also stored to the swizzled tile `ds` for
// dQ), then dV += P^T dO and dK += dS^T Q issued, two commit groups still in flight on return.
// qb / dob: the sub-tile's Q and dO tiles; lse2 / delta: its 64 rows' values.
template <int kD>
__device__ __forceinline__ void bw_sub_tile_dv_dk(float (&dv)[kD / 2], float (&dk)[kD / 2], uint32_t s_k, uint32_t s_v,
                                                  uint32_t qb, uint32_t dob, const float* lse2, const float* delta,
                                                  const uint64_t* masks, int cls, TileKind kind, int keys, int c0,
                                                  int rq0, unsigned char* ds, int wg, int key_lo, int tq,
                                                  float scale_log2) {
  float st[32];
  float dpt[32];
  bw_issue_st_dpt<kD>(st, dpt, s_k, s_v, qb, dob, wg);
  float2 cols[8];
  bw_load_cols(lse2, tq, cols);
  wgmma_wait<1>();
  fence_regs(st);
  bw_probabilities(st, cols, masks, cls, kind, keys, c0, rq0, key_lo, tq, scale_log2);
  bw_load_cols(delta, tq, cols);
  wgmma_wait<0>();
  fence_regs(dpt);
  bw_ds(dpt, st, cols);
  uint32_t pa[4][4];
  uint32_t da[4][4];
  bw_pack_fragment(pa, st);
  bw_pack_fragment(da, dpt);
  bw_store_ds(ds, da, key_lo, tq);
  bw_issue_rs<kD>(dv, pa, dob);
  bw_issue_rs<kD>(dk, da, qb);
}

// dQ (64 q x 64 columns) = dS K: A = the dS^T tile `ds` read MN-major (q contiguous), B = the K
// tile read MN-major (d contiguous); k steps of 16 keys. D = 128: warpgroup wg computes columns
// [64 wg, 64 wg + 64) over all 128 keys; D = 64: all 64 columns over its own 64 keys (a partial
// sum). One commit group.
template <int kD>
__device__ __forceinline__ void bw_issue_dq(float (&dq)[32], uint32_t ds, uint32_t s_k, int wg) {
  constexpr int kDqSteps = kD == 128 ? kBwKeys / 16 : 4;
  const int kk0 = kD == 128 ? 0 : 4 * wg;
  const uint32_t kcols = kD == 128 ? s_k + static_cast<uint32_t>(wg * kBwKeys * 128) : s_k;  // column block
  zero(dq);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kDqSteps; ++kk) {
    wgmma_m64n64k16_ss_tt(dq, desc_mn_major<kBwKeys>(ds, kk0 + kk), desc_mn_major<kBwKeys>(kcols, kk0 + kk), kk > 0 ? 1 : 0);
  }
  wgmma_commit();
}

// dQ * scale into the warpgroup's fp32 tile (rows kDqRowBytes apart): thread rows row_lo, row_lo + 8.
__device__ __forceinline__ void bw_write_dq_tile(unsigned char* tile, const float (&dq)[32], int row_lo, int tq, float scale) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float* trow = reinterpret_cast<float*>(tile + (row_lo + 8 * r) * kDqRowBytes) + 2 * tq;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      *reinterpret_cast<float2*>(trow + 8 * j) = make_float2(dq[4 * j + 2 * r] * scale, dq[4 * j + 2 * r + 1] * scale);
    }
  }
}

// Finish: dK * scale and dV atomically added (fp32) for this thread's keys below `keys`;
// `row0` is the output row of CTA key 0, kvh its kv head.
template <int kD>
__device__ __forceinline__ void bw_add_dk_dv(float* dk_out, float* dv_out, const float (&dk)[kD / 2], const float (&dv)[kD / 2],
                                             int row0, int num_kv_heads, int kvh, int key_lo, int keys, int tq, float scale) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = key_lo + 8 * r;
    if (key >= keys) continue;
    const int64_t off = (static_cast<int64_t>(row0 + key) * num_kv_heads + kvh) * kD + 2 * tq;
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
      atomicAdd(reinterpret_cast<float2*>(dk_out + off + 8 * j), make_float2(dk[4 * j + 2 * r] * scale, dk[4 * j + 2 * r + 1] * scale));
      atomicAdd(reinterpret_cast<float2*>(dv_out + off + 8 * j), make_float2(dv[4 * j + 2 * r], dv[4 * j + 2 * r + 1]));
    }
  }
}

}  // namespace dcp::cuda::detail
