// dq_units.h — the numbers of the one-pass deterministic backward (AttnBackwardParams::dq_units),
// shared by its CUDA kernels and the host tests that check them.
//
// A row's dQ is the sum, over the 128-key chunks of its keys, of contributions
// x_c = scale * sum_{j in c} P_ij (dP_ij - Delta_i) K_j. With dP_ij = dO_i . V_j in [-M, M],
// M = |dO_i|_2 max_j |V_j|_2, and Delta_i their P-weighted mean, sum_j P_ij |dP_ij - Delta_i| is a
// mean absolute deviation of values in [-M, M]: at most their standard deviation, at most M. So
// every contribution, and every sum of them, is at most scale M max |K| = b / 2 in every column,
// b = 2 scale |dO_i|_2 max |V|_2 max |K|. A gradient of the row's lse (AttentionBackwardArgs::
// d_lse) enters as dP_ij - Delta_i + d_lse_i: each |dP_ij - Delta_i| gains at most |d_lse_i|, and
// P sums to one, so b = 2 scale max |K| (|dO_i|_2 max |V|_2 + |d_lse_i|).
//
// Each contribution is rounded to an integer count of the row's unit u = 2^(floor(log2 b) - 28)
// (b < 2^29 u) and the counts are summed as int32: integer addition is associative, so the
// reductions give the same bits in any order. Every exact partial sum is below b / 2 < 2^28 u, 8x
// below int32's 2^31 (the margin for the kernel's bf16 dS and fp32 P against the exact values, and
// for the half unit each rounding adds). A contribution keeps fp32's 24 bits of its own value (the
// product x * scale / u is rounded once in fp32, then to an integer), and dQ keeps 29 bits below
// the bound, which is loose (the spread of dP around Delta, the signs of the products, outlier
// features of K and V): 2^12-2^17 above a row's values in the host test's rows, so 12-17 bits
// there, more than the bf16 gradient it becomes. After the last call adds into a row,
// from_units() turns its counts back into fp32 (cuda::deterministic_dq_from_units).
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

// Bits of the unit below the bound's binade: b < 2^(kBits + 1) u.
inline constexpr int kBits = 28;

// b for a row: k_max = max |K| over the kv head's rows, v2_max = max |V|_2^2, n2 = |dO|_2^2,
// dl_abs = |d_lse| of the row (0 without a gradient of lse).
DCP_DQ_UNITS_FN float bound(float scale, float k_max, float v2_max, float n2, float dl_abs = 0.0F) {
  if (dl_abs > 0.0F) return 2.0F * scale * k_max * (sqrtf(v2_max) * sqrtf(n2) + dl_abs);
  return 2.0F * scale * k_max * sqrtf(v2_max) * sqrtf(n2);
}

// The unit's biased fp32 exponent for bound b: floor(log2 b) - kBits + 127, at least 1 (b below
// 2^-98, or zero: the unit 2^-126 is already above every contribution). At most 255 - kBits (b
// infinite or NaN), so the unit and the multiplier below are normal floats.
DCP_DQ_UNITS_FN int32_t exponent(float b) {
  uint32_t bits = 0;
  memcpy(&bits, &b, sizeof bits);
  const int32_t e = static_cast<int32_t>((bits >> 23) & 0xffU) - kBits;
  return e > 1 ? e : 1;
}

// 2^(e - 127).
DCP_DQ_UNITS_FN float unit(int32_t e) {
  const uint32_t bits = static_cast<uint32_t>(e) << 23;
  float u = 0.0F;
  memcpy(&u, &bits, sizeof u);
  return u;
}

// scale / u = scale 2^(127 - e): exact, a power of two times scale.
DCP_DQ_UNITS_FN float multiplier(int32_t e, float scale) { return scale * unit(254 - e); }

// x * scale in units of 2^(e - 127), rounded to the nearest integer (ties to even): x times
// multiplier(e, scale) rounded once in fp32, then to an integer. |x * scale| < 2^31 u.
DCP_DQ_UNITS_FN int32_t to_units(float x, float multiplier) {
#if defined(__CUDA_ARCH__)
  return __float2int_rn(x * multiplier);
#else
  return static_cast<int32_t>(std::lrint(x * multiplier));
#endif
}

// A sum of counts back in fp32: n u (n rounded to fp32's 24 bits, then scaled exactly).
DCP_DQ_UNITS_FN float from_units(int32_t n, int32_t e) { return static_cast<float>(n) * unit(e); }

}  // namespace dcp::cuda::dq_units

#undef DCP_DQ_UNITS_FN
