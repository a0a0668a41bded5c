// Dense fp64 reference attention (see dcp/reference.h). Each problem is first checked and
// brought into one form: its row masks as one CSR list of key ranges and its tensors widened to
// fp64. Then (problem, kv head) jobs run in parallel: a job walks its rows in order and, for
// each row, the q heads that read its kv head, so dK and dV of that kv head are summed by one
// thread in a fixed order.
#include "dcp/reference.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <string>
#include <utility>

#include "dcp/error.h"

namespace dcp {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A problem in the form the jobs read.
struct Prepared {
  const ReferenceProblem* p = nullptr;
  std::vector<int64_t> range_offsets;  // row i's ranges: ranges[range_offsets[i] .. range_offsets[i + 1])
  std::vector<Range> ranges;
  // fp64 copies: the inner loops then vectorise as plain double arithmetic.
  std::vector<double> q, k, v, d_o;
};

[[noreturn]] void bad_problem(size_t index, const std::string& what) {
  raise(ErrorKind::InvalidInput, "reference attention, problem " + std::to_string(index) + ": " + what);
}

std::vector<double> widen(const float* x, int64_t n) {
  return n > 0 ? std::vector<double>(x, x + n) : std::vector<double>();
}

Prepared prepare(const ReferenceProblem& p, size_t index) {
  if (p.num_q < 0 || p.num_kv < 0) bad_problem(index, "negative row count");
  if (p.q_heads <= 0 || p.kv_heads <= 0 || p.q_heads % p.kv_heads != 0)
    bad_problem(index, "q_heads " + std::to_string(p.q_heads) + " is not a positive multiple of kv_heads " +
                           std::to_string(p.kv_heads));
  if (p.head_dim <= 0) bad_problem(index, "head_dim " + std::to_string(p.head_dim) + " is not positive");
  if (!p.row_keys) bad_problem(index, "no row_keys");
  const int64_t q_elems = p.num_q * p.q_heads * p.head_dim;
  const int64_t kv_elems = p.num_kv * p.kv_heads * p.head_dim;
  if ((q_elems > 0 && p.q == nullptr) || (kv_elems > 0 && (p.k == nullptr || p.v == nullptr)))
    bad_problem(index, "missing Q, K or V");
  if ((p.backward_lse == nullptr) != (p.backward_delta == nullptr))
    bad_problem(index, "backward_lse and backward_delta go together");
  if (p.backward_lse != nullptr && p.d_o == nullptr) bad_problem(index, "backward statistics without dO");

  Prepared out;
  out.p = &p;
  out.range_offsets.reserve(static_cast<size_t>(p.num_q) + 1);
  out.range_offsets.push_back(0);
  std::vector<Range> row;
  for (int64_t i = 0; i < p.num_q; ++i) {
    row.clear();
    p.row_keys(i, row);
    int64_t prev_end = 0;
    for (const Range& r : row) {
      if (r.begin < prev_end || r.end < r.begin || r.end > p.num_kv)
        bad_problem(index, "row " + std::to_string(i) + ": key range [" + std::to_string(r.begin) + ", " +
                               std::to_string(r.end) + ") is not sorted, disjoint and inside [0, " +
                               std::to_string(p.num_kv) + ")");
      prev_end = r.end;
      if (r.end > r.begin) out.ranges.push_back(r);
    }
    const bool has_keys = static_cast<int64_t>(out.ranges.size()) > out.range_offsets.back();
    out.range_offsets.push_back(static_cast<int64_t>(out.ranges.size()));
    if (has_keys && p.backward_lse != nullptr) {
      for (int64_t h = 0; h < p.q_heads; ++h) {
        const int64_t at = i * p.q_heads + h;
        if (!std::isfinite(p.backward_lse[at]) || !std::isfinite(p.backward_delta[at]))
          bad_problem(index, "row " + std::to_string(i) + " head " + std::to_string(h) +
                                 " has keys but a non-finite backward_lse or backward_delta");
      }
    }
  }
  out.q = widen(p.q, q_elems);
  out.k = widen(p.k, kv_elems);
  out.v = widen(p.v, kv_elems);
  if (p.d_o != nullptr) out.d_o = widen(p.d_o, q_elems);
  return out;
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

ReferenceResult allocate(const ReferenceProblem& p) {
  const auto q_elems = static_cast<size_t>(p.num_q * p.q_heads * p.head_dim);
  const auto kv_elems = static_cast<size_t>(p.num_kv * p.kv_heads * p.head_dim);
  const auto stats = static_cast<size_t>(p.num_q * p.q_heads);
  ReferenceResult r;
  r.o.assign(q_elems, 0.0);
  r.lse.assign(stats, -kInf);
  if (p.d_o != nullptr) {
    r.delta.assign(stats, 0.0);
    r.dq.assign(q_elems, 0.0);
    r.dk.assign(kv_elems, 0.0);
    r.dv.assign(kv_elems, 0.0);
  }
  return r;
}

// A thread's buffers for one row: its allowed keys, their scores S and probabilities P.
struct Scratch {
  std::vector<int64_t> keys;
  std::vector<double> s, p;
};

// Every row of one problem for the q heads of kv head g.
void solve_kv_head(const Prepared& in, int64_t g, ReferenceResult& r, Scratch& scratch) {
  const ReferenceProblem& p = *in.p;
  const int64_t hq = p.q_heads, hkv = p.kv_heads, d = p.head_dim;
  const int64_t group = hq / hkv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const bool backward = p.d_o != nullptr;
  const bool given_stats = p.backward_lse != nullptr;
  auto qi = [&](int64_t row, int64_t h) { return static_cast<size_t>((row * hq + h) * d); };
  auto ki = [&](int64_t key) { return static_cast<size_t>((key * hkv + g) * d); };
  std::vector<int64_t>& keys = scratch.keys;
  std::vector<double>& s = scratch.s;
  std::vector<double>& prob = scratch.p;
  for (int64_t row = 0; row < p.num_q; ++row) {
    keys.clear();
    const auto first = static_cast<size_t>(in.range_offsets[static_cast<size_t>(row)]);
    const auto last = static_cast<size_t>(in.range_offsets[static_cast<size_t>(row) + 1]);
    for (size_t at = first; at < last; ++at)
      for (int64_t j = in.ranges[at].begin; j < in.ranges[at].end; ++j) keys.push_back(j);
    if (keys.empty()) continue;  // O = 0, LSE = -inf, Delta = 0, no gradient
    s.resize(keys.size());
    prob.resize(keys.size());
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      const size_t stat = static_cast<size_t>(row * hq + h);
      const double* __restrict q = &in.q[qi(row, h)];
      double m = -kInf;
      for (size_t n = 0; n < keys.size(); ++n) {
        s[n] = dot(q, &in.k[ki(keys[n])], d) * scale;
        m = std::max(m, s[n]);
      }
      double l = 0.0;
      for (const double sn : s) l += std::exp(sn - m);
      const double lse = m + std::log(l);
      r.lse[stat] = lse;
      double* __restrict o = &r.o[qi(row, h)];
      for (size_t n = 0; n < keys.size(); ++n) {
        prob[n] = std::exp(s[n] - lse);
        const double* __restrict v = &in.v[ki(keys[n])];
        for (int64_t x = 0; x < d; ++x) o[x] += prob[n] * v[x];
      }
      if (!backward) continue;
      const double* __restrict d_o = &in.d_o[qi(row, h)];
      double delta = 0.0;  // from the fp64 O
      for (int64_t x = 0; x < d; ++x) delta += o[x] * d_o[x];
      r.delta[stat] = delta;
      if (given_stats) {
        const double given_lse = p.backward_lse[stat];
        for (size_t n = 0; n < keys.size(); ++n) prob[n] = std::exp(s[n] - given_lse);
        delta = p.backward_delta[stat];
      }
      double* __restrict dq = &r.dq[qi(row, h)];
      for (size_t n = 0; n < keys.size(); ++n) {
        const size_t kv = ki(keys[n]);
        const double* __restrict k = &in.k[kv];
        const double* __restrict v = &in.v[kv];
        double* __restrict dk = &r.dk[kv];
        double* __restrict dv = &r.dv[kv];
        const double pn = prob[n];
        const double ds = pn * (dot(d_o, v, d) - delta) * scale;
        for (int64_t x = 0; x < d; ++x) {
          dq[x] += ds * k[x];
          dk[x] += ds * q[x];
          dv[x] += pn * d_o[x];
        }
      }
    }
  }
}

}  // namespace

std::vector<ReferenceResult> reference_attention(std::span<const ReferenceProblem> problems) {
  std::vector<Prepared> prepared;
  prepared.reserve(problems.size());
  std::vector<ReferenceResult> results;
  results.reserve(problems.size());
  std::vector<int64_t> job_begin{0};  // problem i's jobs: [job_begin[i], job_begin[i + 1])
  for (size_t i = 0; i < problems.size(); ++i) {
    prepared.push_back(prepare(problems[i], i));
    results.push_back(allocate(problems[i]));
    job_begin.push_back(job_begin.back() + problems[i].kv_heads);
  }
  const int64_t num_jobs = job_begin.back();

  // An exception may not leave an OpenMP region: the first one is kept and rethrown after it.
  std::exception_ptr failure;
#pragma omp parallel
  {
    Scratch scratch;
#pragma omp for schedule(dynamic, 1)
    for (int64_t job = 0; job < num_jobs; ++job) {
      const auto next = std::upper_bound(job_begin.begin(), job_begin.end(), job);
      const auto i = static_cast<size_t>(next - job_begin.begin()) - 1;  // the problem of this job
      try {
        solve_kv_head(prepared[i], job - job_begin[i], results[i], scratch);
      } catch (...) {
#pragma omp critical(dcp_reference_failure)
        if (!failure) failure = std::current_exception();
      }
    }
  }
  if (failure) std::rethrow_exception(failure);
  return results;
}

ReferenceResult reference_attention(const ReferenceProblem& problem) {
  return std::move(reference_attention(std::span<const ReferenceProblem>(&problem, 1)).front());
}

}  // namespace dcp
