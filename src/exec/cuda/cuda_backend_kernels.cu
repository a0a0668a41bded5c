// cuda_backend_kernels.cu — small kernels of the CUDA backend beside the attention ones.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

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

}  // namespace dcp::cuda
