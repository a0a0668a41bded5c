// Dense fp64 reference attention over one sequence with a per-token mask allowed[i][j] (the
// library's reference, dcp/reference.h, which shares no code with the kernels under test), plus
// random test tensors and the relative error the tests compare with.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "common/rng.h"
#include "dcp/reference.h"

namespace dcp::test {

inline std::vector<float> random_tensor(SplitMix64& rng, size_t n, float amplitude = 1.0f) {
  std::vector<float> v(n);
  for (float& x : v) x = amplitude * rng.symmetric();
  return v;
}

// allowed[i * num_kv + j] for one sequence; q, o, d_o: [num_q][hq][d]; k, v: [num_kv][hkv][d].
// d_o empty: forward only (the gradients come back as zeros).
struct DenseProblem {
  int64_t num_q = 0;
  int64_t num_kv = 0;
  int q_heads = 1;
  int kv_heads = 1;
  int head_dim = 64;
  std::vector<uint8_t> allowed;
  std::vector<float> q, k, v, d_o;
  // Optional, [num_q][q_heads]: the gradient of lse, which the backward takes as Delta - d_lse.
  std::vector<float> d_lse;
};

struct DenseResult {
  std::vector<double> o, lse, dq, dk, dv;
};

// The library's fp64 reference (dcp/reference.h), each row's allowed keys read off the matrix
// as runs of ones.
inline DenseResult dense_reference(const DenseProblem& p) {
  ReferenceProblem rp;
  rp.num_q = p.num_q;
  rp.num_kv = p.num_kv;
  rp.q_heads = p.q_heads;
  rp.kv_heads = p.kv_heads;
  rp.head_dim = p.head_dim;
  rp.q = p.q.data();
  rp.k = p.k.data();
  rp.v = p.v.data();
  rp.d_o = p.d_o.empty() ? nullptr : p.d_o.data();
  rp.row_keys = [&p](int64_t i, std::vector<Range>& out) {
    const uint8_t* row = p.allowed.data() + i * p.num_kv;
    for (int64_t j = 0; j < p.num_kv; ++j) {
      if (!row[j]) continue;
      if (!out.empty() && out.back().end == j) ++out.back().end;
      else out.push_back({j, j + 1});
    }
  };
  ReferenceResult r = reference_attention(rp);
  if (rp.d_o != nullptr && !p.d_lse.empty()) {
    // The backward again with this forward's LSE and Delta - d_lse (dS = P (dP - Delta + d_lse)).
    std::vector<float> lse(r.lse.begin(), r.lse.end());
    std::vector<float> delta(r.delta.size());
    for (size_t i = 0; i < delta.size(); ++i) delta[i] = static_cast<float>(r.delta[i] - double{p.d_lse[i]});
    rp.backward_lse = lse.data();
    rp.backward_delta = delta.data();
    ReferenceResult b = reference_attention(rp);
    r.dq = std::move(b.dq);
    r.dk = std::move(b.dk);
    r.dv = std::move(b.dv);
  }
  if (rp.d_o == nullptr) {
    r.dq.assign(r.o.size(), 0.0);
    r.dk.assign(static_cast<size_t>(p.num_kv * p.kv_heads * p.head_dim), 0.0);
    r.dv.assign(r.dk.size(), 0.0);
  }
  return {std::move(r.o), std::move(r.lse), std::move(r.dq), std::move(r.dk), std::move(r.dv)};
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
