// dcp/bf16.h — bfloat16 on the host: the upper 16 bits of an IEEE float, rounded to nearest even.
#pragma once

#include <cstdint>
#include <cstring>

namespace dcp {

inline uint16_t to_bf16_bits(float x) {
  uint32_t u = 0;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffU) > 0x7f800000U) return static_cast<uint16_t>((u >> 16) | 0x40U);  // NaN stays NaN
  u += 0x7fffU + ((u >> 16) & 1U);
  return static_cast<uint16_t>(u >> 16);
}

inline float from_bf16_bits(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float x = 0;
  std::memcpy(&x, &u, 4);
  return x;
}

// x rounded to the nearest bf16 value, as a float.
inline float round_to_bf16(float x) { return from_bf16_bits(to_bf16_bits(x)); }

}  // namespace dcp
