// attention_backward_sm90_ws.cuh — what the warp-specialised Hopper backward kernels share
// (attention_backward_sm90_ws.cu: 64-row q steps, every tile kind; attention_backward_sm90_wide.cu:
// 80-row q steps, the chunks of Full tiles): the CTA's shape and named barriers, the kernels'
// parameters with their tensor maps, the step record the producer hands the consumers, and the
// swizzled staging of fp32 accumulators for TMA reductions (dQ, and dK / dV at an item's end).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attention_backward_sm90.cuh"
#include "dcp/detail/attention_cuda.h"
#include "sync_sm90.cuh"
#include "wgmma_sm90.cuh"
#include "wgmma_sm90_bwd.cuh"

namespace dcp::cuda::detail {

inline constexpr int kWsThreads = 384;  // producer + 2 consumer warpgroups
inline constexpr int kConsumerThreads = 256;

enum : int {  // named barriers
  kBarDsReady = 1,   // 256 consumer threads: dS^T stored, dQ may read it
  kBarOut0 = 2,      // consumer warpgroup 0: its staged dQ (or, at the end, dK / dV) is written
  kBarOut1 = 3,      // consumer warpgroup 1
  kBarProducer = 4,  // producer-only votes
};

// The kernels' parameters: the caller's, and the tensor maps (a __grid_constant__ parameter, so
// that TMA reads the maps from parameter space).
struct BwWsParams {
  AttnBackwardParams p;
  CUtensorMap dq_map;  // aligned as the driver header requires
  CUtensorMap q_map;   // Q and dO: boxes of 64 rows x 64 bf16 columns, 128-byte swizzled
  CUtensorMap do_map;
  CUtensorMap dk_map;  // dK and dV: boxes of 64 rows x 32 fp32 columns, 128-byte swizzled
  CUtensorMap dv_map;
  CUtensorMap dq_map80;  // the wide kernel's boxes of 80 rows (dQ: x 32 fp32 columns)
  CUtensorMap q_map80;   // (Q, dO: x 64 bf16 columns)
  CUtensorMap do_map80;
  int32_t tma_dq;   // 1: dq_map (and dq_map80) are valid
  int32_t tma_qdo;  // 1: q_map and do_map (and q_map80, do_map80) are valid
  int32_t tma_dkv;  // 1: dk_map and dv_map are valid
  // The 64-row kernel's first work item: AttnTileList::num_wide where the wide kernel runs items
  // [0, num_wide) (CTA b takes item work_begin + b), else 0.
  int32_t work_begin;
};

// The items the wide kernel takes (partition_backward_work): a full 128-key chunk of a Full tile.
__device__ __forceinline__ bool bw_wide_item(const AttnTile& t, int c0) {
  return t.kind == TileKind::Full && t.kv_len - c0 >= kBwKeys;
}

// A staged box of a TMA reduction (dQ, dK, dV): 64 rows x 32 fp32 columns (128 bytes per row),
// 128-byte swizzled: 16-byte chunk c of row r at chunk c ^ (r & 7). A consumer warpgroup's dQ
// staging tile holds 2 of them (its 64 x 64 block).
inline constexpr int kBoxBytes = kBwRows * 128;
inline constexpr int kDqTmaTileBytes = 2 * kBoxBytes;

// What the consumers need of a step, written by the producer: the consumers read it from shared
// memory where they use it instead of holding a tile in registers (they have none to spare:
// dK, dV, dQ and the two score tiles fill them). Four records rotate over two data slots, so a
// record stays intact for its whole step (the producer writes record j + 4 only after the
// consumers released data slot j + 2, which they do within step j + 2).
struct BwStageInfo {
  int32_t cls;     // kFull or kMasked
  int32_t end;     // 1: no step left (nothing else in the record is valid)
  int32_t kind;    // the step's tile kind
  int32_t rq0;     // first q row of the sub-tile in the tile
  int32_t qh;      // q head
  int32_t q_rows;  // rows of the sub-tile (its full height, or fewer at the end of the tile)
  int32_t dq_row;  // dQ row of the sub-tile's first row
  int32_t pad_[5];
};
inline constexpr int kInfoRecords = 4;

// The ring's mbarriers, two slots each: "full" completes on the producer threads' arrivals (the
// warpgroup's 128, or those of the warps that load) and a step's TMA bytes, "empty" on the 256
// consumer threads'. Every thread of the CTA calls it: the one CTA-wide barrier, so the mbarriers
// exist before anyone uses them.
__device__ __forceinline__ void bw_init_ring(uint32_t full_bar, uint32_t empty_bar, int producer_threads = 128) {
  if (threadIdx.x == 0) {
    mbar_init(full_bar, producer_threads);
    mbar_init(full_bar + 8, producer_threads);
    mbar_init(empty_bar, kConsumerThreads);
    mbar_init(empty_bar + 8, kConsumerThreads);
    mbar_init_fence();  // the TMA loads complete on the full barriers
  }
  __syncthreads();
}

// This consumer warpgroup's staged boxes are written: its thread 0 may issue their reductions.
// One barrier instruction picked by register, not a branch, so that it may sit under a product
// in flight (a branch there makes ptxas serialise the kernel's products).
__device__ __forceinline__ void bw_out_bar_sync(int wg) {
  static_assert(kBarOut1 == kBarOut0 + 1, "warpgroup wg's barrier is kBarOut0 + wg");
  bar_sync_id<128>(kBarOut0 + wg);
}

// A staged dQ tile of q_rows rows (two boxes of kBoxRows rows x 32 fp32 columns, 128-byte
// swizzled) added to dq by atomics: where no tensor map fits (a tile's short last step) or none
// was given. Thread tw of the warpgroup adds the (row, box) pairs idx = 2 row + box, idx = tw,
// tw + 128, ...; kUnits: the tile holds int32 counts of units (one-pass deterministic backward).
template <int kBoxRows, bool kUnits>
__device__ __forceinline__ void bw_add_dq_atomic(float* dq, const unsigned char* tile, int q_rows, int dq_row, int64_t row_stride,
                                                 int col0, int tw) {
#pragma unroll 1
  for (int idx = tw; idx < 2 * q_rows; idx += 128) {
    const int row = idx >> 1;
    const int box = idx & 1;
    float* dst = dq + static_cast<int64_t>(dq_row + row) * row_stride + col0 + 32 * box;
    const unsigned char* src = tile + box * (kBoxRows * 128) + row * 128;
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      if constexpr (kUnits) {
        const int4 n4 = *reinterpret_cast<const int4*>(src + ((c ^ (row & 7)) * 16));
        auto* d = reinterpret_cast<int*>(dst + 4 * c);
        atomicAdd(d, n4.x);
        atomicAdd(d + 1, n4.y);
        atomicAdd(d + 2, n4.z);
        atomicAdd(d + 3, n4.w);
      } else {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
        __trap();  // float2 atomics are sm_90's; the kernels trap before this on other targets
#else
        const float4 v4 = *reinterpret_cast<const float4*>(src + ((c ^ (row & 7)) * 16));
        atomicAdd(reinterpret_cast<float2*>(dst + 4 * c), make_float2(v4.x, v4.y));
        atomicAdd(reinterpret_cast<float2*>(dst + 4 * c + 2), make_float2(v4.z, v4.w));
#endif
      }
    }
  }
}

// An accumulator (m64nN fp32, kGroups = N / 8 column groups) * scale into a swizzled TMA staging
// tile of 64-row x 32-column boxes (dQ: N = 64; dK and dV: N = D): thread rows row_lo, row_lo + 8,
// columns 8 j + 2 tq (box j / 4). A warp's 8-byte stores run as two half-warps (g = row_lo & 7 in
// 0..3 and 4..7). Were every thread to store column group j at once, a half-warp's logical chunks
// 2 (j & 3) + tq / 2 would be XORed by g into only four physical chunks: two rows per bank, twice
// the wavefronts. So threads with odd g store group j ^ 2 when the others store j: the chunk's
// bits become (j1 ^ g0 ^ g2, j0 ^ g1, tq1 ^ g0), one-to-one over a half-warp's (g, tq / 2), and
// each half-warp fills all 32 banks once (the minimum: 2 wavefronts per instruction).
// kRaw: the accumulator's bits are stored as they are (int32 counts of dq_units), `scale` unused.
template <int kGroups, bool kRaw = false>
__device__ __forceinline__ void bw_write_boxes(unsigned char* tile, const float (&acc)[4 * kGroups], int row_lo, int tq,
                                               float scale) {
  const bool odd = (row_lo & 1) != 0;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row_lo + 8 * r;
#pragma unroll
    for (int j = 0; j < kGroups; ++j) {
      const int js = j ^ 2;  // compile-time register indices; the choice is a select
      const float x = odd ? acc[4 * js + 2 * r] : acc[4 * j + 2 * r];
      const float y = odd ? acc[4 * js + 2 * r + 1] : acc[4 * j + 2 * r + 1];
      const int jj = odd ? js : j;
      const int chunk = (2 * (jj & 3) + (tq >> 1)) ^ (row & 7);
      auto* dst = reinterpret_cast<float2*>(tile + (j >> 2) * kBoxBytes + row * 128 + chunk * 16 + (tq & 1) * 8);
      if constexpr (kRaw) {
        *dst = make_float2(x, y);
      } else {
        *dst = make_float2(x * scale, y * scale);
      }
    }
  }
}

// TMA reduction (an add of the map's element type: fp32, or int32 for dq_units) of one swizzled
// box at shared address `src` into the tensor at element coordinates (col, row); bulk_group
// completion.
__device__ __forceinline__ void tma_reduce_add_2d(const CUtensorMap* map, uint32_t src, int col, int row) {
  asm volatile("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(src), "r"(col), "r"(row)
               : "memory");
}

// tma_reduce_add_2d and its commit where `issue` holds: predicated instructions, not a branch,
// so that a tensor-core product stays in flight across them.
__device__ __forceinline__ void tma_reduce_add_2d_if(bool issue, const CUtensorMap* map, uint32_t src, int col, int row) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %4, 0;\n"
      "@p cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3}], [%1];\n}\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(src), "r"(col), "r"(row), "r"(static_cast<int>(issue))
      : "memory");
}
__device__ __forceinline__ void bulk_commit_if(bool issue) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %0, 0;\n@p cp.async.bulk.commit_group;\n}\n" ::"r"(static_cast<int>(issue)) : "memory");
}

// An item's dK and dV (fp32 accumulators, dK times `scale`) added by TMA reductions of whole
// lines: staged in the first 128 KB of the CTA's shared memory (warpgroup wg's dK at 64 KB x wg,
// its dV 32 KB above), which the caller guarantees nothing reads any more (both warpgroups past
// their last products, the producer done), then reduced into rows `row` + 64 wg of kv head kvh.
template <int kD>
__device__ __forceinline__ void bw_add_dk_dv_tma(const BwWsParams& wp, unsigned char* smem, uint32_t base, const float (&dk)[kD / 2],
                                                 const float (&dv)[kD / 2], int wg, int tw, int row_lo, int tq, float scale,
                                                 int row, int kvh) {
  constexpr int kBoxes = kD / 32;
  unsigned char* dk_tile = smem + wg * 2 * kBoxes * kBoxBytes;
  unsigned char* dv_tile = dk_tile + kBoxes * kBoxBytes;
  bw_write_boxes<kD / 8>(dk_tile, dk, row_lo, tq, scale);
  bw_write_boxes<kD / 8>(dv_tile, dv, row_lo, tq, 1.0F);
  fence_proxy_async();  // the tiles -> visible to the TMA reductions after the barrier
  bw_out_bar_sync(wg);
  if (tw == 0) {
    const uint32_t src = base + static_cast<uint32_t>(wg * 2 * kBoxes * kBoxBytes);
#pragma unroll
    for (int b = 0; b < kBoxes; ++b) {
      tma_reduce_add_2d(&wp.dk_map, src + static_cast<uint32_t>(b * kBoxBytes), kvh * kD + 32 * b, row + 64 * wg);
      tma_reduce_add_2d(&wp.dv_map, src + static_cast<uint32_t>((kBoxes + b) * kBoxBytes), kvh * kD + 32 * b, row + 64 * wg);
    }
    bulk_commit();
    bulk_wait<0>();  // the CTA's shared memory stays alive until the reductions have read it
  }
}

// dK / dV turns (deterministic backward: AttnWorkItem::dkv_sem / dkv_rank). The items that add to
// the same rows take turns in work order: consumer thread 0 waits, with acquire loads, until the
// rows' semaphore has counted every earlier item, and a barrier of the consumer threads passes
// that on (after it, both warpgroups are past their last products). Once this item's additions
// are complete (atomics, or TMA reductions waited for by their issuing threads), every consumer
// thread fences them, in both proxies, and thread 0 counts the turn with a release.
__device__ __forceinline__ void bw_dkv_turn_take(const int32_t* sem, int rank, int ctid) {
  if (ctid == 0) {
    int seen = 0;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(seen) : "l"(sem) : "memory");
    while (seen < rank) {
      __nanosleep(32);
      asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(seen) : "l"(sem) : "memory");
    }
  }
  bar_sync_n<kBarDsReady, kConsumerThreads>();
  // The earlier items' additions, seen through the acquire and the barrier, come before this
  // thread's TMA reductions (async proxy).
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}
__device__ __forceinline__ void bw_dkv_turn_pass(int32_t* sem, int ctid) {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
  __threadfence();
  bar_sync_n<kBarDsReady, kConsumerThreads>();
  if (ctid == 0) asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(sem) : "memory");
}

// The wide kernel over items [0, wp.p.list.num_wide) (attention_backward_sm90_wide.cu): head dim
// 128, wp's 80-row maps encoded where its 64-row ones are; every item must be one bw_wide_item
// names (partition_backward_work's), else the kernel traps, and may walk a run of tiles
// (make_backward_runs: AttnWorkItem::num_tiles).
// units: the ordered deterministic backward (AttnBackwardParams::ordered): dQ as counts of
// dq_units, dK / dV in the items' turns.
void launch_backward_sm90_wide(const BwWsParams& wp, cudaStream_t stream, bool units = false);

}  // namespace dcp::cuda::detail
