// cuda_backend_kernels.h — launchers of the CUDA backend's small kernels.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dcp::cuda {

struct ZeroRange {
  float* ptr = nullptr;  // 16-byte aligned
  int64_t count = 0;     // floats, a multiple of 4
};

// delta[rh] = sum_d dout[rh][d] * out[rh][d] for rh < num_row_heads (dout bf16, out fp32).
void delta_bf16_f32(const void* dout, const float* out, float* delta, int64_t num_row_heads, int head_dim,
                    cudaStream_t stream);
// n values in [-amplitude, amplitude] from a hash of (seed, index); bf16 or fp32.
void fill_random(void* p, bool bf16, int64_t n, uint64_t seed, float amplitude, cudaStream_t stream);
// Zeroes every range (device array of num_ranges ZeroRange).
void zero_ranges(const ZeroRange* ranges, int num_ranges, cudaStream_t stream);

}  // namespace dcp::cuda
