// attention_backward_sm90_pipe.cu — the pipelined variant of the Hopper backward kernel
// (attention_backward_sm90.cu, "basic"): same contract (dcp/attention_cuda.h), work items, tile
// layouts, instruction shapes, masks and outputs; only the schedule of one q sub-tile step
// differs. attention_backward() runs it for route WgmmaPipelined (and Wgmma unless
// DCP_ATTN_BACKWARD_VARIANT=basic). dQ always leaves by bulk reductions (the basic kernel keeps
// the DCP_ATTN_BACKWARD_DQ=atomic alternative).
//
// What basic does per step s: barrier (Q(s) in) | S^T, dP^T | P, dS | dS^T stores, dV, dK |
// barrier | dQ | wait all | dQ epilogue | barrier; the tensor cores idle through the epilogue,
// the two barriers around it, the S^T latency of the next step, and the LSE / Delta loads (plain
// loads into registers: the issuing warps wait a global-memory latency each step). Here, step s:
//   dP^T(s) [S^T(s) was issued in step s - 1] | P, dS (no wgmma in flight: the loop turns here) |
//   dV, dK (s) | barrier X | classify + load step s + 2 | dS^T stores | barrier Y | dQ(s) |
//   S^T(s + 1) | dQ epilogue (s) under S^T(s + 1)
//   - Q / dO / LSE / Delta / mask have three buffers; step s + 2 is loaded (after X of step s)
//     into the buffer of step s - 1 and needed at Y of step s + 1: a step of latency to hide.
//     LSE and Delta come by 4-byte cp.async too (the log2 conversion moves to the reader).
//   - two CTA barriers per step instead of three:
//       X: every dQ(s - 1) read of dS^T is done and the buffer of step s - 1 is free (both
//          warpgroups waited for their dV / dK (s - 1) and dQ (s - 1) before it);
//       Y: dS^T(s) is complete and Q(s + 1) / dO(s + 1) / LSE / Delta have arrived.
//     dV / dK(s) are issued before X, so the tensor cores have work queued through X, the
//     classification (Partial tiles read their ranges from global memory) and the load issue.
// Wgmma groups per warpgroup, in issue order: S^T(s), dP^T(s), dV+dK(s), dQ(s), S^T(s + 1); waits:
// wait<1> after dP^T (S^T ready), wait<0> (dP^T ready), wait<1> after dQ (dV / dK done: the P^T /
// dS^T A fragments are free, so S^T(s + 1) fits in their registers), wait<1> after S^T(s + 1)
// (dQ ready). Every wgmma sits outside data-dependent branches (a step past the last gets a
// dropped S^T and dP^T on a stale buffer instead of a test): with an accumulator in flight
// across such a branch ptxas serializes every wgmma of the kernel (C7518).
// Registers (ptxas -v, sm_90a): D = 128 255, 12 bytes of spill stores / loads (the bf16 A fragments
// stay live through the classification and load issue); D = 64 212, none.
// Shared memory: D = 128 216.5 KB, D = 64 136.5 KB, +1 KB alignment slack.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "attention_backward_sm90.cuh"
#include "attention_common.cuh"
#include "dcp/attention_cuda.h"
#include "dcp/error.h"
#include "wgmma_sm90.cuh"
#include "wgmma_sm90_bwd.cuh"

namespace dcp::cuda::detail {
namespace {

inline constexpr int kBwThreads = 256;                    // 2 warpgroups
inline constexpr int kStages = 3;                         // Q / dO / LSE / Delta / mask buffers

template <int kD>
struct BwPipeSmem {
  static constexpr int kKvBytes = kBwKeys * kD * 2;
  static constexpr int kQBytes = kBwRows * kD * 2;
  static constexpr int kK = 0;
  static constexpr int kV = kK + kKvBytes;
  static constexpr int kQ = kV + kKvBytes;                 // kStages buffers
  static constexpr int kDo = kQ + kStages * kQBytes;       // kStages buffers
  static constexpr int kDs = kDo + kStages * kQBytes;      // [128 keys][64 q] bf16
  static constexpr int kDqT = kDs + kBwKeys * kBwRows * 2; // one dQ tile per warpgroup
  static constexpr int kDqTileBytes = kBwRows * kDqRowBytes;
  static constexpr int kLse = kDqT + 2 * kDqTileBytes;     // kStages x 64 floats
  static constexpr int kDelta = kLse + kStages * kBwRows * 4;
  static constexpr int kMask = kDelta + kStages * kBwRows * 4;  // [buffer][key half][64 rows] uint64
  static constexpr int kBytes = kMask + kStages * 2 * kBwRows * 8;
  static constexpr int kAlloc = kBytes + kSw128AtomBytes;  // slack to align the base to 1024
  static_assert(kKvBytes % kSw128AtomBytes == 0 && kQBytes % kSw128AtomBytes == 0, "tiles stay atom aligned");
  static_assert(kAlloc <= 227 * 1024, "fits the sm_90 opt-in shared memory");
};

// Loads kR rows of a [tokens][heads][kD] bf16 buffer (row stride `stride` elements; rows at or past
// `valid_rows` zero-filled) into a swizzled kR-row tile; 256 threads, 16 bytes each.
template <int kR, int kD>
__device__ __forceinline__ void load_rows_sw128(uint32_t tile, const __nv_bfloat16* src, int64_t stride, int valid_rows) {
  constexpr int kChunks = kD / 8;
  constexpr int kPerThread = kR * kChunks / kBwThreads;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int idx = static_cast<int>(threadIdx.x) + i * kBwThreads;
    const int row = idx / kChunks;
    const int col = (idx % kChunks) * 8;
    const bool valid = row < valid_rows;
    cp_async16(tile + sw128_offset<kR>(row, col), src + (valid ? row * stride + col : 0), valid);
  }
}

// 4-byte cp.async (LSE, Delta); the source must be 4-byte aligned.
__device__ __forceinline__ void cp_async4(uint32_t dst, const float* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}

// fence_regs for the bf16 A fragments: they must stay put until their wgmma group completed.
__device__ __forceinline__ void fence_regs_u32(uint32_t (&r)[4][4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
  }
}

template <int kD>
__global__ void __launch_bounds__(kBwThreads, 1) attention_backward_sm90_pipe_kernel(const AttnBackwardParams p) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  (void)p;
  __trap();
#else
  using Smem = BwPipeSmem<kD>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t raw_addr = smem_addr(smem_raw);
  const uint32_t pad = ((raw_addr + kSw128AtomBytes - 1) & ~static_cast<uint32_t>(kSw128AtomBytes - 1)) - raw_addr;
  unsigned char* smem = smem_raw + pad;
  const uint32_t s_k = raw_addr + pad + Smem::kK;
  const uint32_t s_v = raw_addr + pad + Smem::kV;
  const uint32_t s_q = raw_addr + pad + Smem::kQ;
  const uint32_t s_do = raw_addr + pad + Smem::kDo;
  const uint32_t s_ds = raw_addr + pad + Smem::kDs;
  const uint32_t s_dqt = raw_addr + pad + Smem::kDqT;
  unsigned char* s_ds_ptr = smem + Smem::kDs;
  auto* s_lse = reinterpret_cast<float*>(smem + Smem::kLse);  // natural-log LSE as given (+inf: padding row)
  const uint32_t s_lse_addr = raw_addr + pad + Smem::kLse;
  const uint32_t s_delta_addr = raw_addr + pad + Smem::kDelta;
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
  const int lse_row0 = t.lse_begin >= 0 ? t.lse_begin : t.q_begin;
  const int delta_row0 = t.delta_begin >= 0 ? t.delta_begin : t.q_begin;
  const int dq_row0 = t.dq_begin >= 0 ? t.dq_begin : t.q_begin;
  const int dkv_row0 = t.dkv_begin >= 0 ? t.dkv_begin : t.kv_begin;

  const int64_t kv_off = (static_cast<int64_t>(t.kv_begin + c0) * hkv + kvh) * kD;
  load_rows_sw128<kBwKeys, kD>(s_k, kp + kv_off, kv_stride, keys);
  load_rows_sw128<kBwKeys, kD>(s_v, vp + kv_off, kv_stride, keys);
  cp_async_commit();

  const int num_q_sub = (t.q_len + kBwRows - 1) / kBwRows;
  const int q_sub_begin = t.kind == TileKind::CausalDiagonal ? c0 / kBwRows : 0;
  const int per_head = num_q_sub - q_sub_begin;
  const int num_steps = per_head * group;

  // Step s: q head kvh * group + s / per_head, q sub-tile q_sub_begin + s % per_head. Same
  // classification as the mma.sync kernel (uniform across the CTA; Partial votes block-wide).
  auto classify = [&](int step, int buf) -> int {
    const int rq0 = (q_sub_begin + step % per_head) * kBwRows;
    const int rows = min(kBwRows, t.q_len - rq0);
    // Keys past kv_len are masked too: with an extreme LSE exp(0 - LSE) could overflow.
    const bool alkey_los = keys == kBwKeys;
    if (t.kind == TileKind::Full) return alkey_los ? kFull : kMasked;
    if (t.kind == TileKind::CausalDiagonal) {
      if (rq0 + rows - 1 < c0) return kEmpty;
      return rq0 >= c0 + kBwKeys - 1 && alkey_los ? kFull : kMasked;
    }
    // Thread (row, half) < 128: bits of keys c0 + 64 half .. + 63 for q row rq0 + row.
    const bool active = tid < 2 * kBwRows;
    const int row = tid & (kBwRows - 1);
    const int half = (tid >> 6) & 1;
    uint64_t mask = 0;
    const bool row_valid = active && row < rows;
    if (row_valid) {
      mask = row_key_mask(p.list.row_offsets, p.list.ranges, t.range_row_begin + rq0 + row, c0 + half * kRows, t.kv_len);
    }
    if (active) s_mask[(buf * 2 + half) * kBwRows + row] = mask;
    if (__syncthreads_or(mask != 0) == 0) return kEmpty;
    const bool full = __syncthreads_and(!row_valid || mask == ~uint64_t{0}) != 0;
    return full && alkey_los ? kFull : kMasked;
  };
  // Rows past q_len load as zeros with LSE = +inf (P = 0 there).
  auto load_step = [&](int step, int buf) {
    const int qh = kvh * group + step / per_head;
    const int rq0 = (q_sub_begin + step % per_head) * kBwRows;
    const int rows = min(kBwRows, t.q_len - rq0);
    const int64_t off = (static_cast<int64_t>(t.q_begin + rq0) * hq + qh) * kD;
    const int64_t do_off = (static_cast<int64_t>(dout_row0 + rq0) * hq + qh) * kD;
    const uint32_t boff = static_cast<uint32_t>(buf * Smem::kQBytes);
    load_rows_sw128<kBwRows, kD>(s_q + boff, qp + off, q_stride, rows);
    load_rows_sw128<kBwRows, kD>(s_do + boff, dop + do_off, q_stride, rows);
    // LSE and Delta by cp.async as well (basic loads them into registers first, which stalls the
    // issuing warps for a global-memory latency); the LSE -> log2 conversion moves to the reader.
    if (tid < kBwRows) {
      const int i = buf * kBwRows + tid;
      if (tid < rows) {
        cp_async4(s_lse_addr + static_cast<uint32_t>(i * 4), p.lse + static_cast<int64_t>(lse_row0 + rq0 + tid) * hq + qh);
        cp_async4(s_delta_addr + static_cast<uint32_t>(i * 4),
                  p.delta + static_cast<int64_t>(delta_row0 + rq0 + tid) * hq + qh);
      } else {
        s_lse[i] = INFINITY;
        s_delta[i] = 0.0F;
      }
    }
  };

  // Accumulator fragments as in basic: acc[4 j + e] = element (16 warp_in_wg + g + 8 (e >> 1),
  // 8 j + 2 tq + (e & 1)); rows are the warpgroup's keys (dQ: q rows).
  float dk[kD / 2];
  float dv[kD / 2];
  zero(dk);
  zero(dv);
  const int row_lo = warp_in_wg * 16 + g;
  const int key_lo = wg * 64 + row_lo;

  // The first non-empty step at or after `from`, classified into mask buffer `b` (num_steps: none).
  auto next_step = [&](int from, int b, int& cls_out) -> int {
    int s = from;
    cls_out = kEmpty;
    while (s < num_steps && (cls_out = classify(s, b)) == kEmpty) ++s;
    return s;
  };
  // S^T = K Q^T of the step in buffer `b` (one commit group).
  float st[32];
  auto issue_st = [&](int b) {
    const uint32_t qb = s_q + static_cast<uint32_t>(b * Smem::kQBytes);
    zero(st);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      wgmma_m64n64k16_ss(st, desc_k_major<kBwKeys>(s_k, wg * 64, kk), desc_k_major<kBwRows>(qb, 0, kk), kk > 0 ? 1 : 0);
    }
    wgmma_commit();
  };

  // dP^T = V dO^T of the step in buffer `b` behind its S^T (issued earlier), P^T while dP^T runs,
  // then dS^T; leaves P^T / dS^T as the bf16 A fragments pa / da (m64k16, k step kk = q columns
  // 16 kk .. + 15: accumulator blocks 2 kk, 2 kk + 1, as P in the forward). No wgmma is in flight
  // afterwards: the loop below turns around here (ptxas serializes every wgmma of the kernel when
  // an accumulator in flight crosses a branch it cannot prove uniform).
  uint32_t pa[4][4];
  uint32_t da[4][4];
  auto p_and_ds = [&](int b, int step_rq0, int step_cls) {
    const uint32_t dob = s_do + static_cast<uint32_t>(b * Smem::kQBytes);
    const float* lse_b = s_lse + b * kBwRows;
    const float* delta_b = s_delta + b * kBwRows;
    float dpt[32];
    zero(dpt);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      wgmma_m64n64k16_ss(dpt, desc_k_major<kBwKeys>(s_v, wg * 64, kk), desc_k_major<kBwRows>(dob, 0, kk), kk > 0 ? 1 : 0);
    }
    wgmma_commit();
    wgmma_wait<1>();
    fence_regs(st);
    // st becomes P^T (columns are q rows: LSE per column).
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float2 lse = *reinterpret_cast<const float2*>(lse_b + 8 * j + 2 * tq);
      // Rows without any allowed key (LSE = -inf) get P = 0 like padding rows.
      const float l2x = lse.x == -INFINITY ? INFINITY : lse.x * kLog2e;
      const float l2y = lse.y == -INFINITY ? INFINITY : lse.y * kLog2e;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = key_lo + 8 * (e >> 1);
        const int col = 8 * j + 2 * tq + (e & 1);
        float pv = exp2f(fmaf(st[4 * j + e], scale_log2, -((e & 1) != 0 ? l2y : l2x)));
        if (step_cls == kMasked) {
          bool ok = key < keys;
          if (t.kind == TileKind::Partial) {
            ok = ok && ((s_mask[(b * 2 + (key >> 6)) * kBwRows + col] >> (key & 63)) & 1U) != 0;
          } else if (t.kind == TileKind::CausalDiagonal) {
            ok = ok && c0 + key <= step_rq0 + col;
          }
          if (!ok) pv = 0.0F;
        }
        st[4 * j + e] = pv;
      }
    }
    wgmma_wait<0>();
    fence_regs(dpt);
    // dpt becomes dS^T.
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float2 d2 = *reinterpret_cast<const float2*>(delta_b + 8 * j + 2 * tq);
#pragma unroll
      for (int e = 0; e < 4; ++e) dpt[4 * j + e] = st[4 * j + e] * (dpt[4 * j + e] - ((e & 1) != 0 ? d2.y : d2.x));
    }
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        pa[kk][i] = pack_bf16(st[8 * kk + 2 * i], st[8 * kk + 2 * i + 1]);
        da[kk][i] = pack_bf16(dpt[8 * kk + 2 * i], dpt[8 * kk + 2 * i + 1]);
      }
    }
  };
  auto sub_tile_row = [&](int s) { return (q_sub_begin + s % per_head) * kBwRows; };

  // Prologue: K / V, then the first two steps (cp.async groups KV, step, next step).
  int cls = kEmpty;
  int step = next_step(0, 0, cls);
  if (step < num_steps) load_step(step, 0);
  cp_async_commit();
  int ncls = kEmpty;
  int nstep = step < num_steps ? next_step(step + 1, 1, ncls) : num_steps;
  if (nstep < num_steps) load_step(nstep, 1);
  cp_async_commit();
  cp_async_wait<1>();
  fence_proxy_async();
  __syncthreads();
  // Unconditional (also when there is no step, and for a step past the last in the loop): a
  // product nobody needs reads a stale buffer and is dropped, but keeps the wgmma out of branches.
  issue_st(0);
  p_and_ds(0, step < num_steps ? sub_tile_row(step) : 0, cls);

  int buf = 0;
  while (step < num_steps) {
    const int nbuf = buf == kStages - 1 ? 0 : buf + 1;
    const int nnbuf = nbuf == kStages - 1 ? 0 : nbuf + 1;
    const int qh = kvh * group + step / per_head;
    const int rq0 = sub_tile_row(step);
    const uint32_t qb = s_q + static_cast<uint32_t>(buf * Smem::kQBytes);
    const uint32_t dob = s_do + static_cast<uint32_t>(buf * Smem::kQBytes);

    // dV += P^T dO, dK += dS^T Q (B operands MN-major); they need no barrier, so the tensor
    // cores have them queued while the barrier, the classification and the loads below run.
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      if constexpr (kD == 128) {
        wgmma_m64n128k16_rs(dv, pa[kk], desc_mn_major<kBwRows>(dob, kk));
      } else {
        wgmma_m64n64k16_rs(dv, pa[kk], desc_mn_major<kBwRows>(dob, kk));
      }
    }
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      if constexpr (kD == 128) {
        wgmma_m64n128k16_rs(dk, da[kk], desc_mn_major<kBwRows>(qb, kk));
      } else {
        wgmma_m64n64k16_rs(dk, da[kk], desc_mn_major<kBwRows>(qb, kk));
      }
    }
    wgmma_commit();

    // Barrier X: every dQ(step - 1) is done (dS^T free) and nobody reads the buffer of step - 1
    // any more: load the step after next into it (classification may vote: all threads are here).
    __syncthreads();
    int nncls = kEmpty;
    const int nnstep = nstep < num_steps ? next_step(nstep + 1, nnbuf, nncls) : num_steps;
    if (nnstep < num_steps) load_step(nnstep, nnbuf);
    cp_async_commit();  // possibly empty: one group per step keeps the wait counts fixed

    // dS^T (keys x q) into shared memory for dQ: da[kk][2 h] = (key_lo, 16 kk + 8 h + 2 tq ..+1),
    // da[kk][2 h + 1] = (key_lo + 8, same columns).
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int col = 16 * kk + 8 * h + 2 * tq;
        *reinterpret_cast<uint32_t*>(s_ds_ptr + sw128_offset<kBwKeys>(key_lo, col)) = da[kk][2 * h];
        *reinterpret_cast<uint32_t*>(s_ds_ptr + sw128_offset<kBwKeys>(key_lo + 8, col)) = da[kk][2 * h + 1];
      }
    }

    // Barrier Y: dS^T(step) complete; Q / dO of the next step arrived (its group is the second
    // newest: the newest is the one just committed); this thread's last bulk reduction has read
    // the dQ tile.
    cp_async_wait<1>();
    fence_proxy_async();  // dS^T stores and cp.async bytes -> visible to wgmma after the barrier
    bulk_wait_read<0>();
    __syncthreads();

    // dQ = dS K (as basic), then S^T of the next step once dV / dK have released pa / da.
    constexpr int kDqSteps = kD == 128 ? kBwKeys / 16 : 4;
    const int kk0 = kD == 128 ? 0 : 4 * wg;
    const uint32_t kcols = kD == 128 ? s_k + static_cast<uint32_t>(wg * kBwKeys * 128) : s_k;
    float dq[32];
    zero(dq);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kDqSteps; ++kk) {
      wgmma_m64n64k16_ss_tt(dq, desc_mn_major<kBwKeys>(s_ds, kk0 + kk), desc_mn_major<kBwKeys>(kcols, kk0 + kk),
                            kk > 0 ? 1 : 0);
    }
    wgmma_commit();
    wgmma_wait<1>();  // dV / dK done
    fence_regs(dv);
    fence_regs(dk);
    fence_regs_u32(pa);
    fence_regs_u32(da);
    issue_st(nbuf);
    wgmma_wait<1>();  // dQ done; S^T(next) keeps running
    fence_regs(dq);

    // dQ epilogue (as basic's bulk route) under S^T(next).
    const int q_rows = min(kBwRows, t.q_len - rq0);
    unsigned char* tile = smem + Smem::kDqT + wg * Smem::kDqTileBytes;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float* trow = reinterpret_cast<float*>(tile + (row_lo + 8 * r) * kDqRowBytes) + 2 * tq;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        *reinterpret_cast<float2*>(trow + 8 * j) = make_float2(dq[4 * j + 2 * r] * scale, dq[4 * j + 2 * r + 1] * scale);
      }
    }
    fence_proxy_async();
    if (wg == 0) {
      named_barrier_sync<1, 128>();
    } else {
      named_barrier_sync<2, 128>();
    }
    if (tw < q_rows) {
      float* dst = p.dq + (static_cast<int64_t>(dq_row0 + rq0 + tw) * hq + qh) * kD + (kD == 128 ? 64 * wg : 0);
      bulk_reduce_add_f32(dst, s_dqt + static_cast<uint32_t>(wg * Smem::kDqTileBytes + tw * kDqRowBytes), 64 * 4);
      bulk_commit();
    }

    step = nstep;
    cls = ncls;
    nstep = nnstep;
    ncls = nncls;
    buf = nbuf;
    p_and_ds(buf, step < num_steps ? sub_tile_row(step) : 0, cls);
  }
  cp_async_wait<0>();
  bulk_wait<0>();

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = key_lo + 8 * r;
    if (key >= keys) continue;
    const int64_t off = (static_cast<int64_t>(dkv_row0 + c0 + key) * hkv + kvh) * kD + 2 * tq;
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
      atomicAdd(reinterpret_cast<float2*>(p.dk + off + 8 * j), make_float2(dk[4 * j + 2 * r] * scale, dk[4 * j + 2 * r + 1] * scale));
      atomicAdd(reinterpret_cast<float2*>(p.dv + off + 8 * j), make_float2(dv[4 * j + 2 * r], dv[4 * j + 2 * r + 1]));
    }
  }
#endif
}

template <int kD>
void launch_backward_sm90_pipe(const AttnBackwardParams& p, cudaStream_t stream) {
  constexpr int kSmem = BwPipeSmem<kD>::kAlloc;
  static const bool ready =
      (allow_shared_memory("attention_backward_sm90_pipe", attention_backward_sm90_pipe_kernel<kD>, kSmem), true);
  (void)ready;
  attention_backward_sm90_pipe_kernel<kD><<<p.list.num_work, kBwThreads, kSmem, stream>>>(p);
}

}  // namespace

void attention_backward_wgmma_pipelined(const AttnBackwardParams& params, cudaStream_t stream) {
  launch_for_head_dim("attention_backward_sm90_pipe", params.shape,
                      [&]<int kD>() { launch_backward_sm90_pipe<kD>(params, stream); });
}

}  // namespace dcp::cuda::detail
