// attention_forward_sm90.cu — forward attention over a tile list on Hopper (sm_90a): warpgroup
// MMA. Same contract as attention_forward.cu (dcp/detail/attention_cuda.h): same work items, masks,
// accumulate and outputs. Route WgmmaBasic; the default Hopper kernel (route Wgmma) is the
// warp-specialised one built from it (attention_forward_sm90_ws.cu), this one the fallback.
// Shape and layout constants: attention_forward_sm90.cuh.
//
// One CTA = 128 q rows x one q head, 2 warpgroups (256 threads), warpgroup w owns q rows
// [64 w, 64 w + 64). Shared memory (128-byte-swizzled tiles, wgmma_sm90.cuh): Q (128 x D), K and
// V sub-tiles of 128 keys x D, double-buffered; all 256 threads load them with cp.async.
// Per 128-key sub-tile, each warpgroup:
//   S (64 x 128) = Q K^T: D / 16 wgmma m64n128k16, both operands from shared memory (K-major);
//   mask (masked sub-tiles only), online softmax in the log2 domain (scale folded into exp2);
//   O (64 x D) += P V: 8 wgmma m64nDk16 with P converted in registers from the S accumulator
//   (its fragment layout is the A-register layout), V from shared memory as an MN-major B.
// Per sub-tile: 4 * 128 * 128 * D FLOPs against 2 * 128 * D * 2 bytes of K/V (128 FLOP per byte
// at any D, twice the mma.sync kernel's 64).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "attention_common.cuh"
#include "attention_forward_sm90.cuh"
#include "dcp/detail/attention_cuda.h"
#include "wgmma_sm90.cuh"

namespace dcp::cuda::detail {
namespace {

template <int kD>
__global__ void __launch_bounds__(kWgThreads, 1) attention_forward_sm90_kernel(const AttnForwardParams p) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  // Built for a target without wgmma (only sm_90a has it): never selected there, fail loudly if run.
  (void)p;
  __trap();
#else
  using Smem = WgSmem<kD>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  // Swizzle atoms must start 1024-byte aligned (sw128_smem_base, wgmma_sm90.cuh).
  const SmemBase aligned = sw128_smem_base(smem_raw);
  unsigned char* smem = aligned.ptr;
  const uint32_t s_q = aligned.addr + Smem::kQ;
  const uint32_t s_k = aligned.addr + Smem::kK;
  const uint32_t s_v = aligned.addr + Smem::kV;
  auto* s_mask = reinterpret_cast<uint64_t*>(smem + Smem::kMask);

  const AttnWorkItem w = p.list.work[blockIdx.x];
  AttnTile ct = p.list.tiles[w.tile];  // tiles [w.tile, t_end) share the q rows and the outputs
  const int t_end = w.tile + max(1, w.num_tiles);
  const int tid = static_cast<int>(threadIdx.x);
  const int wg = tid >> 7;  // warpgroup: q rows [64 wg, 64 wg + 64)
  const FwThread th{wg, (tid >> 5) & 3, (tid & 31) >> 2, tid & 3};
  const int hq = p.shape.num_q_heads;
  const int hkv = p.shape.num_kv_heads;
  const int qh = w.head;
  const int kvh = qh / (hq / hkv);
  const int r0 = w.chunk * kWgRows;
  const int rows = min(kWgRows, ct.q_len - r0);
  const FwOutput out{int64_t{ct.out_begin} + r0, int64_t{ct.lse_begin >= 0 ? ct.lse_begin : ct.out_begin} + r0, qh, rows};
  const float scale_log2 = p.shape.softmax_scale * kLog2e;

  const auto* q = static_cast<const __nv_bfloat16*>(p.q);
  const auto* k = static_cast<const __nv_bfloat16*>(p.k);
  const auto* v = static_cast<const __nv_bfloat16*>(p.v);
  const int64_t q_stride = static_cast<int64_t>(hq) * kD;
  const int64_t kv_stride = static_cast<int64_t>(hkv) * kD;
  auto kv_offset = [&](const AttnTile& x, int n) {
    return (static_cast<int64_t>(x.kv_begin + n * kWgKeys) * hkv + kvh) * kD;
  };

  load_rows_sw128<kWgRows, kD, kWgThreads>(s_q, q + (static_cast<int64_t>(ct.q_begin + r0) * hq + qh) * kD, q_stride, rows);
  cp_async_commit();

  // Uniform across the CTA (Partial uses block-wide votes).
  auto classify = [&](const AttnTile& t, int n, int buf) -> int {
    if (t.kind != TileKind::Partial) return classify_dense<kWgKeys>(t, n * kWgKeys, r0, rows);
    return classify_partial<kMaskWords>(t, p.list.row_offsets, p.list.ranges, n * kWgKeys, r0, rows,
                                        s_mask + buf * kMaskWords * kWgRows);
  };
  // Advances (x, ti, n) to the first non-empty sub-tile at or after sub-tile n of tile ti;
  // ti == t_end when none is left.
  auto seek = [&](AttnTile& x, int& ti, int& n, int buf) -> int {
    while (ti < t_end) {
      const int end = kv_sub_tile_end<kWgKeys>(x, r0, rows);
      for (; n < end; ++n) {
        const int c = classify(x, n, buf);
        if (c != kEmpty) return c;
      }
      if (++ti < t_end) x = p.list.tiles[ti];
      n = 0;
    }
    return kEmpty;
  };
  auto load_kv = [&](const AttnTile& x, int n, int buf) {
    const int kv_rows = min(kWgKeys, x.kv_len - n * kWgKeys);
    const uint32_t off = static_cast<uint32_t>(buf * Smem::kKvBytes);
    load_rows_sw128<kWgKeys, kD, kWgThreads>(s_k + off, k + kv_offset(x, n), kv_stride, kv_rows);
    load_rows_sw128<kWgKeys, kD, kWgThreads>(s_v + off, v + kv_offset(x, n), kv_stride, kv_rows);
  };
  int ti = w.tile;
  int n = 0;
  int cls = seek(ct, ti, n, 0);
  int buf = 0;
  if (ti < t_end) load_kv(ct, n, 0);
  cp_async_commit();

  // Accumulators: see FwThread (attention_forward_sm90.cuh).
  float o[kD / 2];
  float s[kWgKeys / 2];
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) o[i] = 0.0F;
#pragma unroll
  for (int i = 0; i < kWgKeys / 2; ++i) s[i] = 0.0F;
  float m_row[2] = {-INFINITY, -INFINITY};
  float l_row[2] = {0.0F, 0.0F};
  if (w.accumulate != 0) fw_load_partial<kD>(p, out, th, o, m_row, l_row);

  while (ti < t_end) {
    AttnTile nt = ct;
    int nti = ti;
    int nn = n + 1;
    const int ncls = seek(nt, nti, nn, buf ^ 1);
    if (nti < t_end) {
      load_kv(nt, nn, buf ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    fence_proxy_async();  // this thread's cp.async bytes -> visible to wgmma after the barrier
    __syncthreads();

    const uint32_t kb = s_k + static_cast<uint32_t>(buf * Smem::kKvBytes);
    const uint32_t vb = s_v + static_cast<uint32_t>(buf * Smem::kKvBytes);

    // S = Q K^T over kD / 16 k steps (the first overwrites the old S).
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      wgmma_m64n128k16_ss(s, desc_k_major<kWgRows>(s_q, wg * 64, kk), desc_k_major<kWgKeys>(kb, 0, kk), kk > 0 ? 1 : 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(s);

    if (cls == kMasked) fw_mask_scores(s, ct.kind, ct.kv_len, s_mask + buf * kMaskWords * kWgRows, n * kWgKeys, r0, th);
    float alpha[2];
    fw_softmax(s, m_row, l_row, alpha, scale_log2);
    fw_rescale<kD>(o, alpha);
    uint32_t pa[kWgKeys / 16][4];
    fw_pack_p(pa, s);
    wgmma_fence();
    issue_pv<kD>(o, pa, vb);  // O += P V, 16 keys per k step
    wgmma_wait<0>();
    fence_regs(o);
    __syncthreads();  // every warpgroup is done with buffer `buf` before it is refilled
    ct = nt;
    ti = nti;
    n = nn;
    cls = ncls;
    buf ^= 1;
  }
  cp_async_wait<0>();
  fw_store_output<kD>(p, out, th, o, m_row, l_row);
#endif
}

template <int kD>
void launch_forward_sm90(const AttnForwardParams& p, cudaStream_t stream) {
  constexpr int kSmem = WgSmem<kD>::kAlloc;
  allow_shared_memory("attention_forward_sm90", attention_forward_sm90_kernel<kD>, kSmem);
  attention_forward_sm90_kernel<kD><<<p.list.num_work, kWgThreads, kSmem, stream>>>(p);
}

}  // namespace

void attention_forward_wgmma_basic(const AttnForwardParams& params, cudaStream_t stream) {
  launch_for_head_dim("attention_forward_sm90", params.shape,
                      [&]<int kD>() { launch_forward_sm90<kD>(params, stream); });
}

}  // namespace dcp::cuda::detail
