// dq_units.h — the numbers of the one-pass deterministic backward (AttnBackwardParams::dq_units),
// shared by its CUDA kernels and the host tests that check them.
//
// A row's dQ is the sum, over the 128-key chunks of its keys, of contributions
// x_c = scale * sum_{j in c} P_ij (dP_ij - Delta_i) K_j. With dP_ij = dO_i . V_j in [-M, M],
// M = |dO_i|_2 max_j |V_j|_2, and Delta_i their P-weighted mean, sum_j P_ij |dP_ij - Delta_i| is a
// mean absolute deviation of values in [-M, M]: at most their standard deviation, at most M. So
// every contribution, and every sum of them, is at most scale M max |K| = b / 2 in every column,
// b = 2 scale |dO_i|_2 max |V|_2 max |K|. Each contribution is rounded to a multiple of
// u = 2^(floor(log2 b) - 21) (b < 2^22 u): every partial sum, in any order, is a multiple of u
// below 2^21 u, which fp32 holds exactly (8x below 2^24 u, the margin for the kernel's bf16 dS and
// fp32 P against the exact values). The rounding is fmaf(x, scale, c) - c with c = 1.5 2^23 u:
// the binade of c, [2^23 u, 2^24 u), has spacing u, so the FMA lands on the multiple of u nearest
// x scale for any |x scale| < 2^22 u (2x above the largest contribution) and the subtraction is
// exact; two FMA-pipe instructions instead of a multiply, a round-to-integer and a multiply. It
// costs at most u / 2 per contribution: dQ keeps about 22 bits below the bound, and the bound is
// loose (the spread of dP around Delta, the signs of the products, outlier features of K and V):
// 2^12-2^17 above a row's values in the host test's rows.
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

// The unit's biased fp32 exponent for bound b: floor(log2 b) - 21 + 127, at least 1 (b below
// 2^-105, or zero: the unit 2^-126 is already above every contribution).
DCP_DQ_UNITS_FN int32_t exponent(float b) {
  uint32_t bits = 0;
  memcpy(&bits, &b, sizeof bits);
  const int32_t e = static_cast<int32_t>((bits >> 23) & 0xffU) - 21;
  return e > 1 ? e : 1;
}

// 2^(e - 127).
DCP_DQ_UNITS_FN float unit(int32_t e) {
  const uint32_t bits = static_cast<uint32_t>(e) << 23;
  float u = 0.0F;
  memcpy(&u, &bits, sizeof u);
  return u;
}

// 1.5 2^23 u: the shifter whose binade has spacing u.
DCP_DQ_UNITS_FN float shifter(int32_t e) {
  const uint32_t bits = (static_cast<uint32_t>(e + 23) << 23) | 0x400000U;
  float c = 0.0F;
  memcpy(&c, &bits, sizeof c);
  return c;
}

// x * scale rounded to the nearest multiple of the unit (ties to even), for |x * scale| < 2^22 u.
DCP_DQ_UNITS_FN float round(float x, int32_t e, float scale) {
  const float c = shifter(e);
  return fmaf(x, scale, c) - c;
}

}  // namespace dcp::cuda::dq_units

#undef DCP_DQ_UNITS_FN
