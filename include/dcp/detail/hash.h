// dcp/hash.h — FNV-1a 64: the checksum of plan files and the identity of a plan across ranks.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dcp {

inline uint64_t fnv1a(const void* data, size_t n, uint64_t h = 0xcbf29ce484222325ULL) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}

}  // namespace dcp
