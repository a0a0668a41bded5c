// cuda_backend_kernels.cu — small kernels of the CUDA backend beside the attention ones.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "cuda_backend_kernels.h"
#include "dcp/error.h"

namespace dcp::cuda {
namespace {

// One warp per (row, head): Delta = <dO (bf16), O (fp32)>.
__global__ void delta_f32_kernel(const __nv_bfloat16* dout, const float* out, float* delta, int64_t num_row_heads,
                                 int head_dim) {
  const int64_t rh = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x & 31);
  if (rh >= num_row_heads) return;
  float sum = 0.0F;
  for (int d = lane * 2; d < head_dim; d += 64) {
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(dout + rh * head_dim + d));
    const float2 b = *reinterpret_cast<const float2*>(out + rh * head_dim + d);
    sum += a.x * b.x + a.y * b.y;
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffU, sum, off);
  if (lane == 0) delta[rh] = sum;
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

// blockIdx.y: the move; blockIdx.x strides over the array's rows (g, r), the threads of a block
// over one row's heads x head_dim elements (8 at a time on the vector path), so the index
// arithmetic is done once a row, not once an element. The array side is dense; the tensor side is
// dense within a head and strided between heads and tokens.
__global__ void exchange_kernel(ExchangeBatch batch) {
  const ExchangeMove m = batch.moves[blockIdx.y];
  const int per_row = m.heads_per_group * m.head_dim;  // elements of an array row
  const int64_t num_rows = static_cast<int64_t>(m.num_groups) * m.num_rows;
  const int width = m.vector ? 8 : 1;
  for (int64_t gr = blockIdx.x; gr < num_rows; gr += gridDim.x) {
    const int64_t g = gr / m.num_rows;
    const int64_t r = gr - g * m.num_rows;
    const int64_t array_row = gr * per_row;
    const int64_t tensor_row = r * m.row_stride + g * m.heads_per_group * m.head_stride;
    for (int x = threadIdx.x * width; x < per_row; x += blockDim.x * width) {
      const int h = x / m.head_dim;
      const int64_t t = tensor_row + h * m.head_stride + (x - h * m.head_dim);
      const int64_t e = array_row + x;
      if (m.vector) {
        float v[8];
        if (m.import) {
          load8(m.tensor, t, m.tensor_bf16, v);
          store8(m.array, e, m.array_bf16, v);
        } else {
          load8(m.array, e, m.array_bf16, v);
          store8(m.tensor, t, m.tensor_bf16, v);
        }
      } else if (m.import) {
        store_elem(m.array, e, m.array_bf16, load_elem(m.tensor, t, m.tensor_bf16));
      } else {
        store_elem(m.tensor, t, m.tensor_bf16, load_elem(m.array, e, m.array_bf16));
      }
    }
  }
}

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
  for (int d = lane; d < p.head_dim; d += 32) sum += load_elem(p.d_o, a + d, p.do_bf16) * load_elem(p.o, b + d, p.o_bf16);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffU, sum, off);
  if (lane == 0) p.delta[(g * p.num_rows + r) * p.heads_per_group + h] = sum;
}

void check(const char* where) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) raise(ErrorKind::Cuda, std::string(where) + ": launch: " + cudaGetErrorString(err));
}

}  // namespace

void delta_bf16_f32(const void* dout, const float* out, float* delta, int64_t num_row_heads, int head_dim,
                    cudaStream_t stream) {
  if (num_row_heads == 0) return;
  const int64_t threads = num_row_heads * 32;
  delta_f32_kernel<<<static_cast<unsigned>((threads + 255) / 256), 256, 0, stream>>>(
      static_cast<const __nv_bfloat16*>(dout), out, delta, num_row_heads, head_dim);
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
  int64_t rows = 0;
  int widest = 1;  // threads a row needs
  for (int i = 0; i < batch.num_moves; ++i) {
    const ExchangeMove& m = batch.moves[i];
    rows = std::max<int64_t>(rows, static_cast<int64_t>(m.num_groups) * m.num_rows);
    widest = std::max(widest, m.heads_per_group * m.head_dim / (m.vector ? 8 : 1));
  }
  if (rows == 0) return;
  const int threads = std::min(256, (widest + 31) / 32 * 32);
  // Enough blocks to fill the GPU several times over; each strides over rows.
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(rows, 8192));
  exchange_kernel<<<dim3(blocks, static_cast<unsigned>(batch.num_moves)), threads, 0, stream>>>(batch);
  check("exchange_rows");
}

void delta_from_tensors(const DeltaFromParams& p, cudaStream_t stream) {
  const int64_t warps = p.num_rows * p.heads_per_group * p.num_groups;
  if (warps == 0) return;
  delta_from_kernel<<<static_cast<unsigned>((warps * 32 + 255) / 256), 256, 0, stream>>>(p);
  check("delta_from_tensors");
}

}  // namespace dcp::cuda
