// attention_backward_sm90_wide.cu — the warp-specialised Hopper backward over 80-row q steps, for
// the work items that need no mask: a full 128-key chunk of a Full tile, head dim 128
// (partition_backward_work puts them first in the list: AttnTileList::num_wide). The 64-row kernel
// (attention_backward_sm90_ws.cu) takes the other items; the launcher runs both, this one first.
//
// Why 80 rows. The 64-row step is bound by shared memory: each warpgroup's S^T and dP^T read K or
// V and a 64-row Q or dO sub-tile per product (n = 64), and dQ, dK, dV their operands, for 64 rows'
// worth of work. An 80-row step reads the same K / V tiles for 1.25x the work, and its products
// are longer (n = 80; dV and dK five k steps instead of four): per unit of work about 5 % fewer
// operand bytes (bench/results/kernel_profile_h200.md, "The longer q sub-tile, costed"). The
// registers allow it only with the producer on 24 and the consumers on 240: at the peak of a step
// a consumer holds dK and dV (64 + 64 fp32), S^T and dP^T (40 + 40).
//
// What changes against the 64-row kernel (same CTA: a producer warpgroup and two consumer
// warpgroups, each consumer 64 of the chunk's 128 keys; same ring of two slots and four records):
// - S^T and dP^T are m64n80 products (A = K or V rows, B = the 80-row Q or dO tile, K-major).
// - dQ cannot be an m64 product over 80 rows, so each warpgroup computes its 64 columns of dQ
//   transposed: dQ^T = K^T dS^T (m64n80, A = its K column block read MN-major, B = dS stored
//   [q][keys], K-major). dS^T leaves the registers by stmatrix with transposition (five x4
//   instructions a warp), and dQ^T is staged row by row of q into 80-row TMA boxes with 4-byte
//   stores (conflict-free: a warp's 32 stores of one register fill 32 banks).
// - Mask-free: no classification, no row masks; rows past the tile's end load as zeros with
//   LSE = +inf (P = 0 there). A tile's last step is shorter: 64 rows come by the 64-row tensor
//   maps (the slot's rows 64-79 keep finite values: zeroed at the start, later real rows), other
//   lengths by cp.async with zero fill, and their dQ by fp32 atomics.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "attention_backward_sm90.cuh"
#include "attention_backward_sm90_ws.cuh"
#include "attention_common.cuh"
#include "dcp/detail/attention_cuda.h"
#include "sync_sm90.cuh"
#include "tensor_map.h"
#include "wgmma_sm90.cuh"
#include "wgmma_sm90_bwd.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#pragma nv_diag_suppress 177
#endif

namespace dcp::cuda::detail {
namespace {

inline constexpr int kWideRows = 80;    // q rows of a step
inline constexpr int kWideD = 128;      // head dim
inline constexpr int kWideProducerRegs = 24;
inline constexpr int kWideConsumerRegs = 240;
static_assert(128 * kWideProducerRegs + kConsumerThreads * kWideConsumerRegs <= cta_register_pool(kWsThreads), "register file");

// A staged dQ box of the wide kernel: 80 rows x 32 fp32 columns, 128-byte swizzled like kBoxBytes'
// boxes; its first 64 rows are a 64-row box (for a tile's 64-row last step).
inline constexpr int kWideBoxBytes = kWideRows * 128;

struct BwWideSmem {
  static constexpr int kKvBytes = kBwKeys * kWideD * 2;     // 32 KB
  static constexpr int kQBytes = kWideRows * kWideD * 2;    // 20 KB: two 64-column blocks of 80 rows
  static constexpr int kDsBytes = kWideRows * kBwKeys * 2;  // 20 KB: [80 q][128 keys], two 64-key blocks
  static constexpr int kDqTileBytes = 2 * kWideBoxBytes;    // 20 KB: a warpgroup's 64 dQ columns
  static constexpr int kK = 0;
  static constexpr int kV = kK + kKvBytes;
  static constexpr int kQ = kV + kKvBytes;              // 2 slots
  static constexpr int kDo = kQ + 2 * kQBytes;          // 2 slots
  static constexpr int kDs = kDo + 2 * kQBytes;         // 2 buffers
  static constexpr int kDqT = kDs + 2 * kDsBytes;       // one staging tile per consumer warpgroup
  static constexpr int kLse = kDqT + 2 * kDqTileBytes;  // 2 x 80 floats
  static constexpr int kDelta = kLse + 2 * kWideRows * 4;
  static constexpr int kInfo = kDelta + 2 * kWideRows * 4;
  static constexpr int kFull = kInfo + kInfoRecords * static_cast<int>(sizeof(BwStageInfo));  // uint64 mbarrier[2]
  static constexpr int kEmpty = kFull + 16;                                                    // uint64 mbarrier[2]
  static constexpr int kBytes = kEmpty + 16;
  static constexpr int kAlloc = kBytes + kSw128AtomBytes;
  static_assert(kAlloc <= 227 * 1024, "an H100 / H200 CTA holds at most 227 KB of shared memory");
  static_assert(kQBytes % kSw128AtomBytes == 0 && kDsBytes % kSw128AtomBytes == 0 && kWideBoxBytes % kSw128AtomBytes == 0 &&
                    kDqT % kSw128AtomBytes == 0,
                "tiles and boxes stay atom aligned");
  static_assert(4 * (kWideD / 32) * kBoxBytes <= kDs, "an item's dK / dV staged in K, V, Q and dO");
  static_assert(kFull % 8 == 0, "mbarriers are 8-byte aligned");
};

// S^T = K Q^T and dP^T = V dO^T over an 80-row step, two commit groups (S^T first).
__device__ __forceinline__ void bw_wide_issue_st_dpt(float (&st)[40], float (&dpt)[40], uint32_t s_k, uint32_t s_v, uint32_t qb,
                                                     uint32_t dob, int wg) {
  zero(st);
  zero(dpt);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kWideD / 16; ++kk) {
    wgmma_m64n80k16_ss(st, desc_k_major<kBwKeys>(s_k, wg * 64, kk), desc_k_major<kWideRows>(qb, 0, kk), kk > 0 ? 1 : 0);
  }
  wgmma_commit();
#pragma unroll
  for (int kk = 0; kk < kWideD / 16; ++kk) {
    wgmma_m64n80k16_ss(dpt, desc_k_major<kBwKeys>(s_v, wg * 64, kk), desc_k_major<kWideRows>(dob, 0, kk), kk > 0 ? 1 : 0);
  }
  wgmma_commit();
}

// A fragments of m64k16 over the step's 80 q rows (k step kk = rows 16 kk .. + 15) of an
// accumulator tile (P^T or dS^T): accumulator column groups 2 kk and 2 kk + 1.
__device__ __forceinline__ void bw_wide_pack(uint32_t (&a)[5][4], const float (&acc)[40]) {
#pragma unroll
  for (int kk = 0; kk < 5; ++kk) {
#pragma unroll
    for (int i = 0; i < 4; ++i) a[kk][i] = pack_bf16(acc[8 * kk + 2 * i], acc[8 * kk + 2 * i + 1]);
  }
}

// acc (64 keys x D) += A B over the step's 80 q rows: A from registers, B = the step's Q or dO
// tile read MN-major (dV += P^T dO, dK += dS^T Q). One commit group.
__device__ __forceinline__ void bw_wide_issue_rs(float (&acc)[kWideD / 2], const uint32_t (&a)[5][4], uint32_t b) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 5; ++kk) wgmma_m64n128k16_rs(acc, a[kk], desc_mn_major<kWideRows>(b, kk));
  wgmma_commit();
}

// dS^T (keys x q rows, this warp's 16 keys) into the [80 q][128 keys] tile `ds`: fragment pair
// i of k step kk is the 8 x 8 block (keys 16 warp + 8 (i & 1) .., q 16 kk + 8 (i >> 1) ..),
// stored transposed, so each of its q rows receives 8 consecutive keys (one 16-byte chunk).
__device__ __forceinline__ void bw_wide_store_ds(uint32_t ds, const uint32_t (&da)[5][4], int wg, int warp_in_wg, int lane) {
  const int m = lane >> 3;  // the matrix whose row this lane addresses
  const int key = 64 * wg + 16 * warp_in_wg + 8 * (m & 1);
#pragma unroll
  for (int kk = 0; kk < 5; ++kk) {
    const int q = 16 * kk + 8 * (m >> 1) + (lane & 7);
    stmatrix_x4_trans(ds + sw128_offset<kWideRows>(q, key), da[kk]);
  }
}

// dQ^T = K^T dS^T: this warpgroup's 64 dQ columns (K column block wg read MN-major as A) over the
// step's 80 q rows (B = the dS tile, K-major), k steps of 16 keys. One commit group.
__device__ __forceinline__ void bw_wide_issue_dqt(float (&dqt)[40], uint32_t ds, uint32_t s_k, int wg) {
  const uint32_t kcols = s_k + static_cast<uint32_t>(wg * kBwKeys * 128);
  zero(dqt);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kBwKeys / 16; ++kk) {
    wgmma_m64n80k16_ss_ta(dqt, desc_mn_major<kBwKeys>(kcols, kk), desc_k_major<kWideRows>(ds, 0, kk), kk > 0 ? 1 : 0);
  }
  wgmma_commit();
}

// dQ^T * scale into the warpgroup's staging tile of two [80 q][32 columns] boxes: the thread's
// accumulator rows are dQ columns c = row_lo, row_lo + 8, its columns q rows 8 j + 2 tq (+ 1).
// For one register a warp writes columns of 8 consecutive values of (c >> 2) and 4 of (q & 7)
// parity pairs: the swizzled chunks (c >> 2) ^ (q & 7) are 8 distinct ones, times c & 3: 32 banks.
__device__ __forceinline__ void bw_wide_write_dqt(unsigned char* tile, const float (&dqt)[40], int row_lo, int tq, float scale) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int c = row_lo + 8 * r;
    unsigned char* box = tile + (c >> 5) * kWideBoxBytes + (c & 3) * 4;
    const int chunk = (c & 31) >> 2;
#pragma unroll
    for (int j = 0; j < 10; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int q = 8 * j + 2 * tq + e;
        *reinterpret_cast<float*>(box + q * 128 + ((chunk ^ (q & 7)) << 4)) = dqt[4 * j + 2 * r + e] * scale;
      }
    }
  }
}

__global__ void __launch_bounds__(kWsThreads, 1) attention_backward_sm90_wide_kernel(const __grid_constant__ BwWsParams wp) {
  const AttnBackwardParams p = wp.p;
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  (void)wp;
  __trap();
#else
  using Smem = BwWideSmem;
  constexpr int kD = kWideD;
  const AttnWorkItem w = p.list.work[blockIdx.x];
  const int c0 = w.chunk * kBwKeys;
  if (!bw_wide_item(p.list.tiles[w.tile], c0)) __trap();  // not partition_backward_work's: a caller's error

  extern __shared__ __align__(128) unsigned char smem_raw[];
  const SmemBase aligned = sw128_smem_base(smem_raw);
  unsigned char* smem = aligned.ptr;
  const uint32_t base = aligned.addr;
  const uint32_t s_k = base + Smem::kK;
  const uint32_t s_v = base + Smem::kV;
  const uint32_t s_q = base + Smem::kQ;
  const uint32_t s_do = base + Smem::kDo;
  auto* s_lse = reinterpret_cast<float*>(smem + Smem::kLse);
  auto* s_delta = reinterpret_cast<float*>(smem + Smem::kDelta);
  auto* s_info = reinterpret_cast<BwStageInfo*>(smem + Smem::kInfo);
  const uint32_t full_bar = base + Smem::kFull;
  const uint32_t empty_bar = base + Smem::kEmpty;

  const int tid = static_cast<int>(threadIdx.x);
  bw_init_ring(full_bar, empty_bar);

  const int hq = p.shape.num_q_heads;
  const int hkv = p.shape.num_kv_heads;
  const int group = hq / hkv;
  const int kvh = w.head;

  if (tid < 128) {
    // ---------------- producer warpgroup ----------------
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kWideProducerRegs));
    const int ptid = tid;
    const AttnTile* t = p.list.tiles + w.tile;
    {
      const int64_t kv_stride = static_cast<int64_t>(hkv) * kD;
      const int64_t kv_off = (static_cast<int64_t>(t->kv_begin + c0) * hkv + kvh) * kD;
      producer_load_rows<kBwKeys, kD>(s_k, static_cast<const __nv_bfloat16*>(p.k) + kv_off, kv_stride, kBwKeys, ptid);
      producer_load_rows<kBwKeys, kD>(s_v, static_cast<const __nv_bfloat16*>(p.v) + kv_off, kv_stride, kBwKeys, ptid);
    }
    // Rows 64-79 of both column blocks of the four Q / dO slots: a 64-row step's TMA leaves them
    // as they were, and they must hold finite values (their P is 0, and 0 x NaN is NaN).
#pragma unroll 1
    for (int i = ptid; i < 4 * 2 * 16 * 8; i += 128) {
      const int slot_tile = i >> 8;  // Q slot 0, Q slot 1, dO slot 0, dO slot 1 (contiguous)
      const int block = (i >> 7) & 1;
      const int row = 64 + ((i >> 3) & 15);
      *reinterpret_cast<int4*>(smem + Smem::kQ + slot_tile * Smem::kQBytes + block * kWideBoxBytes + row * 128 + (i & 7) * 16) =
          make_int4(0, 0, 0, 0);
    }
    // Every producer thread's zeros land before thread 0's first TMA writes those rows.
    fence_proxy_async();
    bar_sync_n<kBarProducer, 128>();
    const int per_head = (t->q_len + kWideRows - 1) / kWideRows;
    const int num_steps = per_head * group;
    const int dout_row0 = t->dout_begin >= 0 ? t->dout_begin : t->q_begin;
    for (int j = 0;; ++j) {
      const int slot = j & 1;
      const bool end = j >= num_steps;
      if (j >= 2) mbar_wait(empty_bar + static_cast<uint32_t>(slot * 8), static_cast<uint32_t>(((j >> 1) - 1) & 1));
      const int qh = end ? 0 : kvh * group + j / per_head;
      const int rq0 = end ? 0 : (j % per_head) * kWideRows;
      const int rows = end ? 0 : min(kWideRows, t->q_len - rq0);
      if (ptid == 0) {  // the consumers read end, qh, q_rows and dq_row (no mask, no class)
        BwStageInfo info{};
        info.end = end ? 1 : 0;
        if (!end) {
          info.qh = qh;
          info.q_rows = rows;
          info.dq_row = (t->dq_begin >= 0 ? t->dq_begin : t->q_begin) + rq0;
        }
        s_info[j & (kInfoRecords - 1)] = info;
      }
      const uint32_t full = full_bar + static_cast<uint32_t>(slot * 8);
      const bool tma = !end && wp.tma_qdo != 0 && (rows == kWideRows || rows == kBwRows);
      if (!end) {
        const auto boff = static_cast<uint32_t>(slot * Smem::kQBytes);
        if (tma && ptid == 0) {
          const bool wide = rows == kWideRows;
          mbar_arrive_expect_tx(full, static_cast<uint32_t>(2 * rows * kD * 2));
#pragma unroll
          for (int b = 0; b < kD / 64; ++b) {
            const auto box = static_cast<uint32_t>(b * kWideBoxBytes);  // column block b: 80 rows of 128 bytes
            tma_load_2d(s_q + boff + box, wide ? &wp.q_map80 : &wp.q_map, qh * kD + 64 * b, t->q_begin + rq0, full);
            tma_load_2d(s_do + boff + box, wide ? &wp.do_map80 : &wp.do_map, qh * kD + 64 * b, dout_row0 + rq0, full);
          }
        }
        if (ptid < kWideRows) {
          stage_lse_delta(p.lse, p.delta, hq, *t, rq0, rows, qh, ptid, s_lse + slot * kWideRows, s_delta + slot * kWideRows);
        }
        if (!tma) {
          const int64_t q_stride = static_cast<int64_t>(hq) * kD;
          const int64_t off = (static_cast<int64_t>(t->q_begin + rq0) * hq + qh) * kD;
          const int64_t do_off = (static_cast<int64_t>(dout_row0 + rq0) * hq + qh) * kD;
          producer_load_rows<kWideRows, kD>(s_q + boff, static_cast<const __nv_bfloat16*>(p.q) + off, q_stride, rows, ptid);
          producer_load_rows<kWideRows, kD>(s_do + boff, static_cast<const __nv_bfloat16*>(p.dout) + do_off, q_stride, rows, ptid);
        }
      }
      if (!tma || j == 0) {  // this step's cp.async bytes (and K / V and the zeroed rows at iteration 0)
        cp_async_commit();
        cp_async_wait<0>();
        fence_proxy_async();
      }
      if (!tma || ptid != 0) mbar_arrive(full);
      if (end) break;
    }
    return;
  }

  // ---------------- consumer warpgroups ----------------
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kWideConsumerRegs));
  const int ctid = tid - 128;
  const int wg = ctid >> 7;
  const int tw = ctid & 127;
  const int warp_in_wg = tw >> 5;
  const int lane = ctid & 31;
  const int g = lane >> 2;
  const int tq = lane & 3;
  const float scale = p.shape.softmax_scale;
  const float scale_log2 = scale * kLog2e;
  const uint32_t s_ds = base + Smem::kDs;
  const uint32_t s_dqt = base + Smem::kDqT;

  float dk[kD / 2];
  float dv[kD / 2];
  zero(dk);
  zero(dv);
  const int row_lo = warp_in_wg * 16 + g;

  for (int j = 0;; ++j) {
    const int buf = j & 1;
    mbar_wait(full_bar + static_cast<uint32_t>(buf * 8), static_cast<uint32_t>((j >> 1) & 1));
    const BwStageInfo* info = s_info + (j & (kInfoRecords - 1));
    if (info->end != 0) break;
    const uint32_t qb = s_q + static_cast<uint32_t>(buf * Smem::kQBytes);
    const uint32_t dob = s_do + static_cast<uint32_t>(buf * Smem::kQBytes);
    const uint32_t dsb = s_ds + static_cast<uint32_t>(buf * Smem::kDsBytes);
    const float* lse_b = s_lse + buf * kWideRows;
    const float* delta_b = s_delta + buf * kWideRows;

    float st[40];
    float dpt[40];
    bw_wide_issue_st_dpt(st, dpt, s_k, s_v, qb, dob, wg);
    wgmma_wait<1>();
    fence_regs(st);
    // P^T = exp2(S^T scale log2e - LSE log2e); columns are q rows 8 j + 2 tq (+ 1).
#pragma unroll
    for (int jj = 0; jj < 10; ++jj) {
      const float2 l2 = *reinterpret_cast<const float2*>(lse_b + 8 * jj + 2 * tq);
#pragma unroll
      for (int e = 0; e < 4; ++e) st[4 * jj + e] = exp2_ftz(fmaf(st[4 * jj + e], scale_log2, -((e & 1) != 0 ? l2.y : l2.x)));
    }
    wgmma_wait<0>();
    fence_regs(dpt);
    // dS^T = P^T (dP^T - Delta).
#pragma unroll
    for (int jj = 0; jj < 10; ++jj) {
      const float2 d2 = *reinterpret_cast<const float2*>(delta_b + 8 * jj + 2 * tq);
#pragma unroll
      for (int e = 0; e < 4; ++e) dpt[4 * jj + e] = st[4 * jj + e] * (dpt[4 * jj + e] - ((e & 1) != 0 ? d2.y : d2.x));
    }
    uint32_t pa[5][4];
    bw_wide_pack(pa, st);
    bw_wide_issue_rs(dv, pa, dob);
    uint32_t da[5][4];
    bw_wide_pack(da, dpt);
    bw_wide_store_ds(dsb, da, wg, warp_in_wg, lane);
    fence_proxy_async();  // dS stores -> visible to wgmma after the barrier
    bulk_wait_read<0>();  // the last step's dQ tile is read: reusable below
    bar_sync_n<kBarDsReady, kConsumerThreads>();

    float dqt[40];
    bw_wide_issue_dqt(dqt, dsb, s_k, wg);
    bw_wide_issue_rs(dk, da, qb);
    wgmma_wait<1>();  // dV and dQ^T complete; dK runs under the dQ tile's write and reduction
    fence_regs(dv);
    fence_regs(dqt);

    const int q_rows = info->q_rows;
    const int col0 = info->qh * kD + 64 * wg;
    unsigned char* tile = smem + Smem::kDqT + wg * Smem::kDqTileBytes;
    bw_wide_write_dqt(tile, dqt, row_lo, tq, scale);
    fence_proxy_async();  // the tile -> visible to the TMA reduction after the barrier
    bw_out_bar_sync(wg);
    if (wp.tma_dq != 0 && (q_rows == kWideRows || q_rows == kBwRows)) {
      if (tw == 0) {
        const CUtensorMap* map = q_rows == kWideRows ? &wp.dq_map80 : &wp.dq_map;
        const uint32_t src = s_dqt + static_cast<uint32_t>(wg * Smem::kDqTileBytes);
        tma_reduce_add_2d(map, src, col0, info->dq_row);
        tma_reduce_add_2d(map, src + kWideBoxBytes, col0 + 32, info->dq_row);
        bulk_commit();
      }
    } else {
      // Thread tw adds (row, box) pairs idx = 2 row + box of the tile's q_rows rows.
#pragma unroll 1
      for (int idx = tw; idx < 2 * q_rows; idx += 128) {
        const int row = idx >> 1;
        const int half = idx & 1;
        float* dst = p.dq + static_cast<int64_t>(info->dq_row + row) * hq * kD + col0 + 32 * half;
        const unsigned char* src = tile + half * kWideBoxBytes + row * 128;
#pragma unroll
        for (int c = 0; c < 8; ++c) {
          const float4 v4 = *reinterpret_cast<const float4*>(src + ((c ^ (row & 7)) * 16));
          atomicAdd(reinterpret_cast<float2*>(dst + 4 * c), make_float2(v4.x, v4.y));
          atomicAdd(reinterpret_cast<float2*>(dst + 4 * c + 2), make_float2(v4.z, v4.w));
        }
      }
    }
    wgmma_wait<0>();  // dK: the slot (Q, dO, LSE, Delta, record) is no longer read
    fence_regs(dk);
    mbar_arrive(empty_bar + static_cast<uint32_t>(buf * 8));
  }
  bulk_wait<0>();

  const AttnTile* t0 = p.list.tiles + p.list.work[blockIdx.x].tile;
  const int dkv_row0 = t0->dkv_begin >= 0 ? t0->dkv_begin : t0->kv_begin;
  if (wp.tma_dkv != 0) {
    bar_sync_n<kBarDsReady, kConsumerThreads>();  // both warpgroups past their last products
    bw_add_dk_dv_tma<kD>(wp, smem, base, dk, dv, wg, tw, row_lo, tq, scale, dkv_row0 + c0, kvh);
    return;
  }
  bw_add_dk_dv<kD>(p.dk, p.dv, dk, dv, dkv_row0 + c0, hkv, kvh, wg * 64 + row_lo, kBwKeys, tq, scale);
#endif
}

}  // namespace

void launch_backward_sm90_wide(const BwWsParams& wp, cudaStream_t stream) {
  constexpr int kSmem = BwWideSmem::kAlloc;
  allow_shared_memory("attention_backward_sm90_wide", attention_backward_sm90_wide_kernel, kSmem);
  attention_backward_sm90_wide_kernel<<<wp.p.list.num_wide, kWsThreads, kSmem, stream>>>(wp);
}

}  // namespace dcp::cuda::detail
