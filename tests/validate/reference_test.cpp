// The fp64 reference attention (dcp/reference.h) against a naive per-element softmax written
// from the definitions (full score rows, the softmax Jacobian for the backward), plus the
// properties every caller relies on: empty rows, the GQA head mapping, num_q != num_kv,
// results independent of batching and thread count, given backward statistics, bad input.
#include <gtest/gtest.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include <cmath>
#include <limits>
#include <vector>

#include "common/rng.h"
#include "dcp/error.h"
#include "dcp/reference.h"

namespace dcp {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A problem with its tensors and per-row key ranges held by value.
struct Case {
  int64_t num_q = 0, num_kv = 0;
  int q_heads = 1, kv_heads = 1, head_dim = 4;
  std::vector<std::vector<Range>> rows;
  std::vector<float> q, k, v, d_o;

  ReferenceProblem problem(bool backward = true) const {
    ReferenceProblem p;
    p.num_q = num_q;
    p.num_kv = num_kv;
    p.q_heads = q_heads;
    p.kv_heads = kv_heads;
    p.head_dim = head_dim;
    p.q = q.data();
    p.k = k.data();
    p.v = v.data();
    p.d_o = backward ? d_o.data() : nullptr;
    p.row_keys = [this](int64_t i, std::vector<Range>& out) { out = rows[static_cast<size_t>(i)]; };
    return p;
  }
  bool allowed(int64_t i, int64_t j) const {
    for (const Range& r : rows[static_cast<size_t>(i)])
      if (j >= r.begin && j < r.end) return true;
    return false;
  }
};

std::vector<float> random_values(SplitMix64& rng, int64_t n, float amplitude) {
  std::vector<float> out(static_cast<size_t>(n));
  for (float& x : out) x = amplitude * rng.symmetric();
  return out;
}

// Random sorted disjoint ranges (some rows empty, some ranges touching).
Case random_case(uint64_t seed, int64_t num_q, int64_t num_kv, int q_heads, int kv_heads, int head_dim) {
  SplitMix64 rng(seed);
  Case c;
  c.num_q = num_q;
  c.num_kv = num_kv;
  c.q_heads = q_heads;
  c.kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.rows.resize(static_cast<size_t>(num_q));
  for (auto& row : c.rows) {
    int64_t pos = 0;
    const int64_t n = rng.below(4);  // 0: an empty row
    for (int64_t r = 0; r < n && pos < num_kv; ++r) {
      const int64_t b = rng.uniform(pos, num_kv - 1);
      const int64_t e = rng.uniform(b + 1, num_kv);
      row.push_back({b, e});
      pos = e + rng.below(2);
    }
  }
  c.q = random_values(rng, num_q * q_heads * head_dim, 2.0f);
  c.k = random_values(rng, num_kv * kv_heads * head_dim, 2.0f);
  c.v = random_values(rng, num_kv * kv_heads * head_dim, 1.0f);
  c.d_o = random_values(rng, num_q * q_heads * head_dim, 1.0f);
  return c;
}

// From the definitions, one (row, q head) at a time over the whole key axis. The backward uses
// dS_ij = P_ij (dP_ij - sum_k P_ik dP_ik) (the softmax Jacobian), or P from a given LSE and a
// given Delta in place of the sum when `given_lse` / `given_delta` are set.
ReferenceResult naive(const Case& c, const std::vector<float>* given_lse = nullptr,
                      const std::vector<float>* given_delta = nullptr) {
  const int64_t hq = c.q_heads, hkv = c.kv_heads, d = c.head_dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  ReferenceResult r;
  r.o.assign(static_cast<size_t>(c.num_q * hq * d), 0.0);
  r.lse.assign(static_cast<size_t>(c.num_q * hq), -kInf);
  r.delta.assign(r.lse.size(), 0.0);
  r.dq.assign(r.o.size(), 0.0);
  r.dk.assign(static_cast<size_t>(c.num_kv * hkv * d), 0.0);
  r.dv.assign(r.dk.size(), 0.0);
  auto at = [d](const std::vector<float>& t, int64_t row, int64_t heads, int64_t head, int64_t x) {
    return static_cast<double>(t[static_cast<size_t>((row * heads + head) * d + x)]);
  };
  auto q = [&](int64_t i, int64_t h, int64_t x) { return at(c.q, i, hq, h, x); };
  auto d_o = [&](int64_t i, int64_t h, int64_t x) { return at(c.d_o, i, hq, h, x); };
  auto k = [&](int64_t j, int64_t g, int64_t x) { return at(c.k, j, hkv, g, x); };
  auto v = [&](int64_t j, int64_t g, int64_t x) { return at(c.v, j, hkv, g, x); };
  for (int64_t i = 0; i < c.num_q; ++i) {
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t g = h / (hq / hkv);
      const size_t stat = static_cast<size_t>(i * hq + h);
      std::vector<double> s(static_cast<size_t>(c.num_kv), -kInf), p(s.size(), 0.0), dp(s.size(), 0.0);
      double m = -kInf;
      for (int64_t j = 0; j < c.num_kv; ++j) {
        if (!c.allowed(i, j)) continue;
        double acc = 0;
        for (int64_t x = 0; x < d; ++x) acc += q(i, h, x) * k(j, g, x);
        s[static_cast<size_t>(j)] = acc * scale;
        m = std::max(m, acc * scale);
      }
      if (m == -kInf) continue;
      double sum = 0;
      for (int64_t j = 0; j < c.num_kv; ++j)
        if (c.allowed(i, j)) sum += std::exp(s[static_cast<size_t>(j)] - m);
      r.lse[stat] = m + std::log(sum);
      for (int64_t j = 0; j < c.num_kv; ++j) {
        if (!c.allowed(i, j)) continue;
        p[static_cast<size_t>(j)] = std::exp(s[static_cast<size_t>(j)] - m) / sum;
        for (int64_t x = 0; x < d; ++x)
          r.o[stat * static_cast<size_t>(d) + static_cast<size_t>(x)] += p[static_cast<size_t>(j)] * v(j, g, x);
      }
      double jacobian_delta = 0;  // sum_j P_ij dP_ij
      for (int64_t j = 0; j < c.num_kv; ++j) {
        if (!c.allowed(i, j)) continue;
        for (int64_t x = 0; x < d; ++x) dp[static_cast<size_t>(j)] += d_o(i, h, x) * v(j, g, x);
        jacobian_delta += p[static_cast<size_t>(j)] * dp[static_cast<size_t>(j)];
      }
      r.delta[stat] = jacobian_delta;
      double delta = jacobian_delta;
      if (given_lse != nullptr) {
        for (int64_t j = 0; j < c.num_kv; ++j)
          if (c.allowed(i, j)) p[static_cast<size_t>(j)] = std::exp(s[static_cast<size_t>(j)] - (*given_lse)[stat]);
        delta = (*given_delta)[stat];
      }
      for (int64_t j = 0; j < c.num_kv; ++j) {
        if (!c.allowed(i, j)) continue;
        const double ds = p[static_cast<size_t>(j)] * (dp[static_cast<size_t>(j)] - delta);
        for (int64_t x = 0; x < d; ++x) {
          r.dq[stat * static_cast<size_t>(d) + static_cast<size_t>(x)] += scale * ds * k(j, g, x);
          r.dk[static_cast<size_t>((j * hkv + g) * d + x)] += scale * ds * q(i, h, x);
          r.dv[static_cast<size_t>((j * hkv + g) * d + x)] += p[static_cast<size_t>(j)] * d_o(i, h, x);
        }
      }
    }
  }
  return r;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isinf(want[i])) {
      EXPECT_EQ(got[i], want[i]) << what << "[" << i << "]";
      continue;
    }
    EXPECT_NEAR(got[i], want[i], 1e-12 * (1 + std::abs(want[i]))) << what << "[" << i << "]";
  }
}

void expect_all_close(const ReferenceResult& got, const ReferenceResult& want) {
  expect_close(got.o, want.o, "O");
  expect_close(got.lse, want.lse, "LSE");
  expect_close(got.delta, want.delta, "Delta");
  expect_close(got.dq, want.dq, "dQ");
  expect_close(got.dk, want.dk, "dK");
  expect_close(got.dv, want.dv, "dV");
}

TEST(ReferenceAttention, MatchesNaiveSoftmaxForEveryShape) {
  const struct {
    int64_t num_q, num_kv;
    int hq, hkv, d;
  } shapes[] = {{6, 6, 2, 2, 4}, {5, 9, 4, 2, 8}, {9, 3, 3, 1, 5}, {1, 1, 1, 1, 1}, {7, 11, 4, 4, 6}};
  uint64_t seed = 1;
  for (const auto& s : shapes) {
    const Case c = random_case(seed++, s.num_q, s.num_kv, s.hq, s.hkv, s.d);
    SCOPED_TRACE(::testing::Message() << "num_q " << s.num_q << " num_kv " << s.num_kv << " hq " << s.hq << " hkv "
                                      << s.hkv << " d " << s.d);
    expect_all_close(reference_attention(c.problem()), naive(c));
  }
}

TEST(ReferenceAttention, ForwardOnlyLeavesGradientsEmpty) {
  const Case c = random_case(11, 5, 8, 2, 1, 4);
  const ReferenceResult fwd = reference_attention(c.problem(false));
  const ReferenceResult want = naive(c);
  expect_close(fwd.o, want.o, "O");
  expect_close(fwd.lse, want.lse, "LSE");
  EXPECT_TRUE(fwd.delta.empty() && fwd.dq.empty() && fwd.dk.empty() && fwd.dv.empty());
}

TEST(ReferenceAttention, RowsWithoutKeysGiveZeroMinusInfAndNoGradient) {
  Case c = random_case(3, 6, 6, 2, 1, 4);
  for (size_t i = 0; i < c.rows.size(); ++i) c.rows[i] = {{0, static_cast<int64_t>(i) + 1}};  // causal
  c.rows[2].clear();
  c.rows[4] = {{3, 3}};  // an empty range is no key
  const ReferenceResult r = reference_attention(c.problem());
  for (int64_t row : {2, 4}) {
    for (int64_t h = 0; h < c.q_heads; ++h) {
      const auto stat = static_cast<size_t>(row * c.q_heads + h);
      EXPECT_EQ(r.lse[stat], -kInf);
      EXPECT_EQ(r.delta[stat], 0.0);
      for (int64_t x = 0; x < c.head_dim; ++x) {
        EXPECT_EQ(r.o[stat * static_cast<size_t>(c.head_dim) + static_cast<size_t>(x)], 0.0);
        EXPECT_EQ(r.dq[stat * static_cast<size_t>(c.head_dim) + static_cast<size_t>(x)], 0.0);
      }
    }
  }
  // The empty rows add nothing to dK and dV: the same problem without them gives the same bits
  // (the other rows are summed in the same order).
  Case kept = c;
  kept.num_q = 4;
  kept.rows = {c.rows[0], c.rows[1], c.rows[3], c.rows[5]};
  kept.q.clear();
  kept.d_o.clear();
  const size_t row_elems = static_cast<size_t>(c.q_heads * c.head_dim);
  for (size_t row : {0, 1, 3, 5}) {
    kept.q.insert(kept.q.end(), c.q.begin() + static_cast<std::ptrdiff_t>(row * row_elems),
                  c.q.begin() + static_cast<std::ptrdiff_t>((row + 1) * row_elems));
    kept.d_o.insert(kept.d_o.end(), c.d_o.begin() + static_cast<std::ptrdiff_t>(row * row_elems),
                    c.d_o.begin() + static_cast<std::ptrdiff_t>((row + 1) * row_elems));
  }
  const ReferenceResult k = reference_attention(kept.problem());
  EXPECT_EQ(r.dk, k.dk);
  EXPECT_EQ(r.dv, k.dv);
  // Every row empty: nothing at all.
  for (auto& row : c.rows) row.clear();
  const ReferenceResult none = reference_attention(c.problem());
  for (double x : none.lse) EXPECT_EQ(x, -kInf);
  for (const auto* t : {&none.o, &none.dq, &none.dk, &none.dv, &none.delta})
    for (double x : *t) EXPECT_EQ(x, 0.0);
}

// q head h reads kv head h / (q_heads / kv_heads): the same as MHA with each kv head copied to
// the q heads of its group, whose dK and dV then sum over the group.
TEST(ReferenceAttention, GqaReadsTheKvHeadOfEachGroup) {
  const int hq = 6, hkv = 2, d = 4, group = hq / hkv;
  const Case gqa = random_case(5, 7, 9, hq, hkv, d);
  Case mha = gqa;
  mha.kv_heads = hq;
  mha.k.clear();
  mha.v.clear();
  for (int64_t j = 0; j < gqa.num_kv; ++j)
    for (int h = 0; h < hq; ++h)
      for (int x = 0; x < d; ++x) {
        const auto from = static_cast<size_t>((j * hkv + h / group) * d + x);
        mha.k.push_back(gqa.k[from]);
        mha.v.push_back(gqa.v[from]);
      }
  const ReferenceResult a = reference_attention(gqa.problem()), b = reference_attention(mha.problem());
  EXPECT_EQ(a.o, b.o);
  EXPECT_EQ(a.lse, b.lse);
  EXPECT_EQ(a.dq, b.dq);
  std::vector<double> dk(a.dk.size(), 0.0), dv(a.dv.size(), 0.0);
  for (int64_t j = 0; j < gqa.num_kv; ++j)
    for (int h = 0; h < hq; ++h)
      for (int x = 0; x < d; ++x) {
        dk[static_cast<size_t>((j * hkv + h / group) * d + x)] += b.dk[static_cast<size_t>((j * hq + h) * d + x)];
        dv[static_cast<size_t>((j * hkv + h / group) * d + x)] += b.dv[static_cast<size_t>((j * hq + h) * d + x)];
      }
  expect_close(a.dk, dk, "dK");
  expect_close(a.dv, dv, "dV");
}

TEST(ReferenceAttention, LargeScoresStayFinite) {
  Case c = random_case(7, 4, 6, 1, 1, 4);
  for (auto& row : c.rows) row = {{0, 6}};
  // Scores up to 80 * 80 * 4 / 2 = 12800, far past where exp overflows (about 709).
  for (float& x : c.q) x *= 40.0f;
  for (float& x : c.k) x *= 40.0f;
  const ReferenceResult r = reference_attention(c.problem()), want = naive(c);
  for (size_t i = 0; i < r.lse.size(); ++i) {
    EXPECT_TRUE(std::isfinite(r.lse[i]));
    EXPECT_NEAR(r.lse[i], want.lse[i], 1e-9 * std::abs(want.lse[i]));
  }
  for (size_t i = 0; i < r.o.size(); ++i) {
    EXPECT_LE(std::abs(r.o[i]), 1.0);  // a convex combination of V in [-1, 1]
    EXPECT_NEAR(r.o[i], want.o[i], 1e-6);
  }
}

TEST(ReferenceAttention, BatchEqualsSingleProblemsAndIgnoresThreadCount) {
  const Case a = random_case(21, 13, 17, 4, 2, 8), b = random_case(22, 9, 9, 4, 2, 8);
  const ReferenceProblem both[] = {a.problem(), b.problem()};
#ifdef _OPENMP
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
#endif
  const std::vector<ReferenceResult> serial = reference_attention(both);
#ifdef _OPENMP
  omp_set_num_threads(4);
#endif
  const std::vector<ReferenceResult> threaded = reference_attention(both);
#ifdef _OPENMP
  omp_set_num_threads(threads);
#endif
  ASSERT_EQ(serial.size(), 2u);
  const ReferenceResult one[] = {reference_attention(a.problem()), reference_attention(b.problem())};
  for (size_t i = 0; i < 2; ++i) {
    for (const ReferenceResult* r : {&threaded[i], &one[i]}) {
      EXPECT_EQ(r->o, serial[i].o);
      EXPECT_EQ(r->lse, serial[i].lse);
      EXPECT_EQ(r->delta, serial[i].delta);
      EXPECT_EQ(r->dq, serial[i].dq);
      EXPECT_EQ(r->dk, serial[i].dk);
      EXPECT_EQ(r->dv, serial[i].dv);
    }
  }
  EXPECT_TRUE(reference_attention(std::span<const ReferenceProblem>()).empty());
}

// Given statistics: P from the given LSE, dS with the given Delta; O, LSE and Delta stay this
// forward's own.
TEST(ReferenceAttention, BackwardUsesGivenStatistics) {
  const Case c = random_case(31, 8, 10, 2, 2, 4);
  const ReferenceResult own = reference_attention(c.problem());
  SplitMix64 rng(32);
  std::vector<float> lse(own.lse.size()), delta(own.lse.size());
  for (size_t i = 0; i < lse.size(); ++i) {
    lse[i] = std::isinf(own.lse[i]) ? -std::numeric_limits<float>::infinity()
                                    : static_cast<float>(own.lse[i] + 0.3 * rng.symmetric());
    delta[i] = 0.5f * rng.symmetric();
  }
  ReferenceProblem p = c.problem();
  p.backward_lse = lse.data();
  p.backward_delta = delta.data();
  const ReferenceResult given = reference_attention(p);
  expect_all_close(given, naive(c, &lse, &delta));
  expect_close(given.o, own.o, "O");
  expect_close(given.delta, own.delta, "Delta");
  bool differs = false;
  for (size_t i = 0; i < own.dq.size(); ++i) differs = differs || std::abs(given.dq[i] - own.dq[i]) > 1e-6;
  EXPECT_TRUE(differs) << "the given statistics were not used";
}

TEST(ReferenceAttention, RejectsMalformedProblems) {
  const Case c = random_case(41, 4, 6, 2, 1, 4);
  auto rejects = [&](auto&& edit, const char* what) {
    Case bad = c;
    ReferenceProblem p = bad.problem();
    std::vector<float> stats(static_cast<size_t>(c.num_q * c.q_heads), 0.0f);
    edit(bad, p, stats);
    try {
      reference_attention(p);
      ADD_FAILURE() << what << ": accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::InvalidInput) << what;
    }
  };
  rejects([](Case& b, ReferenceProblem&, auto&) { b.rows[1] = {{3, 5}, {1, 2}}; }, "unsorted ranges");
  rejects([](Case& b, ReferenceProblem&, auto&) { b.rows[1] = {{0, 3}, {2, 4}}; }, "overlapping ranges");
  rejects([](Case& b, ReferenceProblem&, auto&) { b.rows[0] = {{4, 7}}; }, "range past num_kv");
  rejects([](Case& b, ReferenceProblem&, auto&) { b.rows[0] = {{-1, 2}}; }, "negative key");
  rejects([](Case& b, ReferenceProblem&, auto&) { b.rows[0] = {{3, 2}}; }, "reversed range");
  rejects([](Case&, ReferenceProblem& p, auto&) { p.kv_heads = 3; }, "q_heads not a multiple of kv_heads");
  rejects([](Case&, ReferenceProblem& p, auto&) { p.head_dim = 0; }, "head_dim 0");
  rejects([](Case&, ReferenceProblem& p, auto&) { p.v = nullptr; }, "no V");
  rejects([](Case&, ReferenceProblem& p, auto&) { p.row_keys = nullptr; }, "no mask");
  rejects([](Case&, ReferenceProblem& p, auto& s) { p.backward_lse = s.data(); }, "LSE without Delta");
  rejects([](Case&, ReferenceProblem& p, auto& s) {
    p.d_o = nullptr;
    p.backward_lse = p.backward_delta = s.data();
  }, "statistics without dO");
  rejects([](Case& b, ReferenceProblem& p, auto& s) {
    b.rows[2] = {{0, 1}};
    s[4] = -std::numeric_limits<float>::infinity();  // row 2, head 0
    p.backward_lse = p.backward_delta = s.data();
  }, "-inf LSE on a row with keys");
}

}  // namespace
}  // namespace dcp
