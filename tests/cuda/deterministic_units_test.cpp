// Host tests of the one-pass deterministic backward's numbers (dcp/detail/dq_units.h; no GPU
// needed). On random attention problems computed in fp64 (bf16 inputs of very different scales
// per row and per feature, rows with several key ranges and rows with none) and on a row built to
// fill half its bound, the most any row can: every row's contributions to dQ, one per 128-key
// chunk, stay within half the row's bound in every column; as integer counts of the row's unit
// they stay 8x inside int32 and sum to the same bits in any order; and that sum, back in fp32, is
// within half a unit per chunk (and fp32's rounding) of the exact one. On odd seeds every row
// also takes a gradient of its lse (d_lse, up to 4x the row's |dO| max |V|, zero-dO rows too),
// which the bound widens by.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "dcp/detail/bf16.h"
#include "dcp/detail/dq_units.h"
#include "dcp/detail/rng.h"

namespace {

namespace units = dcp::cuda::dq_units;
constexpr int kChunk = 128;  // keys per contribution (a backward work item's chunk)

uint32_t bits_of(float x) {
  uint32_t b = 0;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

TEST(DqUnits, ExponentsAndScalings) {
  EXPECT_EQ(units::exponent(0.0F), 1);             // no contribution: the smallest normal unit
  EXPECT_EQ(units::exponent(0x1.0p-100F), 1);
  EXPECT_EQ(units::exponent(1.0F), 127 - 28);      // u = 2^-28 for 1 <= b < 2
  EXPECT_EQ(units::exponent(1.99F), 127 - 28);
  EXPECT_EQ(units::exponent(2.0F), 127 - 27);
  EXPECT_EQ(units::exponent(0x1.8p40F), 127 + 40 - 28);
  EXPECT_EQ(units::exponent(INFINITY), 255 - 28);  // still a normal unit and multiplier
  for (const int32_t e : {1, 23, 105, 127, 200, 255 - 28}) {
    EXPECT_EQ(units::unit(e), std::ldexp(1.0F, e - 127));
    EXPECT_EQ(units::multiplier(e, 0.75F), 0.75F * std::ldexp(1.0F, 127 - e)) << e;
    EXPECT_TRUE(std::isnormal(units::multiplier(e, 0.088F))) << e;
  }
  // Counts: the scale is applied before the one rounding to an integer (ties to even); values up
  // to 2^30 units keep fp32's 24 bits; from_units gives n u back.
  const int32_t e = units::exponent(3.0F);
  const float u = units::unit(e);
  const float one = units::multiplier(e, 1.0F);
  EXPECT_EQ(units::to_units(37.0F * u, one), 37);
  EXPECT_EQ(units::to_units(2.5F * u, one), 2);
  EXPECT_EQ(units::to_units(-3.5F * u, one), -4);
  EXPECT_EQ(units::to_units(3.0F * u, units::multiplier(e, 0.5F)), 2);  // 1.5 u -> 2 (even)
  EXPECT_EQ(units::to_units(0.3F * u, one), 0);
  for (const float m : {1073741824.0F, -1073741824.0F, 12345678.0F, -8388607.0F}) {
    EXPECT_EQ(units::to_units(m * u, one), static_cast<int32_t>(m)) << m;
    EXPECT_EQ(units::from_units(static_cast<int32_t>(m), e), m * u) << m;
  }
  for (const int32_t small : {1, 2, 30}) {  // the smallest units: subnormal values count too
    const float us = units::unit(small);
    EXPECT_EQ(units::to_units(7.0F * us, units::multiplier(small, 1.0F)), 7);
    EXPECT_EQ(units::to_units(0.75F * us, units::multiplier(small, 1.0F)), 1);
  }
}

struct Problem {
  int dim = 0, rows = 0, keys = 0;
  std::vector<float> q, k, v, d_o;                  // bf16 values
  std::vector<std::vector<std::pair<int, int>>> allowed;  // per row: key ranges
};

float bf16(double x) { return dcp::round_to_bf16(static_cast<float>(x)); }

// A row that fills half its bound, the most two keys can: its keys 0 and 128 (two chunks) have
// equal probabilities, V_0 = -V_128 along dO and K_0 = K_128 = max |K|, so the two contributions
// are +-b / 4 each.
Problem half_full_problem() {
  Problem p;
  p.dim = 64;
  p.rows = 1;
  p.keys = 129;
  p.q.assign(static_cast<size_t>(p.dim), 0.0F);  // S = 0: P = 1/2 for both keys
  p.d_o.assign(static_cast<size_t>(p.dim), 0.0F);
  p.d_o[0] = 0.25F;
  p.k.assign(static_cast<size_t>(p.keys) * p.dim, 0.5F);
  p.v.assign(p.k.size(), 0.0F);
  for (int d = 0; d < p.dim; ++d) {
    p.k[static_cast<size_t>(0) * p.dim + d] = 4.0F;
    p.k[static_cast<size_t>(128) * p.dim + d] = 4.0F;
  }
  p.v[0] = 2.0F;
  p.v[static_cast<size_t>(128) * p.dim] = -2.0F;
  p.allowed = {{{0, 1}, {128, 129}}};
  return p;
}

Problem make_problem(uint64_t seed) {
  if (seed == 0) return half_full_problem();
  dcp::SplitMix64 rng(seed);
  Problem p;
  p.dim = rng.coin() ? 128 : 64;
  p.rows = static_cast<int>(rng.uniform(int64_t{40}, int64_t{120}));
  p.keys = static_cast<int>(rng.uniform(int64_t{130}, int64_t{700}));
  const double amp_q = rng.log_uniform(0.05, 8), amp_k = rng.log_uniform(0.05, 8), amp_v = rng.log_uniform(0.05, 8);
  const int outlier = static_cast<int>(rng.below(p.dim));  // a feature of K and V far above the rest
  p.q.resize(static_cast<size_t>(p.rows) * p.dim);
  p.d_o.resize(p.q.size());
  p.k.resize(static_cast<size_t>(p.keys) * p.dim);
  p.v.resize(p.k.size());
  for (int i = 0; i < p.rows; ++i) {
    const double amp_do = rng.log_uniform(1e-7, 1.0);  // loss gradients of very different sizes
    for (int d = 0; d < p.dim; ++d) {
      p.q[static_cast<size_t>(i) * p.dim + d] = bf16(amp_q * rng.normal());
      p.d_o[static_cast<size_t>(i) * p.dim + d] = bf16(amp_do * rng.normal());
    }
  }
  for (int j = 0; j < p.keys; ++j)
    for (int d = 0; d < p.dim; ++d) {
      const double f = d == outlier ? 20.0 : 1.0;
      p.k[static_cast<size_t>(j) * p.dim + d] = bf16(f * amp_k * rng.normal());
      p.v[static_cast<size_t>(j) * p.dim + d] = bf16(f * amp_v * rng.normal());
    }
  p.allowed.resize(static_cast<size_t>(p.rows));
  for (auto& ranges : p.allowed) {
    const int n = static_cast<int>(rng.below(4));  // 0 (a row with no key) .. 3 ranges
    int at = 0;
    for (int r = 0; r < n && at < p.keys; ++r) {
      const int begin = at + static_cast<int>(rng.below(p.keys - at));
      const int end = std::min(p.keys, begin + 1 + static_cast<int>(rng.below(p.keys)));
      ranges.emplace_back(begin, end);
      at = end;
    }
  }
  return p;
}

TEST(DqUnits, RoundedContributionsSumExactlyInAnyOrder) {
  double worst_fill = 0;         // largest sum |contributions| / bound seen
  std::vector<double> row_fill;  // per row: the RMS of its dQ over the columns / its bound
  std::vector<double> row_err;   // per row: the RMS of the rounded sum's error / the RMS of its dQ
  int rows_checked = 0;
  for (uint64_t seed = 0; seed <= 24; ++seed) {
    const Problem p = make_problem(seed * 104729);
    const int dim = p.dim;
    const float scale = 1.0F / std::sqrt(static_cast<float>(dim));
    const auto at = [dim](const std::vector<float>& m, int r, int d) { return static_cast<double>(m[static_cast<size_t>(r) * dim + d]); };
    // The kernel's maxima over every key row of the head (deterministic_dq_units), in fp32.
    float k_max = 0, v2_max = 0;
    for (int j = 0; j < p.keys; ++j) {
      float v2 = 0;
      for (int d = 0; d < dim; ++d) {
        k_max = std::max(k_max, std::fabs(p.k[static_cast<size_t>(j) * dim + d]));
        v2 = std::fma(p.v[static_cast<size_t>(j) * dim + d], p.v[static_cast<size_t>(j) * dim + d], v2);
      }
      v2_max = std::max(v2_max, v2);
    }
    dcp::SplitMix64 order_rng(seed);
    dcp::SplitMix64 dl_rng(seed + 977);
    for (int i = 0; i < p.rows; ++i) {
      std::vector<int> keys;
      for (const auto& [b, e] : p.allowed[static_cast<size_t>(i)])
        for (int j = b; j < e; ++j) keys.push_back(j);
      if (keys.empty()) continue;
      // fp64 reference: P, dP, Delta, dS over the row's keys.
      std::vector<double> s(keys.size()), dp(keys.size());
      double m = -INFINITY;
      for (size_t x = 0; x < keys.size(); ++x) {
        double qk = 0, dov = 0;
        for (int d = 0; d < dim; ++d) {
          qk += at(p.q, i, d) * at(p.k, keys[x], d);
          dov += at(p.d_o, i, d) * at(p.v, keys[x], d);
        }
        s[x] = scale * qk;
        dp[x] = dov;
        m = std::max(m, s[x]);
      }
      double z = 0;
      for (const double x : s) z += std::exp(x - m);
      double delta = 0;
      for (size_t x = 0; x < keys.size(); ++x) {
        s[x] = std::exp(s[x] - m) / z;  // P
        delta += s[x] * dp[x];
      }
      float n2 = 0;
      for (int d = 0; d < dim; ++d) n2 = std::fma(p.d_o[static_cast<size_t>(i) * dim + d], p.d_o[static_cast<size_t>(i) * dim + d], n2);
      // d_lse as the caller passes it (fp32); rows with dO = 0 get one of magnitude up to 4.
      const double reach = std::sqrt(static_cast<double>(n2) * v2_max);
      const float dl = seed % 2 == 1 ? static_cast<float>((reach > 0 ? reach : 1.0) * (8 * dl_rng.uniform() - 4)) : 0.0F;
      const float b = units::bound(scale, k_max, v2_max, n2, std::fabs(dl));
      const int32_t e = units::exponent(b);
      const float u = units::unit(e);
      double row_sq = 0, err_sq = 0;
      for (int d = 0; d < dim; ++d) {
        // One contribution per 128-key chunk holding some of the row's keys (dS K, unscaled).
        std::vector<double> x_c;
        for (size_t x = 0; x < keys.size();) {
          const int chunk = keys[x] / kChunk;
          double acc = 0;
          for (; x < keys.size() && keys[x] / kChunk == chunk; ++x)
            acc += s[x] * (dp[x] - delta + static_cast<double>(dl)) * at(p.k, keys[x], d);
          x_c.push_back(acc);
        }
        double abs_sum = 0, exact = 0;
        for (const double x : x_c) {
          abs_sum += std::fabs(scale * x);
          exact += scale * x;
        }
        // At most b / 2 (dq_units.h: a mean absolute deviation of dP within [-M, M] is at most M).
        ASSERT_LE(abs_sum, 0.5 * b * (1 + 1e-6)) << "seed " << seed << " row " << i << " column " << d
                                                 << ": the bound does not hold";
        worst_fill = std::max(worst_fill, abs_sum / b);
        row_sq += exact * exact;
        const float mult = units::multiplier(e, scale);
        std::vector<int32_t> r;
        double r_abs = 0, fp32_slack = 0;
        for (const double x : x_c) {
          r.push_back(units::to_units(static_cast<float>(x), mult));
          r_abs += std::fabs(static_cast<double>(r.back()));
          fp32_slack += std::fabs(scale * x) * 0x1.0p-23;  // the contribution and its product in fp32
        }
        // Every partial sum of counts within 2^28, 8x inside int32 (the kernel's margin).
        ASSERT_LT(r_abs, 0x1.0p28) << "seed " << seed << " row " << i;
        // Three orders, each from zero (the dq buffer's start), in int32 wrapping as the
        // reductions do; then the sum in fp32 (from_units).
        std::vector<size_t> idx(r.size());
        std::iota(idx.begin(), idx.end(), size_t{0});
        uint32_t first = 0;
        for (int order = 0; order < 3; ++order) {
          if (order == 1) std::reverse(idx.begin(), idx.end());
          if (order == 2)
            for (size_t a = idx.size(); a > 1; --a) std::swap(idx[a - 1], idx[static_cast<size_t>(order_rng.below(static_cast<int64_t>(a)))]);
          uint32_t count = 0;
          for (const size_t a : idx) count += static_cast<uint32_t>(r[a]);
          const float sum = units::from_units(static_cast<int32_t>(count), e);
          if (order == 0) {
            first = bits_of(sum);
            err_sq += (sum - exact) * (sum - exact);
            // Half a unit per rounding, fp32's rounding of each contribution, and that of the sum.
            EXPECT_LE(std::fabs(sum - exact), 0.5 * static_cast<double>(r.size()) * u + fp32_slack +
                                                   std::fabs(exact) * 0x1.0p-23 + 1e-300)
                << "seed " << seed << " row " << i << " column " << d;
          } else {
            ASSERT_EQ(bits_of(sum), first) << "seed " << seed << " row " << i << " column " << d << ": order " << order;
          }
        }
      }
      row_fill.push_back(std::sqrt(row_sq / dim) / b);
      if (row_sq > 0) row_err.push_back(std::sqrt(err_sq / row_sq));
      ++rows_checked;
    }
  }
  // What the rounding leaves of dQ: the unit is 2^-29 to 2^-28 of the bound, so a row keeps about
  // 29 + log2(fill) bits (less the square root of its chunks' count), fp32's 24 at most.
  std::sort(row_fill.begin(), row_fill.end());
  std::sort(row_err.begin(), row_err.end());
  const auto q = [](const std::vector<double>& x, double f) {
    return std::log2(std::max(x[static_cast<size_t>(f * static_cast<double>(x.size() - 1))], 1e-300));
  };
  std::printf("rows' dQ RMS / bound, log2: 10th percentile %.1f, median %.1f, 90th %.1f\n", q(row_fill, 0.1),
              q(row_fill, 0.5), q(row_fill, 0.9));
  std::printf("rows' dQ error RMS / dQ RMS, log2: 10th percentile %.1f, median %.1f, 90th %.1f (bf16: -9)\n",
              q(row_err, 0.1), q(row_err, 0.5), q(row_err, 0.9));
  // The rounding error stays below bf16's (2^-9 relative, half an ulp) on nine rows in ten.
  EXPECT_LT(q(row_err, 0.9), -9.0);
  EXPECT_GT(rows_checked, 500);
  EXPECT_GT(worst_fill, 0.49) << "the half-full row";
}

}  // namespace
