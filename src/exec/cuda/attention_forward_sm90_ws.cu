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
// - Warpgroup 0 (producer, few registers) loads Q once, then walks the sub-tiles of the work
//   item (skipping empty ones, classifying Partial sub-tiles: by the host's cells when the list
//   has them, else one thread per q row, both 64-key words, votes by bar.red among its 128
//   threads; row masks only for Masked sub-tiles), and fills a 2-slot ring: K_j with its masks
//   and a record (tile, sub-tile, class), then V_j. Whole 128-row sub-tiles come by TMA
//   (AttnForwardParams::kv_rows known), the tail of a tile by cp.async with zero fill.
// - Warpgroups 1 and 2 (consumers, 64 q rows each) never load. Ring hand-off by mbarriers:
//   k_full / v_full (producer: 128 arrivals, plus the TMA bytes), k_empty (all 256 consumer
//   threads, once the softmax of S_j no longer reads the masks and record) and v_empty (once
//   P_j V_j completed).
// - Ping-pong: each consumer issues its products of a step only in its turn (named barrier pair
//   T0 / T1 of 256 threads: a warpgroup syncs on its own and arrives on the other's after its
//   issue), so the tensor cores run one warpgroup's products while the other does its softmax.
//   Issue points per warpgroup: one per sub-tile plus the last P V; warpgroup 1 arrives on T0
//   once before its first and not after its last, so both barriers balance exactly, item by item.
// - Persistent (AttnForwardParams::work_counter): one CTA per SM takes work items in list order
//   from a counter. The ring runs on across items: after an item's last sub-tile the producer
//   writes an item-end record (a slot without K / V), loads the next item's Q into the other of
//   two Q slots and starts on its K / V while the consumers finish, write the outputs and release
//   the old Q. Short items (a B = 1024 tile is 8 sub-tiles per q chunk) so lose neither the CTA
//   launch nor the first loads of the next item. Without a counter each CTA runs one item.
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
static_assert(128 * kFwsProducerRegs + kFwsConsumers * kFwsConsumerRegs <= 65536, "register file");
enum : int {  // named barriers
  kBarTurn0 = 1,     // 256 threads: consumer warpgroup 0 may issue
  kBarTurn1 = 2,     // consumer warpgroup 1 may issue
  kBarProducer = 3,  // producer-only votes
};

enum : int32_t {  // FwsRecord::end
  kStep = 0,     // a sub-tile of the item
  kItemEnd = 1,  // the item has no sub-tile left (the slot holds no K / V)
  kAllDone = 2,  // no item left for this CTA
};
struct FwsRecord {
  int32_t item;  // work item
  int32_t tile;  // index into the tile list
  int32_t n;     // 128-key sub-tile of the tile
  int32_t cls;   // kFull or kMasked
  int32_t end;   // kStep, kItemEnd or kAllDone
  int32_t pad_[3];
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
    int j = 0;  // ring iteration, over every item of the CTA
    for (int it = 0;; ++it) {
      // The next item: the list's shared counter (persistent launch) or a fixed stride.
      bar_sync_n<kBarProducer, 128>();  // every producer thread has read the previous one
      if (ptid == 0) {
        int32_t next = 0;
        if (p.work_counter != nullptr) {
          next = atomicAdd(p.work_counter, 1);
          if (next >= p.list.num_work) {
            // The last CTA to run out resets the counter for the next launch: every other CTA
            // has made its last fetch before counting itself out.
            __threadfence();
            if (atomicAdd(p.work_counter + 1, 1) == static_cast<int32_t>(gridDim.x) - 1) {
              atomicExch(p.work_counter, 0);
              atomicExch(p.work_counter + 1, 0);
            }
          }
        } else {
          next = static_cast<int32_t>(blockIdx.x + static_cast<uint32_t>(it) * gridDim.x);
        }
        *s_item = next;
      }
      bar_sync_n<kBarProducer, 128>();
      const int item = *s_item;
      if (item >= p.list.num_work) {
        const int slot = j & 1;
        if (j >= 2) mbar_wait(k_empty(slot), static_cast<uint32_t>(((j >> 1) - 1) & 1));
        if (ptid == 0) s_record[slot] = FwsRecord{item, 0, 0, 0, kAllDone, {}};
        mbar_arrive(k_full(slot));
        return;
      }
      const AttnWorkItem w = p.list.work[item];
      const AttnTile first = p.list.tiles[w.tile];  // tiles [w.tile, t_end) share the q rows and the outputs
      const int t_end = w.tile + max(1, w.num_tiles);
      const int kvh = w.head / (hq / hkv);
      const int r0 = w.chunk * kWgRows;
      const int rows = min(kWgRows, first.q_len - r0);

      // Q into the item's slot, once the item two back no longer reads it.
      const int qs = it & 1;
      if (it >= 2) mbar_wait(q_empty(qs), static_cast<uint32_t>(((it >> 1) - 1) & 1));
      producer_load_rows<kWgRows, kD>(s_q + static_cast<uint32_t>(qs * Smem::kQBytes),
                                      q + (static_cast<int64_t>(first.q_begin + r0) * hq + w.head) * kD, q_stride, rows, ptid);
      cp_async_commit();
      cp_async_wait<0>();
      fence_proxy_async();
      mbar_arrive(q_full(qs));

      // Class of sub-tile n of tile x, uniform over the producer; Partial masks into `masks`
      // ([word][row]): thread ptid computes both 64-key words of q row ptid.
      auto classify = [&](const AttnTile& x, int n, uint64_t* masks) -> int {
        const int kv0 = n * kWgKeys;
        if (x.kind != TileKind::Partial) return classify_dense<kWgKeys>(x, kv0, r0, rows);
        // With the host's cells only a Masked sub-tile needs its row masks, and no vote.
        const bool cells = p.list.cells != nullptr && x.cells_begin >= 0;
        if (cells) {
          const int cls = classify_from_cells<kWgRows, kWgKeys>(p.list.cells, x, r0, rows, kv0);
          if (cls != kMasked) return cls;
        }
        const bool row_valid = ptid < rows;
        uint64_t m[kMaskWords];
        bool any = false;
        bool full = true;
#pragma unroll
        for (int word = 0; word < kMaskWords; ++word) {
          const int kv_word = kv0 + 64 * word;
          m[word] = 0;
          if (row_valid && kv_word < x.kv_len) {
            m[word] = row_key_mask(p.list.row_offsets, p.list.ranges, x.range_row_begin + r0 + ptid, kv_word, x.kv_len);
          }
          masks[word * kWgRows + ptid] = m[word];
          any = any || m[word] != 0;
          full = full && (!row_valid || m[word] == valid_bits(min(max(x.kv_len - kv_word, 0), 64)));
        }
        if (cells) return kMasked;
        if (!bar_any_n<kBarProducer, 128>(any)) return kEmpty;
        const bool all_full = !bar_any_n<kBarProducer, 128>(!full);
        return all_full && x.kv_len - kv0 >= kWgKeys ? kFull : kMasked;
      };

      AttnTile x = first;
      int ti = w.tile;
      int n = 0;
      for (;; ++j) {
        const int slot = j & 1;
        const auto phase = static_cast<uint32_t>(((j >> 1) - 1) & 1);  // of the release of iteration j - 2
        if (j >= 2) mbar_wait(k_empty(slot), phase);
        uint64_t* masks = s_mask + slot * kMaskWords * kWgRows;
        int cls = kEmpty;
        while (ti < t_end) {
          const int end = kv_sub_tile_end<kWgKeys>(x, r0, rows);
          for (; n < end; ++n) {
            cls = classify(x, n, masks);
            if (cls != kEmpty) break;
          }
          if (cls != kEmpty) break;
          if (++ti < t_end) x = p.list.tiles[ti];
          n = 0;
        }
        const bool end = ti >= t_end;
        if (ptid == 0) s_record[slot] = FwsRecord{item, ti, n, cls, end ? kItemEnd : kStep, {}};
        if (end) {
          // A record without K / V. Its v_full phase still completes (after the release of
          // iteration j - 2, as a load's would), so that every iteration advances both halves of
          // its slot by one phase and the parities the consumers wait for stay in step; the
          // consumers release both halves at once.
          mbar_arrive(k_full(slot));
          if (j >= 2) mbar_wait(v_empty(slot), phase);
          mbar_arrive(v_full(slot));
          ++j;
          break;
        }
        const int kv_rows = min(kWgKeys, x.kv_len - n * kWgKeys);
        const bool tma = fp.tma_kv != 0 && kv_rows == kWgKeys;
        const int kv_row = x.kv_begin + n * kWgKeys;
        const int64_t kv_off = (static_cast<int64_t>(kv_row) * hkv + kvh) * kD;
        const uint32_t kb = s_k + static_cast<uint32_t>(slot * Smem::kKvBytes);
        const uint32_t vb = s_v + static_cast<uint32_t>(slot * Smem::kKvBytes);
        // K_j, its masks and record.
        if (tma) {
          if (ptid == 0) {
            mbar_arrive_expect_tx(k_full(slot), static_cast<uint32_t>(Smem::kKvBytes));
#pragma unroll
            for (int b = 0; b < kD / 64; ++b) {
              tma_load_2d(kb + static_cast<uint32_t>(b * kWgKeys * 128), &fp.k_map, kvh * kD + 64 * b, kv_row, k_full(slot));
            }
          } else {
            mbar_arrive(k_full(slot));
          }
        } else {
          producer_load_rows<kWgKeys, kD>(kb, k + kv_off, kv_stride, kv_rows, ptid);
          cp_async_commit();
          cp_async_wait<0>();
          fence_proxy_async();
          mbar_arrive(k_full(slot));
        }
        // V_j, once P_{j-2} V_{j-2} released the slot.
        if (j >= 2) mbar_wait(v_empty(slot), phase);
        if (tma) {
          if (ptid == 0) {
            mbar_arrive_expect_tx(v_full(slot), static_cast<uint32_t>(Smem::kKvBytes));
#pragma unroll
            for (int b = 0; b < kD / 64; ++b) {
              tma_load_2d(vb + static_cast<uint32_t>(b * kWgKeys * 128), &fp.v_map, kvh * kD + 64 * b, kv_row, v_full(slot));
            }
          } else {
            mbar_arrive(v_full(slot));
          }
        } else {
          producer_load_rows<kWgKeys, kD>(vb, v + kv_off, kv_stride, kv_rows, ptid);
          cp_async_commit();
          cp_async_wait<0>();
          fence_proxy_async();
          mbar_arrive(v_full(slot));
        }
        ++n;
      }
    }
  }

  // ---------------- consumer warpgroups ----------------
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kFwsConsumerRegs));
  const int ctid = tid - 128;
  const int wg = ctid >> 7;  // q rows [64 wg, 64 wg + 64) of the CTA
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

  int j = 0;  // ring iteration, as the producer counts it
  for (int it = 0;; ++it) {
    mbar_wait(k_full(j & 1), static_cast<uint32_t>((j >> 1) & 1));
    FwsRecord rec = s_record[j & 1];
    if (rec.end == kAllDone) break;
    const AttnWorkItem w = p.list.work[rec.item];
    const AttnTile first = p.list.tiles[w.tile];
    const int qh = w.head;
    const int r0 = w.chunk * kWgRows;
    const int rows = min(kWgRows, first.q_len - r0);
    const FwOutput out{int64_t{first.out_begin} + r0,
                       int64_t{first.lse_begin >= 0 ? first.lse_begin : first.out_begin} + r0, qh, rows};

    // Accumulators: see FwThread (attention_forward_sm90.cuh).
    float o[kD / 2];
    float s[kWgKeys / 2];
#pragma unroll
    for (int i = 0; i < kD / 2; ++i) o[i] = 0.0F;
#pragma unroll
    for (int i = 0; i < kWgKeys / 2; ++i) s[i] = 0.0F;
    uint32_t pa[kWgKeys / 16][4];
#pragma unroll
    for (int kk = 0; kk < kWgKeys / 16; ++kk) pa[kk][0] = pa[kk][1] = pa[kk][2] = pa[kk][3] = 0U;
    float m_row[2] = {-INFINITY, -INFINITY};
    float l_row[2] = {0.0F, 0.0F};
    if (w.accumulate != 0) fw_load_partial<kD>(p, out, th, o, m_row, l_row);

    const int qs = it & 1;
    const uint32_t s_qi = s_q + static_cast<uint32_t>(qs * Smem::kQBytes);
    mbar_wait(q_full(qs), static_cast<uint32_t>((it >> 1) & 1));
    if (rec.end == kStep) {
      if (wg == 1) bar_arrive_n<kBarTurn0, 256>();  // warpgroup 0 takes the item's first turn
      // One sub-tile j; kFirst: the item's first, no P_{j-1} V_{j-1} yet (peeled: wgmma in no
      // data-dependent branch).
      auto step = [&]<bool kFirst>() {
        const int slot = j & 1;
        const uint32_t kb = s_k + static_cast<uint32_t>(slot * Smem::kKvBytes);
        if constexpr (!kFirst) mbar_wait(v_full(slot ^ 1), static_cast<uint32_t>(((j - 1) >> 1) & 1));
        turn_sync();
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kD / 16; ++kk) {
          wgmma_m64n128k16_ss(s, desc_k_major<kWgRows>(s_qi, wg * 64, kk), desc_k_major<kWgKeys>(kb, 0, kk), kk > 0 ? 1 : 0);
        }
        wgmma_commit();
        if constexpr (!kFirst) issue_pv<kD>(o, pa, s_v + static_cast<uint32_t>((slot ^ 1) * Smem::kKvBytes));
        turn_pass();

        if constexpr (!kFirst) {
          wgmma_wait<1>();  // S_j done; P_{j-1} V_{j-1} may still run
        } else {
          wgmma_wait<0>();
        }
        fence_regs(s);
        if (rec.cls == kMasked) {  // the tile (kind, kv_len) is read only here
          fw_mask_scores(s, p.list.tiles[rec.tile], s_mask + slot * kMaskWords * kWgRows, rec.n * kWgKeys, r0, th);
        }
        float alpha[2];
        fw_softmax(s, m_row, l_row, alpha, scale_log2);
        mbar_arrive(k_empty(slot));  // K_j, its masks and record are no longer read
        if constexpr (!kFirst) {
          wgmma_wait<0>();  // P_{j-1} V_{j-1} done: O and pa are free, and so is V slot j - 1
          fence_regs(o);
          fence_regs_u32(pa);
          mbar_arrive(v_empty(slot ^ 1));
        }
        fw_rescale<kD>(o, alpha);
        fw_pack_p(pa, s);
        ++j;
        mbar_wait(k_full(j & 1), static_cast<uint32_t>((j >> 1) & 1));
        rec = s_record[j & 1];
      };
      step.template operator()<true>();
      while (rec.end == kStep) step.template operator()<false>();
      // The last sub-tile's P V (the last issue point: warpgroup 1 passes no turn after it).
      const int last = (j - 1) & 1;
      mbar_wait(v_full(last), static_cast<uint32_t>(((j - 1) >> 1) & 1));
      turn_sync();
      wgmma_fence();
      issue_pv<kD>(o, pa, s_v + static_cast<uint32_t>(last * Smem::kKvBytes));
      if (wg == 0) turn_pass();
      wgmma_wait<0>();
      fence_regs(o);
      fence_regs_u32(pa);
      mbar_arrive(v_empty(last));
    }
    // Iteration j holds the item's end record: its slot is free at once, and so is the item's Q
    // (every S product of the item has completed). The producer fills both for the next items
    // while this item's outputs are written.
    mbar_arrive(k_empty(j & 1));
    mbar_arrive(v_empty(j & 1));
    mbar_arrive(q_empty(qs));
    ++j;
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
