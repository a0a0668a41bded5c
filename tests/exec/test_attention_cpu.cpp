// CPU attention kernels against the dense fp64 reference with per-token masks.
#include <gtest/gtest.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "dcp/detail/attention_cpu.h"
#include "dcp/error.h"
#include "exec/reference_attention.h"
#include "exec/tile_builder.h"

namespace dcp::test {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Shape {
  int q_heads;
  int kv_heads;
  int head_dim;
};

std::string name(const Shape& s) {
  return "hq" + std::to_string(s.q_heads) + "_hkv" + std::to_string(s.kv_heads) + "_d" + std::to_string(s.head_dim);
}

DenseProblem make_problem(SplitMix64& rng, const Shape& s, const RowRanges& rows, int64_t num_kv) {
  DenseProblem p;
  p.num_q = static_cast<int64_t>(rows.size());
  p.num_kv = num_kv;
  p.q_heads = s.q_heads;
  p.kv_heads = s.kv_heads;
  p.head_dim = s.head_dim;
  p.allowed = to_allowed(rows, num_kv);
  // Amplitude 2 makes the softmax peaked enough that the online rescaling matters.
  p.q = random_tensor(rng, static_cast<size_t>(p.num_q * s.q_heads * s.head_dim), 2.0f);
  p.k = random_tensor(rng, static_cast<size_t>(num_kv * s.kv_heads * s.head_dim), 2.0f);
  p.v = random_tensor(rng, static_cast<size_t>(num_kv * s.kv_heads * s.head_dim));
  p.d_o = random_tensor(rng, static_cast<size_t>(p.num_q * s.q_heads * s.head_dim));
  return p;
}

struct KernelResult {
  std::vector<float> o, lse, dq, dk, dv;
};

// Runs the kernels over the tiles of a cut of the problem (q_cuts x kv_cuts); forward either
// accumulates in place or writes one partial per tile and merges them.
KernelResult run_kernels(const DenseProblem& p, const RowRanges& rows, const std::vector<int64_t>& q_cuts,
                         const std::vector<int64_t>& kv_cuts, bool accumulate) {
  const cpu::HeadLayout heads{p.q_heads, p.kv_heads, p.head_dim};
  const int64_t ldq = static_cast<int64_t>(p.q_heads) * p.head_dim;
  const int64_t ldk = static_cast<int64_t>(p.kv_heads) * p.head_dim;
  std::vector<BuiltTile> built;
  for (size_t a = 0; a + 1 < q_cuts.size(); ++a)
    for (size_t b = 0; b + 1 < kv_cuts.size(); ++b) {
      BuiltTile t = build_tile(rows, q_cuts[a], q_cuts[a + 1], kv_cuts[b], kv_cuts[b + 1]);
      if (!t.empty) built.push_back(std::move(t));
    }
  KernelResult r;
  r.o.assign(static_cast<size_t>(p.num_q * ldq), 0.0f);
  r.lse.assign(static_cast<size_t>(p.num_q * p.q_heads), kNegInf);
  std::vector<std::vector<float>> part_o(built.size()), part_lse(built.size());
  std::vector<cpu::ForwardTile> fwd;
  for (size_t i = 0; i < built.size(); ++i) {
    const BuiltTile& b = built[i];
    cpu::ForwardTile t;
    t.num_q = b.q1 - b.q0;
    t.num_kv = b.k1 - b.k0;
    t.mask = b.view();
    t.q = p.q.data() + b.q0 * ldq;
    t.k = p.k.data() + b.k0 * ldk;
    t.v = p.v.data() + b.k0 * ldk;
    if (accumulate) {
      t.o = r.o.data() + b.q0 * ldq;
      t.lse = r.lse.data() + b.q0 * p.q_heads;
      t.accumulate = true;
    } else {
      part_o[i].assign(static_cast<size_t>(t.num_q * ldq), std::nanf(""));
      part_lse[i].assign(static_cast<size_t>(t.num_q * p.q_heads), std::nanf(""));
      t.o = part_o[i].data();
      t.lse = part_lse[i].data();
    }
    fwd.push_back(t);
  }
  cpu::attend_forward(heads, fwd);
  if (!accumulate) {
    // Merge per q block: rows of a block see the partials of the tiles of that block.
    for (size_t a = 0; a + 1 < q_cuts.size(); ++a) {
      std::vector<cpu::PartialView> parts;
      for (size_t i = 0; i < built.size(); ++i)
        if (built[i].q0 == q_cuts[a]) parts.push_back({part_o[i].data(), part_lse[i].data()});
      const int64_t n = q_cuts[a + 1] - q_cuts[a];
      cpu::merge_partials(parts, r.o.data() + q_cuts[a] * ldq, r.lse.data() + q_cuts[a] * p.q_heads,
                          n * p.q_heads, p.head_dim);
    }
  }
  std::vector<float> delta(static_cast<size_t>(p.num_q * p.q_heads));
  cpu::compute_delta(p.d_o.data(), r.o.data(), p.num_q, p.q_heads, p.head_dim, delta.data());
  r.dq.assign(r.o.size(), 0.0f);
  r.dk.assign(static_cast<size_t>(p.num_kv * ldk), 0.0f);
  r.dv.assign(r.dk.size(), 0.0f);
  std::vector<cpu::BackwardTile> bwd;
  for (const BuiltTile& b : built) {
    cpu::BackwardTile t;
    t.num_q = b.q1 - b.q0;
    t.num_kv = b.k1 - b.k0;
    t.mask = b.view();
    t.q = p.q.data() + b.q0 * ldq;
    t.k = p.k.data() + b.k0 * ldk;
    t.v = p.v.data() + b.k0 * ldk;
    t.d_o = p.d_o.data() + b.q0 * ldq;
    t.lse = r.lse.data() + b.q0 * p.q_heads;
    t.delta = delta.data() + b.q0 * p.q_heads;
    t.dq = r.dq.data() + b.q0 * ldq;
    t.dk = r.dk.data() + b.k0 * ldk;
    t.dv = r.dv.data() + b.k0 * ldk;
    bwd.push_back(t);
  }
  cpu::attend_backward(heads, bwd);
  return r;
}

void expect_close(const KernelResult& got, const DenseResult& want, double tol, const std::string& what) {
  EXPECT_LT(rel_error(got.o, want.o), tol) << what << " O";
  EXPECT_LT(rel_error(got.lse, want.lse, 1.0), tol) << what << " LSE";
  // Gradients can vanish exactly (a row with one allowed key has dS = 0, and fp32 leaves the
  // cancellation noise of dP - Delta): relative to at least
  // 1, the natural scale of the products of inputs of magnitude ~1 (an absolute floor of 1e-5).
  EXPECT_LT(rel_error(got.dq, want.dq, 1.0), tol) << what << " dQ";
  EXPECT_LT(rel_error(got.dk, want.dk, 1.0), tol) << what << " dK";
  EXPECT_LT(rel_error(got.dv, want.dv, 1.0), tol) << what << " dV";
}

const Shape kShapes[] = {{1, 1, 64}, {4, 1, 128}, {8, 1, 64}, {8, 2, 128}, {2, 2, 16}, {3, 1, 80}};
const MaskStyle kStyles[] = {MaskStyle::Full, MaskStyle::Causal, MaskStyle::Window, MaskStyle::Random};

TEST(AttentionCpu, SingleTilesMatchDenseReference) {
  SplitMix64 rng(11);
  for (const Shape& s : kShapes)
    for (MaskStyle style : kStyles) {
      const int64_t num_q = 1 + rng.below(150);
      const int64_t num_kv = style == MaskStyle::Causal ? num_q : 1 + rng.below(150);
      const RowRanges rows = random_rows(rng, style, num_q, num_kv);
      const DenseProblem p = make_problem(rng, s, rows, num_kv);
      const KernelResult got = run_kernels(p, rows, {0, num_q}, {0, num_kv}, false);
      expect_close(got, dense_reference(p), 1e-5,
                   name(s) + " style " + std::to_string(static_cast<int>(style)) + " " +
                       std::to_string(num_q) + "x" + std::to_string(num_kv));
    }
}

TEST(AttentionCpu, SequencesSplitIntoRandomBlocks) {
  SplitMix64 rng(12);
  const Shape shapes[] = {{1, 1, 64}, {4, 1, 128}, {8, 1, 64}, {8, 2, 128}};
  for (const Shape& s : shapes)
    for (MaskStyle style : kStyles)
      for (bool accumulate : {false, true}) {
        const int64_t length = 40 + rng.below(120);
        const RowRanges rows = random_rows(rng, style, length, length);
        const DenseProblem p = make_problem(rng, s, rows, length);
        const std::vector<int64_t> cuts = random_cuts(rng, length, 100);
        const KernelResult got = run_kernels(p, rows, cuts, cuts, accumulate);
        expect_close(got, dense_reference(p), 1e-5,
                     name(s) + " style " + std::to_string(static_cast<int>(style)) + " L=" + std::to_string(length) +
                         (accumulate ? " accumulate" : " merge"));
      }
}

TEST(AttentionCpu, FullyMaskedRowsGiveZeroAndMinusInf) {
  SplitMix64 rng(13);
  const Shape s{4, 1, 64};
  RowRanges rows = random_rows(rng, MaskStyle::Random, 70, 90);
  rows[0].clear();
  rows[65].clear();
  rows[66].clear();
  const DenseProblem p = make_problem(rng, s, rows, 90);
  for (bool accumulate : {false, true}) {
    const KernelResult got = run_kernels(p, rows, {0, 30, 70}, {0, 64, 90}, accumulate);
    for (size_t i = 0; i < rows.size(); ++i) {
      for (int h = 0; h < s.q_heads; ++h) {
        const size_t row = i * s.q_heads + h;
        if (rows[i].empty()) {
          EXPECT_EQ(got.lse[row], kNegInf) << "row " << i;
          for (int x = 0; x < s.head_dim; ++x) {
            EXPECT_EQ(got.o[row * s.head_dim + x], 0.0f) << "row " << i;
            EXPECT_EQ(got.dq[row * s.head_dim + x], 0.0f) << "row " << i;
          }
        } else {
          EXPECT_TRUE(std::isfinite(got.lse[row]));
        }
      }
    }
    for (float x : got.dk) EXPECT_FALSE(std::isnan(x));
    for (float x : got.dv) EXPECT_FALSE(std::isnan(x));
    expect_close(got, dense_reference(p), 1e-5, "masked rows");
  }
}

TEST(AttentionCpu, ResultsDoNotDependOnTheTileCut) {
  // Same problem, two cuts: both agree with the reference (and hence with each other).
  SplitMix64 rng(14);
  const Shape s{8, 1, 128};
  const RowRanges rows = random_rows(rng, MaskStyle::Window, 200, 200);
  const DenseProblem p = make_problem(rng, s, rows, 200);
  const DenseResult want = dense_reference(p);
  expect_close(run_kernels(p, rows, {0, 200}, {0, 200}, false), want, 1e-5, "one tile");
  expect_close(run_kernels(p, rows, {0, 64, 128, 192, 200}, {0, 64, 128, 192, 200}, true), want, 1e-5, "64");
}

TEST(AttentionCpu, HeadGroupsSlicedOutOfAllHeadTensors) {
  // 8 query / 2 KV heads stored together; each head group (4 q heads, 1 KV head) runs as its own
  // call on strided views, as the executor does with a rank's local tensors.
  SplitMix64 rng(15);
  const Shape s{8, 2, 64};
  const int64_t n = 77;
  const RowRanges rows = random_rows(rng, MaskStyle::Random, n, n);
  const DenseProblem p = make_problem(rng, s, rows, n);
  const DenseResult want = dense_reference(p);
  const BuiltTile tile = build_tile(rows, 0, n, 0, n);
  const int d = s.head_dim;
  KernelResult got;
  got.o.assign(static_cast<size_t>(n * s.q_heads * d), 0.0f);
  got.lse.assign(static_cast<size_t>(n * s.q_heads), 0.0f);
  got.dq.assign(got.o.size(), 0.0f);
  got.dk.assign(static_cast<size_t>(n * s.kv_heads * d), 0.0f);
  got.dv.assign(got.dk.size(), 0.0f);
  std::vector<float> delta(got.lse.size());
  const cpu::HeadLayout group{4, 1, d};
  cpu::RowStrides ld;
  ld.q = ld.o = ld.d_o = ld.dq = s.q_heads * d;
  ld.kv = ld.dkv = s.kv_heads * d;
  ld.lse = ld.delta = s.q_heads;
  for (int g = 0; g < 2; ++g) {
    const int64_t qo = g * 4 * d, ko = g * d, lo = g * 4;
    cpu::ForwardTile f;
    f.num_q = f.num_kv = n;
    f.mask = tile.view();
    f.q = p.q.data() + qo;
    f.k = p.k.data() + ko;
    f.v = p.v.data() + ko;
    f.o = got.o.data() + qo;
    f.lse = got.lse.data() + lo;
    f.ld = ld;
    cpu::attend_forward(group, {&f, 1});
  }
  cpu::compute_delta(p.d_o.data(), got.o.data(), n, s.q_heads, d, delta.data());
  for (int g = 0; g < 2; ++g) {
    const int64_t qo = g * 4 * d, ko = g * d, lo = g * 4;
    cpu::BackwardTile b;
    b.num_q = b.num_kv = n;
    b.mask = tile.view();
    b.q = p.q.data() + qo;
    b.k = p.k.data() + ko;
    b.v = p.v.data() + ko;
    b.d_o = p.d_o.data() + qo;
    b.lse = got.lse.data() + lo;
    b.delta = delta.data() + lo;
    b.dq = got.dq.data() + qo;
    b.dk = got.dk.data() + ko;
    b.dv = got.dv.data() + ko;
    b.ld = ld;
    cpu::attend_backward(group, {&b, 1});
  }
  expect_close(got, want, 1e-5, "sliced head groups");
}

TEST(AttentionCpu, BitIdenticalForAnyThreadCount) {
#ifdef _OPENMP
  SplitMix64 rng(16);
  const Shape s{4, 1, 64};
  const RowRanges rows = random_rows(rng, MaskStyle::Window, 300, 300);
  const DenseProblem p = make_problem(rng, s, rows, 300);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const KernelResult one = run_kernels(p, rows, {0, 300}, {0, 300}, false);
  omp_set_num_threads(3);
  const KernelResult three = run_kernels(p, rows, {0, 300}, {0, 300}, false);
  omp_set_num_threads(saved);
  EXPECT_EQ(one.o, three.o);
  EXPECT_EQ(one.lse, three.lse);
  EXPECT_EQ(one.dq, three.dq);
  EXPECT_EQ(one.dk, three.dk);
  EXPECT_EQ(one.dv, three.dv);
#else
  GTEST_SKIP() << "built without OpenMP";
#endif
}

TEST(AttentionCpu, InvalidTilesAreRejected) {
  const cpu::HeadLayout heads{4, 1, 64};
  std::vector<float> buf(64 * 4 * 64);
  cpu::ForwardTile t;
  t.num_q = 3;
  t.num_kv = 4;
  t.q = t.k = t.v = buf.data();
  t.o = t.lse = buf.data();
  t.mask.kind = TileKind::CausalDiagonal;
  EXPECT_THROW(cpu::attend_forward(heads, {&t, 1}), Error);
  const std::vector<int64_t> offsets{0, 1, 1, 2};
  const std::vector<Range> bad{{0, 2}, {3, 5}};  // 5 > num_kv
  t.mask.kind = TileKind::Partial;
  t.mask.row_offsets = offsets;
  t.mask.ranges = bad;
  EXPECT_THROW(cpu::attend_forward(heads, {&t, 1}), Error);
  EXPECT_THROW(cpu::attend_forward(cpu::HeadLayout{4, 3, 64}, {}), Error);
  EXPECT_THROW(cpu::attend_forward(cpu::HeadLayout{4, 1, 72}, {}), Error);
}

}  // namespace
}  // namespace dcp::test
