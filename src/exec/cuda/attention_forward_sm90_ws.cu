// attention_forward_sm90_ws.cu — the warp-specialised Hopper (sm_90a) forward kernel (route
// Wgmma, the default on Hopper). Contract: dcp/detail/attention_cuda.h; CTA shape, tile layout and the
// online softmax as in the basic kernel (attention_forward_sm90.cu).
//
// Per 128-key sub-tile j each MMA warpgroup issues S_j = Q K_j^T together with
// O += P_{j-1} V_{j-1} (P of the previous sub-tile, in registers), waits for S_j only, and runs
// the softmax of S_j while P V still runs; then it rescales O and packs P_j.
//
// An earlier version (pipelined, no producer) met at a CTA barrier every sub-tile, so both
// warpgroups ran their softmax at the same time and the tensor cores idled through the part that
// P V did not cover; its loads and walk also cost the MMA warps issue slots (0.88x the speed of
// this kernel; git show 958ee6f:bench/results/cuda_attention_2026-11-30_h200.md). Here:
// - Warpgroup 0 (producer, few registers) loads an item's Q once, then walks its sub-tiles
//   (skipping empty ones, classifying Partial sub-tiles: by the host's cells when the list
//   has them, else one thread per q row, both 64-key words, votes by bar.red among its 128
//   threads; row masks only for Masked sub-tiles), and fills a 2-slot ring: K_j with its masks
//   and a record (tile, sub-tile, class), then V_j. Whole 128-row K / V sub-tiles come by TMA
//   (AttnForwardParams::kv_rows known), the tail of a tile by cp.async with zero fill; Q by TMA
//   when AttnForwardParams::q_rows is known, else by cp.async.
// - Warpgroups 1 and 2 (consumers, 64 q rows each) never load. Ring hand-off by mbarriers:
//   k_full / v_full (producer: 128 arrivals, plus the TMA bytes), k_empty (all 256 consumer
//   threads, once the softmax of S_j no longer reads the masks and record) and v_empty (once
//   P_j V_j completed).
// - Ping-pong: each consumer issues its products of a step only in its turn (named barrier pair
//   T0 / T1 of 256 threads: a warpgroup syncs on its own and arrives on the other's after its
//   issue), so the tensor cores run one warpgroup's products while the other does its softmax.
//   Issue points per warpgroup: one per sub-tile plus the CTA's last P V; warpgroup 1 arrives on
//   T0 once before its first and not after its last, so both barriers balance exactly.
// - Persistent (AttnForwardParams::work_counter): one CTA per SM takes work items in list order
//   from a counter (the producer fetches the next one when at most two sub-tiles of the current
//   item are left). The ring runs on across items, one slot per sub-tile: the first record of
//   another item begins it (its Q in the other of two Q slots, loaded when its first non-empty
//   sub-tile is found). Its first S is issued together with the previous item's last P V, as
//   any other step's, and the previous item's outputs are written while the tensor cores run
//   those products and the other warpgroup's: an item boundary costs the tensor cores no drain
//   and no refill, which matters for short items (a B = 1024 tile is 8 sub-tiles per q chunk).
//   An item without a non-empty sub-tile never reaches the consumers: the producer writes its
//   O = 0, LSE = -inf itself. Without a counter each CTA runs one item.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "attention_common.cuh"
#include "attention_forward_sm90.cuh"
#include "dcp/detail/attention_cuda.h"
#include "sync_sm90.cuh"
#include "wgmma_sm90.cuh"

namespace dcp::cuda::detail {
namespace {

inline constexpr int kFwsThreads = 384;  // producer + 2 consumer warpgroups
inline constexpr int kFwsConsumers = 256;
inline constexpr int kFwsProducerRegs = 56;
inline constexpr int kFwsConsumerRegs = 224;
static_assert(128 * kFwsProducerRegs + kFwsConsumers * kFwsConsumerRegs <= cta_register_pool(kFwsThreads), "register file");
enum : int {  // named barriers
  kBarTurn0 = 1,     // 256 threads: consumer warpgroup 0 may issue
  kBarTurn1 = 2,     // consumer warpgroup 1 may issue
  kBarProducer = 3,  // producer-only votes
};

enum : int32_t {  // FwsRecord::end
  kStep = 0,     // a sub-tile of an item
  kAllDone = 1,  // no item left for this CTA
};
// One ring slot's record: the sub-tile, and where its item's outputs go (the consumers start an
// item on its first record without reading the work list).
struct FwsRecord {
  int32_t item;  // work item
  int32_t tile;  // index into the tile list
  int32_t n;     // 128-key sub-tile of the tile
  int32_t cls;   // kFull or kMasked
  int32_t end;   // kStep or kAllDone
  int32_t qh;    // q head of the item
  int32_t r0;    // first q row of the item in its tiles
  int32_t rows;  // valid q rows
  int32_t out_row;  // O row and LSE row of item row 0
  int32_t lse_row;
  int32_t accumulate;
  int32_t kind;    // TileKind of the tile, and its keys: what a masked sub-tile's mask needs
  int32_t kv_len;
};

template <int kD>
struct FwsSmem {
  static constexpr int kQBytes = kWgRows * kD * 2;
  static constexpr int kKvBytes = kWgKeys * kD * 2;
  static constexpr int kQ = 0;                               // 2 slots (items alternate)
  static constexpr int kK = kQ + 2 * kQBytes;                // 2 slots
  static constexpr int kV = kK + 2 * kKvBytes;               // 2 slots
  static constexpr int kMask = kV + 2 * kKvBytes;            // [slot][word][row] uint64
  static constexpr int kRecord = kMask + 2 * kMaskWords * kWgRows * 8;
  static constexpr int kItem = kRecord + 2 * static_cast<int>(sizeof(FwsRecord));  // the producer's next item
  static constexpr int kBars = kItem + 16;                   // 12 mbarriers
  static constexpr int kBytes = kBars + 12 * 8;
  static constexpr int kAlloc = kBytes + kSw128AtomBytes;  // slack to align the base to 1024
  static_assert(kQBytes % kSw128AtomBytes == 0 && kKvBytes % kSw128AtomBytes == 0, "tiles stay atom aligned");
  static_assert(kBars % 8 == 0, "mbarriers are 8-byte aligned");
};

template <int kD>
__global__ void __launch_bounds__(kFwsThreads, 1) attention_forward_sm90_ws_kernel(const __grid_constant__ FwTmaParams fp) {
  const AttnForwardParams p = fp.p;  // a copy: fields load from parameter space, not through a pointer
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  (void)p;  // built for a target without wgmma: never selected there, fail loudly if run
  __trap();
#else
  using Smem = FwsSmem<kD>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const SmemBase aligned = sw128_smem_base(smem_raw);
  unsigned char* smem = aligned.ptr;
  const uint32_t base = aligned.addr;
  const uint32_t s_q = base + Smem::kQ;
  const uint32_t s_k = base + Smem::kK;
  const uint32_t s_v = base + Smem::kV;
  auto* s_mask = reinterpret_cast<uint64_t*>(smem + Smem::kMask);
  auto* s_record = reinterpret_cast<FwsRecord*>(smem + Smem::kRecord);
  auto* s_item = reinterpret_cast<volatile int32_t*>(smem + Smem::kItem);
  const uint32_t bars = base + Smem::kBars;
  auto q_full = [&](int slot) { return bars + 8U * static_cast<uint32_t>(slot); };
  auto q_empty = [&](int slot) { return bars + 16U + 8U * static_cast<uint32_t>(slot); };
  auto k_full = [&](int slot) { return bars + 32U + 8U * static_cast<uint32_t>(slot); };
  auto v_full = [&](int slot) { return bars + 48U + 8U * static_cast<uint32_t>(slot); };
  auto k_empty = [&](int slot) { return bars + 64U + 8U * static_cast<uint32_t>(slot); };
  auto v_empty = [&](int slot) { return bars + 80U + 8U * static_cast<uint32_t>(slot); };

  const int tid = static_cast<int>(threadIdx.x);
  if (tid == 0) {
    for (int slot = 0; slot < 2; ++slot) {
      mbar_init(q_full(slot), 128);
      mbar_init(q_empty(slot), kFwsConsumers);
      mbar_init(k_full(slot), 128);
      mbar_init(v_full(slot), 128);
      mbar_init(k_empty(slot), kFwsConsumers);
      mbar_init(v_empty(slot), kFwsConsumers);
    }
    mbar_init_fence();
  }
  __syncthreads();  // the only CTA-wide barrier: the mbarriers exist before anyone uses them

  const int hq = p.shape.num_q_heads;
  const int hkv = p.shape.num_kv_heads;

  if (tid < 128) {
    // ---------------- producer warpgroup ----------------
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kFwsProducerRegs));
    const int ptid = tid;
    const auto* q = static_cast<const __nv_bfloat16*>(p.q);
    const auto* k = static_cast<const __nv_bfloat16*>(p.k);
    const auto* v = static_cast<const __nv_bfloat16*>(p.v);
    const int64_t q_stride = static_cast<int64_t>(hq) * kD;
    const int64_t kv_stride = static_cast<int64_t>(hkv) * kD;
    // Item it of this CTA: from the list's shared counter (persistent launch) or at a fixed stride.
    auto fetch = [&](int it) -> int32_t {
      if (p.work_counter == nullptr) return static_cast<int32_t>(blockIdx.x + static_cast<uint32_t>(it) * gridDim.x);
      const int32_t next = atomicAdd(p.work_counter, 1);
      if (next >= p.list.num_work) {
        // The last CTA to run out resets the counter for the next launch: every other CTA
        // has made its last fetch before counting itself out.
        __threadfence();
        if (atomicAdd(p.work_counter + 1, 1) == static_cast<int32_t>(gridDim.x) - 1) {
          atomicExch(p.work_counter, 0);
          atomicExch(p.work_counter + 1, 0);
        }
      }
      return next;
    };
    int32_t fetched = -1;  // thread 0: the next item, once fetched ahead of the current item's end
    int j = 0;             // ring iteration: one per sub-tile, over every item of the CTA
    int qi = 0;            // items with a sub-tile so far (their Q slots alternate)
    // V_j is issued one iteration late: after sub-tile j + 1 is found (where j ends an item: the
    // next item's descriptors, its first sub-tile's class and its Q load) and before K_{j+1}.
    // V_j's slot is freed by P_{j-2} V_{j-2}, the wait the producer idles in most; issued in
    // order, V_j would put that wait before the search for the next sub-tile, and on lists of
    // short items the consumers would wait for K_{j+1} at every item's start (kernel_profile_h200.md).
    // Pending V: ring iteration, key row, kv head, valid keys (pv_j < 0: none).
    int pv_j = -1, pv_row = 0, pv_kvh = 0, pv_rows = 0;
    // Keys [row, row + rows) of kv head h from src (K or V) into ring buffer dst, announced on
    // barrier full: by TMA where the sub-tile is whole, else by cp.async with zero fill.
    auto load_kv = [&](uint32_t dst, const CUtensorMap* map, const __nv_bfloat16* src, uint32_t full, int row, int h,
                       int rows) {
      if (fp.tma_kv != 0 && rows == kWgKeys) {
        if (ptid == 0) {
          mbar_arrive_expect_tx(full, static_cast<uint32_t>(Smem::kKvBytes));
#pragma unroll
          for (int b = 0; b < kD / 64; ++b) tma_load_2d(dst + static_cast<uint32_t>(b * kWgKeys * 128), map, h * kD + 64 * b, row, full);
        } else {
          mbar_arrive(full);
        }
      } else {
        producer_load_rows<kWgKeys, kD>(dst, src + (static_cast<int64_t>(row) * hkv + h) * kD, kv_stride, rows, ptid);
        cp_async_commit();
        cp_async_wait<0>();
        fence_proxy_async();
        mbar_arrive(full);
      }
    };
    auto issue_pending_v = [&]() {
      if (pv_j < 0) return;
      const int slot = pv_j & 1;
      if (pv_j >= 2) mbar_wait(v_empty(slot), static_cast<uint32_t>(((pv_j >> 1) - 1) & 1));
      load_kv(s_v + static_cast<uint32_t>(slot * Smem::kKvBytes), &fp.v_map, v, v_full(slot), pv_row, pv_kvh, pv_rows);
      pv_j = -1;
    };
    for (int it = 0;; ++it) {
      bar_sync_n<kBarProducer, 128>();  // every producer thread has read the previous item
      if (ptid == 0) {
        *s_item = fetched >= 0 ? fetched : fetch(it);
        fetched = -1;
      }
      bar_sync_n<kBarProducer, 128>();
      const int item = *s_item;
      if (item >= p.list.num_work) {
        issue_pending_v();
        const int slot = j & 1;
        if (j >= 2) mbar_wait(k_empty(slot), static_cast<uint32_t>(((j >> 1) - 1) & 1));
        if (ptid == 0) s_record[slot] = FwsRecord{item, 0, 0, 0, kAllDone, 0, 0, 0, 0, 0, 0, 0, 0};
        mbar_arrive(k_full(slot));
        return;
      }
      const AttnWorkItem w = p.list.work[item];
      const AttnTile first = p.list.tiles[w.tile];  // tiles [w.tile, t_end) share the q rows and the outputs
      const int t_end = w.tile + max(1, w.num_tiles);
      const int kvh = w.head / (hq / hkv);
      const int r0 = w.chunk * kWgRows;
      const int rows = min(kWgRows, first.q_len - r0);
      const int out_row = first.out_begin + r0;
      const int lse_row = (first.lse_begin >= 0 ? first.lse_begin : first.out_begin) + r0;

      auto classify = [&](const AttnTile& x, int n, uint64_t (&m)[kMaskWords]) {
        return producer_classify<kBarProducer>(p.list, x, n, r0, rows, ptid, m);
      };

      bool has_q = false;  // the item's Q is loaded (it has a sub-tile)
      AttnTile x = first;
      int ti = w.tile;
      int n = 0;
      for (;; ++j) {
        const int slot = j & 1;
        const auto phase = static_cast<uint32_t>(((j >> 1) - 1) & 1);  // of the release of iteration j - 2
        // Slot j is waited for only where it is written (a Partial sub-tile's masks, then the
        // record and K), so that the classification of the sub-tile, the end of an item, the next
        // item's descriptors and its Q load come while the consumers still read the slot. (An
        // item with no sub-tile left leaves iteration j to the next item, which waits for the
        // same, completed, phase again.)
        bool slot_free = j < 2;
        auto wait_slot = [&]() {
          if (!slot_free) mbar_wait(k_empty(slot), phase);
          slot_free = true;
        };
        uint64_t* masks = s_mask + slot * kMaskWords * kWgRows;
        uint64_t row_masks[kMaskWords];
        int cls = kEmpty;
        while (ti < t_end) {
          const int2 span = kv_sub_tile_span<kWgKeys>(p.list, x, r0, rows);
          n = max(n, span.x);
          for (; n < span.y; ++n) {
            cls = classify(x, n, row_masks);
            if (cls != kEmpty) break;
          }
          if (cls != kEmpty) break;
          if (++ti < t_end) x = p.list.tiles[ti];
          n = 0;
        }
        if (ti >= t_end) break;
        if (!has_q) {
          // Q into the item's slot, once the item two back no longer reads it. By TMA the rows
          // past the tile's q_len are other rows of the buffer (or zeros past its end): their
          // scores and outputs stay in their own rows, which are never stored.
          const int qs = qi & 1;
          const uint32_t qb = s_q + static_cast<uint32_t>(qs * Smem::kQBytes);
          if (qi >= 2) mbar_wait(q_empty(qs), static_cast<uint32_t>(((qi >> 1) - 1) & 1));
          if (fp.tma_q != 0) {
            if (ptid == 0) {
              mbar_arrive_expect_tx(q_full(qs), static_cast<uint32_t>(Smem::kQBytes));
#pragma unroll
              for (int b = 0; b < kD / 64; ++b) {
                tma_load_2d(qb + static_cast<uint32_t>(b * kWgRows * 128), &fp.q_map, w.head * kD + 64 * b,
                            first.q_begin + r0, q_full(qs));
              }
            } else {
              mbar_arrive(q_full(qs));
            }
          } else {
            producer_load_rows<kWgRows, kD>(qb, q + (static_cast<int64_t>(first.q_begin + r0) * hq + w.head) * kD, q_stride,
                                            rows, ptid);
            cp_async_commit();
            cp_async_wait<0>();
            fence_proxy_async();
            mbar_arrive(q_full(qs));
          }
          has_q = true;
        }
        issue_pending_v();
        wait_slot();
        if (cls == kMasked && x.kind == TileKind::Partial) producer_store_masks(masks, row_masks, ptid);
        if (ptid == 0) {
          s_record[slot] = FwsRecord{item, ti, n, cls, kStep, w.head, r0, rows, out_row, lse_row,
                                     w.accumulate, static_cast<int32_t>(x.kind), x.kv_len};
        }
        const int kv_rows = min(kWgKeys, x.kv_len - n * kWgKeys);
        const int kv_row = x.kv_begin + n * kWgKeys;
        // K_j, its masks and record.
        load_kv(s_k + static_cast<uint32_t>(slot * Smem::kKvBytes), &fp.k_map, k, k_full(slot), kv_row, kvh, kv_rows);
        // The next item is fetched once at most two sub-tiles of this one are left, so that its
        // index is at hand when they are done, without claiming it long before; after K's load
        // is issued, so that the fetch's round trip to global memory does not delay it.
        if (ptid == 0 && fetched < 0 && ti == t_end - 1 && n + 3 > kv_sub_tile_span<kWgKeys>(p.list, x, r0, rows).y) fetched = fetch(it + 1);
        pv_j = j;
        pv_row = kv_row;
        pv_kvh = kvh;
        pv_rows = kv_rows;
        ++n;
      }
      if (has_q) {
        ++qi;
      } else if (w.accumulate == 0 && ptid < rows) {
        // No allowed key in any of the item's rows: O = 0, LSE = -inf (an accumulating item's
        // partial is already the answer). The consumers never see the item.
        auto* o_row = reinterpret_cast<float4*>(p.o + ((static_cast<int64_t>(out_row) + ptid) * hq + w.head) * kD);
#pragma unroll 4
        for (int c = 0; c < kD / 4; ++c) o_row[c] = make_float4(0.0F, 0.0F, 0.0F, 0.0F);
        p.lse[(static_cast<int64_t>(lse_row) + ptid) * hq + w.head] = -INFINITY;
      }
    }
  }

  // ---------------- consumer warpgroups ----------------
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kFwsConsumerRegs));
  const int ctid = tid - 128;
  // q rows [64 wg, 64 wg + 64) of the CTA. The warpgroup index and (in the step that begins an
  // item) the Q slot are read through shuffles from lane 0, so that the compiler knows them uniform
  // over the warp and builds the S product's Q descriptors in uniform registers, also in the step
  // that begins an item, where the Q slot changes. From plain registers it builds them per product
  // in vector registers and moves each over by R2UR: about 70 instructions more in that step, which
  // on lists of short items (4-5 sub-tiles an item) sets the pace (bench/results/kernel_profile_h200.md).
  const int wg = warpgroup_of(ctid);
  const FwThread th{wg, (ctid >> 5) & 3, (ctid & 31) >> 2, ctid & 3};
  const float scale_log2 = p.shape.softmax_scale * kLog2e;

  auto turn_sync = [&]() {
    if (wg == 0) {
      bar_sync_n<kBarTurn0, 256>();
    } else {
      bar_sync_n<kBarTurn1, 256>();
    }
  };
  auto turn_pass = [&]() {
    if (wg == 0) {
      bar_arrive_n<kBarTurn1, 256>();
    } else {
      bar_arrive_n<kBarTurn0, 256>();
    }
  };

  // Accumulators: see FwThread (attention_forward_sm90.cuh). o, m_row and l_row are the online
  // softmax of item `cur`; pa holds P of the previous sub-tile until its P V is issued.
  float o[kD / 2];
  float s[kWgKeys / 2];
  uint32_t pa[kWgKeys / 16][4];
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) o[i] = 0.0F;
#pragma unroll
  for (int i = 0; i < kWgKeys / 2; ++i) s[i] = 0.0F;
#pragma unroll
  for (int kk = 0; kk < kWgKeys / 16; ++kk) pa[kk][0] = pa[kk][1] = pa[kk][2] = pa[kk][3] = 0U;
  float m_row[2] = {-INFINITY, -INFINITY};
  float l_row[2] = {0.0F, 0.0F};
  int32_t cur = -1;
  bool fresh = true;  // o holds nothing of item cur yet: its first P V overwrites o
  FwOutput out{0, 0, 0, 0};
  int r0 = 0;
  int qs = 0;  // Q slot of item cur
  int qi = 0;  // items begun
  int j = 0;   // ring iteration, as the producer counts it
  mbar_wait(k_full(0), 0U);
  // The fields of a record that every step reads; the item's own fields are read from the slot by
  // the step that begins it, so that they occupy no registers across the steps.
  struct Step {
    int32_t item, tile, n, cls, end;
  };
  auto read_step = [&](int slot) {
    const FwsRecord& r = s_record[slot];
    return Step{r.item, r.tile, r.n, r.cls, r.end};
  };
  Step rec = read_step(0);

  // Sub-tile j (record rec). kPending: P_{j-1} waits in pa; its P V is issued together with S_j.
  // kBegin: the record is of another item than cur and begins it (a variant of its own, so that
  // the steps inside an item carry none of this): S_j reads the item's Q slot, and once
  // P_{j-1} V_{j-1} is done the outputs of cur are written and the state starts over, so that the
  // tensor cores run the next item's first product, and the other warpgroup's, while this one
  // writes its outputs (peeled: wgmma in no data-dependent branch).
  auto step = [&]<bool kPending, bool kBegin>() {
    const int slot = j & 1;
    if constexpr (kBegin) {
      if (cur >= 0) mbar_arrive(q_empty(qs));  // every S product of item cur has completed
      qs = __shfl_sync(0xffffffffU, qi & 1, 0);
      mbar_wait(q_full(qs), static_cast<uint32_t>((qi >> 1) & 1));
      ++qi;
    }
    const uint32_t s_qi = s_q + static_cast<uint32_t>(qs * Smem::kQBytes);
    const uint32_t kb = s_k + static_cast<uint32_t>(slot * Smem::kKvBytes);
    if constexpr (kPending) {
      mbar_wait(v_full(slot ^ 1), static_cast<uint32_t>(((j - 1) >> 1) & 1));
    } else {
      if (wg == 1) bar_arrive_n<kBarTurn0, 256>();  // the CTA's first issue: warpgroup 0 takes the first turn
    }
    turn_sync();
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      wgmma_m64n128k16_ss(s, desc_k_major<kWgRows>(s_qi, wg * 64, kk), desc_k_major<kWgKeys>(kb, 0, kk), kk > 0 ? 1 : 0);
    }
    wgmma_commit();
    if constexpr (kPending) {
      issue_pv<kD>(o, pa, s_v + static_cast<uint32_t>((slot ^ 1) * Smem::kKvBytes), fresh);
      fresh = false;
    }
    turn_pass();

    if constexpr (kPending) {
      wgmma_wait<1>();  // S_j done; P_{j-1} V_{j-1} may still run
    } else {
      wgmma_wait<0>();
    }
    fence_regs(s);
    // Item cur's softmax state moves aside while the new item's starts (from its partial, with
    // accumulate); its O waits in o for the last P V.
    float m_prev[2] = {m_row[0], m_row[1]};
    float l_prev[2] = {l_row[0], l_row[1]};
    const FwOutput out_prev = out;
    bool partial[2] = {false, false};
    int accumulate = 0;
    if constexpr (kBegin) {
      const FwsRecord& begun = s_record[slot];
      cur = rec.item;
      r0 = begun.r0;
      accumulate = begun.accumulate;
      out = FwOutput{int64_t{begun.out_row}, int64_t{begun.lse_row}, begun.qh, begun.rows};
      m_row[0] = m_row[1] = -INFINITY;
      l_row[0] = l_row[1] = 0.0F;
      if (accumulate != 0) {
        fw_load_partial_state(p, out, th, m_row, l_row);
        partial[0] = m_row[0] != -INFINITY;
        partial[1] = m_row[1] != -INFINITY;
      }
    }
    if (rec.cls == kMasked) {
      const FwsRecord& masked = s_record[slot];
      fw_mask_scores(s, static_cast<TileKind>(masked.kind), masked.kv_len, s_mask + slot * kMaskWords * kWgRows,
                     rec.n * kWgKeys, r0, th);
    }
    float alpha[2];
    fw_softmax(s, m_row, l_row, alpha, scale_log2);
    mbar_arrive(k_empty(slot));  // K_j, its masks and record are no longer read
    if constexpr (kPending) {
      wgmma_wait<0>();  // P_{j-1} V_{j-1} done: O and pa are free, and so is V slot j - 1
      fence_regs(o);
      fence_regs_u32(pa);
      mbar_arrive(v_empty(slot ^ 1));
    }
    if constexpr (kBegin) {
      if constexpr (kPending) fw_store_output<kD>(p, out_prev, th, o, m_prev, l_prev);
      // A new item's O starts from its first P V, unless it accumulates onto a partial: then from
      // that partial (zero in rows without one), rescaled as any running O.
      fresh = accumulate == 0;
      if (!fresh) {
#pragma unroll
        for (int i = 0; i < kD / 2; ++i) o[i] = 0.0F;
        fw_load_partial_o<kD>(p, out, th, partial, o);
        fw_rescale<kD>(o, alpha);
      }
    } else {
      fw_rescale<kD>(o, alpha);
    }
    fw_pack_p(pa, s);
    ++j;
    mbar_wait(k_full(j & 1), static_cast<uint32_t>((j >> 1) & 1));
    rec = read_step(j & 1);
  };
  if (rec.end == kStep) {
    step.template operator()<false, true>();
    // The steps of an item in a loop of their own: its back edge sees the hot step alone, so the
    // accumulators keep their registers through it (a loop over both variants measured 3-6 %
    // slower per step).
    for (;;) {
      while (rec.end == kStep && rec.item == cur) step.template operator()<true, false>();
      if (rec.end != kStep) break;
      step.template operator()<true, true>();
    }
    // The last sub-tile's P V: the CTA's last issue point (warpgroup 1 passes no turn after it).
    const int last = (j - 1) & 1;
    mbar_wait(v_full(last), static_cast<uint32_t>(((j - 1) >> 1) & 1));
    turn_sync();
    wgmma_fence();
    issue_pv<kD>(o, pa, s_v + static_cast<uint32_t>(last * Smem::kKvBytes), fresh);
    if (wg == 0) turn_pass();
    wgmma_wait<0>();
    fence_regs(o);
    fence_regs_u32(pa);
    mbar_arrive(v_empty(last));
    fw_store_output<kD>(p, out, th, o, m_row, l_row);
  }
#endif
}

template <int kD>
void launch_forward_sm90_ws(const AttnForwardParams& p, cudaStream_t stream) {
  constexpr int kSmem = FwsSmem<kD>::kAlloc;
  allow_shared_memory("attention_forward_sm90_ws", attention_forward_sm90_ws_kernel<kD>, kSmem);
  const FwTmaParams fp = forward_tma_params(p, kD, "attention_forward_sm90_ws");
  // Persistent: one CTA per SM (the shared memory allows no second) takes items from the counter.
  const int ctas = p.work_counter != nullptr ? std::min(p.list.num_work, p.max_ctas > 0 ? p.max_ctas : multiprocessor_count())
                                             : p.list.num_work;
  attention_forward_sm90_ws_kernel<kD><<<ctas, kFwsThreads, kSmem, stream>>>(fp);
}

}  // namespace

void attention_forward_wgmma_ws(const AttnForwardParams& params, cudaStream_t stream) {
  launch_for_head_dim("attention_forward_sm90_ws", params.shape,
                      [&]<int kD>() { launch_forward_sm90_ws<kD>(params, stream); });
}

}  // namespace dcp::cuda::detail
