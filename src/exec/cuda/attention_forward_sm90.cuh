// attention_forward_sm90.cuh — pieces shared by the Hopper (sm_90a) forward kernels
// (attention_forward_sm90.cu: the basic kernel; attention_forward_sm90_ws.cu: the
// warp-specialised one): CTA shape, the basic kernel's shared-memory layout, the online-softmax
// pieces, the P V issue, and the TMA parameters of the warp-specialised kernel. Tile loaders:
// wgmma_sm90.cuh.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "attention_common.cuh"
#include "dcp/detail/attention_cuda.h"
#include "sync_sm90.cuh"
#include "tensor_map.h"
#include "wgmma_sm90.cuh"

namespace dcp::cuda::detail {

inline constexpr int kWgThreads = 256;                 // 2 warpgroups
inline constexpr int kWgRows = kAttnForwardChunkRows;  // q rows per CTA
inline constexpr int kWgKeys = 128;                    // keys per sub-tile
inline constexpr int kMaskWords = kWgKeys / 64;        // uint64 mask words per row and sub-tile
static_assert(kWgRows == 128 && kWgThreads == kWgRows * kMaskWords, "one thread per (row, mask word)");

template <int kD>
struct WgSmem {
  static constexpr int kQBytes = kWgRows * kD * 2;
  static constexpr int kKvBytes = kWgKeys * kD * 2;   // one K or V sub-tile
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kQBytes;             // 2 buffers
  static constexpr int kV = kK + 2 * kKvBytes;        // 2 buffers
  static constexpr int kMask = kV + 2 * kKvBytes;     // [buffer][word][row] uint64
  static constexpr int kBytes = kMask + 2 * kMaskWords * kWgRows * 8;
  static constexpr int kAlloc = kBytes + kSw128AtomBytes;  // slack to align the base to 1024
  static_assert(kQBytes % kSw128AtomBytes == 0 && kKvBytes % kSw128AtomBytes == 0, "tiles stay atom aligned");
};

// ---- Per-thread pieces of the forward's online softmax (both Hopper kernels) ----------------
// A thread of warpgroup wg holds rows row(0) and row(1) = 64 wg + 16 warp_in_wg + g (+ 8) of the
// CTA's 128 q rows, and in every accumulator (wgmma register fragment, m64nN f32), for every
// 8-column block j, acc[4 j + e] = element (row(e >> 1), 8 j + 2 tq + (e & 1)).
struct FwThread {
  int wg, warp_in_wg, g, tq;
  __device__ __forceinline__ int row(int r) const { return wg * 64 + warp_in_wg * 16 + g + r * 8; }
};

// Where a work item's outputs go: row `out` (O) and `lse` (LSE) of CTA row 0, q head qh, valid
// CTA rows [0, rows).
struct FwOutput {
  int64_t out, lse;
  int qh, rows;
};

// Online-softmax state from the partial already in the outputs (work item with accumulate):
// O_old = sum exp(s - LSE_old) v is the state m = LSE_old (log2 units), l = 1, o = O_old.
// fw_load_partial_state sets m and l, fw_load_partial_o then o (rows whose m stays -inf have no
// partial and keep o); fw_load_partial does both.
__device__ __forceinline__ void fw_load_partial_state(const AttnForwardParams& p, const FwOutput& out, const FwThread& th,
                                                      float (&m_row)[2], float (&l_row)[2]) {
  const int hq = p.shape.num_q_heads;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = th.row(r);
    if (row >= out.rows) continue;
    const float lse_old = p.lse[(out.lse + row) * hq + out.qh];
    if (lse_old == -INFINITY) continue;
    m_row[r] = lse_old * kLog2e;
    l_row[r] = th.tq == 0 ? 1.0F : 0.0F;  // l is summed over the 4 lanes of a row at the end
  }
}

template <int kD>
__device__ __forceinline__ void fw_load_partial_o(const AttnForwardParams& p, const FwOutput& out, const FwThread& th,
                                                  const bool (&has)[2], float (&o)[kD / 2]) {
  const int hq = p.shape.num_q_heads;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (!has[r]) continue;
    const float* o_row = p.o + ((out.out + th.row(r)) * hq + out.qh) * kD;
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
      const float2 v2 = *reinterpret_cast<const float2*>(o_row + j * 8 + 2 * th.tq);
      o[4 * j + 2 * r] = v2.x;
      o[4 * j + 2 * r + 1] = v2.y;
    }
  }
}

template <int kD>
__device__ __forceinline__ void fw_load_partial(const AttnForwardParams& p, const FwOutput& out, const FwThread& th,
                                                float (&o)[kD / 2], float (&m_row)[2], float (&l_row)[2]) {
  fw_load_partial_state(p, out, th, m_row, l_row);
  const bool has[2] = {m_row[0] != -INFINITY, m_row[1] != -INFINITY};
  fw_load_partial_o<kD>(p, out, th, has, o);
}

// Masked sub-tile (keys kv0 .. kv0 + 127 of a tile of kind `kind` with kv_len keys, CTA rows from
// tile row r0): disallowed scores become -inf. Partial: bits from `masks` ([word][row],
// classify_partial's layout). A thread holds columns 8 j + 2 tq + b (j < 16, b < 2) of two rows,
// so each row's word is shifted once by 2 tq and every element then tests a constant bit; a dense
// kind allows a prefix of the keys per row, so each element is one comparison with a per-row limit.
// The kernels pass kind and kv_len from their ring's record in shared memory, which keeps a global
// load of the tile off the consumers' critical path.
__device__ __forceinline__ void fw_mask_scores(float (&s)[kWgKeys / 2], TileKind kind, int kv_len, const uint64_t* masks,
                                               int kv0, int r0, const FwThread& th) {
  if (kind == TileKind::Partial) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = th.row(r);
#pragma unroll
      for (int w = 0; w < kMaskWords; ++w) {
        const uint64_t bits = masks[w * kWgRows + row] >> (2 * th.tq);
        const uint32_t half[2] = {static_cast<uint32_t>(bits), static_cast<uint32_t>(bits >> 32)};
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
#pragma unroll
          for (int b = 0; b < 2; ++b) {
            if (((half[jj >> 2] >> (8 * (jj & 3) + b)) & 1U) == 0) s[4 * (8 * w + jj) + 2 * r + b] = -INFINITY;
          }
        }
      }
    }
  } else {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int q_row = r0 + th.row(r);
      const int keys = kind == TileKind::CausalDiagonal ? min(kv_len, q_row + 1) : kv_len;
      const int limit = keys - kv0 - 2 * th.tq;  // allowed: 8 j + b < limit
#pragma unroll
      for (int j = 0; j < kWgKeys / 8; ++j) {
#pragma unroll
        for (int b = 0; b < 2; ++b) {
          if (8 * j + b >= limit) s[4 * j + 2 * r + b] = -INFINITY;
        }
      }
    }
  }
}

// One sub-tile's softmax in the log2 domain (scale folded into exp2): s becomes P, the running
// max m and sum l move on, alpha = exp2(m_old - m_new) is the factor O must be rescaled by.
__device__ __forceinline__ void fw_softmax(float (&s)[kWgKeys / 2], float (&m_row)[2], float (&l_row)[2], float (&alpha)[2],
                                           float scale_log2) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < kWgKeys / 8; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffU, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffU, mx, 2));
    const float m_new = fmaxf(m_row[r], mx * scale_log2);
    const float m_use = m_new == -INFINITY ? 0.0F : m_new;  // a row with no key yet: p = 0
    alpha[r] = exp2_ftz(m_row[r] - m_use);
    m_row[r] = m_new;
    float sum = 0.0F;
#pragma unroll
    for (int j = 0; j < kWgKeys / 8; ++j) {
      s[4 * j + 2 * r] = exp2_ftz(fmaf(s[4 * j + 2 * r], scale_log2, -m_use));
      s[4 * j + 2 * r + 1] = exp2_ftz(fmaf(s[4 * j + 2 * r + 1], scale_log2, -m_use));
      sum += s[4 * j + 2 * r] + s[4 * j + 2 * r + 1];
    }
    l_row[r] = l_row[r] * alpha[r] + sum;
  }
}

template <int kD>
__device__ __forceinline__ void fw_rescale(float (&o)[kD / 2], const float (&alpha)[2]) {
#pragma unroll
  for (int j = 0; j < kD / 8; ++j) {
    o[4 * j] *= alpha[0];
    o[4 * j + 1] *= alpha[0];
    o[4 * j + 2] *= alpha[1];
    o[4 * j + 3] *= alpha[1];
  }
}

// P as the A operand of O += P V: the m64k16 A-register fragment of k step kk (rows g, g + 8;
// a[0] = (g, 2 tq ..+1), a[1] = (g + 8, 2 tq ..), a[2] = (g, 8 + 2 tq ..), a[3] = (g + 8, 8 + 2 tq ..))
// is accumulator blocks 2 kk and 2 kk + 1 of S, in order.
__device__ __forceinline__ void fw_pack_p(uint32_t (&pa)[kWgKeys / 16][4], const float (&s)[kWgKeys / 2]) {
#pragma unroll
  for (int kk = 0; kk < kWgKeys / 16; ++kk) {
    pa[kk][0] = pack_bf16(s[8 * kk], s[8 * kk + 1]);
    pa[kk][1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
    pa[kk][2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
    pa[kk][3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

// O / l and LSE = (m + log2 l) ln 2 of the valid rows; a row that saw no key: O = 0, LSE = -inf.
// 1 / l and log2 l by the special-function unit (MUFU.RCP, MUFU.LG2: errors about 2^-22, far
// below the bf16 inputs' rounding, 2^-8) instead of the IEEE division and log2f, whose slow path
// and polynomial cost each warp about 40 instructions per row pair at every item's end.
template <int kD>
__device__ __forceinline__ void fw_store_output(const AttnForwardParams& p, const FwOutput& out, const FwThread& th,
                                                const float (&o)[kD / 2], const float (&m_row)[2], const float (&l_row)[2]) {
  const int hq = p.shape.num_q_heads;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = l_row[r];
    l += __shfl_xor_sync(0xffffffffU, l, 1);
    l += __shfl_xor_sync(0xffffffffU, l, 2);
    const int row = th.row(r);
    if (row >= out.rows) continue;
    const float inv = l > 0.0F ? __fdividef(1.0F, l) : 0.0F;
    float* o_row = p.o + ((out.out + row) * hq + out.qh) * kD;
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
      *reinterpret_cast<float2*>(o_row + j * 8 + 2 * th.tq) = make_float2(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
    }
    if (th.tq == 0) p.lse[(out.lse + row) * hq + out.qh] = l > 0.0F ? (m_row[r] + __log2f(l)) * kLn2 : -INFINITY;
  }
}

// Class of 128-key sub-tile n of tile x for the q rows [r0, r0 + rows) of a producer warpgroup's
// item (the forward and the deterministic backward's dQ pass), uniform over the warpgroup. A
// Partial sub-tile is classified by the host's cells when the list has them, and only a Masked one
// gets its row masks (thread ptid computes both 64-key words of q row ptid into m); without cells,
// by votes over those masks on named barrier kBar of the 128 producer threads. The masks stay in
// registers (producer_store_masks writes them into a ring slot): their global loads of the rows'
// ranges then run before the producer waits for the slot, not after.
template <int kBar>
__device__ __forceinline__ int producer_classify(const AttnTileList& list, const AttnTile& x, int n, int r0, int rows,
                                                 int ptid, uint64_t (&m)[kMaskWords]) {
  const int kv0 = n * kWgKeys;
  if (x.kind != TileKind::Partial) return classify_dense<kWgKeys>(x, kv0, r0, rows);
  const bool cells = list.cells != nullptr && x.cells_begin >= 0;
  if (cells) {
    const int cls = classify_from_cells<kWgRows, kWgKeys>(list.cells, x, r0, rows, kv0);
    if (cls != kMasked) return cls;
  }
  const bool row_valid = ptid < rows;
  bool any = false;
  bool full = true;
#pragma unroll
  for (int word = 0; word < kMaskWords; ++word) {
    const int kv_word = kv0 + 64 * word;
    m[word] = 0;
    if (row_valid && kv_word < x.kv_len) {
      m[word] = row_key_mask(list.row_offsets, list.ranges, x.range_row_begin + r0 + ptid, kv_word, x.kv_len);
    }
    any = any || m[word] != 0;
    full = full && (!row_valid || m[word] == valid_bits(min(max(x.kv_len - kv_word, 0), 64)));
  }
  if (cells) return kMasked;
  if (!bar_any_n<kBar, 128>(any)) return kEmpty;
  const bool all_full = !bar_any_n<kBar, 128>(!full);
  return all_full && x.kv_len - kv0 >= kWgKeys ? kFull : kMasked;
}

// A Masked Partial sub-tile's row masks (producer_classify's m) into a ring slot's masks[word][row].
__device__ __forceinline__ void producer_store_masks(uint64_t* masks, const uint64_t (&m)[kMaskWords], int ptid) {
#pragma unroll
  for (int word = 0; word < kMaskWords; ++word) masks[word * kWgRows + ptid] = m[word];
}

// Keeps the packed P registers (the A operand of an in-flight wgmma) alive and unmodified until
// after the wait that ends their read: the compiler sees the issue asm only as a reader.
template <int kN>
__device__ __forceinline__ void fence_regs_u32(uint32_t (&r)[kN][4]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    asm volatile("" : "+r"(r[i][0]), "+r"(r[i][1]), "+r"(r[i][2]), "+r"(r[i][3])::"memory");
  }
}

// O += P V over one sub-tile; fresh: O = P V (O's registers hold nothing of the item yet and are
// not read, so an item's start needs neither zeroed nor rescaled accumulators).
template <int kD>
__device__ __forceinline__ void issue_pv(float (&o)[kD / 2], const uint32_t (&pa)[kWgKeys / 16][4], uint32_t vb,
                                         bool fresh = false) {
#pragma unroll
  for (int kk = 0; kk < kWgKeys / 16; ++kk) {
    const int scale_d = kk == 0 && fresh ? 0 : 1;
    if constexpr (kD == 128) {
      wgmma_m64n128k16_rs(o, pa[kk], desc_mn_major<kWgKeys>(vb, kk), scale_d);
    } else {
      wgmma_m64n64k16_rs(o, pa[kk], desc_mn_major<kWgKeys>(vb, kk), scale_d);
    }
  }
  wgmma_commit();
}

// Parameters of the TMA-fed forward kernel (warp-specialised): the caller's, and
// the K and V tensor maps (a __grid_constant__ kernel parameter, so that TMA reads the maps
// from parameter space).
struct FwTmaParams {
  AttnForwardParams p;
  CUtensorMap k_map;  // [kv_rows][num_kv_heads x D] bf16, boxes of 128 rows x 64 columns
  CUtensorMap v_map;
  CUtensorMap q_map;  // [q_rows][num_q_heads x D] bf16, boxes of 128 rows x 64 columns
  int32_t tma_kv;     // 1: k_map and v_map are valid (AttnForwardParams::kv_rows known)
  int32_t tma_q;      // 1: q_map is valid (AttnForwardParams::q_rows known)
};

// Host: the maps of `p` (tma_kv / tma_q = 0 when the rows are unknown or the buffers cannot be
// mapped).
inline FwTmaParams forward_tma_params(const AttnForwardParams& p, int head_dim, const char* name) {
  FwTmaParams fp{};
  fp.p = p;
  const int64_t row_elems = int64_t{p.shape.num_kv_heads} * head_dim;
  const bool tma = p.kv_rows > 0 &&
                   encode_tensor_map_2d(fp.k_map, name, TensorElem::Bf16, p.k, row_elems, p.kv_rows, 64, kWgKeys) &&
                   encode_tensor_map_2d(fp.v_map, name, TensorElem::Bf16, p.v, row_elems, p.kv_rows, 64, kWgKeys);
  fp.tma_kv = tma ? 1 : 0;
  const int64_t q_row_elems = int64_t{p.shape.num_q_heads} * head_dim;
  fp.tma_q = p.q_rows > 0 && encode_tensor_map_2d(fp.q_map, name, TensorElem::Bf16, p.q, q_row_elems, p.q_rows, 64, kWgRows)
                 ? 1
                 : 0;
  return fp;
}

}  // namespace dcp::cuda::detail
