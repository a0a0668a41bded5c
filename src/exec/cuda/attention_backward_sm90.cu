// attention_backward_sm90.cu — backward attention over a tile list on Hopper (sm_90a): warpgroup
// MMA. Same contract as attention_backward.cu (dcp/detail/attention_cuda.h): same work items (one CTA =
// 128 keys x one kv head, looping over the group's q heads and 64-row q sub-tiles), masks, skips
// and fp32 atomic outputs; attention_backward() picks it on sm_90 devices (route Wgmma).
//
// 2 warpgroups (256 threads); warpgroup w owns keys [64 w, 64 w + 64) of the CTA. Shared memory
// (128-byte-swizzled tiles, wgmma_sm90.cuh): K and V (128 keys x D) loaded once; Q and dO
// (64 rows x D), LSE and Delta double-buffered with cp.async; dS^T (128 keys x 64 q, bf16).
// Per q sub-tile, each warpgroup (transposed products: rows = its 64 keys, columns = the 64 q):
//   S^T = K Q^T, dP^T = V dO^T          m64n64k16, both operands K-major from shared memory
//   P^T = exp2(S^T scale log2e - LSE log2e) (masked: 0), dS^T = P^T (dP^T - Delta)
//   dV += P^T dO, dK += dS^T Q            m64nDk16, A from registers (the accumulator layout is
//                                         the A-fragment layout), B = dO / Q MN-major
//   dQ = dS K                             dS^T goes to shared memory and is read back as an
//                                         MN-major A (imm-trans-a), K as an MN-major B. D = 128:
//                                         warpgroup w computes dQ columns [64 w, 64 w + 64) over
//                                         all 128 keys; D = 64: all 64 columns over its own keys.
//   dQ out (default, "bulk")              each warpgroup writes its 64 x 64 fp32 result (times
//                                         scale) to its own shared tile; one thread per q row
//                                         issues a 256-byte cp.reduce.async.bulk add to global
//                                         memory (element-wise atomic in L2, 64 instructions
//                                         instead of 2048 float2 atomics per warpgroup and step).
//                                         At D = 64 the two warpgroups' partial sums both reduce.
//   dQ out (AttnDqMode::Atomic)  float2 atomicAdd from registers; at D = 64 the partial
//                                         sums first meet in shared memory, one atomic per element.
// Finish: dK * scale and dV atomically added (fp32), like the mma.sync kernel.
// Synchronisation per step: a CTA barrier once Q / dO are in, one after the dS^T stores (dQ reads
// both warpgroups' keys), one at the end (buffers reusable); the bulk route adds a warpgroup
// barrier before its reductions. No producer warp: all 256 threads issue the cp.async loads.
// Registers per thread (D = 128): dK, dV 64 + 64; S^T, dP^T 32 + 32 (then P^T, dS^T as bf16
// 16 + 16, and dQ 32): ptxas -v reports 255 registers, no spills (bulk; atomic: 4 bytes).
// Shared memory: D = 128 183 KB (atomic 147 KB), D = 64 119 KB (99 KB), +1 KB alignment slack.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "attention_backward_sm90.cuh"
#include "attention_common.cuh"
#include "dcp/detail/attention_cuda.h"
#include "dcp/error.h"
#include "wgmma_sm90.cuh"
#include "wgmma_sm90_bwd.cuh"

namespace dcp::cuda::detail {
namespace {

inline constexpr int kBwThreads = 256;                    // 2 warpgroups

template <int kD, bool kBulkDq>
struct BwSmem {
  static constexpr int kKvBytes = kBwKeys * kD * 2;
  static constexpr int kQBytes = kBwRows * kD * 2;
  static constexpr int kK = 0;
  static constexpr int kV = kK + kKvBytes;
  static constexpr int kQ = kV + kKvBytes;                 // 2 buffers
  static constexpr int kDo = kQ + 2 * kQBytes;             // 2 buffers
  static constexpr int kDs = kDo + 2 * kQBytes;            // [128 keys][64 q] bf16, one column block
  static constexpr int kXch = kDs + kBwKeys * kBwRows * 2;  // atomic route, D = 64: [2 wg][16][128] floats
  static constexpr int kXchBytes = !kBulkDq && kD == 64 ? 2 * 16 * 128 * 4 : 0;
  static constexpr int kDqT = kXch + kXchBytes;            // bulk route: one dQ tile per warpgroup
  static constexpr int kDqTileBytes = kBwRows * kDqRowBytes;
  static constexpr int kLse = kDqT + (kBulkDq ? 2 * kDqTileBytes : 0);  // 2 x 64 floats
  static constexpr int kDelta = kLse + 2 * kBwRows * 4;    // 2 x 64 floats
  static constexpr int kMask = kDelta + 2 * kBwRows * 4;   // [buffer][key half][64 rows] uint64
  static constexpr int kBytes = kMask + 2 * 2 * kBwRows * 8;
  static constexpr int kAlloc = kBytes + kSw128AtomBytes;  // slack to align the base to 1024
  static_assert(kKvBytes % kSw128AtomBytes == 0 && kQBytes % kSw128AtomBytes == 0, "tiles stay atom aligned");
};

// kBulkDq: dQ leaves through a shared-memory tile and one bulk asynchronous reduction per row
// (cp.reduce.async.bulk, 256 bytes); otherwise fp32 atomicAdd from registers (float2).
template <int kD, bool kBulkDq>
__global__ void __launch_bounds__(kBwThreads, 1) attention_backward_sm90_kernel(const AttnBackwardParams p) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  // Built for a target without wgmma (only sm_90a has it): never selected there, fail loudly if run.
  (void)p;
  __trap();
#else
  using Smem = BwSmem<kD, kBulkDq>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t raw_addr = smem_addr(smem_raw);
  const uint32_t pad = sw128_pad(raw_addr);
  unsigned char* smem = smem_raw + pad;
  const uint32_t s_k = raw_addr + pad + Smem::kK;
  const uint32_t s_v = raw_addr + pad + Smem::kV;
  const uint32_t s_q = raw_addr + pad + Smem::kQ;
  const uint32_t s_do = raw_addr + pad + Smem::kDo;
  const uint32_t s_ds = raw_addr + pad + Smem::kDs;
  const uint32_t s_dqt = raw_addr + pad + Smem::kDqT;
  unsigned char* s_ds_ptr = smem + Smem::kDs;
  auto* s_xch = reinterpret_cast<float*>(smem + Smem::kXch);
  auto* s_lse = reinterpret_cast<float*>(smem + Smem::kLse);
  auto* s_delta = reinterpret_cast<float*>(smem + Smem::kDelta);
  auto* s_mask = reinterpret_cast<uint64_t*>(smem + Smem::kMask);

  const AttnWorkItem w = p.list.work[blockIdx.x];
  const AttnTile t = p.list.tiles[w.tile];
  const int tid = static_cast<int>(threadIdx.x);
  const int wg = tid >> 7;                // keys [64 wg, 64 wg + 64)
  const int tw = tid & 127;               // thread in the warpgroup
  const int warp_in_wg = tw >> 5;         // 16 keys of the warpgroup's 64
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int tq = lane & 3;
  const int hq = p.shape.num_q_heads;
  const int hkv = p.shape.num_kv_heads;
  const int group = hq / hkv;
  const int kvh = w.head;
  const int c0 = w.chunk * kBwKeys;
  const int keys = min(kBwKeys, t.kv_len - c0);
  const float scale = p.shape.softmax_scale;
  const float scale_log2 = scale * kLog2e;

  const int64_t q_stride = static_cast<int64_t>(hq) * kD;
  const int64_t kv_stride = static_cast<int64_t>(hkv) * kD;
  const auto* kp = static_cast<const __nv_bfloat16*>(p.k);
  const auto* vp = static_cast<const __nv_bfloat16*>(p.v);
  const auto* qp = static_cast<const __nv_bfloat16*>(p.q);
  const auto* dop = static_cast<const __nv_bfloat16*>(p.dout);
  const int dout_row0 = t.dout_begin >= 0 ? t.dout_begin : t.q_begin;
  const int dq_row0 = t.dq_begin >= 0 ? t.dq_begin : t.q_begin;
  const int dkv_row0 = t.dkv_begin >= 0 ? t.dkv_begin : t.kv_begin;

  const int64_t kv_off = (static_cast<int64_t>(t.kv_begin + c0) * hkv + kvh) * kD;
  load_rows_sw128<kBwKeys, kD, kBwThreads>(s_k, kp + kv_off, kv_stride, keys);
  load_rows_sw128<kBwKeys, kD, kBwThreads>(s_v, vp + kv_off, kv_stride, keys);
  cp_async_commit();

  const BwSteps steps(t, c0, group);
  const int num_steps = steps.num_steps;

  // Classification uniform across the CTA (Partial: block-wide votes).
  auto classify = [&](int step, int buf) -> int {
    const int rq0 = steps.row0(step);
    const int rows = min(kBwRows, t.q_len - rq0);
    if (t.kind != TileKind::Partial) return classify_dense_bw<kBwKeys>(t.kind, rq0, rows, c0, keys);
    return classify_partial_bw(t, p.list.row_offsets, p.list.ranges, rq0, rows, c0, keys == kBwKeys,
                               s_mask + buf * 2 * kBwRows);
  };
  // Rows past q_len load as zeros with LSE = +inf (P = 0 there).
  auto load_step = [&](int step, int buf) {
    const int qh = steps.q_head(step, kvh, group);
    const int rq0 = steps.row0(step);
    const int rows = min(kBwRows, t.q_len - rq0);
    const int64_t off = (static_cast<int64_t>(t.q_begin + rq0) * hq + qh) * kD;
    const int64_t do_off = (static_cast<int64_t>(dout_row0 + rq0) * hq + qh) * kD;
    const uint32_t boff = static_cast<uint32_t>(buf * Smem::kQBytes);
    load_rows_sw128<kBwRows, kD, kBwThreads>(s_q + boff, qp + off, q_stride, rows);
    load_rows_sw128<kBwRows, kD, kBwThreads>(s_do + boff, dop + do_off, q_stride, rows);
    if (tid < kBwRows) stage_lse_delta(p.lse, p.delta, hq, t, rq0, rows, qh, tid, s_lse + buf * kBwRows, s_delta + buf * kBwRows);
  };

  // Accumulator fragments: attention_backward_sm90.cuh.
  float dk[kD / 2];
  float dv[kD / 2];
  zero(dk);
  zero(dv);
  const int row_lo = warp_in_wg * 16 + g;  // accumulator row of e < 2 (dQ: q row)
  const int key_lo = wg * 64 + row_lo;     // CTA-local key of accumulator rows e < 2

  int step = 0;
  int cls = kEmpty;
  while (step < num_steps && (cls = classify(step, 0)) == kEmpty) ++step;
  int buf = 0;
  if (step < num_steps) load_step(step, 0);
  cp_async_commit();

  while (step < num_steps) {
    int ns = step + 1;
    int ncls = kEmpty;
    while (ns < num_steps && (ncls = classify(ns, buf ^ 1)) == kEmpty) ++ns;
    if (ns < num_steps) {
      load_step(ns, buf ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    fence_proxy_async();  // this thread's cp.async bytes -> visible to wgmma after the barrier
    __syncthreads();

    const int qh = steps.q_head(step, kvh, group);
    const int rq0 = steps.row0(step);
    const uint32_t qb = s_q + static_cast<uint32_t>(buf * Smem::kQBytes);
    const uint32_t dob = s_do + static_cast<uint32_t>(buf * Smem::kQBytes);
    const float* lse_b = s_lse + buf * kBwRows;
    const float* delta_b = s_delta + buf * kBwRows;

    // Per-sub-tile math: attention_backward_sm90.cuh.
    bw_sub_tile_dv_dk<kD>(dv, dk, s_k, s_v, qb, dob, lse_b, delta_b, s_mask + buf * 2 * kBwRows, cls, t.kind, keys, c0, rq0,
                          s_ds_ptr, wg, key_lo, tq, scale_log2);
    fence_proxy_async();  // dS^T stores -> visible to wgmma after the barrier
    if constexpr (kBulkDq) bulk_wait_read<0>();  // the last step's dQ tile is read: reusable below
    __syncthreads();

    float dq[32];
    bw_issue_dq<kD>(dq, s_ds, s_k, wg);
    wgmma_wait<0>();
    fence_regs(dv);
    fence_regs(dk);
    fence_regs(dq);

    // Thread rows of dQ: q rows 16 warp_in_wg + g (+ 8); columns 8 j + 2 tq (+ 64 wg at D = 128).
    const int q_rows = min(kBwRows, t.q_len - rq0);
    if constexpr (kBulkDq) {
      // D = 128: the warpgroup's 64 columns; D = 64: its partial sum over its 64 keys (the two
      // warpgroups' reductions add up in global memory).
      bw_write_dq_tile(smem + Smem::kDqT + wg * Smem::kDqTileBytes, dq, row_lo, tq, scale);
      fence_proxy_async();  // the tile -> visible to the bulk reduction after the barrier
      if (wg == 0) {
        named_barrier_sync<1, 128>();
      } else {
        named_barrier_sync<2, 128>();
      }
      const int row = tw;
      if (row < q_rows) {
        float* dst = p.dq + (static_cast<int64_t>(dq_row0 + rq0 + row) * hq + qh) * kD + (kD == 128 ? 64 * wg : 0);
        bulk_reduce_add_f32(dst, s_dqt + static_cast<uint32_t>(wg * Smem::kDqTileBytes + row * kDqRowBytes), 64 * 4);
        bulk_commit();
      }
    } else {
      if constexpr (kD == 64) {
        // Warpgroup 0 keeps columns [0, 32) (blocks j < 4), warpgroup 1 columns [32, 64); each
        // sends the other half of its partial sum.
#pragma unroll
        for (int i = 0; i < 16; ++i) s_xch[(wg * 16 + i) * 128 + tw] = wg == 0 ? dq[16 + i] : dq[i];
        __syncthreads();
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          const float other = s_xch[((1 - wg) * 16 + i) * 128 + tw];
          if (wg == 0) {
            dq[i] += other;
          } else {
            dq[16 + i] += other;
          }
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = row_lo + 8 * r;
        if (row >= q_rows) continue;
        float* dq_row =
            p.dq + (static_cast<int64_t>(dq_row0 + rq0 + row) * hq + qh) * kD + (kD == 128 ? 64 * wg : 0) + 2 * tq;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if (kD == 64 && (j >= 4) != (wg == 1)) continue;
          atomicAdd(reinterpret_cast<float2*>(dq_row + 8 * j), make_float2(dq[4 * j + 2 * r] * scale, dq[4 * j + 2 * r + 1] * scale));
        }
      }
    }
    __syncthreads();  // buffers `buf`, dS^T and the exchange / dQ tiles are free for the next step
    step = ns;
    cls = ncls;
    buf ^= 1;
  }
  cp_async_wait<0>();
  if constexpr (kBulkDq) bulk_wait<0>();  // the tile stays alive until the reductions are done

  bw_add_dk_dv<kD>(p.dk, p.dv, dk, dv, dkv_row0 + c0, hkv, kvh, key_lo, keys, tq, scale);
#endif
}

template <int kD, bool kBulkDq>
void launch_backward_sm90(const AttnBackwardParams& p, cudaStream_t stream) {
  constexpr int kSmem = BwSmem<kD, kBulkDq>::kAlloc;
  allow_shared_memory("attention_backward_sm90", attention_backward_sm90_kernel<kD, kBulkDq>, kSmem);
  attention_backward_sm90_kernel<kD, kBulkDq><<<p.list.num_work, kBwThreads, kSmem, stream>>>(p);
}

}  // namespace

void attention_backward_wgmma(const AttnBackwardParams& params, cudaStream_t stream) {
  launch_for_head_dim("attention_backward_sm90", params.shape,
                      [&]<int kD>() {
                        if (params.dq_mode == AttnDqMode::Bulk) {
                          launch_backward_sm90<kD, true>(params, stream);
                        } else {
                          launch_backward_sm90<kD, false>(params, stream);
                        }
                      });
}

}  // namespace dcp::cuda::detail
