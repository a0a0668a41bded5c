// attention_forward_sm90_ws.cu — the warp-specialised Hopper (sm_90a) forward kernel (route
// WgmmaWarpSpecialized, DCP_ATTN_FORWARD_VARIANT=ws): the pipelined kernel's per-warpgroup
// schedule (attention_forward_sm90_pipe.cu: S_j = Q K_j^T issued with O += P_{j-1} V_{j-1}, the
// softmax of S_j under the P V product) and its shared-memory tiles, with the loads, the
// sub-tile walk and the Partial masks moved to a producer warpgroup. Same contract as the other
// forward kernels (dcp/attention_cuda.h).
//
// CTA: 3 warpgroups (384 threads). Warpgroup 0 is the producer: it walks the item's sub-tiles
// (skipping empty ones), computes Partial masks (one thread per q row, both 64-key words),
// and loads Q, K and V with cp.async. Warpgroups 1 and 2 are the consumers, 64 q rows each;
// they never load, classify or meet at a CTA barrier. setmaxnreg moves registers from the
// producer (56) to the consumers (224): 128 * 56 + 256 * 224 = 64512 of the 65536
// (ptxas -v: 168 registers at launch, no spills at either head dim).
//
// Hand-off: group G_0 = {Q, K_0}, G_j = {K_j, V_{j-1}} (j >= 1): exactly what consumer
// iteration j reads, so one "full" mbarrier per iteration (2 slots, by j & 1). The producer
// waits for its own cp.async groups, fences them to the async proxy (wgmma reads) and arrives
// (128 arrivals). Every consumer thread arrives on "empty" slot j & 1 after iteration j: K_j, V_{j-1},
// the masks and the stage record of slot j & 1 are then free, which G_{j + 2} needs (K_{j+2} goes
// where K_j was, V_{j+1} where V_{j-1} was). A stage record (class, mask kind, key bounds, or the
// end of the walk) travels with each group, so the consumers' loop needs no tile data.
//
// Ping-pong: two named barriers order the consumers' wgmma issues, warpgroup 1 first then 2
// then 1 ..., so that one warpgroup's softmax runs while the other's products occupy the
// tensor cores (each issue block: S_j and P_{j-1} V_{j-1}).
//
// Dense masking (Full / CausalDiagonal sub-tiles with a short or diagonal edge) compares the column
// with one per-row bound computed once per sub-tile.
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

inline constexpr int kWsThreads = 384;         // producer + 2 consumer warpgroups
inline constexpr int kConsumerThreads = 256;
inline constexpr int kProducerRegs = 56;
inline constexpr int kConsumerRegs = 224;
inline constexpr int kBarConsumer0 = 1;        // ping-pong: consumer 0 waits here
inline constexpr int kBarConsumer1 = 2;        // ping-pong: consumer 1 waits here
inline constexpr int kBarProducer = 3;         // producer-only votes
static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= 65536, "register file");

struct StageInfo {
  int32_t end;      // 1: no sub-tile left (the group only carries the last V)
  int32_t cls;      // kFull or kMasked
  int32_t partial;  // masks in the slot's mask words
  int32_t causal;   // dense: causal diagonal tile
  int32_t kv0;      // tile-local first key of the sub-tile
  int32_t kv_len;
  int32_t pad_[2];
};

template <int kD>
struct WsSmem {
  using Base = WgSmem<kD>;
  static constexpr int kInfo = Base::kBytes;                            // StageInfo[2]
  static constexpr int kFull = kInfo + 2 * static_cast<int>(sizeof(StageInfo));  // uint64 mbarrier[2]
  static constexpr int kEmpty = kFull + 16;                             // uint64 mbarrier[2]
  static constexpr int kBytes = kEmpty + 16;
  static constexpr int kAlloc = kBytes + kSw128AtomBytes;
};

__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

template <int kN>
__device__ __forceinline__ void fence_regs_u32(uint32_t (&r)[kN][4]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    asm volatile("" : "+r"(r[i][0]), "+r"(r[i][1]), "+r"(r[i][2]), "+r"(r[i][3])::"memory");
  }
}

template <int kId>
__device__ __forceinline__ void bar_sync_consumers() {
  bar_sync_n<kId, kConsumerThreads>();
}
template <int kId>
__device__ __forceinline__ void bar_arrive_consumers() {
  bar_arrive_n<kId, kConsumerThreads>();
}

// OR of `v` over the producer warpgroup (a barrier among its 128 threads).
__device__ __forceinline__ bool producer_any(bool v) { return bar_any_n<kBarProducer, 128>(v); }

// 128 rows of a [tokens][heads][kD] buffer into a swizzled tile by the 128 producer threads
// (rows at or past valid_rows zero-filled); a thread's rows share their swizzle phase.
template <int kD>
__device__ __forceinline__ void producer_load(uint32_t tile, const __nv_bfloat16* src, int64_t stride, int valid_rows,
                                              int ptid) {
  constexpr int kChunks = kD / 8;
  constexpr int kStep = 128 / kChunks;
  static_assert(kStep % 8 == 0, "rows of one thread share their swizzle phase");
  const int row0 = ptid / kChunks;
  const int col = (ptid % kChunks) * 8;
  const uint32_t dst = tile + sw128_offset<128>(row0, col);
  const __nv_bfloat16* from = src + row0 * stride + col;
  // Not unrolled: the producer lives on few registers and has time to spare.
#pragma unroll 1
  for (int i = 0; i < 128 / kStep; ++i) {
    const bool valid = row0 + i * kStep < valid_rows;
    cp_async16(dst + static_cast<uint32_t>(i * kStep * 128), valid ? from + i * kStep * stride : src, valid);
  }
}

template <int kD>
__device__ __forceinline__ void issue_pv(float (&o)[kD / 2], const uint32_t (&pa)[kWgKeys / 16][4], uint32_t vb) {
#pragma unroll
  for (int kk = 0; kk < kWgKeys / 16; ++kk) {
    if constexpr (kD == 128) {
      wgmma_m64n128k16_rs(o, pa[kk], desc_mn_major<kWgKeys>(vb, kk));
    } else {
      wgmma_m64n64k16_rs(o, pa[kk], desc_mn_major<kWgKeys>(vb, kk));
    }
  }
  wgmma_commit();
}


template <int kD>
__global__ void __launch_bounds__(kWsThreads, 1) attention_forward_sm90_ws_kernel(const AttnForwardParams p) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  (void)p;  // built for a target without wgmma: never selected there, fail loudly if run
  __trap();
#else
  using Smem = WsSmem<kD>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  // Swizzle atoms must start 1024-byte aligned (wgmma_sm90.cuh): round the base up.
  const uint32_t raw_addr = smem_addr(smem_raw);
  const uint32_t pad = ((raw_addr + kSw128AtomBytes - 1) & ~static_cast<uint32_t>(kSw128AtomBytes - 1)) - raw_addr;
  unsigned char* smem = smem_raw + pad;
  const uint32_t base = raw_addr + pad;
  const uint32_t s_q = base + Smem::Base::kQ;
  const uint32_t s_k = base + Smem::Base::kK;
  const uint32_t s_v = base + Smem::Base::kV;
  auto* s_mask = reinterpret_cast<uint64_t*>(smem + Smem::Base::kMask);
  auto* s_info = reinterpret_cast<StageInfo*>(smem + Smem::kInfo);
  const uint32_t full_bar = base + Smem::kFull;    // + 8 * slot
  const uint32_t empty_bar = base + Smem::kEmpty;  // + 8 * slot

  const int tid = static_cast<int>(threadIdx.x);
  if (tid == 0) {
    mbar_init(full_bar, 128);
    mbar_init(full_bar + 8, 128);
    mbar_init(empty_bar, kConsumerThreads);
    mbar_init(empty_bar + 8, kConsumerThreads);
  }
  __syncthreads();  // the only CTA-wide barrier: the mbarriers exist before anyone uses them

  const AttnWorkItem w = p.list.work[blockIdx.x];
  const AttnTile first = p.list.tiles[w.tile];  // tiles [w.tile, t_end) share the q rows and the outputs
  const int t_end = w.tile + max(1, w.num_tiles);
  const int hq = p.shape.num_q_heads;
  const int hkv = p.shape.num_kv_heads;
  const int qh = w.head;
  const int r0 = w.chunk * kWgRows;
  const int rows = min(kWgRows, first.q_len - r0);

  if (tid < 128) {
    // ---------------- producer warpgroup ----------------
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
    const int kvh = qh / (hq / hkv);
    const auto* k = static_cast<const __nv_bfloat16*>(p.k);
    const auto* v = static_cast<const __nv_bfloat16*>(p.v);
    const int64_t kv_stride = static_cast<int64_t>(hkv) * kD;
    auto kv_offset = [&](const AttnTile& x, int n) {
      return (static_cast<int64_t>(x.kv_begin + n * kWgKeys) * hkv + kvh) * kD;
    };
    // Uniform over the producer warpgroup. Partial: thread tid computes both mask words of
    // chunk row tid (masks[word * 128 + row], the layout the consumers read).
    auto classify = [&](const AttnTile& t, int n, uint64_t* masks) -> int {
      const int kv0 = n * kWgKeys;
      if (t.kind != TileKind::Partial) return classify_dense<kWgKeys>(t, kv0, r0, rows);
      const bool row_valid = tid < rows;
      bool any = false;
      bool full = true;
#pragma unroll 1
      for (int word = 0; word < kMaskWords; ++word) {
        const int kv_word = kv0 + 64 * word;
        uint64_t mask = 0;
        if (row_valid && kv_word < t.kv_len) {
          mask = row_key_mask(p.list.row_offsets, p.list.ranges, t.range_row_begin + r0 + tid, kv_word, t.kv_len);
        }
        masks[word * kWgRows + tid] = mask;
        any = any || mask != 0;
        full = full && (!row_valid || mask == valid_bits(min(max(t.kv_len - kv_word, 0), 64)));
      }
      if (!producer_any(any)) return kEmpty;
      const bool all_full = !producer_any(!full);
      return all_full && t.kv_len - kv0 >= kWgKeys ? kFull : kMasked;
    };
    // Advances (x, ti, n) to the first non-empty sub-tile at or after sub-tile n of tile ti;
    // ti == t_end when none is left.
    auto seek = [&](AttnTile& x, int& ti, int& n, uint64_t* masks) -> int {
      while (ti < t_end) {
        const int end = kv_sub_tile_end<kWgKeys>(x, r0, rows);
        for (; n < end; ++n) {
          const int c = classify(x, n, masks);
          if (c != kEmpty) return c;
        }
        if (++ti < t_end) x = p.list.tiles[ti];
        n = 0;
      }
      return kEmpty;
    };
    auto record = [&](int slot, const AttnTile& x, int n, int cls, bool more) {
      if (tid == 0) {
        StageInfo& info = s_info[slot];
        info.end = more ? 0 : 1;
        info.cls = cls;
        info.partial = x.kind == TileKind::Partial ? 1 : 0;
        info.causal = x.kind == TileKind::CausalDiagonal ? 1 : 0;
        info.kv0 = n * kWgKeys;
        info.kv_len = x.kv_len;
      }
    };

    AttnTile ct = first;
    int ti = w.tile;
    int n = 0;
    int cls = seek(ct, ti, n, s_mask);
    bool more = ti < t_end;
    record(0, ct, n, cls, more);
    const auto* q = static_cast<const __nv_bfloat16*>(p.q);
    producer_load<kD>(s_q, q + (static_cast<int64_t>(first.q_begin + r0) * hq + qh) * kD, static_cast<int64_t>(hq) * kD,
                      rows, tid);
    int64_t prev_off = 0;  // K/V offset and rows of the last sub-tile loaded (its V comes next)
    int prev_rows = 0;
    if (more) {
      prev_off = kv_offset(ct, n);
      prev_rows = min(kWgKeys, ct.kv_len - n * kWgKeys);
      producer_load<kD>(s_k, k + prev_off, kv_stride, prev_rows, tid);
    }
    cp_async_commit();
    int j = 0;
    while (more) {
      ++j;
      // Publish G_{j-1} as soon as it landed.
      cp_async_wait<0>();
      fence_proxy_async();
      mbar_arrive(full_bar + static_cast<uint32_t>(((j - 1) & 1) * 8));
      // Slot j & 1 is free once the consumers finished iteration j - 2.
      if (j >= 2) mbar_wait(empty_bar + static_cast<uint32_t>((j & 1) * 8), static_cast<uint32_t>(((j >> 1) - 1) & 1));
      ++n;
      cls = seek(ct, ti, n, s_mask + (j & 1) * kMaskWords * kWgRows);
      more = ti < t_end;
      record(j & 1, ct, n, cls, more);
      producer_load<kD>(s_v + static_cast<uint32_t>(((j - 1) & 1) * Smem::Base::kKvBytes), v + prev_off, kv_stride,
                        prev_rows, tid);
      if (more) {
        prev_off = kv_offset(ct, n);
        prev_rows = min(kWgKeys, ct.kv_len - n * kWgKeys);
        producer_load<kD>(s_k + static_cast<uint32_t>((j & 1) * Smem::Base::kKvBytes), k + prev_off, kv_stride,
                          prev_rows, tid);
      }
      cp_async_commit();
    }
    cp_async_wait<0>();
    fence_proxy_async();
    mbar_arrive(full_bar + static_cast<uint32_t>((j & 1) * 8));
    return;
  }

  // ---------------- consumer warpgroups ----------------
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs));
  const int ctid = tid - 128;
  const int cwg = ctid >> 7;               // consumer: q rows [64 cwg, 64 cwg + 64)
  const int warp_in_wg = (ctid >> 5) & 3;  // 16 rows of the warpgroup's 64
  const int lane = ctid & 31;
  const int g = lane >> 2;
  const int tq = lane & 3;
  const int out_begin = first.out_begin;
  const int lse_begin = first.lse_begin >= 0 ? first.lse_begin : first.out_begin;
  const float scale_log2 = p.shape.softmax_scale * kLog2e;

  // Accumulator fragments as in the other wgmma kernels: thread (warp_in_wg, g, tq) holds, for every
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
  auto cta_row = [&](int r) { return cwg * 64 + warp_in_wg * 16 + g + r * 8; };
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

  // Consumer 0 issues first: consumer 1 opens its barrier.
  if (cwg == 1) bar_arrive_consumers<kBarConsumer0>();

  // Iteration j: S_j = Q K_j^T with O += P_{j-1} V_{j-1} (not for j = 0), softmax of S_j
  // under the P V product. The first iteration is peeled (no wgmma in a data-dependent branch).
  auto step = [&]<bool kFirst>(int j, const StageInfo& info) {
    const uint32_t kb = s_k + static_cast<uint32_t>((j & 1) * Smem::Base::kKvBytes);
    const uint32_t vb_prev = s_v + static_cast<uint32_t>(((j - 1) & 1) * Smem::Base::kKvBytes);
    if (cwg == 0) {
      bar_sync_consumers<kBarConsumer0>();
    } else {
      bar_sync_consumers<kBarConsumer1>();
    }
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      wgmma_m64n128k16_ss(s, desc_k_major<kWgRows>(s_q, cwg * 64, kk), desc_k_major<kWgKeys>(kb, 0, kk), kk > 0 ? 1 : 0);
    }
    wgmma_commit();
    if constexpr (!kFirst) issue_pv<kD>(o, pa, vb_prev);
    if (cwg == 0) {
      bar_arrive_consumers<kBarConsumer1>();
    } else {
      bar_arrive_consumers<kBarConsumer0>();
    }

    if constexpr (!kFirst) {
      wgmma_wait<1>();  // S_j done; P_{j-1} V_{j-1} may still run
    } else {
      wgmma_wait<0>();
    }
    fence_regs(s);

    if (info.cls == kMasked) {
      if (info.partial != 0) {
        const uint64_t* masks = s_mask + (j & 1) * kMaskWords * kWgRows;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = cta_row(r);
          const uint64_t m0 = masks[row];
          const uint64_t m1 = masks[kWgRows + row];
#pragma unroll
          for (int c = 0; c < kWgKeys / 8; ++c) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const uint64_t word = c < 8 ? m0 : m1;  // 8 columns per c: words of 64 keys
              if (((word >> ((c & 7) * 8 + 2 * tq + e)) & 1U) == 0) s[4 * c + 2 * r + e] = -INFINITY;
            }
          }
        }
      } else {
        // Key kv0 + col is allowed for tile-local q row x iff col < kv_len - kv0 and, causal,
        // col < x + 1 - kv0: one bound per row.
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row_bound = info.causal != 0 ? min(info.kv_len, r0 + cta_row(r) + 1) : info.kv_len;
          const int bound = row_bound - info.kv0;
#pragma unroll
          for (int c = 0; c < kWgKeys / 8; ++c) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              if (c * 8 + 2 * tq + e >= bound) s[4 * c + 2 * r + e] = -INFINITY;
            }
          }
        }
      }
    }

    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int c = 0; c < kWgKeys / 8; ++c) mx = fmaxf(mx, fmaxf(s[4 * c + 2 * r], s[4 * c + 2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffU, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffU, mx, 2));
      const float m_new = fmaxf(m_row[r], mx * scale_log2);
      const float m_use = m_new == -INFINITY ? 0.0F : m_new;  // a row with no key yet: p = 0
      alpha[r] = exp2_ftz(m_row[r] - m_use);
      m_row[r] = m_new;
      float sum = 0.0F;
#pragma unroll
      for (int c = 0; c < kWgKeys / 8; ++c) {
        s[4 * c + 2 * r] = exp2_ftz(fmaf(s[4 * c + 2 * r], scale_log2, -m_use));
        s[4 * c + 2 * r + 1] = exp2_ftz(fmaf(s[4 * c + 2 * r + 1], scale_log2, -m_use));
        sum += s[4 * c + 2 * r] + s[4 * c + 2 * r + 1];
      }
      l_row[r] = l_row[r] * alpha[r] + sum;
    }

    if constexpr (!kFirst) {
      wgmma_wait<0>();  // P_{j-1} V_{j-1} done: O and pa are free
      fence_regs(o);
      fence_regs_u32(pa);
    }
    // K_j, V_{j-1}, the masks and the record of slot j & 1 are no longer read.
    mbar_arrive(empty_bar + static_cast<uint32_t>((j & 1) * 8));
#pragma unroll
    for (int c = 0; c < kD / 8; ++c) {
      o[4 * c] *= alpha[0];
      o[4 * c + 1] *= alpha[0];
      o[4 * c + 2] *= alpha[1];
      o[4 * c + 3] *= alpha[1];
    }
    // A-register fragment of m64k16 = accumulator blocks 2 kk and 2 kk + 1 of S, in order.
#pragma unroll
    for (int kk = 0; kk < kWgKeys / 16; ++kk) {
      pa[kk][0] = pack_bf16(s[8 * kk], s[8 * kk + 1]);
      pa[kk][1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
      pa[kk][2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
      pa[kk][3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
    }
  };

  mbar_wait(full_bar, 0);
  StageInfo info = s_info[0];
  if (info.end == 0) {
    step.template operator()<true>(0, info);
    int j = 1;
    for (;;) {
      mbar_wait(full_bar + static_cast<uint32_t>((j & 1) * 8), static_cast<uint32_t>((j >> 1) & 1));
      info = s_info[j & 1];
      if (info.end != 0) break;
      step.template operator()<false>(j, info);
      ++j;
    }
    // The last sub-tile's P V: its V came with the end record (group j, V slot (j - 1) & 1).
    wgmma_fence();
    issue_pv<kD>(o, pa, s_v + static_cast<uint32_t>(((j - 1) & 1) * Smem::Base::kKvBytes));
    wgmma_wait<0>();
    fence_regs(o);
    fence_regs_u32(pa);
  }
  // Consumer 1's last arrival on consumer 0's barrier (one more than consumer 0's waits in the loop).
  if (cwg == 0) bar_sync_consumers<kBarConsumer0>();

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
    for (int c = 0; c < kD / 8; ++c) {
      *reinterpret_cast<float2*>(o_row + c * 8 + 2 * tq) = make_float2(o[4 * c + 2 * r] * inv, o[4 * c + 2 * r + 1] * inv);
    }
    if (tq == 0) {
      p.lse[static_cast<int64_t>(lse_begin + r0 + row) * hq + qh] = l > 0.0F ? (m_row[r] + log2f(l)) * kLn2 : -INFINITY;
    }
  }
#endif
}

template <int kD>
void launch_forward_sm90_ws(const AttnForwardParams& p, cudaStream_t stream) {
  constexpr int kSmem = WsSmem<kD>::kAlloc;
  static const bool ready =
      (allow_shared_memory("attention_forward_sm90_ws", attention_forward_sm90_ws_kernel<kD>, kSmem), true);
  (void)ready;
  attention_forward_sm90_ws_kernel<kD><<<p.list.num_work, kWsThreads, kSmem, stream>>>(p);
}

}  // namespace

void attention_forward_wgmma_ws(const AttnForwardParams& params, cudaStream_t stream) {
  launch_for_head_dim("attention_forward_sm90_ws", params.shape,
                      [&]<int kD>() { launch_forward_sm90_ws<kD>(params, stream); });
}

}  // namespace dcp::cuda::detail
