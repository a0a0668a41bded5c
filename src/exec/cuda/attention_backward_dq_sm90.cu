// attention_backward_dq_sm90.cu — the dQ pass of the deterministic backward (Hopper,
// sm_90a): dQ = scale * sum_j dS_j K_j with q rows held still and the keys walked, the forward's
// loop shape, so that every dQ element has one writer and a fixed summation order. Contract:
// dcp/detail/attention_cuda.h (AttnBackwardParams::dq_list, make_deterministic_backward_work).
//
// Per 128-key sub-tile j of the item's tiles, each consumer warpgroup (64 q rows) computes
//   S_j = Q K_j^T and dP_j = dO V_j^T          (two SS products, issued together)
//   P_j = exp2(S_j scale log2e - LSE log2e)    (the forward's final LSE: no online softmax)
//   dS_j = P_j (dP_j - Delta)                  (fp32, then packed to bf16 A fragments)
//   dQ += dS_j K_j                             (RS product, K_j read MN-major as the forward's V)
// and adds scale * dQ to the dq rows once, at the end of the item. That is three products per
// sub-tile against the fused kernel's five, two of them repeated from the dK / dV pass: the price
// of one writer per element, with no CTA waiting for another.
//
// CTA: 3 warpgroups. Warpgroup 0 (producer) loads the item's Q and dO once (TMA when the rows of
// the buffers are known, else cp.async), then walks the item's tiles and their 128-key sub-tiles
// as the forward's producer does (skips empty ones, classifies Partial ones by the host's cells or
// by row masks) and fills a 2-slot ring: K_j, V_j, the masks and a record, one mbarrier pair per
// slot (full: 128 arrivals plus the TMA bytes; empty: the 256 consumer threads, once dQ += dS_j K_j
// has completed, the last read of the slot). Warpgroups 1 and 2 are the consumers; setmaxnreg
// moves registers to them (dQ, S and dP are 64 registers each at D = 128).
// The consumers take turns at issuing their products (see the consumer part). One CTA per work
// item (grid = number of items), heaviest items first in the list.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "attention_common.cuh"
#include "attention_forward_sm90.cuh"
#include "dcp/detail/attention_cuda.h"
#include "sync_sm90.cuh"
#include "tensor_map.h"
#include "wgmma_sm90.cuh"

namespace dcp::cuda::detail {
namespace {

inline constexpr int kDqThreads = 384;  // producer + 2 consumer warpgroups
inline constexpr int kDqConsumers = 256;
inline constexpr int kDqProducerRegs = 40;
inline constexpr int kDqConsumerRegs = 232;
static_assert(128 * kDqProducerRegs + kDqConsumers * kDqConsumerRegs <= cta_register_pool(kDqThreads), "register file");
enum : int {  // named barriers
  kBarDqProducer = 1,  // producer-only votes
  kBarDqTurn0 = 2,     // 256 threads: consumer warpgroup 0 may issue
  kBarDqTurn1 = 3,     // consumer warpgroup 1 may issue
};

struct DqRecord {
  int32_t tile;  // index into the dq list's tiles
  int32_t n;     // 128-key sub-tile of the tile
  int32_t cls;   // kFull or kMasked
  int32_t end;   // 1: the walk is over (nothing else is valid)
  int32_t kind;  // TileKind of the tile, and its keys: what a masked sub-tile's mask needs
  int32_t kv_len;
};

struct DqParams {
  AttnBackwardParams p;
  CUtensorMap k_map;  // [kv_rows][num_kv_heads x D] bf16, boxes of 128 rows x 64 columns
  CUtensorMap v_map;
  CUtensorMap q_map;  // [q_rows][num_q_heads x D] bf16, boxes of 128 rows x 64 columns
  CUtensorMap do_map;
  int32_t tma_kv;
  int32_t tma_qdo;
};

template <int kD>
struct DqSmem {
  static constexpr int kQBytes = kWgRows * kD * 2;
  static constexpr int kKvBytes = kWgKeys * kD * 2;
  static constexpr int kQ = 0;
  static constexpr int kDo = kQ + kQBytes;
  static constexpr int kK = kDo + kQBytes;                 // 2 slots
  static constexpr int kV = kK + 2 * kKvBytes;             // 2 slots
  static constexpr int kMask = kV + 2 * kKvBytes;          // [slot][word][row] uint64
  static constexpr int kLse = kMask + 2 * kMaskWords * kWgRows * 8;  // LSE log2e per row
  static constexpr int kDelta = kLse + kWgRows * 4;
  static constexpr int kRecord = kDelta + kWgRows * 4;
  static constexpr int kBars = kRecord + 2 * static_cast<int>(sizeof(DqRecord));  // 5 mbarriers
  static constexpr int kBytes = kBars + 5 * 8;
  static constexpr int kAlloc = kBytes + kSw128AtomBytes;  // slack to align the base to 1024
  static_assert(kQBytes % kSw128AtomBytes == 0 && kKvBytes % kSw128AtomBytes == 0, "tiles stay atom aligned");
  static_assert(kBars % 8 == 0, "mbarriers are 8-byte aligned");
};

// dP = dO V^T: as S = Q K^T, from the dO tile and the V slot.
template <int kD>
__device__ __forceinline__ void dq_issue_s_dp(float (&s)[kWgKeys / 2], float (&dp)[kWgKeys / 2], uint32_t s_q, uint32_t s_do,
                                             uint32_t kb, uint32_t vb, int wg) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    wgmma_m64n128k16_ss(s, desc_k_major<kWgRows>(s_q, wg * 64, kk), desc_k_major<kWgKeys>(kb, 0, kk), kk > 0 ? 1 : 0);
  }
  wgmma_commit();
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    wgmma_m64n128k16_ss(dp, desc_k_major<kWgRows>(s_do, wg * 64, kk), desc_k_major<kWgKeys>(vb, 0, kk), kk > 0 ? 1 : 0);
  }
  wgmma_commit();
}

template <int kD>
__global__ void __launch_bounds__(kDqThreads, 1) attention_backward_dq_sm90_kernel(const __grid_constant__ DqParams dp_params) {
  const AttnBackwardParams p = dp_params.p;
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  (void)p;  // built for a target without wgmma: never selected there, fail loudly if run
  __trap();
#else
  using Smem = DqSmem<kD>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const SmemBase aligned = sw128_smem_base(smem_raw);
  unsigned char* smem = aligned.ptr;
  const uint32_t base = aligned.addr;
  const uint32_t s_q = base + Smem::kQ;
  const uint32_t s_do = base + Smem::kDo;
  const uint32_t s_k = base + Smem::kK;
  const uint32_t s_v = base + Smem::kV;
  auto* s_mask = reinterpret_cast<uint64_t*>(smem + Smem::kMask);
  auto* s_lse = reinterpret_cast<float*>(smem + Smem::kLse);
  auto* s_delta = reinterpret_cast<float*>(smem + Smem::kDelta);
  auto* s_record = reinterpret_cast<DqRecord*>(smem + Smem::kRecord);
  const uint32_t bars = base + Smem::kBars;
  const uint32_t q_full = bars;
  auto full = [&](int slot) { return bars + 8U + 8U * static_cast<uint32_t>(slot); };
  auto empty = [&](int slot) { return bars + 24U + 8U * static_cast<uint32_t>(slot); };

  const int tid = static_cast<int>(threadIdx.x);
  if (tid == 0) {
    mbar_init(q_full, 128);
    for (int slot = 0; slot < 2; ++slot) {
      mbar_init(full(slot), 128);
      mbar_init(empty(slot), kDqConsumers);
    }
    mbar_init_fence();
  }
  __syncthreads();  // the only CTA-wide barrier: the mbarriers exist before anyone uses them

  const int hq = p.shape.num_q_heads;
  const int hkv = p.shape.num_kv_heads;
  const AttnTileList& list = p.dq_list;
  const AttnWorkItem w = list.work[blockIdx.x];
  const AttnTile first = list.tiles[w.tile];  // the item's tiles share q rows, dO, LSE, Delta and dQ rows
  const int kvh = w.head / (hq / hkv);
  const int r0 = w.chunk * kWgRows;
  const int rows = min(kWgRows, first.q_len - r0);

  if (tid < 128) {
    // ---------------- producer warpgroup ----------------
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kDqProducerRegs));
    const int ptid = tid;
    const int64_t q_stride = static_cast<int64_t>(hq) * kD;
    const int64_t kv_stride = static_cast<int64_t>(hkv) * kD;
    const int dout_row0 = (first.dout_begin >= 0 ? first.dout_begin : first.q_begin) + r0;
    // LSE and Delta first: the arrivals below publish them with Q and dO.
    stage_lse_delta(p.lse, p.delta, hq, first, r0, rows, w.head, ptid, s_lse, s_delta);
    // Q and dO. By TMA the rows past q_len are other rows of the buffers (or zeros past their
    // end): finite, and their LSE below is +inf, so their P and dS are 0.
    if (dp_params.tma_qdo != 0) {
      if (ptid == 0) {
        mbar_arrive_expect_tx(q_full, static_cast<uint32_t>(2 * Smem::kQBytes));
#pragma unroll
        for (int b = 0; b < kD / 64; ++b) {
          const auto box = static_cast<uint32_t>(b * kWgRows * 128);
          tma_load_2d(s_q + box, &dp_params.q_map, w.head * kD + 64 * b, first.q_begin + r0, q_full);
          tma_load_2d(s_do + box, &dp_params.do_map, w.head * kD + 64 * b, dout_row0, q_full);
        }
      }
    } else {
      const auto* q = static_cast<const __nv_bfloat16*>(p.q);
      const auto* dout = static_cast<const __nv_bfloat16*>(p.dout);
      producer_load_rows<kWgRows, kD>(s_q, q + (static_cast<int64_t>(first.q_begin + r0) * hq + w.head) * kD, q_stride, rows, ptid);
      producer_load_rows<kWgRows, kD>(s_do, dout + (static_cast<int64_t>(dout_row0) * hq + w.head) * kD, q_stride, rows, ptid);
    }
    cp_async_commit();
    cp_async_wait<0>();
    fence_proxy_async();
    if (dp_params.tma_qdo == 0 || ptid != 0) mbar_arrive(q_full);  // thread 0 of a TMA load arrived with its bytes

    auto classify = [&](const AttnTile& x, int n, uint64_t (&m)[kMaskWords]) {
      return producer_classify<kBarDqProducer>(list, x, n, r0, rows, ptid, m);
    };

    const int t_end = w.tile + max(1, w.num_tiles);
    int ti = w.tile;
    AttnTile x = first;
    int n = 0;
    for (int j = 0;; ++j) {
      const int slot = j & 1;
      uint64_t* masks = s_mask + slot * kMaskWords * kWgRows;
      uint64_t row_masks[kMaskWords];
      int cls = kEmpty;
      while (ti < t_end) {
        // A tile of another head group than the item's q head has nothing for it.
        const bool mine = kvh >= x.kv_head_begin && kvh < x.kv_head_end;
        const int2 span = mine ? kv_sub_tile_span<kWgKeys>(list, x, r0, rows) : make_int2(0, 0);
        n = max(n, span.x);
        for (; n < span.y; ++n) {
          cls = classify(x, n, row_masks);
          if (cls != kEmpty) break;
        }
        if (cls != kEmpty) break;
        if (++ti < t_end) x = list.tiles[ti];
        n = 0;
      }
      // The slot is waited for once the sub-tile is classified: the masks' loads of the rows'
      // ranges run while the consumers still read it.
      if (j >= 2) mbar_wait(empty(slot), static_cast<uint32_t>(((j >> 1) - 1) & 1));
      if (ti >= t_end) {
        if (ptid == 0) s_record[slot] = DqRecord{0, 0, 0, 1, 0, 0};
        mbar_arrive(full(slot));
        break;
      }
      if (cls == kMasked && x.kind == TileKind::Partial) producer_store_masks(masks, row_masks, ptid);
      if (ptid == 0) s_record[slot] = DqRecord{ti, n, cls, 0, static_cast<int32_t>(x.kind), x.kv_len};
      const int kv_rows = min(kWgKeys, x.kv_len - n * kWgKeys);
      const bool tma = dp_params.tma_kv != 0 && kv_rows == kWgKeys;
      const int kv_row = x.kv_begin + n * kWgKeys;
      const uint32_t kb = s_k + static_cast<uint32_t>(slot * Smem::kKvBytes);
      const uint32_t vb = s_v + static_cast<uint32_t>(slot * Smem::kKvBytes);
      if (tma) {
        if (ptid == 0) {
          mbar_arrive_expect_tx(full(slot), static_cast<uint32_t>(2 * Smem::kKvBytes));
#pragma unroll
          for (int b = 0; b < kD / 64; ++b) {
            const auto box = static_cast<uint32_t>(b * kWgKeys * 128);
            tma_load_2d(kb + box, &dp_params.k_map, kvh * kD + 64 * b, kv_row, full(slot));
            tma_load_2d(vb + box, &dp_params.v_map, kvh * kD + 64 * b, kv_row, full(slot));
          }
        } else {
          mbar_arrive(full(slot));
        }
      } else {
        // The tail of a tile: keys past kv_len load as zeros (their P is 0: masked).
        const int64_t kv_off = (static_cast<int64_t>(kv_row) * hkv + kvh) * kD;
        producer_load_rows<kWgKeys, kD>(kb, static_cast<const __nv_bfloat16*>(p.k) + kv_off, kv_stride, kv_rows, ptid);
        producer_load_rows<kWgKeys, kD>(vb, static_cast<const __nv_bfloat16*>(p.v) + kv_off, kv_stride, kv_rows, ptid);
        cp_async_commit();
        cp_async_wait<0>();
        fence_proxy_async();
        mbar_arrive(full(slot));
      }
      ++n;
    }
    return;
  }

  // ---------------- consumer warpgroups ----------------
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kDqConsumerRegs));
  const int ctid = tid - 128;
  const int wg = warpgroup_of(ctid);  // q rows [64 wg, 64 wg + 64) of the CTA
  const FwThread th{wg, (ctid >> 5) & 3, (ctid & 31) >> 2, ctid & 3};
  const float scale_log2 = p.shape.softmax_scale * kLog2e;

  float dq[kD / 2];
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) dq[i] = 0.0F;
  // Turns: each consumer issues its products only in its turn (a named barrier pair: a warpgroup
  // syncs on its own and arrives on the other's after issuing), so that the tensor cores run one
  // warpgroup's products while the other computes P and dS. Two issue points per sub-tile (S and
  // dP; the dQ product); warpgroup 1 arrives on turn 0 once before its first issue, and warpgroup
  // 0 syncs once more after its last, so both barriers balance.
  auto turn_sync = [&]() {
    if (wg == 0) {
      bar_sync_n<kBarDqTurn0, 256>();
    } else {
      bar_sync_n<kBarDqTurn1, 256>();
    }
  };
  auto turn_pass = [&]() {
    if (wg == 0) {
      bar_arrive_n<kBarDqTurn1, 256>();
    } else {
      bar_arrive_n<kBarDqTurn0, 256>();
    }
  };
  if (wg == 1) bar_arrive_n<kBarDqTurn0, 256>();
  mbar_wait(q_full, 0U);
  const float lse2[2] = {s_lse[th.row(0)], s_lse[th.row(1)]};
  const float delta[2] = {s_delta[th.row(0)], s_delta[th.row(1)]};

  for (int j = 0;; ++j) {
    const int slot = j & 1;
    mbar_wait(full(slot), static_cast<uint32_t>((j >> 1) & 1));
    const DqRecord rec = s_record[slot];
    if (rec.end != 0) break;
    const uint32_t kb = s_k + static_cast<uint32_t>(slot * Smem::kKvBytes);
    const uint32_t vb = s_v + static_cast<uint32_t>(slot * Smem::kKvBytes);
    float s[kWgKeys / 2];
    float dp[kWgKeys / 2];
    turn_sync();
    dq_issue_s_dp<kD>(s, dp, s_q, s_do, kb, vb, wg);
    turn_pass();
    wgmma_wait<1>();  // S done; dP may still run
    fence_regs(s);
    if (rec.cls == kMasked) {
      fw_mask_scores(s, static_cast<TileKind>(rec.kind), rec.kv_len, s_mask + slot * kMaskWords * kWgRows, rec.n * kWgKeys,
                     r0, th);
    }
#pragma unroll
    for (int i = 0; i < kWgKeys / 2; ++i) s[i] = exp2_ftz(fmaf(s[i], scale_log2, -lse2[(i >> 1) & 1]));
    wgmma_wait<0>();
    fence_regs(dp);
#pragma unroll
    for (int i = 0; i < kWgKeys / 2; ++i) s[i] *= dp[i] - delta[(i >> 1) & 1];
    uint32_t ds[kWgKeys / 16][4];
    fw_pack_p(ds, s);
    turn_sync();
    wgmma_fence();
    issue_pv<kD>(dq, ds, kb);  // dQ += dS K_j: K_j as the forward's V (keys x D, MN-major)
    turn_pass();
    wgmma_wait<0>();
    fence_regs(dq);
    fence_regs_u32(ds);
    mbar_arrive(empty(slot));  // K_j, V_j, the masks and the record are no longer read
  }
  if (wg == 0) bar_sync_n<kBarDqTurn0, 256>();  // warpgroup 1's last pass

  // scale * dQ onto the dq rows. This item is their only writer in the launch, so each element
  // takes exactly one addition and the result does not depend on timing: the additions go as
  // fire-and-forget reductions rather than loads and stores, whose loads the compiler would
  // serialise behind each store (one memory latency per pair of columns).
  const int dq_row0 = (first.dq_begin >= 0 ? first.dq_begin : first.q_begin) + r0;
  const float scale = p.shape.softmax_scale;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = th.row(r);
    if (row >= rows) continue;
    float* out = p.dq + (static_cast<int64_t>(dq_row0 + row) * hq + w.head) * kD + 2 * th.tq;
#pragma unroll
    for (int jb = 0; jb < kD / 8; ++jb) {
      atomicAdd(reinterpret_cast<float2*>(out + 8 * jb), make_float2(dq[4 * jb + 2 * r] * scale, dq[4 * jb + 2 * r + 1] * scale));
    }
  }
#endif
}

template <int kD>
void launch_backward_dq_sm90(const AttnBackwardParams& p, cudaStream_t stream) {
  constexpr int kSmem = DqSmem<kD>::kAlloc;
  const char* name = "attention_backward_dq_sm90";
  allow_shared_memory(name, attention_backward_dq_sm90_kernel<kD>, kSmem);
  DqParams dp{};
  dp.p = p;
  const int64_t kv_elems = int64_t{p.shape.num_kv_heads} * kD;
  dp.tma_kv = p.kv_rows > 0 && encode_tensor_map_2d(dp.k_map, name, TensorElem::Bf16, p.k, kv_elems, p.kv_rows, 64, kWgKeys) &&
                      encode_tensor_map_2d(dp.v_map, name, TensorElem::Bf16, p.v, kv_elems, p.kv_rows, 64, kWgKeys)
                  ? 1
                  : 0;
  const int64_t q_elems = int64_t{p.shape.num_q_heads} * kD;
  dp.tma_qdo = p.q_rows > 0 && p.dout_rows > 0 &&
                       encode_tensor_map_2d(dp.q_map, name, TensorElem::Bf16, p.q, q_elems, p.q_rows, 64, kWgRows) &&
                       encode_tensor_map_2d(dp.do_map, name, TensorElem::Bf16, p.dout, q_elems, p.dout_rows, 64, kWgRows)
                   ? 1
                   : 0;
  attention_backward_dq_sm90_kernel<kD><<<p.dq_list.num_work, kDqThreads, kSmem, stream>>>(dp);
}

}  // namespace

void attention_backward_dq_wgmma(const AttnBackwardParams& params, cudaStream_t stream) {
  if (params.dq_list.num_work == 0) return;
  launch_for_head_dim("attention_backward_dq_sm90", params.shape,
                      [&]<int kD>() { launch_backward_dq_sm90<kD>(params, stream); });
}

}  // namespace dcp::cuda::detail
