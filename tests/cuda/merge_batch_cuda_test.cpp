// merge_batch (dcp/detail/attention_cuda.h): the host preparation (everywhere) and one launch of many
// LSE-merge and sum segments against an fp64 host reference (skipped without a GPU), including
// in-place accumulation, empty partial lists, -inf partials and bf16 outputs.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "attention_cuda_check.h"
#include "common/rng.h"
#include "dcp/detail/attention_cuda.h"
#include "dcp/error.h"

namespace {

using dcp::cuda::MergePart;
using dcp::cuda::MergeSegment;

TEST(MergeBatchHost, PrepareAssignsConsecutiveBlocksAndRejectsBadSegments) {
  std::vector<MergeSegment> s(4);
  s[0].num_rows = 10;
  s[0].row_elems = 512;  // 10 x 128 vectors: 5 CTAs of 256 threads
  s[0].head_dim = 128;
  s[1].num_rows = 0;     // no CTA
  s[1].row_elems = 64;
  s[2].num_rows = 3;
  s[2].row_elems = 64;   // 48 vectors: 1 CTA
  s[3].num_rows = 33;
  s[3].row_elems = 32;   // 264 vectors: 2 CTAs
  EXPECT_EQ(dcp::cuda::prepare_merge_batch(s), 8);
  EXPECT_EQ(s[0].block_begin, 0);
  EXPECT_EQ(s[1].block_begin, 5);
  EXPECT_EQ(s[2].block_begin, 5);
  EXPECT_EQ(s[3].block_begin, 6);
  std::vector<MergeSegment> bad(1);
  bad[0].num_rows = 1;
  bad[0].row_elems = 6;  // not a multiple of 4
  EXPECT_THROW(dcp::cuda::prepare_merge_batch(bad), dcp::Error);
  bad[0].row_elems = 96;
  bad[0].head_dim = 48;  // 12 threads a head do not divide a CTA
  EXPECT_THROW(dcp::cuda::prepare_merge_batch(bad), dcp::Error);
  bad[0].head_dim = 64;  // does not divide the row
  EXPECT_THROW(dcp::cuda::prepare_merge_batch(bad), dcp::Error);
}

template <class T>
T* device_alloc(size_t count) {
  void* p = nullptr;
  if (cudaMalloc(&p, count * sizeof(T)) != cudaSuccess) return nullptr;
  return static_cast<T*>(p);
}

float bf16_to_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float x = 0;
  std::memcpy(&x, &u, 4);
  return x;
}

// One pool of fp32 rows (partials and outputs alike) and one of LSE rows, both on the device.
TEST(MergeBatchCuda, MatchesSequentialFp64MergesInOneLaunch) {
  if (!dcp::cuda::check::gpu_available()) GTEST_SKIP() << "no CUDA GPU on this machine";
  constexpr int kHeads = 4, kDim = 64, kRowElems = kHeads * kDim, kRowsPerBlock = 37, kBlocks = 24;
  constexpr int64_t kPoolRows = int64_t{kRowsPerBlock} * kBlocks;
  dcp::test::SplitMix64 rng(17);
  std::vector<float> pool(static_cast<size_t>(kPoolRows * kRowElems)), lse(static_cast<size_t>(kPoolRows * kHeads));
  for (float& x : pool) x = rng.symmetric();
  for (float& x : lse) x = rng.below(5) == 0 ? -std::numeric_limits<float>::infinity() : 3.0F * rng.symmetric();
  float* d_pool = device_alloc<float>(pool.size());
  float* d_lse = device_alloc<float>(lse.size());
  void* d_bf16 = device_alloc<uint16_t>(pool.size());
  ASSERT_TRUE(d_pool != nullptr && d_lse != nullptr && d_bf16 != nullptr);
  ASSERT_EQ(cudaMemcpy(d_pool, pool.data(), pool.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_lse, lse.data(), lse.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(d_bf16, 0, pool.size() * 2), cudaSuccess);

  // Blocks 0..7 are outputs (each written once), 8..23 sources; outputs 0..1 accumulate in place.
  std::vector<MergeSegment> segs;
  std::vector<MergePart> parts;
  std::vector<std::vector<int>> srcs;  // block of each partial, per segment
  auto rows = [&](int block) { return d_pool + int64_t{block} * kRowsPerBlock * kRowElems; };
  auto lses = [&](int block) { return d_lse + int64_t{block} * kRowsPerBlock * kHeads; };
  for (int out = 0; out < 8; ++out) {
    MergeSegment g;
    const bool lse_merge = out % 2 == 0 || out == 1;
    g.num_rows = out == 7 ? 5 : kRowsPerBlock;  // a short block
    g.row_elems = kRowElems;
    g.head_dim = lse_merge ? kDim : 0;
    g.out_f32 = out == 3 ? nullptr : rows(out);
    g.out_bf16 = out == 3 || out == 4 ? static_cast<char*>(d_bf16) + int64_t{out} * kRowsPerBlock * kRowElems * 2 : nullptr;
    g.lse_out = lse_merge ? lses(out) : nullptr;
    g.part_begin = static_cast<int32_t>(parts.size());
    std::vector<int> src;
    if (out <= 1) src.push_back(out);                            // in place
    const int num_src = out == 5 ? 0 : 1 + out % 3;  // segment 5: no partial at all
    for (int k = 0; k < num_src; ++k) src.push_back(8 + static_cast<int>(rng.below(16)));
    for (int b : src) parts.push_back({rows(b), lse_merge ? lses(b) : nullptr});
    g.part_end = static_cast<int32_t>(parts.size());
    segs.push_back(g);
    srcs.push_back(src);
  }
  const int32_t blocks = dcp::cuda::prepare_merge_batch(segs);
  MergeSegment* d_segs = device_alloc<MergeSegment>(segs.size());
  MergePart* d_parts = device_alloc<MergePart>(parts.size());
  ASSERT_TRUE(d_segs != nullptr && d_parts != nullptr);
  ASSERT_EQ(cudaMemcpy(d_segs, segs.data(), segs.size() * sizeof(MergeSegment), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_parts, parts.data(), parts.size() * sizeof(MergePart), cudaMemcpyHostToDevice), cudaSuccess);
  dcp::cuda::merge_batch({d_segs, static_cast<int32_t>(segs.size()), blocks, d_parts}, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> got(pool.size()), got_lse(lse.size());
  std::vector<uint16_t> got_bf16(pool.size());
  ASSERT_EQ(cudaMemcpy(got.data(), d_pool, got.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(got_lse.data(), d_lse, got_lse.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(got_bf16.data(), d_bf16, got_bf16.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);

  double worst = 0;
  for (int out = 0; out < 8; ++out) {
    const MergeSegment& g = segs[static_cast<size_t>(out)];
    for (int r = 0; r < kRowsPerBlock; ++r) {
      const int64_t orow = int64_t{out} * kRowsPerBlock + r;
      for (int h = 0; h < kHeads; ++h) {
        double m = -std::numeric_limits<double>::infinity(), denom = 0;
        std::vector<double> acc(kDim, 0.0);
        for (int b : srcs[static_cast<size_t>(out)]) {
          const int64_t prow = int64_t{b} * kRowsPerBlock + r;
          const double l = g.head_dim > 0 ? lse[static_cast<size_t>(prow * kHeads + h)] : 0.0;
          m = std::max(m, l);
        }
        for (int b : srcs[static_cast<size_t>(out)]) {
          const int64_t prow = int64_t{b} * kRowsPerBlock + r;
          const double w = g.head_dim > 0 ? std::exp(lse[static_cast<size_t>(prow * kHeads + h)] - m) : 1.0;
          if (g.head_dim > 0 && std::isinf(m)) continue;
          denom += w;
          for (int d = 0; d < kDim; ++d) acc[static_cast<size_t>(d)] += w * pool[static_cast<size_t>((prow * kHeads + h) * kDim + d)];
        }
        const size_t lse_i = static_cast<size_t>(orow * kHeads + h);
        if (r >= g.num_rows) {  // past the short block: untouched
          ASSERT_EQ(std::memcmp(&got_lse[lse_i], &lse[lse_i], 4), 0);
          continue;
        }
        if (g.head_dim > 0) {
          const double want = denom > 0 ? m + std::log(denom) : -std::numeric_limits<double>::infinity();
          if (std::isinf(want)) {
            ASSERT_TRUE(std::isinf(got_lse[lse_i]) && got_lse[lse_i] < 0) << "out " << out << " row " << r;
          } else {
            worst = std::max(worst, std::abs(got_lse[lse_i] - want) / (1 + std::abs(want)));
          }
        }
        for (int d = 0; d < kDim; ++d) {
          const size_t i = static_cast<size_t>((orow * kHeads + h) * kDim + d);
          const double want = g.head_dim > 0 ? (denom > 0 ? acc[static_cast<size_t>(d)] / denom : 0.0) : acc[static_cast<size_t>(d)];
          if (g.out_f32 != nullptr) {
            worst = std::max(worst, std::abs(got[i] - want) / (1 + std::abs(want)));
          } else {
            ASSERT_EQ(got[i], pool[i]);  // no fp32 output: untouched
          }
          if (g.out_bf16 != nullptr) {
            ASSERT_LE(std::abs(bf16_to_float(got_bf16[i]) - want), 1e-2 * (1 + std::abs(want)));
          }
        }
      }
    }
  }
  EXPECT_LT(worst, 1e-5);
  // Sources are only read.
  for (int64_t i = int64_t{8} * kRowsPerBlock * kRowElems; i < static_cast<int64_t>(pool.size()); ++i)
    ASSERT_EQ(got[static_cast<size_t>(i)], pool[static_cast<size_t>(i)]);
  cudaFree(d_pool);
  cudaFree(d_lse);
  cudaFree(d_bf16);
  cudaFree(d_segs);
  cudaFree(d_parts);
}

}  // namespace
