// Dense fp64 reference attention over one sequence with a per-token mask allowed[i][j], plus a
// deterministic PRNG for test data. Shares no code with the kernels under test.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/rng.h"

namespace dcp::test {


inline std::vector<float> random_tensor(SplitMix64& rng, size_t n, float amplitude = 1.0f) {
  std::vector<float> v(n);
  for (float& x : v) x = amplitude * rng.symmetric();
  return v;
}

// allowed[i * num_kv + j] for one sequence; q, o, d_o: [L][hq][d]; k, v: [L][hkv][d].
struct DenseProblem {
  int64_t num_q = 0;
  int64_t num_kv = 0;
  int q_heads = 1;
  int kv_heads = 1;
  int head_dim = 64;
  std::vector<uint8_t> allowed;
  std::vector<float> q, k, v, d_o;
};

struct DenseResult {
  std::vector<double> o, lse, dq, dk, dv;
};

inline DenseResult dense_reference(const DenseProblem& p) {
  const int d = p.head_dim;
  const int ratio = p.q_heads / p.kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  DenseResult r;
  r.o.assign(static_cast<size_t>(p.num_q * p.q_heads * d), 0.0);
  r.lse.assign(static_cast<size_t>(p.num_q * p.q_heads), -std::numeric_limits<double>::infinity());
  r.dq.assign(r.o.size(), 0.0);
  r.dk.assign(static_cast<size_t>(p.num_kv * p.kv_heads * d), 0.0);
  r.dv.assign(r.dk.size(), 0.0);
  auto qi = [&](int64_t i, int h) { return (i * p.q_heads + h) * d; };
  auto ki = [&](int64_t j, int g) { return (j * p.kv_heads + g) * d; };
  std::vector<double> s(static_cast<size_t>(p.num_kv));
  for (int h = 0; h < p.q_heads; ++h) {
    const int g = h / ratio;
    for (int64_t i = 0; i < p.num_q; ++i) {
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < p.num_kv; ++j) {
        if (!p.allowed[i * p.num_kv + j]) continue;
        double acc = 0.0;
        for (int x = 0; x < d; ++x) acc += static_cast<double>(p.q[qi(i, h) + x]) * p.k[ki(j, g) + x];
        s[j] = acc * scale;
        m = std::max(m, s[j]);
      }
      if (m == -std::numeric_limits<double>::infinity()) continue;  // O = 0, LSE = -inf
      double l = 0.0;
      for (int64_t j = 0; j < p.num_kv; ++j)
        if (p.allowed[i * p.num_kv + j]) l += std::exp(s[j] - m);
      const double lse = m + std::log(l);
      r.lse[i * p.q_heads + h] = lse;
      for (int64_t j = 0; j < p.num_kv; ++j) {
        if (!p.allowed[i * p.num_kv + j]) continue;
        const double pij = std::exp(s[j] - lse);
        for (int x = 0; x < d; ++x) r.o[qi(i, h) + x] += pij * p.v[ki(j, g) + x];
      }
      if (p.d_o.empty()) continue;
      double delta = 0.0;
      for (int x = 0; x < d; ++x) delta += r.o[qi(i, h) + x] * p.d_o[qi(i, h) + x];
      for (int64_t j = 0; j < p.num_kv; ++j) {
        if (!p.allowed[i * p.num_kv + j]) continue;
        const double pij = std::exp(s[j] - lse);
        double dp = 0.0;
        for (int x = 0; x < d; ++x) dp += static_cast<double>(p.d_o[qi(i, h) + x]) * p.v[ki(j, g) + x];
        const double ds = pij * (dp - delta) * scale;
        for (int x = 0; x < d; ++x) {
          r.dv[ki(j, g) + x] += pij * p.d_o[qi(i, h) + x];
          r.dq[qi(i, h) + x] += ds * p.k[ki(j, g) + x];
          r.dk[ki(j, g) + x] += ds * p.q[qi(i, h) + x];
        }
      }
    }
  }
  return r;
}

// max |got - want| / max(max |want|, floor): the norm-wise relative error used by the tests.
inline double rel_error(const std::vector<float>& got, const std::vector<double>& want, double floor = 1e-30) {
  double err = 0.0;
  double ref = floor;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(got[i])) return std::numeric_limits<double>::infinity();
    if (std::isinf(want[i])) {
      if (!(std::isinf(got[i]) && (got[i] < 0) == (want[i] < 0))) return std::numeric_limits<double>::infinity();
      continue;
    }
    err = std::max(err, std::abs(static_cast<double>(got[i]) - want[i]));
    ref = std::max(ref, std::abs(want[i]));
  }
  return err / ref;
}

}  // namespace dcp::test
