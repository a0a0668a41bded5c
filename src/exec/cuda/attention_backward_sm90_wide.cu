// attention_backward_sm90_wide.cu — the warp-specialised Hopper backward over 80-row q steps, for
// the work items that need no mask: a full 128-key chunk of a Full tile, head dim 128
// (partition_backward_work puts them first in the list: AttnTileList::num_wide). The 64-row kernel
// (attention_backward_sm90_ws.cu) takes the other items; the launcher runs both side by side.
//
// Why 80 rows. The 64-row step is bound by shared memory: each warpgroup's S^T and dP^T read K or
// V and a 64-row Q or dO sub-tile per product (n = 64), and dQ, dK, dV their operands, for 64 rows'
// worth of work. An 80-row step reads the same K / V tiles for 1.25x the work, and its products
// are longer (n = 80; dV and dK five k steps instead of four): per unit of work about 5 % fewer
// operand bytes (bench/results/kernel_profile_h200.md, "The longer q sub-tile, costed"). The
// registers allow it only with the producer on 24 and the consumers on 240: at the peak of a step
// a consumer holds dK and dV (64 + 64 fp32), S^T and dP^T (40 + 40).
//
// An item may walk a run of tiles that share its key block (make_backward_runs): K / V stay in
// shared memory and dK / dV in registers from the run's first tile to its last, so the item's
// prologue (K / V loads, the ring's first fill) and epilogue (the dK / dV reductions) come once per
// run; with 1024-row tiles a tile alone is only 52 steps.
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
//   LSE = +inf (P = 0 there). A tile whose length is a multiple of 16 ends on up to four 64-row
//   steps instead of one short step (wide_backward_steps), which come by the 64-row tensor maps
//   (the slot's rows 64-79 keep finite values: zeroed at the start, later real rows); other
//   lengths end on a short step loaded by cp.async with zero fill, its dQ added by fp32 atomics.
// - Steps overlap by one product, and dQ leaves through a warp of its own. The producer's warps
//   0-2 load; its warp 3 issues the dQ^T tiles' TMA reductions. A consumer issues step j's S^T as
//   soon as the slot is full, then hands step j - 1's written tiles to that warp (a proxy fence
//   and a non-blocking barrier arrival) while S^T runs, so the tensor pipe works through the
//   hand-off and the slot's handshake instead of waiting for a barrier of the warpgroup and the
//   reductions' issue. (ptxas keeps a product in flight only across straight-line code: a branch
//   under it, such as an `if` around the TMA issue, serialises every product of the kernel.)
//   1.03-1.04x on full and causal-sequence lists (H100), 1.03-1.06x on the whole causal, lambda
//   and shared-question plans (bench/results/cuda_attention_h200.md).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "attention_backward_sm90.cuh"
#include "attention_backward_sm90_ws.cuh"
#include "attention_common.cuh"
#include "dcp/detail/attention_cuda.h"
#include "dcp/detail/dq_units.h"
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
static_assert(kWideRows == 80 && kBwRows == 64, "wide_backward_steps' step sizes");
inline constexpr int kWideLoaders = 96;  // producer warps 0-2 load the ring's slots; warp 3 adds dQ
// Named barriers of the dQ warp (beside attention_backward_sm90_ws.cuh's 1-4), each of the 256
// consumer threads and the dQ warp's 32: the consumers arrive and the warp waits, or the reverse.
inline constexpr int kBarDqFull = 5;  // a step's two dQ^T tiles are written (consumers arrive)
inline constexpr int kBarDqFree = 6;  // the tiles have been read by the reductions (the dQ warp arrives)
inline constexpr int kDqBarThreads = kConsumerThreads + 32;

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
  static constexpr int kUnitExps = kDelta + 2 * kWideRows * 4;  // 2 x 80 unit exponents (ordered deterministic), a byte each
  static constexpr int kInfo = kUnitExps + 2 * kWideRows;
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


// The steps of an item: the tiles of its run (AttnWorkItem::num_tiles, make_backward_runs: they
// share q_len) one after the other, in each tile the kv head's q heads, in each head
// wide_backward_steps' steps. The producer's loaders and the dQ warp each walk it by the step's
// index (the loaders run on 24 registers: state carried from step to step spills), the consumers
// read the steps' records. An item of one tile is walked by WideTileWalk, which keeps its tile and
// first dO row in registers: the run walk's division and tile reads per step cost such an item
// about 2 % (kernels_h100_2026-12-05.json, s63_backward_runs), so only runs pay for them.
struct WideStep {
  const AttnTile* tile;
  int head;  // q head kv head x group + head
  int row0, rows;
  int dout_row0;  // the tile's first dO row
};
struct WideTileWalk {
  const AttnTile* t;
  WideBackwardSteps steps;
  int num_steps;
  int dout_row0;
  __device__ WideTileWalk(const AttnTile* tile, int group)
      : t(tile), steps(wide_backward_steps(tile->q_len)), num_steps(steps.per_head * group),
        dout_row0(tile->dout_begin >= 0 ? tile->dout_begin : tile->q_begin) {}
  __device__ WideStep at(int j) const {
    const int head = j / steps.per_head;
    const int s = j - head * steps.per_head;
    return {t, head, steps.row0(s), steps.rows(s, t->q_len), dout_row0};
  }
};
struct WideRun {
  const AttnTile* first;
  WideBackwardSteps steps;
  int per_tile;   // steps of a tile: per_head x group
  int num_steps;  // of the run
  __device__ WideRun(const AttnTile* tiles, int count, int group)
      : first(tiles), steps(wide_backward_steps(tiles->q_len)), per_tile(steps.per_head * group), num_steps(per_tile * count) {}
  __device__ WideStep at(int j) const {
    const int ti = j / per_tile;
    const int r = j - ti * per_tile;
    const int head = r / steps.per_head;
    const int s = r - head * steps.per_head;
    const AttnTile* t = first + ti;
    return {t, head, steps.row0(s), steps.rows(s, t->q_len), t->dout_begin >= 0 ? t->dout_begin : t->q_begin};
  }
};

// Whether a step's dQ rows go out by TMA reductions (80 or 64 rows: a tensor map's box), not by
// the consumers' atomics.
__device__ __forceinline__ bool bw_wide_dq_by_tma(const BwWsParams& wp, int rows) {
  return wp.tma_dq != 0 && (rows == kWideRows || rows == kBwRows);
}

// The dQ warp (producer warp 3): for every step, once both consumer warpgroups have written their
// dQ^T tiles, it adds them to dQ by TMA reductions and waits until the tiles have been read, then
// frees them. The consumers only fence and arrive, so their products stay in flight across it (a
// branch while a product is in flight makes ptxas serialise them all).
// Barrier phases: the consumers arrive on kBarDqFull once per iteration (n steps + the end
// record; the first arrival carries no tile) and wait on kBarDqFree before writing step s's tiles
// (n times); the order below keeps every party at most one phase ahead of the other.
template <class Walk>
__device__ __forceinline__ void bw_wide_dq_warp(const BwWsParams& wp, uint32_t s_dqt, const Walk& run, int qh0, int lane) {
  bar_sync_n<kBarDqFull, kDqBarThreads>();  // iteration 0: no tile yet
  bar_arrive_n<kBarDqFree, kDqBarThreads>();
#pragma unroll 1
  for (int j = 0; j < run.num_steps; ++j) {
    bar_sync_n<kBarDqFull, kDqBarThreads>();  // step's tiles written and fenced
    const WideStep st = run.at(j);
    if (lane == 0 && bw_wide_dq_by_tma(wp, st.rows)) {
      const CUtensorMap* map = st.rows == kWideRows ? &wp.dq_map80 : &wp.dq_map;
      const int col0 = (qh0 + st.head) * kWideD;
      const int dq_row = (st.tile->dq_begin >= 0 ? st.tile->dq_begin : st.tile->q_begin) + st.row0;
#pragma unroll
      for (int wg = 0; wg < 2; ++wg) {
        const uint32_t src = s_dqt + static_cast<uint32_t>(wg * 2 * kWideBoxBytes);
        tma_reduce_add_2d(map, src, col0 + 64 * wg, dq_row);
        tma_reduce_add_2d(map, src + kWideBoxBytes, col0 + 64 * wg + 32, dq_row);
      }
      bulk_commit();
      bulk_wait_read<0>();
    }
    __syncwarp();
    if (j + 1 < run.num_steps) bar_arrive_n<kBarDqFree, kDqBarThreads>();
  }
  if (lane == 0) bulk_wait<0>();
}

// One score product over an 80-row step: S^T = K Q^T (a = K, b = the Q tile) or dP^T = V dO^T.
// One commit group. The register fences pin the accumulator to the same registers from the first
// k step to the last: a copy between them (SSA values the front end did not coalesce) would make
// ptxas serialise every product of the kernel.
__device__ __forceinline__ void bw_wide_issue_scores(float (&acc)[40], uint32_t a, uint32_t b, int wg) {
  zero(acc);
  fence_regs(acc);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kWideD / 16; ++kk) {
    wgmma_m64n80k16_ss(acc, desc_k_major<kBwKeys>(a, wg * 64, kk), desc_k_major<kWideRows>(b, 0, kk), kk > 0 ? 1 : 0);
  }
  wgmma_commit();
  fence_regs(acc);
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
// kUnits: int32 counts of the q rows' units instead (`units`: the step's exponents, one byte per
// row; dcp/detail/dq_units.h).
template <bool kUnits>
__device__ __forceinline__ void bw_wide_write_dqt(unsigned char* tile, const float (&dqt)[40], int row_lo, int tq, float scale,
                                                  const uint8_t* units) {
  if constexpr (!kUnits) {
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
  } else {
    // The same stores, a q row's multiplier made once for both of its columns.
#pragma unroll
    for (int j = 0; j < 10; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int q = 8 * j + 2 * tq + e;
        const float m = dq_units::multiplier(units[q], scale);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int c = row_lo + 8 * r;
          unsigned char* at = tile + (c >> 5) * kWideBoxBytes + (c & 3) * 4 + q * 128 + ((((c & 31) >> 2) ^ (q & 7)) << 4);
          *reinterpret_cast<int32_t*>(at) = dq_units::to_units(dqt[4 * j + 2 * r + e], m);
        }
      }
    }
  }
}

// kUnits: the ordered deterministic backward (dQ as counts of dq_units, dK / dV in turns).
template <bool kUnits>
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
  auto* s_units = reinterpret_cast<uint8_t*>(smem + Smem::kUnitExps);
  auto* s_info = reinterpret_cast<BwStageInfo*>(smem + Smem::kInfo);
  const uint32_t full_bar = base + Smem::kFull;
  const uint32_t empty_bar = base + Smem::kEmpty;

  const int tid = static_cast<int>(threadIdx.x);
  bw_init_ring(full_bar, empty_bar, kWideLoaders);

  const int hq = p.shape.num_q_heads;
  const int hkv = p.shape.num_kv_heads;
  const int group = hq / hkv;
  const int kvh = w.head;

  if (tid < 128) {
    // ---------------- producer warpgroup ----------------
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kWideProducerRegs));
    const int ptid = tid;
    const AttnTile* run_first = p.list.tiles + w.tile;
    if (ptid >= kWideLoaders) {
      if (w.num_tiles == 1) {
        bw_wide_dq_warp(wp, base + BwWideSmem::kDqT, WideTileWalk(run_first, group), kvh * group, ptid & 31);
      } else {
        bw_wide_dq_warp(wp, base + BwWideSmem::kDqT, WideRun(run_first, w.num_tiles, group), kvh * group, ptid & 31);
      }
      return;
    }
    {
      const int64_t kv_stride = static_cast<int64_t>(hkv) * kD;
      const int64_t kv_off = (static_cast<int64_t>(run_first->kv_begin + c0) * hkv + kvh) * kD;
      producer_load_rows<kBwKeys, kD, kWideLoaders>(s_k, static_cast<const __nv_bfloat16*>(p.k) + kv_off, kv_stride, kBwKeys, ptid);
      producer_load_rows<kBwKeys, kD, kWideLoaders>(s_v, static_cast<const __nv_bfloat16*>(p.v) + kv_off, kv_stride, kBwKeys, ptid);
    }
    // Rows 64-79 of both column blocks of the four Q / dO slots: a 64-row step's TMA leaves them
    // as they were, and they must hold finite values (their P is 0, and 0 x NaN is NaN).
#pragma unroll 1
    for (int i = ptid; i < 4 * 2 * 16 * 8; i += kWideLoaders) {
      const int slot_tile = i >> 8;  // Q slot 0, Q slot 1, dO slot 0, dO slot 1 (contiguous)
      const int block = (i >> 7) & 1;
      const int row = 64 + ((i >> 3) & 15);
      *reinterpret_cast<int4*>(smem + Smem::kQ + slot_tile * Smem::kQBytes + block * kWideBoxBytes + row * 128 + (i & 7) * 16) =
          make_int4(0, 0, 0, 0);
    }
    // Every loader's zeros land before thread 0's first TMA writes those rows.
    fence_proxy_async();
    bar_sync_n<kBarProducer, kWideLoaders>();
    // The steps' loads, by either walk (one copy of the loop each).
    auto produce = [&](const auto& run) {
      for (int j = 0;; ++j) {
        const int slot = j & 1;
        const bool end = j >= run.num_steps;
        const WideStep st = run.at(end ? 0 : j);
        const AttnTile* t = st.tile;
        const int qh = end ? 0 : kvh * group + st.head;
        const int rq0 = end ? 0 : st.row0;
        const int rows = end ? 0 : st.rows;
        const int dout_row0 = end ? 0 : st.dout_row0;
        // The step's LSE, Delta (and units) are read before its slot is free: off the path from the
        // consumers' release to the slot's fill.
        LseDelta stats;
        int32_t unit = 1;
        if (!end && ptid < kWideRows) {
          stats = load_lse_delta(p.lse, p.delta, hq, *t, rq0, rows, qh, ptid);
          if (kUnits && ptid < rows) unit = p.dq_units[static_cast<int64_t>(dout_row0 + rq0 + ptid) * hq + qh];
        }
        if (j >= 2) mbar_wait(empty_bar + static_cast<uint32_t>(slot * 8), static_cast<uint32_t>(((j >> 1) - 1) & 1));
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
            // Its bytes only: thread 0 arrives below with the others, once its row's statistics are stored.
            mbar_expect_tx(full, static_cast<uint32_t>(2 * rows * kD * 2));
#pragma unroll
            for (int b = 0; b < kD / 64; ++b) {
              const auto box = static_cast<uint32_t>(b * kWideBoxBytes);  // column block b: 80 rows of 128 bytes
              tma_load_2d(s_q + boff + box, wide ? &wp.q_map80 : &wp.q_map, qh * kD + 64 * b, t->q_begin + rq0, full);
              tma_load_2d(s_do + boff + box, wide ? &wp.do_map80 : &wp.do_map, qh * kD + 64 * b, dout_row0 + rq0, full);
            }
          }
          if (ptid < kWideRows) {
            s_lse[slot * kWideRows + ptid] = stats.lse2;
            s_delta[slot * kWideRows + ptid] = stats.delta;
            if (kUnits) s_units[slot * kWideRows + ptid] = static_cast<uint8_t>(unit);
          }
          if (!tma) {
            const int64_t q_stride = static_cast<int64_t>(hq) * kD;
            const int64_t off = (static_cast<int64_t>(t->q_begin + rq0) * hq + qh) * kD;
            const int64_t do_off = (static_cast<int64_t>(dout_row0 + rq0) * hq + qh) * kD;
            producer_load_rows<kWideRows, kD, kWideLoaders>(s_q + boff, static_cast<const __nv_bfloat16*>(p.q) + off, q_stride, rows, ptid);
            producer_load_rows<kWideRows, kD, kWideLoaders>(s_do + boff, static_cast<const __nv_bfloat16*>(p.dout) + do_off, q_stride, rows,
                                                            ptid);
          }
        }
        if (!tma || j == 0) {  // this step's cp.async bytes (and K / V and the zeroed rows at iteration 0)
          cp_async_commit();
          cp_async_wait<0>();
          fence_proxy_async();
        }
        mbar_arrive(full);  // every producer thread, its stores of the slot done
        if (end) break;
      }
    };
    if (w.num_tiles == 1) {
      produce(WideTileWalk(run_first, group));
    } else {
      produce(WideRun(run_first, w.num_tiles, group));
    }
    return;
  }

  // ---------------- consumer warpgroups ----------------
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kWideConsumerRegs));
  const int ctid = tid - 128;
  const int wg = warpgroup_of(ctid);
  const int tw = ctid & 127;
  const int warp_in_wg = tw >> 5;
  const int lane = ctid & 31;
  const int g = lane >> 2;
  const int tq = lane & 3;
  const float scale = p.shape.softmax_scale;
  const float scale_log2 = scale * kLog2e;
  const uint32_t s_ds = base + Smem::kDs;

  float dk[kD / 2];
  float dv[kD / 2];
  zero(dk);
  zero(dv);
  const int row_lo = warp_in_wg * 16 + g;

  // Steps overlap by one product: step j's S^T is issued as soon as its slot is full, and step
  // j - 1's dQ^T tiles (written by then) are handed to the dQ warp under it, so the tensor pipe
  // works through that hand-off and the slot's handshake. Every product's issue and wait fall
  // inside one iteration (an accumulator in flight across the loop's back edge or a branch, or
  // issued on a path that leaves the loop, makes ptxas serialise all products).
  unsigned char* tile = smem + Smem::kDqT + wg * Smem::kDqTileBytes;
  for (int j = 0;; ++j) {
    const int buf = j & 1;
    mbar_wait(full_bar + static_cast<uint32_t>(buf * 8), static_cast<uint32_t>((j >> 1) & 1));
    const BwStageInfo& info = s_info[j & (kInfoRecords - 1)];
    const bool end = info.end != 0;
    const uint32_t qb = s_q + static_cast<uint32_t>(buf * Smem::kQBytes);
    const uint32_t dob = s_do + static_cast<uint32_t>(buf * Smem::kQBytes);
    if (j > 0) {
      const BwStageInfo& prev = s_info[(j - 1) & (kInfoRecords - 1)];
      if (!bw_wide_dq_by_tma(wp, prev.q_rows)) {  // a short step: its rows by atomics, before any product is issued
        bw_out_bar_sync(wg);
        bw_add_dq_atomic<kWideRows, kUnits>(p.dq, tile, prev.q_rows, prev.dq_row, int64_t{hq} * kD, prev.qh * kD + 64 * wg, tw);
      }
    }
    if (end) {
      fence_proxy_async();  // the last step's tiles -> visible to the dQ warp's reductions
      bar_arrive_n<kBarDqFull, kDqBarThreads>();
      break;
    }
    float st[40];
    bw_wide_issue_scores(st, s_k, qb, wg);
    fence_proxy_async();  // step j - 1's tiles -> visible to the dQ warp's reductions
    bar_arrive_n<kBarDqFull, kDqBarThreads>();
    wgmma_wait<0>();  // S^T
    fence_regs(st);
    const uint32_t dsb = s_ds + static_cast<uint32_t>(buf * Smem::kDsBytes);
    const float* lse_b = s_lse + buf * kWideRows;
    const float* delta_b = s_delta + buf * kWideRows;

    float dpt[40];
    bw_wide_issue_scores(dpt, s_v, dob, wg);
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
    bar_sync_n<kBarDsReady, kConsumerThreads>();

    float dqt[40];
    bw_wide_issue_dqt(dqt, dsb, s_k, wg);
    bw_wide_issue_rs(dk, da, qb);
    wgmma_wait<1>();  // dV and dQ^T complete; dK runs under the dQ tile's write
    fence_regs(dv);
    fence_regs(dqt);
    bar_sync_n<kBarDqFree, kDqBarThreads>();  // the dQ warp has read step j - 1's tiles
    bw_wide_write_dqt<kUnits>(tile, dqt, row_lo, tq, scale, s_units + buf * kWideRows);
    wgmma_wait<0>();  // dK: the slot (Q, dO, LSE, Delta) is no longer read
    fence_regs(dk);
    mbar_arrive(empty_bar + static_cast<uint32_t>(buf * 8));
  }
  bulk_wait<0>();

  const AttnWorkItem& we = p.list.work[blockIdx.x];
  const AttnTile* t0 = p.list.tiles + we.tile;
  const int dkv_row0 = t0->dkv_begin >= 0 ? t0->dkv_begin : t0->kv_begin;
  const bool ordered = kUnits && we.dkv_sem >= 0;
  if (ordered) bw_dkv_turn_take(p.semaphores + we.dkv_sem, we.dkv_rank, ctid);  // its barrier as below
  if (wp.tma_dkv != 0) {
    if (!ordered) bar_sync_n<kBarDsReady, kConsumerThreads>();  // both warpgroups past their last products
    bw_add_dk_dv_tma<kD>(wp, smem, base, dk, dv, wg, tw, row_lo, tq, scale, dkv_row0 + c0, kvh);
  } else {
    bw_add_dk_dv<kD>(p.dk, p.dv, dk, dv, dkv_row0 + c0, hkv, kvh, wg * 64 + row_lo, kBwKeys, tq, scale);
  }
  if (ordered) bw_dkv_turn_pass(p.semaphores + we.dkv_sem, ctid);
#endif
}

}  // namespace

void launch_backward_sm90_wide(const BwWsParams& wp, cudaStream_t stream, bool units) {
  constexpr int kSmem = BwWideSmem::kAlloc;
  if (units) {
    allow_shared_memory("attention_backward_sm90_wide (ordered deterministic)", attention_backward_sm90_wide_kernel<true>, kSmem);
    attention_backward_sm90_wide_kernel<true><<<wp.p.list.num_wide, kWsThreads, kSmem, stream>>>(wp);
    return;
  }
  allow_shared_memory("attention_backward_sm90_wide", attention_backward_sm90_wide_kernel<false>, kSmem);
  attention_backward_sm90_wide_kernel<false><<<wp.p.list.num_wide, kWsThreads, kSmem, stream>>>(wp);
}

}  // namespace dcp::cuda::detail
