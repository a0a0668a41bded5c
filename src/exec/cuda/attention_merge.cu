// attention_merge.cu — memory-bound combine kernels: LSE merge of partial (O, LSE), sum of fp32
// partials (one output block per launch, or a whole batch of blocks of either kind in one
// launch: merge_batch), and Delta = rowsum(dO * O) for the backward.
//
// Each thread owns 4 consecutive floats of one (row, head) (16-byte loads and stores); the
// partial list of a row is read in order, so results are deterministic. Bytes per output
// element: 4 * parts read + 4 (fp32) or 2 (bf16) written; ideal time = bytes / ~4 TB/s.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <span>
#include <string>

#include "attention_common.cuh"
#include "dcp/detail/attention_cuda.h"
#include "dcp/error.h"

namespace dcp::cuda {
namespace {

constexpr int kBlock = 256;

__device__ __forceinline__ void store_bf16x4(void* out, int64_t elem, float4 v) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y);
  const __nv_bfloat162 hi = __floats2bfloat162_rn(v.z, v.w);
  uint2 packed;
  packed.x = *reinterpret_cast<const uint32_t*>(&lo);
  packed.y = *reinterpret_cast<const uint32_t*>(&hi);
  *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(out) + elem) = packed;
}

__global__ void __launch_bounds__(kBlock) merge_kernel(const AttnMergeParams p) {
  const int vec_per_head = p.head_dim / 4;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  const int64_t total = static_cast<int64_t>(p.num_rows) * p.num_heads * vec_per_head;
  if (idx >= total) return;
  const int64_t row_head = idx / vec_per_head;
  const int vec = static_cast<int>(idx % vec_per_head);
  const int row = static_cast<int>(row_head / p.num_heads);
  const int head = static_cast<int>(row_head % p.num_heads);
  const int begin = p.part_offsets[row];
  const int end = p.part_offsets[row + 1];
  const int32_t* lrows = p.part_lse_rows != nullptr ? p.part_lse_rows : p.part_rows;
  float m = -INFINITY;
  for (int i = begin; i < end; ++i) m = fmaxf(m, p.lse_part[static_cast<int64_t>(lrows[i]) * p.num_heads + head]);
  float4 acc = make_float4(0.0F, 0.0F, 0.0F, 0.0F);
  float denom = 0.0F;
  if (m != -INFINITY) {
    for (int i = begin; i < end; ++i) {
      const int64_t prow = p.part_rows[i];
      const float wgt = __expf(p.lse_part[static_cast<int64_t>(lrows[i]) * p.num_heads + head] - m);
      const float4 o = *reinterpret_cast<const float4*>(p.o_part + (prow * p.num_heads + head) * p.head_dim + vec * 4);
      acc.x += wgt * o.x;
      acc.y += wgt * o.y;
      acc.z += wgt * o.z;
      acc.w += wgt * o.w;
      denom += wgt;
    }
  }
  const float inv = denom > 0.0F ? 1.0F / denom : 0.0F;
  acc.x *= inv;
  acc.y *= inv;
  acc.z *= inv;
  acc.w *= inv;
  const int64_t elem = row_head * p.head_dim + vec * 4;
  // In place: every lane of this (row, head) has read the partial LSEs before lane 0 writes.
  // The lanes of one (row, head) are consecutive, aligned and all active (head_dim / 4 of them).
  const unsigned lane = threadIdx.x & 31U;
  const unsigned span = static_cast<unsigned>(vec_per_head < 32 ? vec_per_head : 32);
  const unsigned group = span == 32 ? 0xffffffffU : (((1U << span) - 1U) << (lane & ~(span - 1U)));
  __syncwarp(group);
  if (p.out_f32 != nullptr) *reinterpret_cast<float4*>(p.out_f32 + elem) = acc;
  if (p.out_bf16 != nullptr) store_bf16x4(p.out_bf16, elem, acc);
  if (p.lse_out != nullptr && vec == 0) p.lse_out[row_head] = denom > 0.0F ? m + logf(denom) : -INFINITY;
}

__global__ void __launch_bounds__(kBlock) sum_kernel(const SumPartialsParams p) {
  const int vec_per_row = p.row_elems / 4;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  if (idx >= static_cast<int64_t>(p.num_rows) * vec_per_row) return;
  const int row = static_cast<int>(idx / vec_per_row);
  const int vec = static_cast<int>(idx % vec_per_row);
  float4 acc = make_float4(0.0F, 0.0F, 0.0F, 0.0F);
  for (int i = p.part_offsets[row]; i < p.part_offsets[row + 1]; ++i) {
    const float4 v = *reinterpret_cast<const float4*>(p.part + static_cast<int64_t>(p.part_rows[i]) * p.row_elems + vec * 4);
    acc.x += v.x;
    acc.y += v.y;
    acc.z += v.z;
    acc.w += v.w;
  }
  const int64_t elem = static_cast<int64_t>(row) * p.row_elems + vec * 4;
  if (p.out_f32 != nullptr) *reinterpret_cast<float4*>(p.out_f32 + elem) = acc;
  if (p.out_bf16 != nullptr) store_bf16x4(p.out_bf16, elem, acc);
}

// One thread per 4 output floats of one segment; a CTA belongs to one segment (segments start at
// CTA boundaries), found by a binary search over the segments' first CTAs.
__global__ void __launch_bounds__(kBlock) merge_batch_kernel(const MergeBatchParams p) {
  const auto b = static_cast<int32_t>(blockIdx.x);
  int lo = 0;
  int hi = p.num_segments - 1;
  while (lo < hi) {  // the last segment starting at or before b (empty segments share its start)
    const int mid = (lo + hi + 1) >> 1;
    if (p.segments[mid].block_begin <= b) lo = mid;
    else hi = mid - 1;
  }
  const MergeSegment s = p.segments[lo];
  const int vec_per_row = s.row_elems >> 2;
  const int64_t idx = static_cast<int64_t>(b - s.block_begin) * kBlock + threadIdx.x;
  const bool active = idx < static_cast<int64_t>(s.num_rows) * vec_per_row;
  const int64_t row = idx / vec_per_row;
  const int col = static_cast<int>(idx % vec_per_row) * 4;
  const int64_t elem = row * s.row_elems + col;
  float4 acc = make_float4(0.0F, 0.0F, 0.0F, 0.0F);
  if (s.head_dim == 0) {  // plain sum; uniform over the CTA
    if (!active) return;
    for (int i = s.part_begin; i < s.part_end; ++i) {
      const float4 v = *reinterpret_cast<const float4*>(p.parts[i].rows + elem);
      acc.x += v.x;
      acc.y += v.y;
      acc.z += v.z;
      acc.w += v.w;
    }
    if (s.out_f32 != nullptr) *reinterpret_cast<float4*>(s.out_f32 + elem) = acc;
    if (s.out_bf16 != nullptr) store_bf16x4(s.out_bf16, elem, acc);
    return;
  }
  const int heads = s.row_elems / s.head_dim;
  const int64_t lse_at = row * heads + col / s.head_dim;
  float m = -INFINITY;
  float denom = 0.0F;
  if (active) {
    for (int i = s.part_begin; i < s.part_end; ++i) m = fmaxf(m, p.parts[i].lse[lse_at]);
    if (m != -INFINITY) {
      for (int i = s.part_begin; i < s.part_end; ++i) {
        const float wgt = __expf(p.parts[i].lse[lse_at] - m);
        const float4 o = *reinterpret_cast<const float4*>(p.parts[i].rows + elem);
        acc.x += wgt * o.x;
        acc.y += wgt * o.y;
        acc.z += wgt * o.z;
        acc.w += wgt * o.w;
        denom += wgt;
      }
    }
  }
  // In place: every thread of a (row, head) has read the partial LSEs before its first thread
  // overwrites the output LSE. They share this CTA: head_dim / 4 divides kBlock (host check).
  __syncthreads();
  if (!active) return;
  const float inv = denom > 0.0F ? 1.0F / denom : 0.0F;
  acc.x *= inv;
  acc.y *= inv;
  acc.z *= inv;
  acc.w *= inv;
  if (s.out_f32 != nullptr) *reinterpret_cast<float4*>(s.out_f32 + elem) = acc;
  if (s.out_bf16 != nullptr) store_bf16x4(s.out_bf16, elem, acc);
  if (s.lse_out != nullptr && col % s.head_dim == 0) s.lse_out[lse_at] = denom > 0.0F ? m + logf(denom) : -INFINITY;
}

// One warp per (row, head): lanes take 8-element (16-byte) chunks, then a warp reduction.
__global__ void __launch_bounds__(kBlock) delta_kernel(const __nv_bfloat16* dout, const __nv_bfloat16* out, float* delta,
                                                       int64_t num_row_heads, int head_dim) {
  const int64_t rh = (static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x & 31);
  if (rh >= num_row_heads) return;
  float sum = 0.0F;
  for (int c = lane; c < head_dim / 8; c += 32) {
    const uint4 a = *reinterpret_cast<const uint4*>(dout + rh * head_dim + c * 8);
    const uint4 b = *reinterpret_cast<const uint4*>(out + rh * head_dim + c * 8);
    const auto* a2 = reinterpret_cast<const __nv_bfloat162*>(&a);
    const auto* b2 = reinterpret_cast<const __nv_bfloat162*>(&b);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 fa = __bfloat1622float2(a2[i]);
      const float2 fb = __bfloat1622float2(b2[i]);
      sum += fa.x * fb.x + fa.y * fb.y;
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffU, sum, off);
  if (lane == 0) delta[rh] = sum;
}

void check_launch(const char* where) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) raise(ErrorKind::Cuda, std::string(where) + ": launch: " + cudaGetErrorString(err));
}

unsigned grid_for(int64_t threads) { return static_cast<unsigned>((threads + kBlock - 1) / kBlock); }

}  // namespace

void attention_merge(const AttnMergeParams& params, cudaStream_t stream) {
  if (params.head_dim % 4 != 0 || params.head_dim <= 0) {
    raise(ErrorKind::InvalidInput, "attention_merge: head_dim must be a positive multiple of 4");
  }
  const int64_t threads = static_cast<int64_t>(params.num_rows) * params.num_heads * (params.head_dim / 4);
  if (threads == 0) return;
  merge_kernel<<<grid_for(threads), kBlock, 0, stream>>>(params);
  check_launch("attention_merge");
}

void sum_partials(const SumPartialsParams& params, cudaStream_t stream) {
  if (params.row_elems % 4 != 0 || params.row_elems <= 0) {
    raise(ErrorKind::InvalidInput, "sum_partials: row_elems must be a positive multiple of 4");
  }
  const int64_t threads = static_cast<int64_t>(params.num_rows) * (params.row_elems / 4);
  if (threads == 0) return;
  sum_kernel<<<grid_for(threads), kBlock, 0, stream>>>(params);
  check_launch("sum_partials");
}

int32_t prepare_merge_batch(std::span<MergeSegment> segments) {
  int64_t blocks = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    MergeSegment& g = segments[i];
    const bool lse = g.head_dim > 0;
    if (g.num_rows < 0 || g.row_elems <= 0 || g.row_elems % 4 != 0 || g.head_dim < 0 || g.part_end < g.part_begin ||
        g.part_begin < 0 ||
        (lse && (g.head_dim % 4 != 0 || g.row_elems % g.head_dim != 0 || kBlock % (g.head_dim / 4) != 0))) {
      raise(ErrorKind::InvalidInput,
            "merge_batch: segment " + std::to_string(i) + " has " + std::to_string(g.num_rows) + " rows of " +
                std::to_string(g.row_elems) + " floats, head_dim " + std::to_string(g.head_dim) + ", partials [" +
                std::to_string(g.part_begin) + ", " + std::to_string(g.part_end) +
                ") (expected rows >= 0, row_elems a positive multiple of 4, head_dim 0 or a multiple of 4 dividing "
                "row_elems with head_dim / 4 dividing " + std::to_string(kBlock) + ")");
    }
    g.block_begin = static_cast<int32_t>(blocks);
    blocks += (static_cast<int64_t>(g.num_rows) * (g.row_elems / 4) + kBlock - 1) / kBlock;
    if (blocks > INT32_MAX) raise(ErrorKind::Unsupported, "merge_batch: more than 2^31 CTAs");
  }
  return static_cast<int32_t>(blocks);
}

void merge_batch(const MergeBatchParams& params, cudaStream_t stream) {
  if (params.num_blocks <= 0 || params.num_segments <= 0) return;
  merge_batch_kernel<<<static_cast<unsigned>(params.num_blocks), kBlock, 0, stream>>>(params);
  check_launch("merge_batch");
}

void attention_backward_delta(const void* dout_bf16, const void* out_bf16, float* delta, int32_t num_rows,
                              int32_t num_heads, int32_t head_dim, cudaStream_t stream) {
  if (head_dim % 8 != 0 || head_dim <= 0) {
    raise(ErrorKind::InvalidInput, "attention_backward_delta: head_dim must be a positive multiple of 8");
  }
  const int64_t row_heads = static_cast<int64_t>(num_rows) * num_heads;
  if (row_heads == 0) return;
  delta_kernel<<<grid_for(row_heads * 32), kBlock, 0, stream>>>(static_cast<const __nv_bfloat16*>(dout_bf16),
                                                              static_cast<const __nv_bfloat16*>(out_bf16), delta,
                                                              row_heads, head_dim);
  check_launch("attention_backward_delta");
}

}  // namespace dcp::cuda
