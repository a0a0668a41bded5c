// tests/common/rng.h — the one PRNG of the test suites: splitmix64, small, portable and explicitly
// seeded, so every random test case is reproducible from its seed on any platform.
#pragma once

#include <cstdint>

namespace dcp::test {

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  // Uniform in [lo, hi] (inclusive); the modulo bias is irrelevant for tests.
  int64_t uniform(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(next() % static_cast<uint64_t>(hi - lo + 1));
  }
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }
  bool coin() { return (next() & 1) != 0; }
  float symmetric() { return static_cast<float>(2.0 * uniform() - 1.0); }  // [-1, 1)

 private:
  uint64_t state_;
};

using Rng = SplitMix64;

}  // namespace dcp::test
