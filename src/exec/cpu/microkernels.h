// Internal: register-blocked micro-kernels of the CPU attention kernels.
//
// Written with GCC/Clang vector extensions (16 fp32 lanes) so that the same source compiles to
// AVX-512, AVX2 or SSE; the callers are compiled once per ISA through target_clones (see
// DCP_CPU_CLONES) and these helpers are always inlined into each clone. The clones name ISA
// levels (x86-64-v4 = AVX-512, v3 = AVX2 + FMA), not CPU models: `arch=haswell` would dispatch on
// the CPU model and send AMD CPUs to the baseline clone.
//
// Sub-block geometry: kKeyBlock = 64 keys; score rows S[r][0..64) live in a [rows][64] buffer;
// transposed key/value panels are [head_dim][64], 64-byte aligned.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__) && !defined(DCP_NO_CLONES)
#define DCP_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define DCP_CPU_CLONES
#endif

#define DCP_INLINE inline __attribute__((always_inline))

namespace dcp::cpu::detail {

constexpr int kKeyBlock = 64;  // keys per sub-block (columns of S)
constexpr int kRowBlock = 64;  // query rows per work unit chunk

// A parallel region costs microseconds (more when cores are oversubscribed and idle threads
// spin), so small tiles run on the calling thread. `work` counts multiply-adds (or floats).
constexpr int64_t kMinParallelWork = int64_t{1} << 21;
inline bool worth_threads(int64_t work) { return work >= kMinParallelWork; }

typedef float F16 __attribute__((vector_size(64)));
typedef int32_t I16 __attribute__((vector_size(64)));

DCP_INLINE F16 load(const float* p) {
  F16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
DCP_INLINE void store(float* p, F16 v) { std::memcpy(p, &v, sizeof(v)); }
DCP_INLINE F16 splat(float x) { return F16{} + x; }

// exp(x) for x <= 0-ish arguments of softmax: range reduction x = n ln2 + r, |r| <= ln2/2, and a
// degree-7 Taylor polynomial (relative error < 1e-8 before rounding). Inputs below -87.3
// (including -inf) give exactly 0, so masked scores contribute exactly nothing.
DCP_INLINE F16 exp16(F16 x) {
  const F16 lo = splat(-87.3f);
  const F16 hi = splat(88.3f);
  const I16 keep = x >= lo;  // all-ones where the result is not flushed to 0
  I16 below = x < lo;
  x = (F16)(((I16)x & ~below) | ((I16)lo & below));
  const I16 above = x > hi;
  x = (F16)(((I16)x & ~above) | ((I16)hi & above));
  const F16 magic = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to the nearest integer
  F16 n = (x * splat(1.44269504088896341f) + magic) - magic;
  F16 r = x - n * splat(0.693145751953125f);
  r = r - n * splat(1.42860682030941723212e-6f);
  F16 p = splat(1.0f / 5040.0f);
  p = p * r + splat(1.0f / 720.0f);
  p = p * r + splat(1.0f / 120.0f);
  p = p * r + splat(1.0f / 24.0f);
  p = p * r + splat(1.0f / 6.0f);
  p = p * r + splat(0.5f);
  p = p * r + splat(1.0f);
  p = p * r + splat(1.0f);
  const I16 ni = __builtin_convertvector(n, I16);
  const F16 two_n = (F16)((ni + 127) << 23);
  return (F16)((I16)(p * two_n) & keep);
}

// s[r][0..64) = sum_x a[r * lda + x] * bt[x * 64 + 0..64) for r < RB. bt is a [dim][64] panel.
template <int RB>
DCP_INLINE void rows_times_panel(const float* a, int64_t lda, const float* bt, int dim, float* s) {
  F16 acc[RB][4];
  for (int r = 0; r < RB; ++r)
    for (int c = 0; c < 4; ++c) acc[r][c] = F16{};
  for (int x = 0; x < dim; ++x) {
    const float* b = bt + static_cast<int64_t>(x) * kKeyBlock;
    const F16 b0 = load(b), b1 = load(b + 16), b2 = load(b + 32), b3 = load(b + 48);
    for (int r = 0; r < RB; ++r) {
      const float ar = a[r * lda + x];
      acc[r][0] += ar * b0;
      acc[r][1] += ar * b1;
      acc[r][2] += ar * b2;
      acc[r][3] += ar * b3;
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int c = 0; c < 4; ++c) store(s + r * kKeyBlock + 16 * c, acc[r][c]);
}

// S[rows][64] = A[rows] * panel, rows in steps of 4.
DCP_INLINE void scores(const float* a, int64_t lda, int64_t rows, const float* bt, int dim, float* s) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) rows_times_panel<4>(a + r * lda, lda, bt, dim, s + r * kKeyBlock);
  for (; r < rows; ++r) rows_times_panel<1>(a + r * lda, lda, bt, dim, s + r * kKeyBlock);
}

// out[r][col..col+16*NV) += sum_{j < nk} p[r][j] * b[j * ldb + col ..] for r < RB.
template <int RB, int NV>
DCP_INLINE void probs_times_rows(const float* p, int nk, const float* b, int64_t ldb, float* out,
                                 int64_t ldo, int col) {
  F16 acc[RB][NV];
  for (int r = 0; r < RB; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = load(out + r * ldo + col + 16 * v);
  for (int j = 0; j < nk; ++j) {
    F16 bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = load(b + j * ldb + col + 16 * v);
    for (int r = 0; r < RB; ++r) {
      const float pr = p[r * kKeyBlock + j];
      for (int v = 0; v < NV; ++v) acc[r][v] += pr * bv[v];
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int v = 0; v < NV; ++v) store(out + r * ldo + col + 16 * v, acc[r][v]);
}

template <int RB>
DCP_INLINE void probs_times_rows_all_cols(const float* p, int nk, const float* b, int64_t ldb,
                                          float* out, int64_t ldo, int dim) {
  int col = 0;
  for (; col + 64 <= dim; col += 64) probs_times_rows<RB, 4>(p, nk, b, ldb, out, ldo, col);
  switch ((dim - col) / 16) {
    case 3: probs_times_rows<RB, 3>(p, nk, b, ldb, out, ldo, col); break;
    case 2: probs_times_rows<RB, 2>(p, nk, b, ldb, out, ldo, col); break;
    case 1: probs_times_rows<RB, 1>(p, nk, b, ldb, out, ldo, col); break;
    default: break;
  }
}

// OUT[rows][dim] += P[rows][0..nk) * B[nk][dim] (B rows strided by ldb).
DCP_INLINE void probs_times(const float* p, int64_t rows, int nk, const float* b, int64_t ldb,
                            float* out, int64_t ldo, int dim) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4)
    probs_times_rows_all_cols<4>(p + r * kKeyBlock, nk, b, ldb, out + r * ldo, ldo, dim);
  for (; r < rows; ++r)
    probs_times_rows_all_cols<1>(p + r * kKeyBlock, nk, b, ldb, out + r * ldo, ldo, dim);
}

// out[c][col..] += sum_{r < rows} p[r][c0 + c] * x[r * ldx + col ..] for c < 4 (transposed P).
template <int NV>
DCP_INLINE void probs_t_times_rows(const float* p, int64_t rows, int c0, const float* x, int64_t ldx,
                                   float* out, int dim, int col) {
  F16 acc[4][NV];
  for (int c = 0; c < 4; ++c)
    for (int v = 0; v < NV; ++v) acc[c][v] = load(out + (c0 + c) * dim + col + 16 * v);
  for (int64_t r = 0; r < rows; ++r) {
    F16 xv[NV];
    for (int v = 0; v < NV; ++v) xv[v] = load(x + r * ldx + col + 16 * v);
    const float* pr = p + r * kKeyBlock + c0;
    for (int c = 0; c < 4; ++c) {
      const float pc = pr[c];
      for (int v = 0; v < NV; ++v) acc[c][v] += pc * xv[v];
    }
  }
  for (int c = 0; c < 4; ++c)
    for (int v = 0; v < NV; ++v) store(out + (c0 + c) * dim + col + 16 * v, acc[c][v]);
}

// OUT[64][dim] += P[rows][64]^T * X[rows][dim]; columns of P beyond the valid keys are zero.
DCP_INLINE void probs_t_times(const float* p, int64_t rows, int nk, const float* x, int64_t ldx,
                              float* out, int dim) {
  for (int c0 = 0; c0 < nk; c0 += 4) {
    int col = 0;
    for (; col + 64 <= dim; col += 64) probs_t_times_rows<4>(p, rows, c0, x, ldx, out, dim, col);
    switch ((dim - col) / 16) {
      case 3: probs_t_times_rows<3>(p, rows, c0, x, ldx, out, dim, col); break;
      case 2: probs_t_times_rows<2>(p, rows, c0, x, ldx, out, dim, col); break;
      case 1: probs_t_times_rows<1>(p, rows, c0, x, ldx, out, dim, col); break;
      default: break;
    }
  }
}

// panel[x][j] = src[(c0 + j) * ld + x] for j < nk, zero for nk <= j < 64.
DCP_INLINE void pack_transposed(const float* src, int64_t ld, int nk, int dim, float* panel) {
  for (int j = 0; j < nk; ++j) {
    const float* row = src + j * ld;
    for (int x = 0; x < dim; ++x) panel[x * kKeyBlock + j] = row[x];
  }
  if (nk < kKeyBlock)
    for (int x = 0; x < dim; ++x)
      for (int j = nk; j < kKeyBlock; ++j) panel[x * kKeyBlock + j] = 0.0f;
}

// Zero-initialised, 64-byte aligned fp32 scratch owned by one work unit.
class Scratch {
 public:
  explicit Scratch(int64_t num_floats)
      : data_(static_cast<float*>(std::aligned_alloc(64, round_up_bytes(num_floats)))) {
    if (data_ == nullptr) throw std::bad_alloc();
    std::memset(data_.get(), 0, round_up_bytes(num_floats));
  }
  float* get() const { return data_.get(); }

 private:
  static size_t round_up_bytes(int64_t num_floats) {
    return (static_cast<size_t>(num_floats) * sizeof(float) + 63) / 64 * 64;
  }
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> data_;
};

}  // namespace dcp::cpu::detail
