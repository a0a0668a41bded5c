#include "dense_reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "dcp/reference.h"

namespace dcp::cli {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
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
  const int64_t qw = int64_t{shape.q_heads} * shape.head_dim, kw = int64_t{shape.kv_heads} * shape.head_dim;
  // One problem per sequence, reading its rows of the packed tensors in place.
  std::vector<ReferenceProblem> problems(lengths.size());
  int64_t start = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    ReferenceProblem& p = problems[i];
    const int64_t len = lengths[i];
    p.num_q = p.num_kv = len;
    p.q_heads = shape.q_heads;
    p.kv_heads = shape.kv_heads;
    p.head_dim = shape.head_dim;
    p.q = in.q.data() + start * qw;
    p.k = in.k.data() + start * kw;
    p.v = in.v.data() + start * kw;
    p.d_o = in.d_o.data() + start * qw;
    p.row_keys = [&mask = masks[i], len](int64_t row, std::vector<Range>& out) { mask.row_ranges(row, len, out); };
    start += len;
  }
  std::vector<ReferenceResult> per_seq = reference_attention(problems);
  // Sequence results one after the other, each freed once copied.
  auto pack = [&](std::vector<double> ReferenceResult::*field) {
    size_t n = 0;
    for (const ReferenceResult& s : per_seq) n += (s.*field).size();
    std::vector<double> all;
    all.reserve(n);
    for (ReferenceResult& s : per_seq) {
      all.insert(all.end(), (s.*field).begin(), (s.*field).end());
      std::vector<double>().swap(s.*field);
    }
    return all;
  };
  ReferenceOutputs r;
  r.o = pack(&ReferenceResult::o);
  r.lse = pack(&ReferenceResult::lse);
  r.dq = pack(&ReferenceResult::dq);
  r.dk = pack(&ReferenceResult::dk);
  r.dv = pack(&ReferenceResult::dv);
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
