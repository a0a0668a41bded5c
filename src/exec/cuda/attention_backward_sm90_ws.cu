// attention_backward_sm90_ws.cu — the warp-specialised Hopper (sm_90a) backward kernel (route
// Wgmma, the default on Hopper): the basic kernel's products and
// math per q sub-tile (attention_backward_sm90.cu: S^T, dP^T, P^T, dS^T, dV += P^T dO,
// dK += dS^T Q, dQ = dS K by bulk reductions), with the loads, the step walk and the Partial
// classification moved to a producer warpgroup. Same contract as the other backward kernels
// (dcp/detail/attention_cuda.h); dQ always leaves by bulk reductions. At head dim 128 the items
// that need no mask (full chunks of Full tiles, AttnTileList::num_wide of them at the list's
// front) run in the wide kernel (attention_backward_sm90_wide.cu, 80-row steps) beside this one,
// which takes the rest (BwWsParams::work_begin).
//
// CTA: 3 warpgroups (384 threads). Warpgroup 0 is the producer: it loads K and V once, then walks
// the steps (q head, 64-row q sub-tile) as the basic kernel does, classifies each (Partial: by
// the host's cells when the list has them, else one thread per (q row, 64-key half) and votes by
// bar.red among its 128 threads; row masks only for Masked steps), skips empty ones, and
// loads Q, dO, LSE and Delta of the next non-empty step into a 2-slot ring: whole 64-row Q / dO
// sub-tiles by TMA when the caller gave the buffers' rows (AttnBackwardParams::q_rows, dout_rows),
// the last, shorter sub-tile of a tile (zero-filled past q_len) and K / V by cp.async. (With
// cp.async the producer's 128 threads spent most of a step issuing 16-byte copies, and the
// consumers waited for a filled slot 13 % of their time: kernel_profile_h200.md.)
// Warpgroups 1 and 2 are the consumers (keys [0, 64) and [64, 128) of the CTA, as warpgroups 0
// and 1 of the basic kernel); they never load or classify. setmaxnreg moves registers from the
// producer (kProducerRegs) to the consumers (kConsumerRegs).
//
// Hand-off (sync_sm90.cuh): ring iteration j uses slot j & 1, which holds Q, dO, LSE, Delta and
// the Partial masks, and record j & 3 (the step's class, tile kind, rows, q head and dQ row, or the
// end of the walk: the consumers read these where they use them). The producer classifies the
// step (a Masked step's row masks, dependent loads of its rows' ranges, held in registers), then
// waits for "empty" slot j & 1 (the consumers finished iteration j - 2), stores the masks into
// it, loads, waits for its own cp.async group, fences to the async proxy and arrives on "full" (128 arrivals, one
// of them with the TMA byte count when the step's tiles come by TMA; K and V travel with
// iteration 0). Every consumer thread arrives on "empty" once the products that read the slot
// (dV: dO, dK: Q) are complete.
//
// Order of a step's products (as in FlashAttention-3's backward): S^T and dP^T; dV as soon as P^T
// is packed; dQ after the barrier, then dK, so that dK runs while the dQ tile is written and its
// reduction issued. (This order gains 2-5 % on full and causal lists over issuing dK with dV
// before the barrier, and lost 3-8 % on window and partial lists while their producer classified
// only once it had the slot back; choosing the order per step made every list slower.) A step's dQ
// tile is written at its end and reduced at the next step's start, under that step's S^T and dP^T
// (1-3 % on the lists this kernel runs; bench/results/cuda_attention_h200.md).
//
// Between the consumers: dS^T is double-buffered by j & 1, so one named barrier of the 256
// consumer threads per step (the dS^T stores of both warpgroups before either dQ product) is the
// only meeting point: warpgroup A can write dS^T buffer j & 1 again (iteration j + 2) only after
// passing iteration j + 1's barrier, which warpgroup B reaches after its iteration-j dQ completed.
// Each consumer's dQ tile is its own, guarded by its bulk_wait_read before that barrier and a
// barrier of its 128 threads before the reductions issue. No CTA-wide barrier after the start.
//
// dQ leaves by tensor-memory-access (TMA) reductions when the caller gave the dq buffer's rows
// (AttnBackwardParams::dq_rows): the launcher encodes a 2-D tensor map of dq ([rows][heads x D]
// fp32, boxes of 64 rows x 32 columns, 128-byte swizzle) and each consumer warpgroup adds its
// 64 x 64 block of a full 64-row sub-tile with two instructions from one thread. (Per-row bulk
// reductions, 64 per warpgroup and step, were issued one thread at a time and cost about a fifth
// of the consumers' time in the profile: bench/results/kernel_profile_h200.md.) Sub-tiles
// with fewer rows (the last of a tile), or no tensor map, add dQ with fp32 atomics from registers.
//
// dK / dV pass of the deterministic backward (template flag kDq = false; the contract in
// dcp/detail/attention_cuda.h): a work item walks every tile of its unit of a key block, computes
// no dQ (no dS^T tile, no barrier between the consumers, no reductions: the dQ pass,
// attention_backward_dq_sm90.cu, follows), and adds its dK / dV once, in turns with the block's
// other units, if any. The one-pass deterministic backward (kDq and kUnit) walks the same units
// with all five products and turns each dQ tile into int32 counts of its rows' units before the
// reduction (AttnBackwardParams::dq_units: integer sums are the same in any order).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <string>

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
// The device pass for GPUs before Hopper keeps only the kernel's trap: its helpers and most of
// its locals go unused there.
#pragma nv_diag_suppress 177
#endif

namespace dcp::cuda::detail {
namespace {

inline constexpr int kProducerRegs = 40;
inline constexpr int kConsumerRegs = 232;
static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= cta_register_pool(kWsThreads), "register file");

template <int kD>
struct BwWsSmem {
  static constexpr int kKvBytes = kBwKeys * kD * 2;
  static constexpr int kQBytes = kBwRows * kD * 2;
  static constexpr int kDsBytes = kBwKeys * kBwRows * 2;
  static constexpr int kDqTileBytes = kDqTmaTileBytes;
  static constexpr int kK = 0;
  static constexpr int kV = kK + kKvBytes;
  static constexpr int kQ = kV + kKvBytes;                // 2 slots
  static constexpr int kDo = kQ + 2 * kQBytes;            // 2 slots
  static constexpr int kDs = kDo + 2 * kQBytes;           // 2 x [128 keys][64 q] bf16
  static constexpr int kDqT = kDs + 2 * kDsBytes;         // one dQ tile per consumer warpgroup
  static constexpr int kLse = kDqT + 2 * kDqTileBytes;    // 2 x 64 floats
  static constexpr int kDelta = kLse + 2 * kBwRows * 4;   // 2 x 64 floats
  static constexpr int kUnits = kDelta + 2 * kBwRows * 4;  // 2 x 64 int32 (one-pass deterministic)
  static constexpr int kMask = kUnits + 2 * kBwRows * 4;   // [slot][key half][64 rows] uint64
  static constexpr int kInfo = kMask + 2 * 2 * kBwRows * 8;
  static constexpr int kFull = kInfo + kInfoRecords * static_cast<int>(sizeof(BwStageInfo));  // uint64 mbarrier[2]
  static constexpr int kEmpty = kFull + 16;                                         // uint64 mbarrier[2]
  static constexpr int kBytes = kEmpty + 16;
  static constexpr int kAlloc = kBytes + kSw128AtomBytes;  // slack to align the base to 1024
  static_assert(kKvBytes % kSw128AtomBytes == 0 && kQBytes % kSw128AtomBytes == 0 && kDsBytes % kSw128AtomBytes == 0 &&
                    kDqT % kSw128AtomBytes == 0 && kBoxBytes % kSw128AtomBytes == 0,
                "tiles (and the TMA boxes) stay atom aligned");
  static_assert(kFull % 8 == 0, "mbarriers are 8-byte aligned");
};

// One-pass deterministic backward (AttnBackwardParams::dq_units): scale * dq as int32 counts of
// the units of rows row_lo and row_lo + 8 (`units`: their exponents, staged by the producer;
// dcp/detail/dq_units.h), kept in the accumulator's registers as bits.
__device__ __forceinline__ void bw_dq_to_units(float (&dq)[32], const int32_t* units, int row_lo, float scale) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float m = dq_units::multiplier(units[row_lo + 8 * r], scale);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      dq[4 * j + 2 * r] = __int_as_float(dq_units::to_units(dq[4 * j + 2 * r], m));
      dq[4 * j + 2 * r + 1] = __int_as_float(dq_units::to_units(dq[4 * j + 2 * r + 1], m));
    }
  }
}

// kDq: the item computes dQ; kUnit: the item walks a unit of tiles of one key block (the
// deterministic work); kUnits: dQ added as int32 counts of AttnBackwardParams::dq_units. kDq and
// kUnit: the one-pass deterministic backward; kDq and kUnits alone: the ordered one (the default
// work, each item's dK / dV added in its turn).
template <int kD, bool kDq, bool kUnit = !kDq, bool kUnits = kDq && kUnit>
__global__ void __launch_bounds__(kWsThreads, 1) attention_backward_sm90_ws_kernel(const __grid_constant__ BwWsParams wp) {
  const AttnBackwardParams p = wp.p;  // a copy: fields load from parameter space, not through a pointer
  static_assert(kDq || !kUnits, "dQ units without dQ");
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  (void)wp;  // built for a target without wgmma: never selected there, fail loudly if run
  __trap();
#else
  using Smem = BwWsSmem<kD>;
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
  auto* s_units = reinterpret_cast<int32_t*>(smem + Smem::kUnits);
  auto* s_mask = reinterpret_cast<uint64_t*>(smem + Smem::kMask);
  auto* s_info = reinterpret_cast<BwStageInfo*>(smem + Smem::kInfo);
  const uint32_t full_bar = base + Smem::kFull;    // + 8 * slot
  const uint32_t empty_bar = base + Smem::kEmpty;  // + 8 * slot

  const int tid = static_cast<int>(threadIdx.x);
  bw_init_ring(full_bar, empty_bar);

  const AttnWorkItem w = p.list.work[wp.work_begin + static_cast<int>(blockIdx.x)];
  const int hq = p.shape.num_q_heads;
  const int hkv = p.shape.num_kv_heads;
  const int group = hq / hkv;
  const int kvh = w.head;
  const int c0 = w.chunk * kBwKeys;
  // A deterministic item's tiles share kv rows, dK/dV rows and their kv head.
  const int keys = min(kBwKeys, p.list.tiles[w.tile].kv_len - c0);

  if (tid < 128) {
    // ---------------- producer warpgroup ----------------
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
    const int ptid = tid;
    const int64_t q_stride = static_cast<int64_t>(hq) * kD;
    const int64_t kv_stride = static_cast<int64_t>(hkv) * kD;
    {
      const int64_t kv_off = (static_cast<int64_t>(p.list.tiles[w.tile].kv_begin + c0) * hkv + kvh) * kD;
      producer_load_rows<kBwKeys, kD>(s_k, static_cast<const __nv_bfloat16*>(p.k) + kv_off, kv_stride, keys, ptid);
      producer_load_rows<kBwKeys, kD>(s_v, static_cast<const __nv_bfloat16*>(p.v) + kv_off, kv_stride, keys, ptid);
    }

    // The walk: tiles [w.tile, tile_end), each tile's steps in order. The tile is read through a
    // pointer (L1 serves it) rather than copied: this warpgroup runs on 40 registers.
    const int tile_end = w.tile + (kUnit ? w.num_tiles : 1);  // deterministic: a unit of tiles
    int ti = w.tile;
    const AttnTile* t = p.list.tiles + ti;
    BwSteps steps(*t, c0, group, p.list);
    if constexpr (!kUnit) steps.stagger(w.chunk);
    // The basic kernel's classification, uniform over the producer warpgroup; Partial: thread
    // (half, row) = (ptid >> 6, ptid & 63) computes the bits of keys c0 + 64 half .. + 63 of q row
    // rq0 + row into row_mask (stored into the slot once it is free).
    const int mask_row = ptid & (kBwRows - 1);
    const int mask_half = ptid >> 6;
    uint64_t row_mask = 0;
    auto classify = [&](int step) -> int {
      const int rq0 = steps.row0(step);
      const int rows = min(kBwRows, t->q_len - rq0);
      if (t->kind != TileKind::Partial) return classify_dense_bw<kBwKeys>(t->kind, rq0, rows, c0, keys);
      // With the host's cells only a Masked step needs its row masks, and no vote.
      const bool cells = p.list.cells != nullptr && t->cells_begin >= 0;
      if (cells) {
        const int cls = classify_from_cells<kBwRows, kBwKeys>(p.list.cells, *t, rq0, rows, c0);
        if (cls != kMasked) return cls;
      }
      const bool row_valid = mask_row < rows;
      uint64_t mask = 0;
      if (row_valid) {
        mask = row_key_mask(p.list.row_offsets, p.list.ranges, t->range_row_begin + rq0 + mask_row, c0 + mask_half * kRows, t->kv_len);
      }
      row_mask = mask;
      if (cells) return kMasked;
      if (!bar_any_n<kBarProducer, 128>(mask != 0)) return kEmpty;
      const bool full = !bar_any_n<kBarProducer, 128>(row_valid && mask != ~uint64_t{0});
      return full && keys == kBwKeys ? kFull : kMasked;
    };

    int step = 0;
    for (int j = 0;; ++j, ++step) {
      const int slot = j & 1;
      // The next step with an allowed pair (the deterministic order counts those only).
      int cls = kEmpty;
      bool end = false;
      for (;;) {
        if (step >= steps.num_steps) {
          if (++ti >= tile_end) {
            end = true;
            break;
          }
          t = p.list.tiles + ti;
          steps = BwSteps(*t, c0, group, p.list);
          if constexpr (!kUnit) steps.stagger(w.chunk);
          step = 0;
          continue;
        }
        cls = classify(step);
        if (cls != kEmpty) break;
        ++step;
      }
      // The slot is waited for once the step is classified and its rows' LSE, Delta (and units)
      // are read: those loads, and a Masked step's loads of its rows' ranges, run while the
      // consumers still read the slot, not between their release and the slot's fill.
      const int qh = end ? 0 : steps.q_head(step, kvh, group);
      const int rq0 = end ? 0 : steps.row0(step);
      const int rows = end ? 0 : min(kBwRows, t->q_len - rq0);
      const bool fill = !end && cls != kEmpty;
      const int dout_row0 = t->dout_begin >= 0 ? t->dout_begin : t->q_begin;
      LseDelta stats;
      int32_t unit = 1;
      if (fill && ptid < kBwRows) {
        stats = load_lse_delta(p.lse, p.delta, hq, *t, rq0, rows, qh, ptid);
        if (kUnits && ptid < rows) unit = p.dq_units[static_cast<int64_t>(dout_row0 + rq0 + ptid) * hq + qh];
      }
      if (j >= 2) mbar_wait(empty_bar + static_cast<uint32_t>(slot * 8), static_cast<uint32_t>(((j >> 1) - 1) & 1));
      if (cls == kMasked && t->kind == TileKind::Partial) s_mask[(slot * 2 + mask_half) * kBwRows + mask_row] = row_mask;
      if (ptid == 0) {
        BwStageInfo info{};
        info.cls = cls;
        info.end = end ? 1 : 0;
        if (!end) {
          info.kind = static_cast<int32_t>(t->kind);
          info.rq0 = rq0;
          info.qh = qh;
          info.q_rows = rows;
          info.dq_row = (t->dq_begin >= 0 ? t->dq_begin : t->q_begin) + rq0;
        }
        s_info[j & (kInfoRecords - 1)] = info;
      }
      const uint32_t full = full_bar + static_cast<uint32_t>(slot * 8);
      // Whole sub-tiles come by TMA: one thread issues four boxes and the slot's phase completes
      // when their bytes have landed, so the producer no longer spends the step on 16-byte copies.
      const bool tma = fill && wp.tma_qdo != 0 && rows == kBwRows;
      if (fill) {
        const auto boff = static_cast<uint32_t>(slot * Smem::kQBytes);
        // The sub-tiles' TMA first: its latency is the fill's, and the statistics stored after it
        // are in registers already.
        if (tma && ptid == 0) {
          // Its bytes only: thread 0 arrives below with the others, once its row's statistics are stored.
          mbar_expect_tx(full, static_cast<uint32_t>(2 * Smem::kQBytes));
#pragma unroll
          for (int b = 0; b < kD / 64; ++b) {
            const auto box = static_cast<uint32_t>(b * kBwRows * 128);
            tma_load_2d(s_q + boff + box, &wp.q_map, qh * kD + 64 * b, t->q_begin + rq0, full);
            tma_load_2d(s_do + boff + box, &wp.do_map, qh * kD + 64 * b, dout_row0 + rq0, full);
          }
        }
        if (ptid < kBwRows) {
          s_lse[slot * kBwRows + ptid] = stats.lse2;
          s_delta[slot * kBwRows + ptid] = stats.delta;
          if (kUnits) s_units[slot * kBwRows + ptid] = unit;
        }
        if (!tma) {
          // Rows past q_len load as zeros with LSE = +inf (P = 0 there).
          const int64_t off = (static_cast<int64_t>(t->q_begin + rq0) * hq + qh) * kD;
          const int64_t do_off = (static_cast<int64_t>(dout_row0 + rq0) * hq + qh) * kD;
          producer_load_rows<kBwRows, kD>(s_q + boff, static_cast<const __nv_bfloat16*>(p.q) + off, q_stride, rows, ptid);
          producer_load_rows<kBwRows, kD>(s_do + boff, static_cast<const __nv_bfloat16*>(p.dout) + do_off, q_stride, rows,
                                          ptid);
        }
      }
      if (!tma || j == 0) {  // this step's cp.async bytes (and K / V at iteration 0)
        cp_async_commit();
        cp_async_wait<0>();
        fence_proxy_async();  // -> visible to wgmma after the consumers' wait
      }
      mbar_arrive(full);  // every producer thread, its stores of the slot done
      if (end) break;
    }
    return;
  }

  // ---------------- consumer warpgroups ----------------
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs));
  const int ctid = tid - 128;
  const int wg = warpgroup_of(ctid);      // keys [64 wg, 64 wg + 64)
  const int tw = ctid & 127;              // thread in the warpgroup
  const int warp_in_wg = tw >> 5;         // 16 keys of the warpgroup's 64
  const int lane = ctid & 31;
  const int g = lane >> 2;
  const int tq = lane & 3;
  const float scale = p.shape.softmax_scale;
  const float scale_log2 = scale * kLog2e;
  unsigned char* s_ds_ptr = smem + Smem::kDs;
  const uint32_t s_ds = base + Smem::kDs;
  const uint32_t s_dqt = base + Smem::kDqT;

  // Accumulator fragments: attention_backward_sm90.cuh.
  float dk[kD / 2];
  float dv[kD / 2];
  zero(dk);
  zero(dv);
  const int row_lo = warp_in_wg * 16 + g;  // accumulator row of e < 2 (dQ: q row)
  const int key_lo = wg * 64 + row_lo;     // CTA-local key of accumulator rows e < 2

  // Steps overlap by their first products: step j's S^T and dP^T are issued as soon as the slot is
  // full, and step j - 1's dQ tile (written at its end) is fenced, synchronised and handed to the
  // TMA reduction under them. That hand-off is straight-line code (a barrier picked by register,
  // predicated TMA instructions): a branch under a product in flight makes ptxas serialise every
  // product of the kernel. A step whose dQ goes by atomics (a short
  // last sub-tile, or no tensor map) is added at the next step's start, before its products.
  unsigned char* tile = smem + Smem::kDqT + wg * Smem::kDqTileBytes;
  const uint32_t tile_addr = s_dqt + static_cast<uint32_t>(wg * Smem::kDqTileBytes);
  for (int j = 0;; ++j) {
    const int buf = j & 1;
    mbar_wait(full_bar + static_cast<uint32_t>(buf * 8), static_cast<uint32_t>((j >> 1) & 1));
    const BwStageInfo* info = s_info + (j & (kInfoRecords - 1));
    const BwStageInfo* prev = s_info + ((j - 1) & (kInfoRecords - 1));  // step j - 1 (j > 0; still intact)
    bool prev_tma = false;
    if constexpr (kDq) {
      prev_tma = j > 0 && wp.tma_dq != 0 && prev->q_rows == kBwRows;
      if (j > 0 && !prev_tma) {
        bw_out_bar_sync(wg);
        bw_add_dq_atomic<kBwRows, kUnits>(p.dq, tile, prev->q_rows, prev->dq_row, int64_t{hq} * kD,
                                          prev->qh * kD + (kD == 128 ? 64 * wg : 0), tw);
      }
    }
    auto hand_off_prev_dq = [&]() {
      fence_proxy_async();  // the tile -> visible to the TMA reduction after the barrier
      bw_out_bar_sync(wg);
      const bool issue = prev_tma && tw == 0;
      const int col0 = prev->qh * kD + (kD == 128 ? 64 * wg : 0);
      tma_reduce_add_2d_if(issue, &wp.dq_map, tile_addr, col0, prev->dq_row);
      tma_reduce_add_2d_if(issue, &wp.dq_map, tile_addr + kBoxBytes, col0 + 32, prev->dq_row);
      bulk_commit_if(issue);
    };
    if (info->end != 0) {
      if constexpr (kDq) hand_off_prev_dq();
      break;
    }
    const int cls = info->cls;
    const auto kind = static_cast<TileKind>(info->kind);
    const int rq0 = info->rq0;
    const uint32_t qb = s_q + static_cast<uint32_t>(buf * Smem::kQBytes);
    const uint32_t dob = s_do + static_cast<uint32_t>(buf * Smem::kQBytes);
    const uint32_t dsb = s_ds + static_cast<uint32_t>(buf * Smem::kDsBytes);
    unsigned char* ds_ptr = s_ds_ptr + buf * Smem::kDsBytes;
    const float* lse_b = s_lse + buf * kBwRows;
    const float* delta_b = s_delta + buf * kBwRows;

    // S^T, dP^T; P^T; dS^T (attention_backward_sm90.cuh). dV's product is issued before dS^T is
    // packed and stored, and dK's after dQ's, so that the tensor cores have work while this
    // warpgroup packs dS^T, meets the other at the barrier and writes its dQ tile.
    float st[32];
    float dpt[32];
    bw_issue_st_dpt<kD>(st, dpt, s_k, s_v, qb, dob, wg);
    if constexpr (kDq) hand_off_prev_dq();
    float2 cols[8];  // LSE, then Delta: loaded before the wait for the product that needs them
    bw_load_cols(lse_b, tq, cols);
    wgmma_wait<1>();
    fence_regs(st);
    bw_probabilities(st, cols, s_mask + buf * 2 * kBwRows, cls, kind, keys, c0, rq0, key_lo, tq, scale_log2);
    bw_load_cols(delta_b, tq, cols);
    wgmma_wait<0>();
    fence_regs(dpt);
    bw_ds(dpt, st, cols);
    uint32_t pa[4][4];
    bw_pack_fragment(pa, st);
    bw_issue_rs<kD>(dv, pa, dob);
    uint32_t da[4][4];
    bw_pack_fragment(da, dpt);
    if constexpr (!kDq) {
      // dK / dV only: no dS^T tile, no meeting with the other warpgroup.
      bw_issue_rs<kD>(dk, da, qb);
      wgmma_wait<0>();
      fence_regs(dv);
      fence_regs(dk);
      mbar_arrive(empty_bar + static_cast<uint32_t>(buf * 8));
      continue;
    }
    bw_store_ds(ds_ptr, da, key_lo, tq);  // dS^T into buffer buf
    fence_proxy_async();  // dS^T stores -> visible to wgmma after the barrier
    bulk_wait_read<0>();  // the last step's dQ tile is read: reusable below
    bar_sync_n<kBarDsReady, kConsumerThreads>();

    float dq[32];
    bw_issue_dq<kD>(dq, dsb, s_k, wg);
    bw_issue_rs<kD>(dk, da, qb);
    wgmma_wait<1>();  // dV and dQ complete; dK runs under the dQ tile's write
    fence_regs(dv);
    fence_regs(dq);
    // Thread rows of dQ: q rows 16 warp_in_wg + g (+ 8); columns 8 j + 2 tq (+ 64 wg at D = 128).
    // D = 64: each warpgroup's partial sum over its 64 keys reduces separately.
    if constexpr (kUnits) {
      bw_dq_to_units(dq, s_units + buf * kBwRows, row_lo, scale);
      bw_write_boxes<8, true>(tile, dq, row_lo, tq, 1.0F);
    } else {
      bw_write_boxes<8>(tile, dq, row_lo, tq, scale);
    }
    // dK (the last group) complete: Q, dO, LSE, Delta, the masks and the record of this slot are
    // no longer read, so the producer may refill it.
    wgmma_wait<0>();
    fence_regs(dk);
    mbar_arrive(empty_bar + static_cast<uint32_t>(buf * 8));
  }
  bulk_wait<0>();  // the tile stays alive until the reductions are done

  // The item's fields read again rather than kept in registers through the walk.
  const AttnWorkItem& we = p.list.work[wp.work_begin + static_cast<int>(blockIdx.x)];
  const AttnTile* t0 = p.list.tiles + we.tile;
  const int dkv_row0 = t0->dkv_begin >= 0 ? t0->dkv_begin : t0->kv_begin;
  // Deterministic: the items adding to these rows add one after another, in work order (the
  // units of a cut key block, or every item of the ordered method that shares its chunk).
  const bool ordered = (kUnit || kUnits) && we.dkv_sem >= 0;
  if (ordered) bw_dkv_turn_take(p.semaphores + we.dkv_sem, we.dkv_rank, ctid);
  // A cut key block's units add by atomics in their turns (the method measured); the ordered
  // method's items by TMA reductions like the default's.
  if (wp.tma_dkv != 0 && keys == kBwKeys && !(kUnit && ordered)) {
    // dK and dV by TMA reductions: 8-byte atomics from registers took 12 % of the dK / dV pass's
    // samples on lists of short items (causal-diagonal tiles at B 1024), L2 taking them at a
    // fraction of the rate of whole lines. Staged in the shared memory of K, V, Q and dO, which
    // nothing reads once both warpgroups are past their last products (the barrier, which the
    // turn's already was) and the producer has posted the end of the walk.
    if (!ordered) bar_sync_n<kBarDsReady, kConsumerThreads>();
    static_assert(4 * (kD / 32) * kBoxBytes <= Smem::kDs, "staged in K, V, Q and dO");
    bw_add_dk_dv_tma<kD>(wp, smem, base, dk, dv, wg, tw, row_lo, tq, scale, dkv_row0 + c0, kvh);
  } else {
    bw_add_dk_dv<kD>(p.dk, p.dv, dk, dv, dkv_row0 + c0, hkv, kvh, key_lo, keys, tq, scale);
  }
  if (ordered) bw_dkv_turn_pass(p.semaphores + we.dkv_sem, ctid);
#endif
}

template <int kD>
void launch_backward_sm90_ws(const AttnBackwardParams& p, cudaStream_t stream) {
  constexpr int kSmem = BwWsSmem<kD>::kAlloc;
  allow_shared_memory("attention_backward_sm90_ws", attention_backward_sm90_ws_kernel<kD, true>, kSmem);
  BwWsParams wp{};
  wp.p = p;
  // The items the list puts first take 80-row q steps (attention_backward_sm90_wide.cu): head
  // dim 128, the default backward and the ordered deterministic one.
  const bool ordered = p.deterministic && p.ordered;
  if (ordered && p.dq_units == nullptr)
    raise(ErrorKind::InvalidInput, "attention_backward (ordered deterministic): no dq_units (deterministic_dq_units)");
  const bool wide = kD == 128 && (!p.deterministic || ordered) && p.list.num_wide > 0;
  if (p.list.num_wide < 0 || p.list.num_wide > p.list.num_work) {
    raise(ErrorKind::InvalidInput, "attention_backward: num_wide " + std::to_string(p.list.num_wide) + " outside [0, num_work = " +
                                       std::to_string(p.list.num_work) + "]");
  }
  // dq: [dq_rows][num_q_heads x D] fp32 (int32 counts of units in the one-pass deterministic
  // backward), boxes of 64 rows x 32 columns.
  const TensorElem dq_elem = p.deterministic && p.dq_units != nullptr ? TensorElem::I32 : TensorElem::F32;
  const bool tma = p.dq_rows > 0 && encode_tensor_map_2d(wp.dq_map, "attention_backward_sm90_ws", dq_elem, p.dq,
                                                         int64_t{p.shape.num_q_heads} * p.shape.head_dim, p.dq_rows, 32,
                                                         kBwRows) &&
                   (!wide || encode_tensor_map_2d(wp.dq_map80, "attention_backward_sm90_wide", dq_elem, p.dq,
                                                  int64_t{p.shape.num_q_heads} * p.shape.head_dim, p.dq_rows, 32, 80));
  wp.tma_dq = tma ? 1 : 0;
  // Q, dO: [rows][num_q_heads x D] bf16, boxes of 64 rows x 64 columns (the sub-tile layout).
  const int64_t q_elems = int64_t{p.shape.num_q_heads} * p.shape.head_dim;
  const bool tma_qdo =
      p.q_rows > 0 && p.dout_rows > 0 &&
      encode_tensor_map_2d(wp.q_map, "attention_backward_sm90_ws", TensorElem::Bf16, p.q, q_elems, p.q_rows, 64, kBwRows) &&
      encode_tensor_map_2d(wp.do_map, "attention_backward_sm90_ws", TensorElem::Bf16, p.dout, q_elems, p.dout_rows, 64, kBwRows) &&
      (!wide ||
       (encode_tensor_map_2d(wp.q_map80, "attention_backward_sm90_wide", TensorElem::Bf16, p.q, q_elems, p.q_rows, 64, 80) &&
        encode_tensor_map_2d(wp.do_map80, "attention_backward_sm90_wide", TensorElem::Bf16, p.dout, q_elems, p.dout_rows, 64, 80)));
  wp.tma_qdo = tma_qdo ? 1 : 0;
  // dK, dV: [dkv_rows][num_kv_heads x D] fp32, boxes of 64 rows x 32 columns.
  const int64_t kv_elems = int64_t{p.shape.num_kv_heads} * p.shape.head_dim;
  const bool tma_dkv =
      p.dkv_rows > 0 &&
      encode_tensor_map_2d(wp.dk_map, "attention_backward_sm90_ws", TensorElem::F32, p.dk, kv_elems, p.dkv_rows, 32, kBwRows) &&
      encode_tensor_map_2d(wp.dv_map, "attention_backward_sm90_ws", TensorElem::F32, p.dv, kv_elems, p.dkv_rows, 32, kBwRows);
  wp.tma_dkv = tma_dkv ? 1 : 0;
  if (!p.deterministic) {
    // The wide kernel beside the 64-row one (their items are independent and their additions
    // commute): one after the other, the SMs that the wide kernel's last items leave idle wait
    // for all of them, up to an item's time per call (1.017x on the lambda plan at B 1024, the
    // others unchanged: bench/results/cuda_attention_h200.md).
    const int rest = p.list.num_work - (wide ? p.list.num_wide : 0);
    const SideStream* side = wide && rest > 0 ? &side_stream("attention_backward") : nullptr;
    if (side != nullptr) fork_side("attention_backward", stream, *side);
    if (wide) launch_backward_sm90_wide(wp, side != nullptr ? side->stream : stream);
    if (rest > 0) {
      wp.work_begin = p.list.num_work - rest;
      attention_backward_sm90_ws_kernel<kD, true><<<rest, kWsThreads, kSmem, stream>>>(wp);
    }
    if (side != nullptr) join_side("attention_backward", stream, *side);
    return;
  }
  const bool fused = p.dq_units != nullptr;
  if (p.semaphores == nullptr && p.num_semaphores > 0) {
    raise(ErrorKind::InvalidInput, "attention_backward (deterministic): no semaphores (make_deterministic_backward_work's num_semaphores)");
  }
  if (p.num_semaphores > 0) {
    if (const cudaError_t e = cudaMemsetAsync(p.semaphores, 0, static_cast<size_t>(p.num_semaphores) * sizeof(int32_t), stream);
        e != cudaSuccess) {
      raise(ErrorKind::Cuda, std::string("attention_backward (deterministic): zeroing the semaphores: ") + cudaGetErrorString(e));
    }
  }
  if (ordered) {
    // The wide kernel's items, then the 64-row kernel's, in that order on the stream: a turn
    // waits only for items launched before it.
    if (wide) launch_backward_sm90_wide(wp, stream, true);
    const int rest = p.list.num_work - (wide ? p.list.num_wide : 0);
    if (rest > 0) {
      wp.work_begin = p.list.num_work - rest;
      allow_shared_memory("attention_backward_sm90_ws (ordered deterministic)", attention_backward_sm90_ws_kernel<kD, true, false, true>,
                          kSmem);
      attention_backward_sm90_ws_kernel<kD, true, false, true><<<rest, kWsThreads, kSmem, stream>>>(wp);
    }
    return;
  }
  if (fused) {
    allow_shared_memory("attention_backward_sm90_ws (one-pass deterministic)", attention_backward_sm90_ws_kernel<kD, true, true>,
                        kSmem);
    attention_backward_sm90_ws_kernel<kD, true, true><<<p.list.num_work, kWsThreads, kSmem, stream>>>(wp);
    return;
  }
  allow_shared_memory("attention_backward_sm90_ws (dK / dV pass)", attention_backward_sm90_ws_kernel<kD, false>, kSmem);
  attention_backward_sm90_ws_kernel<kD, false><<<p.list.num_work, kWsThreads, kSmem, stream>>>(wp);
  attention_backward_dq_wgmma(p, stream);
}

}  // namespace

void attention_backward_wgmma_ws(const AttnBackwardParams& params, cudaStream_t stream) {
  launch_for_head_dim("attention_backward_sm90_ws", params.shape,
                      [&]<int kD>() { launch_backward_sm90_ws<kD>(params, stream); });
}

}  // namespace dcp::cuda::detail
