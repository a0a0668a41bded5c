// dq_units.h — the numbers of the one-pass deterministic backward (AttnBackwardParams::dq_units),
// shared by its CUDA kernels and the host tests that check them.
//
// A row's dQ is the sum, over the 128-key chunks of its keys, of contributions
// x_c = scale * sum_{j in c} P_ij (dP_ij - Delta_i) K_j. With dP_ij = dO_i . V_j and Delta_i the
// P-weighted mean of dP_ij, |dP_ij - Delta_i| <= 2 |dO_i|_2 max_j |V_j|_2, and the probabilities
// of a row sum to 1, so sum_c |x_c| <= b = 2 scale |dO_i|_2 max |V|_2 max |K| in every column.
// Each contribution is rounded to a multiple of u = 2^(floor(log2 b) - 22): b < 2^23 u, so every
// partial sum, in any order, is a multiple of u below 2^24 u (twice the margin that the bf16
// rounding of dS and the fp32 rounding of P could use), which fp32 holds exactly. The rounding
// costs at most u / 2 per contribution: dQ keeps about 23 bits below the bound, and the bound
// is loose (the spread of dP around Delta, the signs of the products, outlier features of K and
// V): 2^12-2^17 above a row's values in the host test's rows.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define DCP_DQ_UNITS_FN __host__ __device__ inline
#else
#define DCP_DQ_UNITS_FN inline
#endif

namespace dcp::cuda::dq_units {

// b for a row: k_max = max |K| over the kv head's rows, v2_max = max |V|_2^2, n2 = |dO|_2^2.
DCP_DQ_UNITS_FN float bound(float scale, float k_max, float v2_max, float n2) {
  return 2.0F * scale * k_max * sqrtf(v2_max) * sqrtf(n2);
}

// The unit's biased fp32 exponent for bound b: floor(log2 b) - 22 + 127, at least 1 (b below
// 2^-104, or zero: the unit 2^-126 is already above every contribution).
DCP_DQ_UNITS_FN int32_t exponent(float b) {
  uint32_t bits = 0;
  memcpy(&bits, &b, sizeof bits);
  const int32_t e = static_cast<int32_t>((bits >> 23) & 0xffU) - 22;
  return e > 1 ? e : 1;
}

// 2^(e - 127) and scale / 2^(e - 127), both exact scalings but for scale's one rounding.
DCP_DQ_UNITS_FN float unit(int32_t e) {
  const uint32_t bits = static_cast<uint32_t>(e) << 23;
  float u = 0.0F;
  memcpy(&u, &bits, sizeof u);
  return u;
}
DCP_DQ_UNITS_FN float inverse(int32_t e, float scale) { return unit(254 - e) * scale; }

// A contribution x (before the softmax scale) rounded to a multiple of the unit.
DCP_DQ_UNITS_FN float round(float x, int32_t e, float scale) { return rintf(x * inverse(e, scale)) * unit(e); }

}  // namespace dcp::cuda::dq_units

#undef DCP_DQ_UNITS_FN
