// attention_forward_sm90_pipe.cu — the pipelined Hopper (sm_90a) forward kernel: the basic
// kernel's CTA shape, shared-memory layout and contract (attention_forward_sm90.cu,
// dcp/attention_cuda.h), with the softmax of one sub-tile overlapped with tensor-core work.
//
// The basic kernel runs, per 128-key sub-tile j, S_j = Q K_j^T (wait), softmax, O += P_j V_j
// (wait): the tensor cores idle during every softmax. Here iteration j issues, back to back,
//   S_j = Q K_j^T            (wgmma group 1)
//   O += P_{j-1} V_{j-1}     (wgmma group 2; P_{j-1} from the previous iteration, in registers)
// then waits for group 1 only and computes the softmax of S_j while group 2 runs; only then
// waits for group 2, rescales O by exp2(m_{j-1} - m_j) (O then holds every sub-tile up to j-1 at
// the scale of m_j) and packs P_j for the next iteration. The last P V runs after the loop.
// Live registers: O (D / 2), S (64), P (32 packed bf16), the same accumulators as the basic
// kernel plus P, which the basic kernel derives from S just before its last use.
//
// Shared memory: since V_{j-1} is still read while S_j runs, K and V move one sub-tile apart:
// after the barrier of iteration j and the wgmma issue, all threads start the cp.async loads
// of V_j (into the buffer of V_{j-2}, done in iteration j-1) and K_{j+1} (into the buffer of
// K_{j-1}); both are waited for at the next barrier. One __syncthreads per sub-tile, as in the basic kernel.
// Partial masks of sub-tile j + 1 are computed during iteration j (as in the basic kernel).
//
// exp2 runs as exp2_ftz (attention_common.cuh).
//
// K and V sub-tiles with all 128 rows arrive by TMA when the caller gave the buffers' rows
// (AttnForwardParams::kv_rows): thread 0 issues one box per 64 columns onto the mbarrier of the
// iteration, and every thread waits on it before the iteration's barrier. The cp.async loads
// they replace took 16 instructions per thread and sub-tile plus their address arithmetic, the
// largest share of the issue slots in the profile (bench/results/kernel_profile_2026-11-30.md).
// Sub-tiles with fewer rows (the end of a tile) still load by cp.async, which zero-fills the
// rows past the tile: TMA would read the neighbouring rows of the buffer, whose values (even
// NaN) would then meet P = 0 in P V.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "attention_common.cuh"
#include "attention_forward_sm90.cuh"
#include "dcp/attention_cuda.h"
#include "sync_sm90.cuh"
#include "wgmma_sm90.cuh"

namespace dcp::cuda::detail {
namespace {

// load_tile_sw128 with the per-thread offsets computed once (keeps the loop's register count
// low): a thread's rows are row0 + i * kStep with kStep a multiple of 8, so its swizzled chunk
// slot is the same for every i.
template <int kD>
__device__ __forceinline__ void load_tile_lean(uint32_t tile, const __nv_bfloat16* src, int64_t stride, int valid_rows) {
  constexpr int kChunks = kD / 8;
  constexpr int kStep = kWgThreads / kChunks;
  static_assert(kStep % 8 == 0, "rows of one thread share their swizzle phase");
  const int tid = static_cast<int>(threadIdx.x);
  const int row0 = tid / kChunks;
  const int col = (tid % kChunks) * 8;
  const uint32_t dst = tile + sw128_offset<128>(row0, col);
  const __nv_bfloat16* from = src + row0 * stride + col;
#pragma unroll
  for (int i = 0; i < 128 / kStep; ++i) {
    const bool valid = row0 + i * kStep < valid_rows;
    cp_async16(dst + static_cast<uint32_t>(i * kStep * 128), valid ? from + i * kStep * stride : src, valid);
  }
}

template <int kD>
__global__ void __launch_bounds__(kWgThreads, 1) attention_forward_sm90_pipe_kernel(const __grid_constant__ FwTmaParams fp) {
  const AttnForwardParams p = fp.p;  // a copy: fields load from parameter space, not through a pointer
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  (void)p;  // built for a target without wgmma: never selected there, fail loudly if run
  __trap();
#else
  using Smem = WgSmem<kD>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  // Swizzle atoms must start 1024-byte aligned (wgmma_sm90.cuh): round the base up.
  const uint32_t raw_addr = smem_addr(smem_raw);
  const uint32_t pad = ((raw_addr + kSw128AtomBytes - 1) & ~static_cast<uint32_t>(kSw128AtomBytes - 1)) - raw_addr;
  unsigned char* smem = smem_raw + pad;
  const uint32_t s_q = raw_addr + pad + Smem::kQ;
  const uint32_t s_k = raw_addr + pad + Smem::kK;
  const uint32_t s_v = raw_addr + pad + Smem::kV;
  auto* s_mask = reinterpret_cast<uint64_t*>(smem + Smem::kMask);
  const uint32_t s_bar = raw_addr + pad + Smem::kBytes;  // 2 mbarriers: TMA loads of iterations j & 1
  const bool tma = fp.tma_kv != 0;

  const AttnWorkItem w = p.list.work[blockIdx.x];
  AttnTile ct = p.list.tiles[w.tile];  // tiles [w.tile, t_end) share the q rows and the outputs
  const int t_end = w.tile + max(1, w.num_tiles);
  const int out_begin = ct.out_begin;
  const int lse_begin = ct.lse_begin >= 0 ? ct.lse_begin : ct.out_begin;
  const int tid = static_cast<int>(threadIdx.x);
  const int wg = tid >> 7;                // warpgroup: q rows [64 wg, 64 wg + 64)
  const int warp_in_wg = (tid >> 5) & 3;  // 16 rows of the warpgroup's 64
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int tq = lane & 3;
  const int hq = p.shape.num_q_heads;
  const int hkv = p.shape.num_kv_heads;
  const int qh = w.head;
  const int kvh = qh / (hq / hkv);
  const int r0 = w.chunk * kWgRows;
  const int rows = min(kWgRows, ct.q_len - r0);
  const float scale_log2 = p.shape.softmax_scale * kLog2e;

  const auto* q = static_cast<const __nv_bfloat16*>(p.q);
  const auto* k = static_cast<const __nv_bfloat16*>(p.k);
  const auto* v = static_cast<const __nv_bfloat16*>(p.v);
  const int64_t q_stride = static_cast<int64_t>(hq) * kD;
  const int64_t kv_stride = static_cast<int64_t>(hkv) * kD;
  auto kv_offset = [&](const AttnTile& x, int n) {
    return (static_cast<int64_t>(x.kv_begin + n * kWgKeys) * hkv + kvh) * kD;
  };
  auto kv_rows = [&](const AttnTile& x, int n) { return min(kWgKeys, x.kv_len - n * kWgKeys); };

  if (tid == 0 && tma) {
    mbar_init(s_bar, 1);
    mbar_init(s_bar + 8, 1);
    mbar_init_fence();  // published by the first iteration's barrier, before any TMA issue
  }
  load_tile_sw128<kD>(s_q, q + (static_cast<int64_t>(ct.q_begin + r0) * hq + qh) * kD, q_stride, rows);
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
  int ti = w.tile;
  int n = 0;
  int cls = seek(ct, ti, n, 0);
  int buf = 0;
  if (ti < t_end) load_tile_sw128<kD>(s_k, k + kv_offset(ct, n), kv_stride, kv_rows(ct, n));
  cp_async_commit();

  // Accumulator fragments as in the basic kernel: thread (warp_in_wg, g, tq) holds, for every
  // 8-column block j, acc[4 j + e] = element (16 warp_in_wg + g + 8 (e >> 1), 8 j + 2 tq + (e & 1)).
  float o[kD / 2];
  float s[kWgKeys / 2];
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) o[i] = 0.0F;
#pragma unroll
  for (int i = 0; i < kWgKeys / 2; ++i) s[i] = 0.0F;
  uint32_t pa[kWgKeys / 16][4];  // P of the previous sub-tile: A fragments of O += P V
#pragma unroll
  for (int kk = 0; kk < kWgKeys / 16; ++kk) pa[kk][0] = pa[kk][1] = pa[kk][2] = pa[kk][3] = 0U;
  float m_row[2] = {-INFINITY, -INFINITY};
  float l_row[2] = {0.0F, 0.0F};
  auto cta_row = [&](int r) { return wg * 64 + warp_in_wg * 16 + g + r * 8; };
  const int64_t o_stride = static_cast<int64_t>(hq) * kD;
  if (w.accumulate != 0) {
    // The partial already there: O_old = sum exp(s - LSE_old) v, i.e. the online-softmax state
    // m = LSE_old (log2 units), l = 1, o = O_old.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = cta_row(r);
      if (row >= rows) continue;
      const float lse_old = p.lse[static_cast<int64_t>(lse_begin + r0 + row) * hq + qh];
      if (lse_old == -INFINITY) continue;
      m_row[r] = lse_old * kLog2e;
      l_row[r] = tq == 0 ? 1.0F : 0.0F;  // l is summed over the 4 lanes of a row at the end
      const float* o_row = p.o + static_cast<int64_t>(out_begin + r0 + row) * o_stride + static_cast<int64_t>(qh) * kD;
#pragma unroll
      for (int j = 0; j < kD / 8; ++j) {
        const float2 v2 = *reinterpret_cast<const float2*>(o_row + j * 8 + 2 * tq);
        o[4 * j + 2 * r] = v2.x;
        o[4 * j + 2 * r + 1] = v2.y;
      }
    }
  }

  // TMA bookkeeping, uniform across the CTA: whether the last iteration issued TMA loads (onto
  // barrier tma_bar) and the parity of each barrier's next phase.
  bool tma_pending = false;
  int tma_bar = 0;
  uint32_t tma_phase = 0;  // bit b: parity of barrier b's next phase
  // The loads of the last iteration landed (cp.async and TMA) and every warpgroup is past its
  // reads of the buffers the next loads overwrite.
  auto wait_loads = [&]() {
    cp_async_wait<0>();
    if (tma_pending) {
      mbar_wait(s_bar + static_cast<uint32_t>(tma_bar * 8), (tma_phase >> tma_bar) & 1U);
      tma_phase ^= 1U << tma_bar;
      tma_pending = false;
    }
    fence_proxy_async();
    __syncthreads();
  };

  // One sub-tile j; kFirst: j = 0, no P_{j-1} V_{j-1} yet. wgmma sits in no data-dependent
  // branch (ptxas serializes every wgmma of a kernel where it does): the first iteration is
  // peeled instead of testing a flag.
  auto step = [&]<bool kFirst>() {
    // K_j (and V_{j-1}) landed; every warpgroup is done with K_{j-1}, V_{j-2} and the masks of
    // sub-tile j - 1, whose buffers are refilled below.
    wait_loads();

    const uint32_t kb = s_k + static_cast<uint32_t>(buf * Smem::kKvBytes);
    const uint32_t vb = s_v + static_cast<uint32_t>(buf * Smem::kKvBytes);
    const uint32_t vb_prev = s_v + static_cast<uint32_t>((buf ^ 1) * Smem::kKvBytes);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      wgmma_m64n128k16_ss(s, desc_k_major<kWgRows>(s_q, wg * 64, kk), desc_k_major<kWgKeys>(kb, 0, kk), kk > 0 ? 1 : 0);
    }
    wgmma_commit();
    if constexpr (!kFirst) issue_pv<kD>(o, pa, vb_prev);

    // While the tensor cores run: loads of V_j and K_{j+1}, classification of sub-tile j + 1.
    const bool v_tma = tma && kv_rows(ct, n) == kWgKeys;
    if (!v_tma) load_tile_lean<kD>(vb, v + kv_offset(ct, n), kv_stride, kv_rows(ct, n));
    AttnTile nt = ct;
    int nti = ti;
    int nn = n + 1;
    const int ncls = seek(nt, nti, nn, buf ^ 1);
    const uint32_t kb_next = s_k + static_cast<uint32_t>((buf ^ 1) * Smem::kKvBytes);
    const bool k_tma = nti < t_end && tma && kv_rows(nt, nn) == kWgKeys;
    if (nti < t_end && !k_tma) load_tile_lean<kD>(kb_next, k + kv_offset(nt, nn), kv_stride, kv_rows(nt, nn));
    cp_async_commit();
    if (v_tma || k_tma) {
      if (tid == 0) {
        const uint32_t bar = s_bar + static_cast<uint32_t>(buf * 8);
        mbar_arrive_expect_tx(bar, static_cast<uint32_t>(((v_tma ? 1 : 0) + (k_tma ? 1 : 0)) * Smem::kKvBytes));
        // One box per 64 columns: column block b of the swizzled tile starts at b * 128 rows * 128 bytes.
#pragma unroll
        for (int b = 0; b < kD / 64; ++b) {
          const auto off = static_cast<uint32_t>(b * kWgKeys * 128);
          if (v_tma) tma_load_2d(vb + off, &fp.v_map, kvh * kD + 64 * b, ct.kv_begin + n * kWgKeys, bar);
          if (k_tma) tma_load_2d(kb_next + off, &fp.k_map, kvh * kD + 64 * b, nt.kv_begin + nn * kWgKeys, bar);
        }
      }
      tma_pending = true;
      tma_bar = buf;
    }

    if constexpr (!kFirst) {
      wgmma_wait<1>();  // S_j done; P_{j-1} V_{j-1} may still run
    } else {
      wgmma_wait<0>();
    }
    fence_regs(s);

    if (cls == kMasked) {
      const int kv0 = n * kWgKeys;
      const uint64_t* masks = s_mask + buf * kMaskWords * kWgRows;
#pragma unroll
      for (int j = 0; j < kWgKeys / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = cta_row(e >> 1);
          const int col = j * 8 + 2 * tq + (e & 1);
          const bool ok = ct.kind == TileKind::Partial
                              ? ((masks[(col >> 6) * kWgRows + row] >> (col & 63)) & 1U) != 0
                              : dense_key_allowed(ct.kind, kv0 + col, ct.kv_len, r0 + row);
          if (!ok) s[4 * j + e] = -INFINITY;
        }
      }
    }

    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < kWgKeys / 8; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffU, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffU, mx, 2));
      const float m_new = fmaxf(m_row[r], mx * scale_log2);
      const float m_use = m_new == -INFINITY ? 0.0F : m_new;  // a row with no key yet: p = 0
      alpha[r] = exp2_ftz(m_row[r] - m_use);
      m_row[r] = m_new;
      float sum = 0.0F;
#pragma unroll
      for (int j = 0; j < kWgKeys / 8; ++j) {
        s[4 * j + 2 * r] = exp2_ftz(fmaf(s[4 * j + 2 * r], scale_log2, -m_use));
        s[4 * j + 2 * r + 1] = exp2_ftz(fmaf(s[4 * j + 2 * r + 1], scale_log2, -m_use));
        sum += s[4 * j + 2 * r] + s[4 * j + 2 * r + 1];
      }
      l_row[r] = l_row[r] * alpha[r] + sum;
    }

    if constexpr (!kFirst) {
      wgmma_wait<0>();  // P_{j-1} V_{j-1} done: O and pa are free
      fence_regs(o);
      fence_regs_u32(pa);
    }
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
      o[4 * j] *= alpha[0];
      o[4 * j + 1] *= alpha[0];
      o[4 * j + 2] *= alpha[1];
      o[4 * j + 3] *= alpha[1];
    }
    // A-register fragment of m64k16 = accumulator blocks 2 kk and 2 kk + 1 of S, in order
    // (see the basic kernel).
#pragma unroll
    for (int kk = 0; kk < kWgKeys / 16; ++kk) {
      pa[kk][0] = pack_bf16(s[8 * kk], s[8 * kk + 1]);
      pa[kk][1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
      pa[kk][2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
      pa[kk][3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
    }
    ct = nt;
    ti = nti;
    n = nn;
    cls = ncls;
    buf ^= 1;
  };
  if (ti < t_end) {
    step.template operator()<true>();
    while (ti < t_end) step.template operator()<false>();
    // The last sub-tile's P V: its V was loaded in the last step (buffer buf ^ 1 now).
    wait_loads();
    wgmma_fence();
    issue_pv<kD>(o, pa, s_v + static_cast<uint32_t>((buf ^ 1) * Smem::kKvBytes));
    wgmma_wait<0>();
    fence_regs(o);
    fence_regs_u32(pa);
  }
  cp_async_wait<0>();

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = l_row[r];
    l += __shfl_xor_sync(0xffffffffU, l, 1);
    l += __shfl_xor_sync(0xffffffffU, l, 2);
    const int row = cta_row(r);
    if (row >= rows) continue;
    const float inv = l > 0.0F ? 1.0F / l : 0.0F;
    float* o_row = p.o + static_cast<int64_t>(out_begin + r0 + row) * o_stride + static_cast<int64_t>(qh) * kD;
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
      *reinterpret_cast<float2*>(o_row + j * 8 + 2 * tq) = make_float2(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
    }
    if (tq == 0) {
      p.lse[static_cast<int64_t>(lse_begin + r0 + row) * hq + qh] = l > 0.0F ? (m_row[r] + log2f(l)) * kLn2 : -INFINITY;
    }
  }
#endif
}

template <int kD>
void launch_forward_sm90_pipe(const AttnForwardParams& p, cudaStream_t stream) {
  constexpr int kSmem = WgSmem<kD>::kAlloc + 16;  // + the 2 mbarriers after the layout's bytes
  static_assert(WgSmem<kD>::kBytes % 8 == 0, "mbarriers are 8-byte aligned");
  static const bool ready =
      (allow_shared_memory("attention_forward_sm90_pipe", attention_forward_sm90_pipe_kernel<kD>, kSmem), true);
  (void)ready;
  const FwTmaParams fp = forward_tma_params(p, kD, "attention_forward_sm90_pipe");
  attention_forward_sm90_pipe_kernel<kD><<<p.list.num_work, kWgThreads, kSmem, stream>>>(fp);
}

}  // namespace

void attention_forward_wgmma_pipelined(const AttnForwardParams& params, cudaStream_t stream) {
  launch_for_head_dim("attention_forward_sm90_pipe", params.shape,
                      [&]<int kD>() { launch_forward_sm90_pipe<kD>(params, stream); });
}

}  // namespace dcp::cuda::detail
