// The CUDA backend's small kernels on a caller's strided tensors (cuda_backend_kernels.h), against
// host references; skipped without a GPU.
// exchange_rows (moves between group-major arrays and the tensors): every element lands where the
// layout says, for both directions, bf16 and fp32 on either side, the 8-wide and the scalar path,
// and several moves of different sizes in one launch; an export of the one-pass deterministic
// backward's counts (ExchangeMove::units) lands as their values.
// delta_from_tensors (Delta = <dO, O> per row and head): against fp64, on the 8-wide path (head
// dims 64, 128, 256) and the scalar one (unaligned strides, a head dim of 24); with it, |dO|_2^2.
// deterministic_dq_units and _from_norms (the one-pass deterministic backward's units): the K and
// V maxima exact, and each unit the host formula of dcp/detail/dq_units.h on them.
// deterministic_dq_from_units: counts back to fp32 bit for bit as the host's from_units, on the
// 4-wide path and the scalar one (a head dim of 6).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "attention_cuda_check.h"
#include "common/rng.h"
#include "dcp/detail/attention_cuda.h"
#include "dcp/detail/dq_units.h"
#include "exec/cuda/cuda_backend_kernels.h"

namespace {

uint16_t float_to_bf16(float x) {  // round to nearest even, as the kernels' conversions
  uint32_t u = 0;
  std::memcpy(&u, &x, 4);
  u += 0x7FFFU + ((u >> 16) & 1U);
  return static_cast<uint16_t>(u >> 16);
}
float bf16_to_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float x = 0;
  std::memcpy(&x, &u, 4);
  return x;
}

// A buffer of n elements of either type, on the host and on the device.
struct Buffer {
  bool bf16 = false;
  std::vector<uint16_t> h16;
  std::vector<float> h32;
  void* dev = nullptr;
  Buffer(bool is_bf16, size_t n, dcp::test::SplitMix64& rng) : bf16(is_bf16) {
    if (bf16) {
      h16.resize(n);
      for (auto& x : h16) x = float_to_bf16(rng.symmetric());
    } else {
      h32.resize(n);
      for (auto& x : h32) x = rng.symmetric();
    }
    EXPECT_EQ(cudaMalloc(&dev, n * (bf16 ? 2 : 4) + 64), cudaSuccess);
    upload();
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { cudaFree(dev); }
  size_t size() const { return bf16 ? h16.size() : h32.size(); }
  float get(size_t i) const { return bf16 ? bf16_to_float(h16[i]) : h32[i]; }
  void set(size_t i, float x) {
    if (bf16) h16[i] = float_to_bf16(x);
    else h32[i] = x;
  }
  void upload() {
    EXPECT_EQ(cudaMemcpy(dev, bf16 ? static_cast<const void*>(h16.data()) : h32.data(), size() * (bf16 ? 2 : 4),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  // The device contents, as floats.
  std::vector<float> download() const {
    std::vector<float> out(size());
    if (bf16) {
      std::vector<uint16_t> tmp(size());
      EXPECT_EQ(cudaMemcpy(tmp.data(), dev, size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      for (size_t i = 0; i < size(); ++i) out[i] = bf16_to_float(tmp[i]);
    } else {
      EXPECT_EQ(cudaMemcpy(out.data(), dev, size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return out;
  }
};

struct Case {
  int groups, rows, heads_per_group, head_dim;
  int64_t row_pad, head_pad;  // extra elements between tokens and between heads of the tensor
  bool tensor_bf16, array_bf16, import, vector;
  bool counts = false;  // export of int32 counts of per-(row, head) units (ExchangeMove::units)
};

// Runs the cases as one batch and checks every element of every destination.
void run_batch(const std::vector<Case>& cases, uint64_t seed) {
  dcp::test::SplitMix64 rng(seed);
  std::vector<std::unique_ptr<Buffer>> tensors, arrays;
  std::vector<std::vector<int32_t>> exps(cases.size());
  std::vector<int32_t*> exps_dev;
  dcp::cuda::ExchangeBatch batch;
  for (const Case& c : cases) {
    const int64_t head_stride = c.head_dim + c.head_pad;
    const int64_t row_stride = int64_t{c.groups} * c.heads_per_group * head_stride + c.row_pad;
    const auto tensor_elems = static_cast<size_t>(row_stride * c.rows);
    const auto array_elems = static_cast<size_t>(int64_t{c.groups} * c.rows * c.heads_per_group * c.head_dim);
    tensors.push_back(std::make_unique<Buffer>(c.tensor_bf16, tensor_elems, rng));
    arrays.push_back(std::make_unique<Buffer>(c.array_bf16, array_elems, rng));
    dcp::cuda::ExchangeMove& m = batch.moves[batch.num_moves++];
    m.tensor = tensors.back()->dev;
    m.array = arrays.back()->dev;
    m.row_stride = row_stride;
    m.head_stride = head_stride;
    m.num_rows = c.rows;
    m.heads_per_group = c.heads_per_group;
    m.head_dim = c.head_dim;
    m.num_groups = c.groups;
    m.tensor_bf16 = c.tensor_bf16 ? 1 : 0;
    m.array_bf16 = c.array_bf16 ? 1 : 0;
    m.import = c.import ? 1 : 0;
    m.vector = c.vector ? 1 : 0;
    if (c.counts) {  // random counts in the fp32 array, random units per (row, head)
      Buffer& a = *arrays.back();
      for (size_t k = 0; k < a.size(); ++k) {
        const auto n = static_cast<int32_t>(rng.uniform(-(int64_t{1} << 30), int64_t{1} << 30) >> rng.below(31));
        float f = 0;
        std::memcpy(&f, &n, 4);
        a.set(k, f);
      }
      a.upload();
      auto& e = exps[batch.num_moves - 1];
      e.resize(array_elems / static_cast<size_t>(c.head_dim));
      for (auto& x : e) x = static_cast<int32_t>(rng.uniform(int64_t{100}, int64_t{140}));
      int32_t* dev = nullptr;
      EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&dev), e.size() * 4), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(dev, e.data(), e.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
      exps_dev.push_back(dev);
      m.units = dev;
    }
  }
  dcp::cuda::exchange_rows(batch, nullptr);
  for (int32_t* p : exps_dev) cudaFree(p);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    Buffer& t = *tensors[i];
    Buffer& a = *arrays[i];
    const dcp::cuda::ExchangeMove& m = batch.moves[i];
    // The expected destination: its old contents, with every mapped element replaced.
    Buffer& dst = c.import ? a : t;
    const Buffer& src = c.import ? t : a;
    for (int g = 0; g < c.groups; ++g) {
      for (int r = 0; r < c.rows; ++r) {
        for (int h = 0; h < c.heads_per_group; ++h) {
          for (int d = 0; d < c.head_dim; ++d) {
            const auto ai = static_cast<size_t>(((int64_t{g} * c.rows + r) * c.heads_per_group + h) * c.head_dim + d);
            const auto ti = static_cast<size_t>(r * m.row_stride + (int64_t{g} * c.heads_per_group + h) * m.head_stride + d);
            float x = src.get(c.import ? ti : ai);
            if (c.counts) {
              int32_t n = 0;
              std::memcpy(&n, &x, 4);
              x = dcp::cuda::dq_units::from_units(n, exps[i][ai / static_cast<size_t>(c.head_dim)]);
            }
            dst.set(c.import ? ai : ti, x);
          }
        }
      }
    }
    const std::vector<float> got = dst.download();
    int64_t bad = 0;
    for (size_t k = 0; k < got.size(); ++k) {
      if (got[k] != dst.get(k)) {
        if (bad++ < 5) ADD_FAILURE() << "move " << i << " element " << k << ": got " << got[k] << ", want " << dst.get(k);
      }
    }
    EXPECT_EQ(bad, 0) << "move " << i << " (groups " << c.groups << ", rows " << c.rows << ", heads " << c.heads_per_group
                      << ", dim " << c.head_dim << ", import " << c.import << ", vector " << c.vector << ")";
  }
}

TEST(ExchangeCuda, ImportsAndExportsEveryLayoutAndType) {
  if (!dcp::cuda::check::gpu_available()) GTEST_SKIP() << "no CUDA GPU on this machine";
  uint64_t seed = 1;
  for (const bool import : {true, false}) {
    for (const bool tensor_bf16 : {true, false}) {
      for (const bool array_bf16 : {true, false}) {
        // 8-wide: strides and dims multiples of 8; scalar: a head dim of 12 and odd padding.
        run_batch({{2, 37, 4, 128, 16, 0, tensor_bf16, array_bf16, import, true},
                   {1, 1, 1, 64, 0, 8, tensor_bf16, array_bf16, import, true},
                   {3, 19, 2, 12, 5, 3, tensor_bf16, array_bf16, import, false}},
                  seed++);
      }
    }
  }
}

TEST(ExchangeCuda, ExportsCountsOfUnitsAsTheirValues) {
  if (!dcp::cuda::check::gpu_available()) GTEST_SKIP() << "no CUDA GPU on this machine";
  for (const bool tensor_bf16 : {true, false}) {
    run_batch({{2, 37, 4, 128, 16, 0, tensor_bf16, false, false, true, true},
               {3, 19, 2, 12, 5, 3, tensor_bf16, false, false, false, true},
               {1, 5, 1, 64, 0, 0, tensor_bf16, false, false, true, false}},
              tensor_bf16 ? 7 : 8);
  }
}

TEST(ExchangeCuda, LargeMovesOfDifferentSizesInOneLaunch) {
  if (!dcp::cuda::check::gpu_available()) GTEST_SKIP() << "no CUDA GPU on this machine";
  // Many strides of the grid per thread (pieces far beyond the launch's threads).
  run_batch({{4, 20000, 4, 128, 0, 0, true, true, true, true},
             {4, 20000, 1, 128, 128, 0, true, false, false, true},
             {1, 3001, 3, 40, 8, 8, false, true, true, true}},
            99);
}

// Delta of every (row, head) of random strided dO and O, into the group-major delta array, and
// |dO|_2^2 beside it (the one-pass deterministic backward's norms) when `norms`.
void check_delta(int groups, int heads_per_group, int rows, int head_dim, int64_t row_pad, bool do_bf16, bool o_bf16,
                 uint64_t seed, bool norms) {
  dcp::test::SplitMix64 rng(seed);
  const int heads = groups * heads_per_group;
  const int64_t head_stride = head_dim + row_pad;  // padding between heads too
  const int64_t row_stride = heads * head_stride + row_pad;
  Buffer d_o(do_bf16, static_cast<size_t>(row_stride * rows), rng);
  Buffer o(o_bf16, static_cast<size_t>(row_stride * rows), rng);
  void* delta_mem = nullptr;
  const auto n = static_cast<size_t>(rows) * heads;
  ASSERT_EQ(cudaMalloc(&delta_mem, 2 * n * 4), cudaSuccess);
  auto* delta = static_cast<float*>(delta_mem);
  dcp::cuda::DeltaFromParams p;
  p.d_o = d_o.dev;
  p.o = o.dev;
  p.delta = delta;
  p.do_row_stride = p.o_row_stride = row_stride;
  p.do_head_stride = p.o_head_stride = head_stride;
  p.num_rows = rows;
  p.heads_per_group = heads_per_group;
  p.num_groups = groups;
  p.head_dim = head_dim;
  p.do_bf16 = do_bf16 ? 1 : 0;
  p.o_bf16 = o_bf16 ? 1 : 0;
  p.norm2 = norms ? delta + n : nullptr;
  ASSERT_EQ(cudaMemset(delta + n, 0xff, n * 4), cudaSuccess);  // NaN: stays so unless written
  dcp::cuda::delta_from_tensors(p, nullptr);
  std::vector<float> got(2 * n);
  ASSERT_EQ(cudaMemcpy(got.data(), delta, 2 * n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(delta);
  int bad = 0;
  for (int g = 0; g < groups; ++g) {
    for (int r = 0; r < rows; ++r) {
      for (int h = 0; h < heads_per_group; ++h) {
        double want = 0.0;
        double scale = 0.0;
        double n2 = 0.0;
        for (int d = 0; d < head_dim; ++d) {
          const auto i = static_cast<size_t>(r * row_stride + (int64_t{g} * heads_per_group + h) * head_stride + d);
          want += double{d_o.get(i)} * o.get(i);
          scale += std::fabs(double{d_o.get(i)} * o.get(i));
          n2 += double{d_o.get(i)} * d_o.get(i);
        }
        const auto at = static_cast<size_t>((int64_t{g} * rows + r) * heads_per_group + h);
        const float x = got[at];
        if (std::fabs(x - want) > 1e-5 * (scale + 1e-30) && bad++ < 5) {
          ADD_FAILURE() << "delta (g " << g << ", row " << r << ", head " << h << "): got " << x << ", want " << want;
        }
        const float y = got[n + at];
        if (norms ? !(std::fabs(y - n2) <= 1e-5 * n2) : !std::isnan(y)) {
          if (bad++ < 5) {
            ADD_FAILURE() << "|dO|^2 (g " << g << ", row " << r << ", head " << h << "): got " << y << ", want "
                          << (norms ? n2 : std::nan("")) << " (norms " << (norms ? "asked" : "not asked") << ")";
          }
        }
      }
    }
  }
  EXPECT_EQ(bad, 0) << "head dim " << head_dim << ", pad " << row_pad;
}

TEST(DeltaFromCuda, MatchesFp64OnEveryPath) {
  if (!dcp::cuda::check::gpu_available()) GTEST_SKIP() << "no CUDA GPU on this machine";
  uint64_t seed = 7;
  for (const bool do_bf16 : {true, false}) {
    for (const bool o_bf16 : {true, false}) {
      for (const bool norms : {false, true}) {
        check_delta(2, 4, 301, 128, 0, do_bf16, o_bf16, seed++, norms);  // 16 lanes a (row, head)
        check_delta(3, 1, 77, 64, 8, do_bf16, o_bf16, seed++, norms);    // 8 lanes, padded strides
        check_delta(1, 2, 33, 256, 0, do_bf16, o_bf16, seed++, norms);   // a whole warp
        check_delta(2, 2, 50, 24, 0, do_bf16, o_bf16, seed++, norms);    // scalar: 24 / 8 is not a power of two
        check_delta(1, 3, 40, 64, 3, do_bf16, o_bf16, seed++, norms);    // scalar: unaligned strides
      }
    }
  }
}

TEST(DqUnitsCuda, BothRoutesGiveTheHostFormulaOnExactMaxima) {
  if (!dcp::cuda::check::gpu_available()) GTEST_SKIP() << "no CUDA GPU on this machine";
  namespace units = dcp::cuda::dq_units;
  constexpr int kRows = 300, kKvHeads = 2, kQHeads = 8, kDim = 128;
  const dcp::cuda::AttnShape shape{kQHeads, kKvHeads, kDim, 1.0F / std::sqrt(static_cast<float>(kDim))};
  dcp::test::SplitMix64 rng(41);
  Buffer k(true, size_t{kRows} * kKvHeads * kDim, rng), v(true, size_t{kRows} * kKvHeads * kDim, rng);
  Buffer d_o(true, size_t{kRows} * kQHeads * kDim, rng);
  // Rows and heads of very different scales, and one outlier feature of K.
  for (size_t i = 0; i < d_o.size(); ++i) d_o.set(i, d_o.get(i) * std::ldexp(1.0F, static_cast<int>(i / kDim % 13) - 6));
  for (size_t i = 0; i < v.size(); ++i) v.set(i, v.get(i) * std::ldexp(1.0F, static_cast<int>(i / kDim % 5) - 2));
  k.set(size_t{(123 * kKvHeads + 1) * kDim + 7}, 37.5F);
  k.upload();
  v.upload();
  d_o.upload();
  const size_t n = size_t{kRows} * kQHeads;
  std::vector<float> norms(n);
  for (size_t i = 0; i < n; ++i) {
    double s = 0;
    for (int d = 0; d < kDim; ++d) s += double{d_o.get(i * kDim + d)} * d_o.get(i * kDim + d);
    norms[i] = static_cast<float>(s);
  }
  void* mem = nullptr;
  ASSERT_EQ(cudaMalloc(&mem, (3 * n + 2 * kKvHeads) * 4), cudaSuccess);
  auto* norms_dev = static_cast<float*>(mem);
  auto* units_do = reinterpret_cast<int32_t*>(norms_dev + n);
  auto* units_norms = units_do + n;
  auto* bound = reinterpret_cast<float*>(units_norms + n);
  ASSERT_EQ(cudaMemcpy(norms_dev, norms.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
  dcp::cuda::deterministic_dq_units(k.dev, v.dev, kRows, d_o.dev, kRows, shape, bound, units_do, nullptr);
  dcp::cuda::deterministic_dq_units_from_norms(k.dev, v.dev, kRows, norms_dev, kRows, shape, bound, units_norms,
                                               nullptr);
  std::vector<int32_t> got(2 * n);
  std::vector<float> got_bound(2 * kKvHeads);
  ASSERT_EQ(cudaMemcpy(got.data(), units_do, 2 * n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(got_bound.data(), bound, got_bound.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(mem);
  for (int h = 0; h < kKvHeads; ++h) {
    float k_max = 0;
    double v2_max = 0;
    for (int r = 0; r < kRows; ++r) {
      double v2 = 0;
      for (int d = 0; d < kDim; ++d) {
        const size_t i = (static_cast<size_t>(r) * kKvHeads + h) * kDim + d;
        k_max = std::max(k_max, std::fabs(k.get(i)));
        v2 += double{v.get(i)} * v.get(i);
      }
      v2_max = std::max(v2_max, v2);
    }
    EXPECT_EQ(got_bound[2 * h], k_max) << "kv head " << h;
    EXPECT_NEAR(got_bound[2 * h + 1], v2_max, 1e-6 * v2_max) << "kv head " << h;
  }
  EXPECT_EQ(got_bound[2 * 1], 37.5F);
  int bad = 0;
  for (size_t i = 0; i < n; ++i) {
    const int kvh = static_cast<int>(i % kQHeads) / (kQHeads / kKvHeads);
    const int32_t want =
        units::exponent(units::bound(shape.softmax_scale, got_bound[2 * kvh], got_bound[2 * kvh + 1], norms[i]));
    // From the norms: the formula exactly. From dO: its own fp32 sum of squares, one rounding
    // from the host's, so at most one exponent away where that straddles a power of two.
    if ((got[n + i] != want || std::abs(got[i] - want) > 1) && bad++ < 5) {
      ADD_FAILURE() << "(row " << i / kQHeads << ", head " << i % kQHeads << "): from norms " << got[n + i]
                    << ", from dO " << got[i] << ", want " << want;
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(DqUnitsCuda, CountsBackToFp32AsTheHostFormula) {
  if (!dcp::cuda::check::gpu_available()) GTEST_SKIP() << "no CUDA GPU on this machine";
  namespace units = dcp::cuda::dq_units;
  for (const int dim : {128, 6}) {
    constexpr int kRows = 70, kHeads = 3;
    const dcp::cuda::AttnShape shape{kHeads, 1, dim, 0.1F};
    const size_t n = size_t{kRows} * kHeads * static_cast<size_t>(dim);
    dcp::test::SplitMix64 rng(static_cast<uint64_t>(dim));
    std::vector<int32_t> counts(n), exps(size_t{kRows} * kHeads);
    for (auto& c : counts) c = static_cast<int32_t>(rng.uniform(-(int64_t{1} << 30), int64_t{1} << 30) >> rng.below(31));
    for (auto& e : exps) e = static_cast<int32_t>(rng.uniform(int64_t{1}, int64_t{255 - units::kBits}));
    void* mem = nullptr;
    ASSERT_EQ(cudaMalloc(&mem, (n + exps.size()) * 4), cudaSuccess);
    auto* dq = static_cast<float*>(mem);
    auto* exps_dev = reinterpret_cast<int32_t*>(dq + n);
    ASSERT_EQ(cudaMemcpy(dq, counts.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(exps_dev, exps.data(), exps.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    dcp::cuda::deterministic_dq_from_units(dq, exps_dev, kRows, shape, nullptr);
    std::vector<float> got(n);
    ASSERT_EQ(cudaMemcpy(got.data(), dq, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    cudaFree(mem);
    int bad = 0;
    for (size_t i = 0; i < n; ++i) {
      const float want = units::from_units(counts[i], exps[i / static_cast<size_t>(dim)]);
      if (std::memcmp(&got[i], &want, 4) != 0 && bad++ < 5)
        ADD_FAILURE() << "head dim " << dim << ", element " << i << ": " << got[i] << ", want " << want;
    }
    EXPECT_EQ(bad, 0) << "head dim " << dim;
  }
}

}  // namespace
