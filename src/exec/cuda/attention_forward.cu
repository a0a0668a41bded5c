// attention_forward.cu — forward attention over a tile list, one launch (see dcp/detail/attention_cuda.h
// for the math and layouts).
//
// Roles inside one CTA (kFwdRows = 128 q rows x one q head, 4 warps x 32 rows: each K/V
// fragment read from shared memory feeds two m16 tiles, halving shared-memory and L2 traffic
// per FLOP against 16 rows per warp):
//   load:    cp.async of the Q tile once, then K/V sub-tiles (64 keys) double-buffered; the next
//            non-empty sub-tile is classified (empty / full / masked) before its load is issued,
//            so empty sub-tiles cost neither bytes nor FLOPs.
//   compute: S = Q K^T (mma.sync m16n8k16), mask (masked sub-tiles only), online softmax in the
//            log2 domain, O += P V with P re-packed from accumulators to A fragments.
//   finish:  O / l and LSE = (m + log2 l) ln 2 straight from registers; rows with no key get
//            O = 0, LSE = -inf.
// Per 128x64 sub-tile: 4 * 128 * 64 * D FLOPs of MMA; bytes from L2/HBM: 2 * 64 * D * 2 (K and V),
// i.e. 64 FLOP per byte of L2 traffic at D = 128; shared memory: each warp reads K and V once.
// The Hopper versions (attention_forward_sm90.cu, attention_forward_sm90_ws.cu) keep this
// interface: same args, work list and finish; attention_forward() at the end of this file picks
// the route.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "attention_common.cuh"
#include "dcp/detail/attention_cuda.h"
#include "dcp/error.h"

namespace dcp::cuda {
namespace detail {

inline constexpr int kMt = 2;                 // m16 tiles per warp
inline constexpr int kFwdRows = 64 * kMt;     // q rows per CTA (== kAttnForwardChunkRows)
static_assert(kFwdRows == kAttnForwardChunkRows, "work items and kernel disagree on chunk rows");

template <int kD>
struct FwdSmem {
  static constexpr int kTileBytes = kRows * kD * 2;   // one 64-row tile
  static constexpr int kQ = 0;                        // kMt tiles
  static constexpr int kK = kQ + kMt * kTileBytes;    // 2 buffers
  static constexpr int kV = kK + 2 * kTileBytes;      // 2 buffers
  static constexpr int kMask = kV + 2 * kTileBytes;   // 2 x kFwdRows uint64
  static constexpr int kBytes = kMask + 2 * kFwdRows * 8;
};

template <int kD>
__global__ void __launch_bounds__(kThreads) attention_forward_kernel(const AttnForwardParams p) {
  using Smem = FwdSmem<kD>;
  extern __shared__ __align__(128) unsigned char smem[];
  const AttnWorkItem w = p.list.work[blockIdx.x];
  // Tiles [w.tile, t_end) share the q rows and the outputs; t is the one being iterated.
  AttnTile ct = p.list.tiles[w.tile];
  const int t_end = w.tile + max(1, w.num_tiles);
  const int out_begin = ct.out_begin;
  const int lse_begin = ct.lse_begin >= 0 ? ct.lse_begin : ct.out_begin;
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int tq = lane & 3;
  const int hq = p.shape.num_q_heads;
  const int hkv = p.shape.num_kv_heads;
  const int qh = w.head;
  const int kvh = qh / (hq / hkv);
  const int r0 = w.chunk * kFwdRows;
  const int rows = min(kFwdRows, ct.q_len - r0);
  const float scale_log2 = p.shape.softmax_scale * kLog2e;

  const uint32_t s_q = smem_addr(smem + Smem::kQ);
  const uint32_t s_k = smem_addr(smem + Smem::kK);
  const uint32_t s_v = smem_addr(smem + Smem::kV);
  auto* s_mask = reinterpret_cast<uint64_t*>(smem + Smem::kMask);

  const auto* q = static_cast<const __nv_bfloat16*>(p.q);
  const auto* k = static_cast<const __nv_bfloat16*>(p.k);
  const auto* v = static_cast<const __nv_bfloat16*>(p.v);
  const int64_t q_stride = static_cast<int64_t>(hq) * kD;
  const int64_t kv_stride = static_cast<int64_t>(hkv) * kD;
  const __nv_bfloat16* q_base = q + (static_cast<int64_t>(ct.q_begin + r0) * hq + qh) * kD;
  auto k_base_of = [&](const AttnTile& x) { return k + (static_cast<int64_t>(x.kv_begin) * hkv + kvh) * kD; };
  auto v_base_of = [&](const AttnTile& x) { return v + (static_cast<int64_t>(x.kv_begin) * hkv + kvh) * kD; };

#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
    const int tile_rows = rows - mt * kRows;  // <= 0: all zero-filled, read nothing
    load_tile_async<kD>(s_q + static_cast<uint32_t>(mt * Smem::kTileBytes),
                        tile_rows > 0 ? q_base + mt * kRows * q_stride : q_base, q_stride, tile_rows);
  }
  cp_async_commit();

  auto sub_end_of = [&](const AttnTile& x) { return kv_sub_tile_end<kRows>(x, r0, rows); };

  // Uniform across the CTA (Partial uses block-wide votes).
  static_assert(kFwdRows == kThreads, "one thread per q row");
  auto classify = [&](const AttnTile& t, int n, int buf) -> int {
    if (t.kind != TileKind::Partial) return classify_dense<kRows>(t, n * kRows, r0, rows);
    return classify_partial<1>(t, p.list.row_offsets, p.list.ranges, n * kRows, r0, rows, s_mask + buf * kFwdRows);
  };

  // Advances (x, ti, n) to the first non-empty sub-tile at or after sub-tile n of tile ti;
  // ti == t_end when none is left.
  auto seek = [&](AttnTile& x, int& ti, int& n, int buf) -> int {
    while (ti < t_end) {
      const int end = sub_end_of(x);
      for (; n < end; ++n) {
        const int c = classify(x, n, buf);
        if (c != kEmpty) return c;
      }
      if (++ti < t_end) x = p.list.tiles[ti];
      n = 0;
    }
    return kEmpty;
  };
  int ti = w.tile;
  int n = 0;
  int cls = seek(ct, ti, n, 0);
  int buf = 0;
  if (ti < t_end) {
    const int kv_rows = min(kRows, ct.kv_len - n * kRows);
    load_tile_async<kD>(s_k, k_base_of(ct) + n * kRows * kv_stride, kv_stride, kv_rows);
    load_tile_async<kD>(s_v, v_base_of(ct) + n * kRows * kv_stride, kv_stride, kv_rows);
  }
  cp_async_commit();
  cp_async_wait<1>();
  __syncthreads();

  // Warp rows: warp * 32 + mt * 16 + (g, g + 8); the Q tile of m tile mt is s_q + mt * tile.
  float o[kMt][kD / 8][4];
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) o[mt][j][0] = o[mt][j][1] = o[mt][j][2] = o[mt][j][3] = 0.0F;
  }
  float m_row[kMt][2];
  float l_row[kMt][2];
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
    m_row[mt][0] = m_row[mt][1] = -INFINITY;
    l_row[mt][0] = l_row[mt][1] = 0.0F;
  }
  // Row index inside the CTA of m tile mt, accumulator half r.
  auto cta_row = [&](int mt, int r) { return warp * 16 * kMt + mt * 16 + g + r * 8; };
  const int64_t o_stride = static_cast<int64_t>(hq) * kD;
  if (w.accumulate != 0) {
    // The partial already there: O_old = sum exp(s - LSE_old) v, i.e. the online-softmax state
    // m = LSE_old (log2 units), l = 1, o = O_old.
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = cta_row(mt, r);
        if (row >= rows) continue;
        const float lse_old = p.lse[static_cast<int64_t>(lse_begin + r0 + row) * hq + qh];
        if (lse_old == -INFINITY) continue;
        m_row[mt][r] = lse_old * kLog2e;
        l_row[mt][r] = tq == 0 ? 1.0F : 0.0F;  // l is summed over the 4 lanes of a row at the end
        const float* o_row = p.o + static_cast<int64_t>(out_begin + r0 + row) * o_stride + static_cast<int64_t>(qh) * kD;
#pragma unroll
        for (int j = 0; j < kD / 8; ++j) {
          const float2 v2 = *reinterpret_cast<const float2*>(o_row + j * 8 + 2 * tq);
          o[mt][j][2 * r] = v2.x;
          o[mt][j][2 * r + 1] = v2.y;
        }
      }
    }
  }
  auto q_tile_addr = [&](int mt) { return s_q + static_cast<uint32_t>(((warp * kMt + mt) / 4) * Smem::kTileBytes); };
  auto q_tile_row = [&](int mt) { return ((warp * kMt + mt) % 4) * 16; };

  while (ti < t_end) {
    AttnTile nt = ct;
    int nti = ti;
    int nn = n + 1;
    const int ncls = seek(nt, nti, nn, buf ^ 1);
    if (nti < t_end) {
      const int kv_rows = min(kRows, nt.kv_len - nn * kRows);
      const uint32_t off = static_cast<uint32_t>((buf ^ 1) * Smem::kTileBytes);
      load_tile_async<kD>(s_k + off, k_base_of(nt) + nn * kRows * kv_stride, kv_stride, kv_rows);
      load_tile_async<kD>(s_v + off, v_base_of(nt) + nn * kRows * kv_stride, kv_stride, kv_rows);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();

    const uint32_t kb = s_k + static_cast<uint32_t>(buf * Smem::kTileBytes);
    const uint32_t vb = s_v + static_cast<uint32_t>(buf * Smem::kTileBytes);
    float s[kMt][8][4];
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
      for (int j = 0; j < 8; ++j) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.0F;
    }
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      uint32_t qa[kMt][4];
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt) load_a<kD>(qa[mt], q_tile_addr(mt), q_tile_row(mt), kk * 16);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t b[4];
        load_b_nk<kD>(b, kb, np * 16, kk * 16);
#pragma unroll
        for (int mt = 0; mt < kMt; ++mt) {
          mma(s[mt][2 * np], qa[mt], b[0], b[1]);
          mma(s[mt][2 * np + 1], qa[mt], b[2], b[3]);
        }
      }
    }

    if (cls == kMasked) {
      const int kv0 = n * kRows;
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int row = cta_row(mt, e >> 1);
            const int col = j * 8 + 2 * tq + (e & 1);
            const bool ok = ct.kind == TileKind::Partial ? ((s_mask[buf * kFwdRows + row] >> col) & 1U) != 0
                                                         : dense_key_allowed(ct.kind, kv0 + col, ct.kv_len, r0 + row);
            if (!ok) s[mt][j][e] = -INFINITY;
          }
        }
      }
    }

#pragma unroll
    for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < 8; ++j) mx = fmaxf(mx, fmaxf(s[mt][j][2 * r], s[mt][j][2 * r + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffU, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffU, mx, 2));
        const float m_new = fmaxf(m_row[mt][r], mx * scale_log2);
        const float m_use = m_new == -INFINITY ? 0.0F : m_new;
        const float alpha = exp2f(m_row[mt][r] - m_use);
        m_row[mt][r] = m_new;
        float sum = 0.0F;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          s[mt][j][2 * r] = exp2f(fmaf(s[mt][j][2 * r], scale_log2, -m_use));
          s[mt][j][2 * r + 1] = exp2f(fmaf(s[mt][j][2 * r + 1], scale_log2, -m_use));
          sum += s[mt][j][2 * r] + s[mt][j][2 * r + 1];
        }
        l_row[mt][r] = l_row[mt][r] * alpha + sum;
#pragma unroll
        for (int j = 0; j < kD / 8; ++j) {
          o[mt][j][2 * r] *= alpha;
          o[mt][j][2 * r + 1] *= alpha;
        }
      }
    }

#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      uint32_t a[kMt][4];
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt) acc_to_a(a[mt], s[mt][2 * kk], s[mt][2 * kk + 1]);
#pragma unroll
      for (int dp = 0; dp < kD / 16; ++dp) {
        uint32_t b[4];
        load_b_kn<kD>(b, vb, kk * 16, dp * 16);
#pragma unroll
        for (int mt = 0; mt < kMt; ++mt) {
          mma(o[mt][2 * dp], a[mt], b[0], b[1]);
          mma(o[mt][2 * dp + 1], a[mt], b[2], b[3]);
        }
      }
    }
    __syncthreads();
    ct = nt;
    ti = nti;
    n = nn;
    cls = ncls;
    buf ^= 1;
  }
  cp_async_wait<0>();

#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = l_row[mt][r];
      l += __shfl_xor_sync(0xffffffffU, l, 1);
      l += __shfl_xor_sync(0xffffffffU, l, 2);
      const int row = cta_row(mt, r);
      if (row >= rows) continue;
      const float inv = l > 0.0F ? 1.0F / l : 0.0F;
      const int64_t out_row = out_begin + r0 + row;
      float* o_row = p.o + out_row * o_stride + static_cast<int64_t>(qh) * kD;
#pragma unroll
      for (int j = 0; j < kD / 8; ++j) {
        *reinterpret_cast<float2*>(o_row + j * 8 + 2 * tq) =
            make_float2(o[mt][j][2 * r] * inv, o[mt][j][2 * r + 1] * inv);
      }
      if (tq == 0) p.lse[static_cast<int64_t>(lse_begin + r0 + row) * hq + qh] = l > 0.0F ? (m_row[mt][r] + log2f(l)) * kLn2 : -INFINITY;
    }
  }
}

template <int kD>
void launch_forward(const AttnForwardParams& p, cudaStream_t stream) {
  constexpr int kSmem = FwdSmem<kD>::kBytes;
  allow_shared_memory("attention_forward", attention_forward_kernel<kD>, kSmem);
  attention_forward_kernel<kD><<<p.list.num_work, kThreads, kSmem, stream>>>(p);
}

void attention_forward_mma(const AttnForwardParams& params, cudaStream_t stream) {
  launch_for_head_dim("attention_forward", params.shape, [&]<int kD>() { launch_forward<kD>(params, stream); });
}

namespace {

bool device_is_sm90() {
  constexpr int kMaxDevices = 64;
  static int cached[kMaxDevices] = {};  // 0 unknown, 1 yes, 2 no
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0) return false;
  if (dev < kMaxDevices && cached[dev] != 0) return cached[dev] == 1;
  int major = 0, minor = 0;
  const bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess;
  const bool yes = ok && major == 9 && minor == 0;
  if (dev < kMaxDevices) cached[dev] = yes ? 1 : 2;
  return yes;
}

}  // namespace

AttnKernelRoute resolve_route(AttnKernelRoute requested, int head_dim, const char* who) {
  AttnKernelRoute route = requested;
  const bool head_dim_ok = head_dim == 64 || head_dim == 128;
  if (route == AttnKernelRoute::Auto) route = device_is_sm90() && head_dim_ok ? AttnKernelRoute::Wgmma : AttnKernelRoute::Mma;
  if (route != AttnKernelRoute::Mma && !device_is_sm90())
    raise(ErrorKind::Unsupported, std::string(who) + ": the wgmma routes need an sm_90 (Hopper) device");
  return route;
}

}  // namespace detail

AttnKernelRoute attention_forward_route(const AttnForwardParams& params) {
  return detail::resolve_route(params.route, params.shape.head_dim, "attention_forward");
}

void attention_forward(const AttnForwardParams& params, cudaStream_t stream) {
  if (params.list.num_work == 0) return;
  switch (attention_forward_route(params)) {
    case AttnKernelRoute::Wgmma: detail::attention_forward_wgmma_ws(params, stream); break;
    case AttnKernelRoute::WgmmaBasic: detail::attention_forward_wgmma_basic(params, stream); break;
    default: detail::attention_forward_mma(params, stream); break;
  }
}

}  // namespace dcp::cuda
