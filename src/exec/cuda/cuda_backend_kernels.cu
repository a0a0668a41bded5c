// cuda_backend_kernels.cu — small kernels of the CUDA backend beside the attention ones.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda_backend_kernels.h"
#include "dcp/detail/dq_units.h"
#include "dcp/error.h"

namespace dcp::cuda {
namespace {

// One warp per (row, head): Delta = <dO (bf16), O (fp32)>, and |dO|_2^2 where norm2 is given.
__global__ void delta_f32_kernel(const __nv_bfloat16* dout, const float* out, float* delta, float* norm2,
                                 int64_t num_row_heads, int head_dim) {
  const int64_t rh = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x & 31);
  if (rh >= num_row_heads) return;
  float sum = 0.0F;
  float n2 = 0.0F;
  for (int d = lane * 2; d < head_dim; d += 64) {
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(dout + rh * head_dim + d));
    const float2 b = *reinterpret_cast<const float2*>(out + rh * head_dim + d);
    sum += a.x * b.x + a.y * b.y;
    n2 += a.x * a.x + a.y * a.y;
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    sum += __shfl_xor_sync(0xffffffffU, sum, off);
    n2 += __shfl_xor_sync(0xffffffffU, n2, off);
  }
  if (lane == 0) {
    delta[rh] = sum;
    if (norm2 != nullptr) norm2[rh] = n2;
  }
}

// Zeroes many row ranges of fp32 arrays in one launch: range i is floats [begin, begin + count).
__global__ void zero_ranges_kernel(const ZeroRange* ranges, int num_ranges) {
  for (int i = blockIdx.y; i < num_ranges; i += gridDim.y) {
    const ZeroRange r = ranges[i];
    for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < r.count / 4;
         j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      reinterpret_cast<float4*>(r.ptr)[j] = make_float4(0.0F, 0.0F, 0.0F, 0.0F);
    }
  }
}

__global__ void fill_random_kernel(void* p, bool bf16, int64_t n, uint64_t seed, float amplitude) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint64_t z = seed * 0x9e3779b97f4a7c15ULL + static_cast<uint64_t>(i) * 0xd1b54a32d192ed03ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    const float v = amplitude * (static_cast<float>(z >> 40) * (2.0F / 16777216.0F) - 1.0F);
    if (bf16) static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(v);
    else static_cast<float*>(p)[i] = v;
  }
}

__device__ __forceinline__ float load_elem(const void* p, int64_t i, int bf16) {
  return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]) : static_cast<const float*>(p)[i];
}
__device__ __forceinline__ void store_elem(void* p, int64_t i, int bf16, float x) {
  if (bf16) static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(x);
  else static_cast<float*>(p)[i] = x;
}
// 8 consecutive elements at p + i (16-byte aligned for bf16, 32 for fp32 as two 16-byte halves).
__device__ __forceinline__ void load8(const void* p, int64_t i, int bf16, float (&x)[8]) {
  if (bf16) {
    const uint4 u = *reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(p) + i);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 f = __bfloat1622float2(h[k]);
      x[2 * k] = f.x;
      x[2 * k + 1] = f.y;
    }
  } else {
    const float4 a = *reinterpret_cast<const float4*>(static_cast<const float*>(p) + i);
    const float4 b = *reinterpret_cast<const float4*>(static_cast<const float*>(p) + i + 4);
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
  }
}
__device__ __forceinline__ void store8(void* p, int64_t i, int bf16, const float (&x)[8]) {
  if (bf16) {
    uint4 u;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&u);
#pragma unroll
    for (int k = 0; k < 4; ++k) h[k] = __floats2bfloat162_rn(x[2 * k], x[2 * k + 1]);
    *reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(p) + i) = u;
  } else {
    *reinterpret_cast<float4*>(static_cast<float*>(p) + i) = make_float4(x[0], x[1], x[2], x[3]);
    *reinterpret_cast<float4*>(static_cast<float*>(p) + i + 4) = make_float4(x[4], x[5], x[6], x[7]);
  }
}

// blockIdx.y: the move. The threads of the grid stride over the move's accesses (array row, 8
// elements at a time on the vector path, else one): consecutive threads take consecutive pieces
// of the dense array side, so its accesses coalesce, and the tensor side is dense within a head.
// Each thread first loads kInFlight pieces and then stores them: a copy is bound by the latency of
// its loads, and with one load in flight per thread the copies moved about 2 TB/s of the H200's
// 4.8 (2.9-4 TB/s with four).
inline constexpr int kExchangeThreads = 256;
inline constexpr int kInFlight = 4;

template <class Index>
__device__ __forceinline__ void exchange_piece(const ExchangeMove& m, Index idx, Index vecs, int width, int64_t& t,
                                               int64_t& e) {
  const Index gr = idx / vecs;  // array row (g, r)
  const int x = static_cast<int>(idx - gr * vecs) * width;
  const Index g = gr / static_cast<Index>(m.num_rows);
  const Index r = gr - g * static_cast<Index>(m.num_rows);
  const int h = x / m.head_dim;
  t = static_cast<int64_t>(r) * m.row_stride + (static_cast<int64_t>(g) * m.heads_per_group + h) * m.head_stride +
      (x - h * m.head_dim);
  e = static_cast<int64_t>(idx) * width;
}

template <class Index>
__device__ __forceinline__ void exchange_move(const ExchangeMove& m) {
  const int width = m.vector ? 8 : 1;
  const auto vecs = static_cast<Index>(m.heads_per_group * m.head_dim / width);
  const Index total = static_cast<Index>(m.num_groups) * static_cast<Index>(m.num_rows) * vecs;
  const Index stride = static_cast<Index>(gridDim.x) * blockDim.x;
  const void* src = m.import ? m.tensor : m.array;
  void* dst = m.import ? m.array : m.tensor;
  const int src_bf16 = m.import ? m.tensor_bf16 : m.array_bf16;
  const int dst_bf16 = m.import ? m.array_bf16 : m.tensor_bf16;
  for (Index first = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; first < total;
       first += stride * kInFlight) {
    int64_t from[kInFlight];
    int64_t to[kInFlight];
    float v[kInFlight][8];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const Index idx = first + u * stride;
      if (idx >= total) break;
      int64_t t = 0;
      int64_t e = 0;
      exchange_piece<Index>(m, idx, vecs, width, t, e);
      from[u] = m.import ? t : e;
      to[u] = m.import ? e : t;
      if (m.vector) {
        load8(src, from[u], src_bf16, v[u]);
      } else {
        v[u][0] = load_elem(src, from[u], src_bf16);
      }
      if (m.units != nullptr) {  // counts of the (row, head)'s unit: from = the array element
        const int32_t ex = m.units[from[u] / m.head_dim];
        if (m.vector) {
#pragma unroll
          for (int k = 0; k < 8; ++k) v[u][k] = dq_units::from_units(__float_as_int(v[u][k]), ex);
        } else {
          v[u][0] = dq_units::from_units(__float_as_int(v[u][0]), ex);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      if (first + u * stride >= total) break;
      if (m.vector) {
        store8(dst, to[u], dst_bf16, v[u]);
      } else {
        store_elem(dst, to[u], dst_bf16, v[u][0]);
      }
    }
  }
}

__global__ void __launch_bounds__(kExchangeThreads) exchange_kernel(ExchangeBatch batch) {
  const ExchangeMove& m = batch.moves[blockIdx.y];
  const int64_t total = static_cast<int64_t>(m.num_groups) * m.num_rows * m.heads_per_group * m.head_dim;
  // 32-bit index arithmetic (its divisions are the kernel's costliest instructions) where it fits.
  if (total + static_cast<int64_t>(gridDim.x) * blockDim.x * kInFlight < (int64_t{1} << 32)) {
    exchange_move<uint32_t>(m);
  } else {
    exchange_move<int64_t>(m);
  }
}

// One warp per (row, head), one element per lane and step: for any type, stride and head dim.
__global__ void delta_from_kernel(DeltaFromParams p) {
  const int64_t heads = static_cast<int64_t>(p.heads_per_group) * p.num_groups;
  const int64_t rh = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;  // r * heads + head
  const int lane = static_cast<int>(threadIdx.x & 31);
  if (rh >= p.num_rows * heads) return;
  const int64_t r = rh / heads;
  const int64_t head = rh - r * heads;
  const int64_t g = head / p.heads_per_group;
  const int64_t h = head - g * p.heads_per_group;
  const int64_t a = r * p.do_row_stride + head * p.do_head_stride;
  const int64_t b = r * p.o_row_stride + head * p.o_head_stride;
  float sum = 0.0F;
  float n2 = 0.0F;
  for (int d = lane; d < p.head_dim; d += 32) {
    const float x = load_elem(p.d_o, a + d, p.do_bf16);
    sum += x * load_elem(p.o, b + d, p.o_bf16);
    n2 = fmaf(x, x, n2);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    sum += __shfl_xor_sync(0xffffffffU, sum, off);
    n2 += __shfl_xor_sync(0xffffffffU, n2, off);
  }
  if (lane == 0) {
    const int64_t i = (g * p.num_rows + r) * p.heads_per_group + h;
    if (p.d_lse != nullptr) {
      const float dl = p.d_lse[r * p.dlse_row_stride + (g * p.heads_per_group + h) * p.dlse_head_stride];
      sum -= dl;
      if (p.dlse_abs != nullptr) p.dlse_abs[i] = fabsf(dl);
    }
    p.delta[i] = sum;
    if (p.norm2 != nullptr) p.norm2[i] = n2;
  }
}

// The same with 8 elements per lane (16-byte aligned rows, head_dim / 8 a power of two up to
// 32): kLanes = head_dim / 8 lanes take one (row, head), so a warp covers 32 / kLanes of them.
// Scalar loads of 2 bytes left the kernel at about a third of the memory bandwidth.
template <int kLanes>
__global__ void delta_from_vec_kernel(DeltaFromParams p) {
  const int64_t heads = static_cast<int64_t>(p.heads_per_group) * p.num_groups;
  const int64_t rh = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kLanes;
  const int lane = static_cast<int>(threadIdx.x & (kLanes - 1));
  const bool valid = rh < p.num_rows * heads;
  float sum = 0.0F;
  float n2 = 0.0F;
  int64_t r = 0, g = 0, h = 0;
  if (valid) {
    r = rh / heads;
    const int64_t head = rh - r * heads;
    g = head / p.heads_per_group;
    h = head - g * p.heads_per_group;
    float x[8];
    float y[8];
    load8(p.d_o, r * p.do_row_stride + head * p.do_head_stride + 8 * lane, p.do_bf16, x);
    load8(p.o, r * p.o_row_stride + head * p.o_head_stride + 8 * lane, p.o_bf16, y);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      sum = fmaf(x[k], y[k], sum);
      n2 = fmaf(x[k], x[k], n2);
    }
  }
#pragma unroll
  for (int off = kLanes / 2; off > 0; off >>= 1) {
    sum += __shfl_xor_sync(0xffffffffU, sum, off);
    n2 += __shfl_xor_sync(0xffffffffU, n2, off);
  }
  if (valid && lane == 0) {
    const int64_t i = (g * p.num_rows + r) * p.heads_per_group + h;
    if (p.d_lse != nullptr) {
      const float dl = p.d_lse[r * p.dlse_row_stride + (g * p.heads_per_group + h) * p.dlse_head_stride];
      sum -= dl;
      if (p.dlse_abs != nullptr) p.dlse_abs[i] = fabsf(dl);
    }
    p.delta[i] = sum;
    if (p.norm2 != nullptr) p.norm2[i] = n2;
  }
}

void check(const char* where) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) raise(ErrorKind::Cuda, std::string(where) + ": launch: " + cudaGetErrorString(err));
}

}  // namespace

bool build_runs_on_current_device() {
  cudaFuncAttributes attributes{};
  const cudaError_t e = cudaFuncGetAttributes(&attributes, zero_ranges_kernel);
  if (e == cudaSuccess) return true;
  (void)cudaGetLastError();  // the probe's error is an answer, not a failure to keep
  return false;
}

void delta_bf16_f32(const void* dout, const float* out, float* delta, float* norm2, int64_t num_row_heads,
                    int head_dim, cudaStream_t stream) {
  if (num_row_heads == 0) return;
  const int64_t threads = num_row_heads * 32;
  delta_f32_kernel<<<static_cast<unsigned>((threads + 255) / 256), 256, 0, stream>>>(
      static_cast<const __nv_bfloat16*>(dout), out, delta, norm2, num_row_heads, head_dim);
  check("delta_bf16_f32");
}

void fill_random(void* p, bool bf16, int64_t n, uint64_t seed, float amplitude, cudaStream_t stream) {
  if (n == 0) return;
  fill_random_kernel<<<1024, 256, 0, stream>>>(p, bf16, n, seed, amplitude);
  check("fill_random");
}

void zero_ranges(const ZeroRange* ranges, int num_ranges, cudaStream_t stream) {
  if (num_ranges == 0) return;
  const dim3 grid(64, static_cast<unsigned>(num_ranges < 65535 ? num_ranges : 65535));
  zero_ranges_kernel<<<grid, 256, 0, stream>>>(ranges, num_ranges);
  check("zero_ranges");
}

void exchange_rows(const ExchangeBatch& batch, cudaStream_t stream) {
  if (batch.num_moves == 0) return;
  int64_t pieces = 0;  // of the largest move
  for (int i = 0; i < batch.num_moves; ++i) {
    const ExchangeMove& m = batch.moves[i];
    pieces = std::max<int64_t>(pieces, static_cast<int64_t>(m.num_groups) * m.num_rows * m.heads_per_group *
                                           m.head_dim / (m.vector ? 8 : 1));
  }
  if (pieces == 0) return;
  // Enough threads for kInFlight pieces each, capped at a few waves (the threads stride).
  const int64_t wanted = (pieces + int64_t{kExchangeThreads} * kInFlight - 1) / (int64_t{kExchangeThreads} * kInFlight);
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(wanted, 4096));
  exchange_kernel<<<dim3(blocks, static_cast<unsigned>(batch.num_moves)), kExchangeThreads, 0, stream>>>(batch);
  check("exchange_rows");
}

void delta_from_tensors(const DeltaFromParams& p, cudaStream_t stream) {
  const int64_t pairs = p.num_rows * p.heads_per_group * p.num_groups;  // (row, head)
  if (pairs == 0) return;
  const auto aligned = [](const void* ptr, int64_t row_stride, int64_t head_stride) {
    return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && row_stride % 8 == 0 && head_stride % 8 == 0;
  };
  const int lanes = p.head_dim / 8;
  if (p.head_dim % 8 == 0 && lanes >= 1 && lanes <= 32 && (lanes & (lanes - 1)) == 0 &&
      aligned(p.d_o, p.do_row_stride, p.do_head_stride) && aligned(p.o, p.o_row_stride, p.o_head_stride)) {
    const auto blocks = static_cast<unsigned>((pairs * lanes + 255) / 256);
    switch (lanes) {
      case 1: delta_from_vec_kernel<1><<<blocks, 256, 0, stream>>>(p); break;
      case 2: delta_from_vec_kernel<2><<<blocks, 256, 0, stream>>>(p); break;
      case 4: delta_from_vec_kernel<4><<<blocks, 256, 0, stream>>>(p); break;
      case 8: delta_from_vec_kernel<8><<<blocks, 256, 0, stream>>>(p); break;
      case 16: delta_from_vec_kernel<16><<<blocks, 256, 0, stream>>>(p); break;
      default: delta_from_vec_kernel<32><<<blocks, 256, 0, stream>>>(p); break;
    }
  } else {
    delta_from_kernel<<<static_cast<unsigned>((pairs * 32 + 255) / 256), 256, 0, stream>>>(p);
  }
  check("delta_from_tensors");
}

}  // namespace dcp::cuda
