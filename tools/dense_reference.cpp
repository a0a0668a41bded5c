#include "dense_reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace dcp::cli {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Four partial sums: the compiler may not reorder an fp64 reduction, and one chain is latency-bound.
double dot(const double* __restrict a, const double* __restrict b, int64_t n) {
  double acc[4] = {0, 0, 0, 0};
  int64_t x = 0;
  for (; x + 4 <= n; x += 4)
    for (int64_t u = 0; u < 4; ++u) acc[u] += a[x + u] * b[x + u];
  for (; x < n; ++x) acc[0] += a[x] * b[x];
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

std::vector<float> random_tensor(uint64_t seed, uint64_t stream, size_t n, float amplitude) {
  std::vector<float> out(n);
  const uint64_t base = mix(seed * 0x9e3779b97f4a7c15ull + stream);
  for (size_t i = 0; i < n; ++i) {
    const double u = static_cast<double>(mix(base + (i + 1) * 0x9e3779b97f4a7c15ull) >> 11) * 0x1.0p-53;
    out[i] = amplitude * static_cast<float>(2.0 * u - 1.0);
  }
  return out;
}

}  // namespace

AttentionInputs make_inputs(const AttentionShape& shape, int64_t total_tokens, uint64_t seed) {
  const auto qn = static_cast<size_t>(total_tokens * shape.q_heads * shape.head_dim);
  const auto kn = static_cast<size_t>(total_tokens * shape.kv_heads * shape.head_dim);
  AttentionInputs in;
  in.q = random_tensor(seed, 1, qn, 2.0f);
  in.k = random_tensor(seed, 2, kn, 2.0f);
  in.v = random_tensor(seed, 3, kn, 1.0f);
  in.d_o = random_tensor(seed, 4, qn, 1.0f);
  return in;
}

ReferenceOutputs dense_reference(const AttentionShape& shape, const std::vector<int64_t>& lengths,
                                 const std::vector<Mask>& masks, const AttentionInputs& in) {
  const int64_t hq = shape.q_heads, hkv = shape.kv_heads, d = shape.head_dim;
  const int64_t ratio = hq / hkv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  int64_t total = 0;
  std::vector<int64_t> start;
  for (int64_t len : lengths) {
    start.push_back(total);
    total += len;
  }
  ReferenceOutputs r;
  r.o.assign(static_cast<size_t>(total * hq * d), 0.0);
  r.lse.assign(static_cast<size_t>(total * hq), -kInf);
  r.dq.assign(r.o.size(), 0.0);
  r.dk.assign(static_cast<size_t>(total * hkv * d), 0.0);
  r.dv.assign(r.dk.size(), 0.0);
  // fp64 copies: the loops below then vectorise as plain double arithmetic.
  const std::vector<double> qd(in.q.begin(), in.q.end()), kd(in.k.begin(), in.k.end()),
      vd(in.v.begin(), in.v.end()), dod(in.d_o.begin(), in.d_o.end());
  const auto num_seq = static_cast<int64_t>(lengths.size());
  const int64_t num_jobs = num_seq * hkv;

  // A (sequence, KV head) job owns its rows of every output: no two threads write one value.
#pragma omp parallel
  {
    std::vector<Range> ranges;
    std::vector<int64_t> keys;
    std::vector<double> s, o_row, do_row;
#pragma omp for schedule(dynamic, 1)
    for (int64_t job = 0; job < num_jobs; ++job) {
      const auto si = static_cast<size_t>(job / hkv);
      const int64_t g = job % hkv;
      const int64_t len = lengths[si], s0 = start[si];
      auto qi = [&](int64_t row, int64_t h) { return static_cast<size_t>(((s0 + row) * hq + h) * d); };
      auto ki = [&](int64_t key) { return static_cast<size_t>(((s0 + key) * hkv + g) * d); };
      for (int64_t row = 0; row < len; ++row) {
        masks[si].row_ranges(row, len, ranges);
        keys.clear();
        for (const Range& rg : ranges)
          for (int64_t j = rg.begin; j < rg.end; ++j) keys.push_back(j);
        if (keys.empty()) continue;  // O = 0, LSE = -inf, no gradient
        s.resize(keys.size());
        for (int64_t h = g * ratio; h < (g + 1) * ratio; ++h) {
          const double* __restrict q = &qd[qi(row, h)];
          double m = -kInf;
          for (size_t n = 0; n < keys.size(); ++n) {
            const double* __restrict k = &kd[ki(keys[n])];
            s[n] = dot(q, k, d) * scale;
            m = std::max(m, s[n]);
          }
          double l = 0.0;
          for (double sn : s) l += std::exp(sn - m);
          const double lse = m + std::log(l);
          r.lse[static_cast<size_t>((s0 + row) * hq + h)] = lse;
          double* __restrict o = &r.o[qi(row, h)];
          for (size_t n = 0; n < keys.size(); ++n) {
            s[n] = std::exp(s[n] - lse);  // probability from here on
            const double* __restrict v = &vd[ki(keys[n])];
            for (int64_t x = 0; x < d; ++x) o[x] += s[n] * v[x];
          }
          const double* __restrict d_o = &dod[qi(row, h)];
          double delta = 0.0;
          for (int64_t x = 0; x < d; ++x) delta += o[x] * d_o[x];
          double* __restrict dq = &r.dq[qi(row, h)];
          for (size_t n = 0; n < keys.size(); ++n) {
            const size_t kv = ki(keys[n]);
            const double* __restrict k = &kd[kv];
            const double* __restrict v = &vd[kv];
            double* __restrict dk = &r.dk[kv];
            double* __restrict dv = &r.dv[kv];
            const double dp = dot(d_o, v, d);
            const double ds = s[n] * (dp - delta) * scale, p = s[n];
            for (int64_t x = 0; x < d; ++x) {
              dq[x] += ds * k[x];
              dk[x] += ds * q[x];
              dv[x] += p * d_o[x];
            }
          }
        }
      }
    }
  }
  return r;
}

std::array<double, 5> error_floors(const AttentionInputs& in) {
  auto max_abs = [](const std::vector<float>& v) {
    double m = 0;
    for (float x : v) m = std::max(m, static_cast<double>(std::abs(x)));
    return m;
  };
  const double q = max_abs(in.q), k = max_abs(in.k), v = max_abs(in.v), d_o = max_abs(in.d_o);
  return {v, 1.0, d_o * v * k, d_o * v * q, d_o};
}

ErrorStats compare(const std::vector<float>& got, const std::vector<double>& want, double floor) {
  double max_err = 0, max_ref = 0, sum_err = 0, sum_ref = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = got[i], w = want[i];
    if (std::isnan(g)) return {kInf, kInf};
    if (std::isinf(w) || std::isinf(g)) {
      if (g != w) return {kInf, kInf};
      continue;
    }
    const double e = std::abs(g - w);
    max_err = std::max(max_err, e);
    max_ref = std::max(max_ref, std::abs(w));
    sum_err += e;
    sum_ref += std::abs(w);
  }
  constexpr double kTiny = 1e-300;
  const double n = static_cast<double>(want.size());
  return {max_err / std::max({max_ref, floor, kTiny}), sum_err / std::max({sum_ref, n * floor, kTiny})};
}

}  // namespace dcp::cli
