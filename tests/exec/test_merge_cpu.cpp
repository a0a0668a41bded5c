// LSE merge, partial sums, bf16 rounding, and a finite-difference check of the fp64 reference
// backward that the kernel tests trust.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "dcp/detail/attention_cpu.h"
#include "dcp/detail/bf16.h"
#include "exec/reference_attention.h"

namespace dcp::test {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kDim = 32;
constexpr int64_t kRows = 50;

struct Partial {
  std::vector<float> o, lse;
};

Partial random_partial(SplitMix64& rng, double masked_fraction) {
  Partial p{random_tensor(rng, kRows * kDim), std::vector<float>(kRows)};
  for (float& l : p.lse) l = rng.uniform() < masked_fraction ? kNegInf : 5.0f * rng.symmetric();
  for (int64_t i = 0; i < kRows; ++i)
    if (p.lse[i] == kNegInf)
      for (int x = 0; x < kDim; ++x) p.o[i * kDim + x] = 0.0f;
  return p;
}

Partial merged(const Partial& a, const Partial& b) {
  Partial r = a;
  cpu::merge_into(r.o.data(), r.lse.data(), b.o.data(), b.lse.data(), kRows, kDim);
  return r;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i]) continue;  // covers matching infinities
    d = std::max(d, std::abs(static_cast<double>(a[i]) - b[i]));
    if (std::isnan(a[i]) || std::isnan(b[i])) return std::numeric_limits<double>::infinity();
  }
  return d;
}

TEST(MergeCpu, CommutativeAndAssociative) {
  SplitMix64 rng(21);
  const Partial a = random_partial(rng, 0.3), b = random_partial(rng, 0.3), c = random_partial(rng, 0.3);
  EXPECT_LT(max_diff(merged(a, b).o, merged(b, a).o), 1e-6);
  EXPECT_LT(max_diff(merged(a, b).lse, merged(b, a).lse), 1e-6);
  const Partial left = merged(merged(a, b), c);
  const Partial right = merged(a, merged(b, c));
  EXPECT_LT(max_diff(left.o, right.o), 1e-6);
  EXPECT_LT(max_diff(left.lse, right.lse), 1e-6);
  Partial all;
  all.o.resize(kRows * kDim);
  all.lse.resize(kRows);
  const cpu::PartialView views[] = {{a.o.data(), a.lse.data()}, {b.o.data(), b.lse.data()},
                                    {c.o.data(), c.lse.data()}};
  cpu::merge_partials(views, all.o.data(), all.lse.data(), kRows, kDim);
  EXPECT_LT(max_diff(all.o, left.o), 1e-6);
  EXPECT_LT(max_diff(all.lse, left.lse), 1e-6);
}

TEST(MergeCpu, MatchesFp64Softmax) {
  // Merging partials of disjoint key sets equals the softmax over the union: with partial
  // LSE_i and O_i, O = sum_i exp(LSE_i - LSE) O_i and LSE = log sum_i exp(LSE_i).
  SplitMix64 rng(22);
  const Partial a = random_partial(rng, 0.2), b = random_partial(rng, 0.2);
  const Partial m = merged(a, b);
  for (int64_t i = 0; i < kRows; ++i) {
    const double la = a.lse[i], lb = b.lse[i];
    if (std::isinf(la) && std::isinf(lb)) {
      EXPECT_EQ(m.lse[i], kNegInf);
      continue;
    }
    const double mx = std::max(la, lb);
    const double lse = mx + std::log(std::exp(la - mx) + std::exp(lb - mx));
    EXPECT_NEAR(m.lse[i], lse, 1e-5 * std::max(1.0, std::abs(lse)));
    for (int x = 0; x < kDim; ++x) {
      const double want = std::exp(la - lse) * a.o[i * kDim + x] + std::exp(lb - lse) * b.o[i * kDim + x];
      EXPECT_NEAR(m.o[i * kDim + x], want, 1e-6);
    }
  }
}

TEST(MergeCpu, MinusInfinityIsTheExactIdentity) {
  SplitMix64 rng(23);
  const Partial real = random_partial(rng, 0.0);
  Partial empty{std::vector<float>(kRows * kDim, 0.0f), std::vector<float>(kRows, kNegInf)};
  EXPECT_EQ(merged(real, empty).o, real.o);
  EXPECT_EQ(merged(real, empty).lse, real.lse);
  EXPECT_EQ(merged(empty, real).o, real.o);
  EXPECT_EQ(merged(empty, real).lse, real.lse);
  const Partial both = merged(empty, empty);
  for (float l : both.lse) EXPECT_EQ(l, kNegInf);
  for (float x : both.o) EXPECT_EQ(x, 0.0f);
  std::vector<float> o(kRows * kDim), lse(kRows);
  const cpu::PartialView views[] = {{empty.o.data(), empty.lse.data()}, {real.o.data(), real.lse.data()}};
  cpu::merge_partials(views, o.data(), lse.data(), kRows, kDim);
  EXPECT_EQ(o, real.o);
  EXPECT_EQ(lse, real.lse);
}

TEST(MergeCpu, SumAndDelta) {
  std::vector<float> dst{1, 2, 3}, src{0.5f, -2, 4};
  cpu::sum_into(dst.data(), src.data(), 3);
  EXPECT_EQ(dst, (std::vector<float>{1.5f, 0.0f, 7.0f}));
  const std::vector<float> d_o{1, 2, 3, 4, 1, 1, 1, 1}, o{1, 1, 1, 1, 2, 0, 0, 2};
  std::vector<float> delta(2);
  cpu::compute_delta(d_o.data(), o.data(), 1, 2, 4, delta.data());
  EXPECT_EQ(delta, (std::vector<float>{10.0f, 4.0f}));
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(dcp::round_to_bf16(1.0f), 1.0f);
  EXPECT_EQ(dcp::round_to_bf16(1.0f + 0x1.0p-8f), 1.0f);                 // tie, even is 1
  EXPECT_EQ(dcp::round_to_bf16(1.0f + 3 * 0x1.0p-8f), 1.0f + 0x1.0p-6f);  // tie, even is up
  EXPECT_EQ(dcp::round_to_bf16(1.0f + 0x1.8p-8f), 1.0f + 0x1.0p-7f);      // above the tie
  EXPECT_EQ(dcp::round_to_bf16(-2.5f), -2.5f);
  EXPECT_TRUE(std::isnan(dcp::round_to_bf16(std::nanf(""))));
  EXPECT_EQ(dcp::round_to_bf16(std::numeric_limits<float>::infinity()), std::numeric_limits<float>::infinity());
  std::vector<float> v{3.14159265f};
  cpu::round_to_bf16(v);
  EXPECT_EQ(v[0], 3.140625f);
}

// Finite differences of L = sum(O * dO) with respect to Q, K, V against the reference backward.
TEST(DenseReference, BackwardMatchesFiniteDifferences) {
  SplitMix64 rng(24);
  DenseProblem p;
  p.num_q = 5;
  p.num_kv = 6;
  p.q_heads = 2;
  p.kv_heads = 1;
  p.head_dim = 4;
  p.allowed.assign(30, 0);
  for (int64_t i = 0; i < 5; ++i)
    for (int64_t j = 0; j < 6; ++j) p.allowed[i * 6 + j] = (j <= i + 1 && (i + j) % 4 != 3) ? 1 : 0;
  p.allowed[2 * 6 + 0] = p.allowed[2 * 6 + 1] = p.allowed[2 * 6 + 2] = p.allowed[2 * 6 + 3] = 0;  // row 2 empty
  p.q = random_tensor(rng, 5 * 2 * 4);
  p.k = random_tensor(rng, 6 * 4);
  p.v = random_tensor(rng, 6 * 4);
  p.d_o = random_tensor(rng, 5 * 2 * 4);
  const DenseResult grad = dense_reference(p);
  auto loss = [&](const DenseProblem& pp) {
    DenseProblem fwd = pp;
    fwd.d_o.clear();
    const DenseResult r = dense_reference(fwd);
    double l = 0.0;
    for (size_t i = 0; i < r.o.size(); ++i) l += r.o[i] * pp.d_o[i];
    return l;
  };
  // Central differences (error O(h^2)); the step is measured after fp32 rounding.
  const float h = 0x1.0p-10f;
  auto check = [&](std::vector<float> DenseProblem::*field, const std::vector<double>& analytic, const char* what) {
    for (size_t i = 0; i < analytic.size(); ++i) {
      DenseProblem plus = p, minus = p;
      (plus.*field)[i] += h;
      (minus.*field)[i] -= h;
      const double step = static_cast<double>((plus.*field)[i]) - (minus.*field)[i];
      const double numeric = (loss(plus) - loss(minus)) / step;
      EXPECT_NEAR(numeric, analytic[i], 1e-5) << what << "[" << i << "]";
    }
  };
  check(&DenseProblem::q, grad.dq, "dQ");
  check(&DenseProblem::k, grad.dk, "dK");
  check(&DenseProblem::v, grad.dv, "dV");
}

}  // namespace
}  // namespace dcp::test
