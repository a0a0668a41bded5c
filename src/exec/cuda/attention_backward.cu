// attention_backward.cu — backward attention over a tile list, one launch (math and layouts in
// dcp/detail/attention_cuda.h).
//
// Roles inside one CTA (kBwdKeys = 128 keys x one kv head, 8 warps x 16 keys; 128 keys per CTA
// halve the dQ atomics and the Q/dO traffic per FLOP against 64):
//   load:    K and V of the CTA's keys once; then, for each q head of the group and each non-empty
//            64-row q sub-tile, Q, dO, LSE and Delta double-buffered with cp.async (classified
//            before the load is issued, as in the forward).
//   compute: S^T = K Q^T, P^T = exp2(S^T scale log2e - LSE log2e), dP^T = V dO^T,
//            dS^T = P^T (dP^T - Delta), dV += P^T dO, dK += dS^T Q (all from registers), then
//            dS^T goes through shared memory for dQ = dS K, which each warp adds (16 rows x
//            D/2 columns) to global memory with fp32 atomics.
//   finish:  dK * scale and dV atomically added to the outputs (other tiles may share the keys).
// The Hopper versions (attention_backward_sm90.cu: route WgmmaBasic; attention_backward_sm90_ws.cu:
// route Wgmma) keep this interface; attention_backward() at the end of this file picks the route
// (AttnBackwardParams::route).
// Per 128-key x 64-row step: 10 * 128 * 64 * D FLOPs of MMA (2.5x the forward's 4); 64 * D dQ
// atomics.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "attention_common.cuh"
#include "dcp/detail/attention_cuda.h"
#include "dcp/detail/dq_units.h"
#include "dcp/error.h"

namespace dcp::cuda {
namespace detail {

inline constexpr int kBwdThreads = 256;                // 8 warps
inline constexpr int kBwdKeys = 128;                    // keys per CTA (== kAttnBackwardChunkRows)
static_assert(kBwdKeys == kAttnBackwardChunkRows, "work items and kernel disagree on chunk keys");

template <int kD>
struct BwdSmem {
  static constexpr int kTileBytes = kRows * kD * 2;     // one 64-row tile
  static constexpr int kK = 0;                          // 2 tiles (128 keys)
  static constexpr int kV = kK + 2 * kTileBytes;        // 2 tiles
  static constexpr int kQ = kV + 2 * kTileBytes;        // 2 buffers
  static constexpr int kDo = kQ + 2 * kTileBytes;       // 2 buffers
  static constexpr int kDs = kDo + 2 * kTileBytes;      // [128 keys][64 q] bf16
  static constexpr int kLse = kDs + kBwdKeys * kRows * 2;  // 2 x 64 floats
  static constexpr int kDelta = kLse + 2 * kRows * 4;      // 2 x 64 floats
  static constexpr int kMask = kDelta + 2 * kRows * 4;     // 2 buffers x 64 rows x 2 uint64
  static constexpr int kBytes = kMask + 2 * kRows * 16;
};

template <int kD>
__global__ void __launch_bounds__(kBwdThreads, 1) attention_backward_kernel(const AttnBackwardParams p) {
  using Smem = BwdSmem<kD>;
  extern __shared__ __align__(128) unsigned char smem[];
  const AttnWorkItem w = p.list.work[blockIdx.x];
  const AttnTile t = p.list.tiles[w.tile];
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int tq = lane & 3;
  const int hq = p.shape.num_q_heads;
  const int hkv = p.shape.num_kv_heads;
  const int group = hq / hkv;
  const int kvh = w.head;
  const int c0 = w.chunk * kBwdKeys;
  const int keys = min(kBwdKeys, t.kv_len - c0);
  const float scale = p.shape.softmax_scale;
  const float scale_log2 = scale * kLog2e;

  const uint32_t s_k = smem_addr(smem + Smem::kK);
  const uint32_t s_v = smem_addr(smem + Smem::kV);
  const uint32_t s_q = smem_addr(smem + Smem::kQ);
  const uint32_t s_do = smem_addr(smem + Smem::kDo);
  const uint32_t s_ds = smem_addr(smem + Smem::kDs);
  auto* s_ds_ptr = smem + Smem::kDs;
  auto* s_lse = reinterpret_cast<float*>(smem + Smem::kLse);
  auto* s_delta = reinterpret_cast<float*>(smem + Smem::kDelta);
  auto* s_mask = reinterpret_cast<uint64_t*>(smem + Smem::kMask);

  const int64_t q_stride = static_cast<int64_t>(hq) * kD;
  const int64_t kv_stride = static_cast<int64_t>(hkv) * kD;
  const auto* kp = static_cast<const __nv_bfloat16*>(p.k);
  const auto* vp = static_cast<const __nv_bfloat16*>(p.v);
  const auto* qp = static_cast<const __nv_bfloat16*>(p.q);
  const auto* dop = static_cast<const __nv_bfloat16*>(p.dout);
  const int64_t kv_off = (static_cast<int64_t>(t.kv_begin + c0) * hkv + kvh) * kD;
  const int dout_row0 = t.dout_begin >= 0 ? t.dout_begin : t.q_begin;
  const int dq_row0 = t.dq_begin >= 0 ? t.dq_begin : t.q_begin;
  const int dkv_row0 = t.dkv_begin >= 0 ? t.dkv_begin : t.kv_begin;
#pragma unroll
  for (int h = 0; h < kBwdKeys / kRows; ++h) {
    const int tile_keys = keys - h * kRows;  // <= 0: all zero-filled, read nothing
    const int64_t off = tile_keys > 0 ? kv_off + h * kRows * kv_stride : kv_off;
    const uint32_t boff = static_cast<uint32_t>(h * Smem::kTileBytes);
    load_tile_async<kD, kBwdThreads>(s_k + boff, kp + off, kv_stride, tile_keys);
    load_tile_async<kD, kBwdThreads>(s_v + boff, vp + off, kv_stride, tile_keys);
  }
  cp_async_commit();

  const BwSteps steps(t, c0, group);
  const int num_steps = steps.num_steps;

  // Classification uniform across the CTA (Partial: block-wide votes).
  auto classify = [&](int step, int buf) -> int {
    const int rq0 = steps.row0(step);
    const int rows = min(kRows, t.q_len - rq0);
    if (t.kind != TileKind::Partial) return classify_dense_bw<kBwdKeys>(t.kind, rq0, rows, c0, keys);
    return classify_partial_bw(t, p.list.row_offsets, p.list.ranges, rq0, rows, c0, keys == kBwdKeys,
                               s_mask + buf * 2 * kRows);
  };
  // Rows past q_len load as zeros with LSE = +inf, so P = 0 there; keys past kv_len load as
  // zeros and are masked (short chunks always take the masked path).
  auto load_step = [&](int step, int buf) {
    const int qh = steps.q_head(step, kvh, group);
    const int rq0 = steps.row0(step);
    const int rows = min(kRows, t.q_len - rq0);
    const int64_t off = (static_cast<int64_t>(t.q_begin + rq0) * hq + qh) * kD;
    const int64_t do_off = (static_cast<int64_t>(dout_row0 + rq0) * hq + qh) * kD;
    const uint32_t boff = static_cast<uint32_t>(buf * Smem::kTileBytes);
    load_tile_async<kD, kBwdThreads>(s_q + boff, qp + off, q_stride, rows);
    load_tile_async<kD, kBwdThreads>(s_do + boff, dop + do_off, q_stride, rows);
    if (tid < kRows) stage_lse_delta(p.lse, p.delta, hq, t, rq0, rows, qh, tid, s_lse + buf * kRows, s_delta + buf * kRows);
  };

  float dk[kD / 8][4];
  float dv[kD / 8][4];
#pragma unroll
  for (int j = 0; j < kD / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[j][e] = dv[j][e] = 0.0F;
  }

  int step = 0;
  int cls = kEmpty;
  while (step < num_steps && (cls = classify(step, 0)) == kEmpty) ++step;
  int buf = 0;
  if (step < num_steps) load_step(step, 0);
  cp_async_commit();

  while (step < num_steps) {
    int ns = step + 1;
    int ncls = kEmpty;
    while (ns < num_steps && (ncls = classify(ns, buf ^ 1)) == kEmpty) ++ns;
    if (ns < num_steps) {
      load_step(ns, buf ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();

    const int qh = steps.q_head(step, kvh, group);
    const int rq0 = steps.row0(step);
    const uint32_t qb = s_q + static_cast<uint32_t>(buf * Smem::kTileBytes);
    const uint32_t dob = s_do + static_cast<uint32_t>(buf * Smem::kTileBytes);
    const float* lse_b = s_lse + buf * kRows;
    const float* delta_b = s_delta + buf * kRows;

    float st[8][4];
    float dpt[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) st[j][e] = dpt[j][e] = 0.0F;
    }
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      uint32_t ka[4];
      uint32_t va[4];
      load_a<kD>(ka, s_k, warp * 16, kk * 16);
      load_a<kD>(va, s_v, warp * 16, kk * 16);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t b[4];
        load_b_nk<kD>(b, qb, np * 16, kk * 16);
        mma(st[2 * np], ka, b[0], b[1]);
        mma(st[2 * np + 1], ka, b[2], b[3]);
        load_b_nk<kD>(b, dob, np * 16, kk * 16);
        mma(dpt[2 * np], va, b[0], b[1]);
        mma(dpt[2 * np + 1], va, b[2], b[3]);
      }
    }

    // st becomes P^T, dpt becomes dS^T.
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = warp * 16 + g + (e >> 1) * 8;
        const int col = j * 8 + 2 * tq + (e & 1);
        float pv = exp2f(st[j][e] * scale_log2 - lse_b[col]);
        if (cls == kMasked) {
          bool ok = key < keys;
          if (t.kind == TileKind::Partial) {
            ok = ok && ((s_mask[(buf * 2 + (key >> 6)) * kRows + col] >> (key & 63)) & 1U) != 0;
          } else if (t.kind == TileKind::CausalDiagonal) {
            ok = ok && c0 + key <= rq0 + col;
          }
          if (!ok) pv = 0.0F;
        }
        st[j][e] = pv;
        dpt[j][e] = pv * (dpt[j][e] - delta_b[col]);
      }
    }

#pragma unroll
    for (int kq = 0; kq < 4; ++kq) {
      uint32_t pa[4];
      uint32_t da[4];
      acc_to_a(pa, st[2 * kq], st[2 * kq + 1]);
      acc_to_a(da, dpt[2 * kq], dpt[2 * kq + 1]);
#pragma unroll
      for (int dp = 0; dp < kD / 16; ++dp) {
        uint32_t b[4];
        load_b_kn<kD>(b, dob, kq * 16, dp * 16);
        mma(dv[2 * dp], pa, b[0], b[1]);
        mma(dv[2 * dp + 1], pa, b[2], b[3]);
        load_b_kn<kD>(b, qb, kq * 16, dp * 16);
        mma(dk[2 * dp], da, b[0], b[1]);
        mma(dk[2 * dp + 1], da, b[2], b[3]);
      }
      // dS^T rows (keys) x cols (q) into shared memory for dQ.
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int col = (2 * kq + h) * 8 + 2 * tq;
        const int key = warp * 16 + g;
        *reinterpret_cast<uint32_t*>(s_ds_ptr + swz<kRows>(key, col)) = da[2 * h];
        *reinterpret_cast<uint32_t*>(s_ds_ptr + swz<kRows>(key + 8, col)) = da[2 * h + 1];
      }
    }
    __syncthreads();

    // dQ (64 q x D) = dS (q x 128 keys) K (keys x D); warp w: q rows (w % 4) * 16, columns
    // (w / 4) * D / 2 .. + D / 2.
    const int q_row0 = (warp & 3) * 16;
    const int col0 = (warp >> 2) * (kD / 2);
    uint32_t dsa[kBwdKeys / 16][4];
#pragma unroll
    for (int kk = 0; kk < kBwdKeys / 16; ++kk) load_a_trans<kRows>(dsa[kk], s_ds, q_row0, kk * 16);
    const int q_rows = min(kRows, t.q_len - rq0);
#pragma unroll
    for (int dc = 0; dc < kD / 64; ++dc) {
      float acc[4][4];
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0F;
#pragma unroll
      for (int kk = 0; kk < kBwdKeys / 16; ++kk) {
#pragma unroll
        for (int np = 0; np < 2; ++np) {
          uint32_t b[4];
          load_b_kn<kD>(b, s_k, kk * 16, col0 + dc * 32 + np * 16);
          mma(acc[2 * np], dsa[kk], b[0], b[1]);
          mma(acc[2 * np + 1], dsa[kk], b[2], b[3]);
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = q_row0 + g + r * 8;
        if (row >= q_rows) continue;
        float* dq_row =
            p.dq + (static_cast<int64_t>(dq_row0 + rq0 + row) * hq + qh) * kD + col0 + dc * 32 + 2 * tq;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          atomic_add2(dq_row + j * 8, acc[j][2 * r] * scale, acc[j][2 * r + 1] * scale);
        }
      }
    }
    __syncthreads();
    step = ns;
    cls = ncls;
    buf ^= 1;
  }
  cp_async_wait<0>();

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = warp * 16 + g + r * 8;
    if (key >= keys) continue;
    const int64_t off = (static_cast<int64_t>(dkv_row0 + c0 + key) * hkv + kvh) * kD + 2 * tq;
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
      atomic_add2(p.dk + off + j * 8, dk[j][2 * r] * scale, dk[j][2 * r + 1] * scale);
      atomic_add2(p.dv + off + j * 8, dv[j][2 * r], dv[j][2 * r + 1]);
    }
  }
}

template <int kD>
void launch_backward(const AttnBackwardParams& p, cudaStream_t stream) {
  constexpr int kSmem = BwdSmem<kD>::kBytes;
  allow_shared_memory("attention_backward", attention_backward_kernel<kD>, kSmem);
  attention_backward_kernel<kD><<<p.list.num_work, kBwdThreads, kSmem, stream>>>(p);
}

void attention_backward_mma(const AttnBackwardParams& params, cudaStream_t stream) {
  launch_for_head_dim("attention_backward", params.shape, [&]<int kD>() { launch_backward<kD>(params, stream); });
}

// Warp w takes kv head w % heads and every (heads x warps)-th row from w / heads on: the head's
// largest |K| element and |V|_2^2 (lane partial sums in column order, then a butterfly: the same
// bits for the same row wherever it runs), folded into the maxima once per warp by integer
// atomicMax on the non-negative floats' bits (exact in any order; one atomic per warp, not per
// row: a few hundred thousand on the same addresses took milliseconds).
__global__ void dq_bound_kernel(const __nv_bfloat16* k, const __nv_bfloat16* v, int64_t rows, int heads, int dim,
                                unsigned int* out) {
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t warps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int head = static_cast<int>(warp % heads);
  const int64_t stride = warps / heads;  // warps is a multiple of heads (launcher)
  float kmax = 0.0F;
  float v2max = 0.0F;
  for (int64_t row = warp / heads; row < rows; row += stride) {
    const int64_t off = (row * heads + head) * dim;
    float v2 = 0.0F;
    for (int d = lane; d < dim; d += 32) {
      kmax = fmaxf(kmax, fabsf(__bfloat162float(k[off + d])));
      const float x = __bfloat162float(v[off + d]);
      v2 = fmaf(x, x, v2);
    }
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) v2 += __shfl_xor_sync(0xffffffffU, v2, s);
    v2max = fmaxf(v2max, v2);
  }
#pragma unroll
  for (int s = 16; s > 0; s >>= 1) kmax = fmaxf(kmax, __shfl_xor_sync(0xffffffffU, kmax, s));
  if (lane == 0) {
    atomicMax(out + 2 * head, __float_as_uint(kmax));
    atomicMax(out + 2 * head + 1, __float_as_uint(v2max));
  }
}

// One warp per (dO row, q head): |dO|_2^2 in a fixed order as above, then its unit's exponent
// (dcp/detail/dq_units.h).
__global__ void dq_units_kernel(const __nv_bfloat16* dout, int64_t rows, int q_heads, int group, int dim, float scale,
                                const float* bound, int32_t* units) {
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = static_cast<int>(threadIdx.x & 31);
  if (warp >= rows * q_heads) return;
  const int kvh = static_cast<int>(warp % q_heads) / group;
  const int64_t off = warp * dim;
  float n2 = 0.0F;
  for (int d = lane; d < dim; d += 32) {
    const float x = __bfloat162float(dout[off + d]);
    n2 = fmaf(x, x, n2);
  }
#pragma unroll
  for (int s = 16; s > 0; s >>= 1) n2 += __shfl_xor_sync(0xffffffffU, n2, s);
  if (lane == 0) units[warp] = dq_units::exponent(dq_units::bound(scale, bound[2 * kvh], bound[2 * kvh + 1], n2));
}

// One thread per (row, q head), from |dO|_2^2 (and |d_lse| where given) computed beside Delta.
__global__ void dq_units_from_norms_kernel(const float* norm2, const float* dlse_abs, int64_t count, int q_heads,
                                           int group, float scale, const float* bound, int32_t* units) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const int kvh = static_cast<int>(i % q_heads) / group;
  const float dl = dlse_abs != nullptr ? dlse_abs[i] : 0.0F;
  units[i] = dq_units::exponent(dq_units::bound(scale, bound[2 * kvh], bound[2 * kvh + 1], norm2[i], dl));
}

// dq counts of units -> fp32 in place, four elements per thread (head_dim % 4 == 0) or one.
template <int kVec>
__global__ void dq_from_units_kernel(float* dq, const int32_t* units, int64_t count, int dim) {
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kVec;
  if (i >= count) return;
  const int32_t e = units[i / dim];  // (row, q head): head_dim elements each
  if constexpr (kVec == 4) {
    const int4 n = *reinterpret_cast<const int4*>(dq + i);
    *reinterpret_cast<float4*>(dq + i) = make_float4(dq_units::from_units(n.x, e), dq_units::from_units(n.y, e),
                                                     dq_units::from_units(n.z, e), dq_units::from_units(n.w, e));
  } else {
    dq[i] = dq_units::from_units(__float_as_int(dq[i]), e);
  }
}

}  // namespace detail

namespace {

// K and V maxima of every kv head into bound[2 x num_kv_heads] (zeroed first).
void dq_bound(const void* k, const void* v, int64_t kv_rows, const AttnShape& shape, float* bound,
              cudaStream_t stream) {
  if (shape.num_kv_heads <= 0 || shape.num_q_heads % shape.num_kv_heads != 0)
    raise(ErrorKind::InvalidInput, "deterministic_dq_units: num_q_heads must be a positive multiple of num_kv_heads");
  cudaError_t e = cudaMemsetAsync(bound, 0, static_cast<size_t>(2 * shape.num_kv_heads) * sizeof(float), stream);
  if (e == cudaSuccess && kv_rows > 0) {
    // One warp per block, a multiple of the heads in all: every warp keeps one head.
    const int64_t warps = std::min<int64_t>(kv_rows, 1024) * shape.num_kv_heads;
    detail::dq_bound_kernel<<<static_cast<unsigned int>(warps), 32, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(k), static_cast<const __nv_bfloat16*>(v), kv_rows, shape.num_kv_heads,
        shape.head_dim, reinterpret_cast<unsigned int*>(bound));
    e = cudaGetLastError();
  }
  if (e != cudaSuccess) raise(ErrorKind::Cuda, std::string("deterministic_dq_units: bound: ") + cudaGetErrorString(e));
}

}  // namespace

void deterministic_dq_units(const void* k, const void* v, int64_t kv_rows, const void* dout, int64_t dout_rows,
                            const AttnShape& shape, float* bound, int32_t* units, cudaStream_t stream) {
  dq_bound(k, v, kv_rows, shape, bound, stream);
  if (dout_rows <= 0) return;
  constexpr int kThreads = 256;
  const int64_t threads = dout_rows * shape.num_q_heads * 32;
  detail::dq_units_kernel<<<static_cast<unsigned int>((threads + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      static_cast<const __nv_bfloat16*>(dout), dout_rows, shape.num_q_heads, shape.num_q_heads / shape.num_kv_heads,
      shape.head_dim, shape.softmax_scale, bound, units);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) raise(ErrorKind::Cuda, std::string("deterministic_dq_units: units: ") + cudaGetErrorString(e));
}

void deterministic_dq_units_from_norms(const void* k, const void* v, int64_t kv_rows, const float* dout_norm2,
                                       int64_t rows, const AttnShape& shape, float* bound, int32_t* units,
                                       cudaStream_t stream, const float* dlse_abs) {
  dq_bound(k, v, kv_rows, shape, bound, stream);
  const int64_t count = rows * shape.num_q_heads;
  if (count <= 0) return;
  constexpr int kThreads = 256;
  detail::dq_units_from_norms_kernel<<<static_cast<unsigned int>((count + kThreads - 1) / kThreads), kThreads, 0,
                                       stream>>>(dout_norm2, dlse_abs, count, shape.num_q_heads,
                                                 shape.num_q_heads / shape.num_kv_heads, shape.softmax_scale, bound,
                                                 units);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) raise(ErrorKind::Cuda, std::string("deterministic_dq_units: units: ") + cudaGetErrorString(e));
}

void deterministic_dq_from_units(float* dq, const int32_t* units, int64_t rows, const AttnShape& shape,
                                 cudaStream_t stream) {
  const int64_t count = rows * shape.num_q_heads * shape.head_dim;
  if (count <= 0) return;
  constexpr int kThreads = 256;
  const bool vec = shape.head_dim % 4 == 0 && reinterpret_cast<uintptr_t>(dq) % 16 == 0;
  const int64_t threads = vec ? count / 4 : count;
  const auto blocks = static_cast<unsigned int>((threads + kThreads - 1) / kThreads);
  if (vec) {
    detail::dq_from_units_kernel<4><<<blocks, kThreads, 0, stream>>>(dq, units, count, shape.head_dim);
  } else {
    detail::dq_from_units_kernel<1><<<blocks, kThreads, 0, stream>>>(dq, units, count, shape.head_dim);
  }
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) raise(ErrorKind::Cuda, std::string("deterministic_dq_from_units: ") + cudaGetErrorString(e));
}

AttnKernelRoute attention_backward_route(const AttnBackwardParams& params) {
  return detail::resolve_route(params.route, params.shape.head_dim, "attention_backward");
}

void attention_backward(const AttnBackwardParams& params, cudaStream_t stream) {
  if (params.list.num_work == 0) return;
  const AttnKernelRoute route = attention_backward_route(params);
  if (params.deterministic && route != AttnKernelRoute::Wgmma) {
    raise(ErrorKind::Unsupported, "attention_backward: the deterministic backward runs on the warp-specialised Hopper "
                                  "kernel only (route wgmma on an sm_90 device), not on route " +
                                      std::string(route == AttnKernelRoute::Mma ? "mma" : "wgmma-basic"));
  }
  switch (route) {
    case AttnKernelRoute::Wgmma: detail::attention_backward_wgmma_ws(params, stream); break;
    case AttnKernelRoute::WgmmaBasic: detail::attention_backward_wgmma(params, stream); break;
    default: detail::attention_backward_mma(params, stream); break;
  }
}

}  // namespace dcp::cuda
