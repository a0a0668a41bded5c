// GPU tests of the CUDA attention kernels against the fp64 reference (skipped without a GPU).
#include <gtest/gtest.h>

#include "attention_cuda_check.h"

namespace {

using dcp::cuda::check::CaseConfig;

struct Shape {
  int hq, hkv, dim;
};

class CudaAttention : public ::testing::TestWithParam<Shape> {};

TEST_P(CudaAttention, MatchesFp64ReferenceOnRandomTileLists) {
  if (!dcp::cuda::check::gpu_available()) GTEST_SKIP() << "no CUDA GPU on this machine";
  const Shape s = GetParam();
  for (uint64_t seed = 1; seed <= 2; ++seed) {
    CaseConfig cfg;
    cfg.seed = seed * 1000 + static_cast<uint64_t>(s.hkv * 10 + s.dim);
    cfg.num_q_heads = s.hq;
    cfg.num_kv_heads = s.hkv;
    cfg.head_dim = s.dim;
    const auto r = dcp::cuda::check::run_case(cfg);
    ASSERT_TRUE(r.ran);
    EXPECT_TRUE(dcp::cuda::check::passed(r)) << dcp::cuda::check::describe(cfg, r);
    EXPECT_GT(r.num_empty_rows, 0) << "the random lists are meant to contain fully masked rows";
  }
}

// GQA 1, 4 and 8 at head dims 64 and 128.
INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttention,
                         ::testing::Values(Shape{8, 8, 64}, Shape{8, 2, 64}, Shape{8, 1, 64}, Shape{8, 8, 128},
                                           Shape{8, 2, 128}, Shape{8, 1, 128}));

}  // namespace
