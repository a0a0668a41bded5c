// Memory-bound helpers of the CPU backend: LSE merge of partial outputs, partial sums, Delta,
// bf16 rounding, and the argument checks shared by the attention kernels.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "dcp/detail/attention_cpu.h"
#include "dcp/detail/bf16.h"
#include "dcp/error.h"
#include "exec/cpu/tile_mask.h"

namespace dcp::cpu {

void HeadLayout::validate() const {
  if (q_heads <= 0 || kv_heads <= 0)
    raise(ErrorKind::InvalidInput, "HeadLayout: q_heads and kv_heads must be positive (got " +
                                       std::to_string(q_heads) + ", " + std::to_string(kv_heads) + ")");
  if (q_heads % kv_heads != 0)
    raise(ErrorKind::InvalidInput, "HeadLayout: q_heads (" + std::to_string(q_heads) +
                                       ") must be a multiple of kv_heads (" + std::to_string(kv_heads) + ")");
  if (head_dim <= 0 || head_dim % 16 != 0 || head_dim > 256)
    raise(ErrorKind::Unsupported, "HeadLayout: head_dim must be a multiple of 16 in [16, 256] (got " +
                                      std::to_string(head_dim) + ")");
}

RowStrides RowStrides::resolved(const HeadLayout& heads) const {
  const int64_t dq_dense = static_cast<int64_t>(heads.q_heads) * heads.head_dim;
  const int64_t dkv_dense = static_cast<int64_t>(heads.kv_heads) * heads.head_dim;
  auto pick = [](int64_t given, int64_t dense) { return given > 0 ? given : dense; };
  RowStrides r;
  r.q = pick(q, dq_dense);
  r.kv = pick(kv, dkv_dense);
  r.o = pick(o, dq_dense);
  r.lse = pick(lse, heads.q_heads);
  r.d_o = pick(d_o, dq_dense);
  r.delta = pick(delta, heads.q_heads);
  r.dq = pick(dq, dq_dense);
  r.dkv = pick(dkv, dkv_dense);
  return r;
}

namespace detail {

void validate_tile_mask(const TileMaskView& mask, int64_t num_q, int64_t num_kv, const char* where) {
  const std::string w(where);
  if (num_q < 0 || num_kv < 0)
    raise(ErrorKind::InvalidInput, w + ": negative tile size (" + std::to_string(num_q) + " x " +
                                       std::to_string(num_kv) + ")");
  switch (mask.kind) {
    case TileKind::Full: return;
    case TileKind::CausalDiagonal:
      if (num_q != num_kv)
        raise(ErrorKind::InvalidInput, w + ": a causal-diagonal tile must be square (got " +
                                           std::to_string(num_q) + " x " + std::to_string(num_kv) + ")");
      return;
    case TileKind::Partial: break;
  }
  if (static_cast<int64_t>(mask.row_offsets.size()) != num_q + 1)
    raise(ErrorKind::InvalidInput, w + ": row_offsets must have num_q + 1 = " + std::to_string(num_q + 1) +
                                       " entries (got " + std::to_string(mask.row_offsets.size()) + ")");
  if (mask.row_offsets[0] != 0 ||
      mask.row_offsets[static_cast<size_t>(num_q)] != static_cast<int64_t>(mask.ranges.size()))
    raise(ErrorKind::InvalidInput, w + ": row_offsets must start at 0 and end at the number of ranges");
  for (int64_t r = 0; r < num_q; ++r) {
    const int64_t b = mask.row_offsets[static_cast<size_t>(r)];
    const int64_t e = mask.row_offsets[static_cast<size_t>(r) + 1];
    if (e < b) raise(ErrorKind::InvalidInput, w + ": row_offsets decrease at row " + std::to_string(r));
    int64_t prev_end = 0;
    for (int64_t i = b; i < e; ++i) {
      const Range& g = mask.ranges[static_cast<size_t>(i)];
      if (g.begin < prev_end || g.begin >= g.end || g.end > num_kv)
        raise(ErrorKind::InvalidInput, w + ": row " + std::to_string(r) + " range [" + std::to_string(g.begin) +
                                           ", " + std::to_string(g.end) +
                                           ") is empty, unsorted, overlapping or outside [0, " +
                                           std::to_string(num_kv) + ")");
      prev_end = g.end;
    }
  }
}

}  // namespace detail

void compute_delta(const float* d_o, const float* o, int64_t num_rows, int q_heads, int head_dim,
                   float* delta) {
  const int64_t n = num_rows * q_heads;
#pragma omp parallel for schedule(static) if (detail::worth_threads(n * head_dim))
  for (int64_t i = 0; i < n; ++i) {
    double acc = 0.0;
    for (int x = 0; x < head_dim; ++x) acc += static_cast<double>(d_o[i * head_dim + x]) * o[i * head_dim + x];
    delta[i] = static_cast<float>(acc);
  }
}

void merge_into(float* o, float* lse, const float* o_part, const float* lse_part, int64_t num_rows,
                int head_dim) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
#pragma omp parallel for schedule(static) if (detail::worth_threads(num_rows * head_dim))
  for (int64_t i = 0; i < num_rows; ++i) {
    float* orow = o + i * head_dim;
    const float* prow = o_part + i * head_dim;
    const float a = lse[i];
    const float b = lse_part[i];
    if (b == kNegInf) continue;  // identity
    if (a == kNegInf) {
      std::copy_n(prow, head_dim, orow);
      lse[i] = b;
      continue;
    }
    const float m = std::max(a, b);
    const float wa = std::exp(a - m);
    const float wb = std::exp(b - m);
    const float total = wa + wb;
    const float ca = wa / total;
    const float cb = wb / total;
    for (int x = 0; x < head_dim; ++x) orow[x] = ca * orow[x] + cb * prow[x];
    lse[i] = m + std::log(total);
  }
}

void merge_partials(std::span<const PartialView> parts, float* o, float* lse, int64_t num_rows,
                    int head_dim) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
#pragma omp parallel for schedule(static) if (detail::worth_threads(num_rows * head_dim * static_cast<int64_t>(parts.size())))
  for (int64_t i = 0; i < num_rows; ++i) {
    float* orow = o + i * head_dim;
    float m = kNegInf;
    for (const PartialView& p : parts) m = std::max(m, p.lse[i]);
    std::fill_n(orow, head_dim, 0.0f);
    if (m == kNegInf) {
      lse[i] = kNegInf;
      continue;
    }
    float total = 0.0f;
    for (const PartialView& p : parts) total += p.lse[i] == kNegInf ? 0.0f : std::exp(p.lse[i] - m);
    for (const PartialView& p : parts) {
      if (p.lse[i] == kNegInf) continue;
      const float c = std::exp(p.lse[i] - m) / total;
      const float* prow = p.o + i * head_dim;
      for (int x = 0; x < head_dim; ++x) orow[x] += c * prow[x];
    }
    lse[i] = m + std::log(total);
  }
}

void sum_into(float* dst, const float* src, int64_t n) {
#pragma omp parallel for schedule(static) if (detail::worth_threads(n))
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

void round_to_bf16(std::span<float> values) {
  for (float& v : values) v = dcp::round_to_bf16(v);
}

}  // namespace dcp::cpu
