// dcp/rng.h — the project's one small pseudo-random generator (SplitMix64): deterministic,
// seedable streams for synthetic batches, benchmarks, searches and tests. Not for cryptography.
#pragma once

#include <cmath>
#include <cstdint>

namespace dcp {

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  // Uniform in (0, 1]: safe for log().
  double uniform_open() { return static_cast<double>((next() >> 11) + 1) * 0x1.0p-53; }
  // Standard normal by Box-Muller; the second value is dropped to keep the stream simple.
  double normal() {
    const double u1 = uniform_open();
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * 3.14159265358979323846 * u2);
  }
  double log_uniform(double lo, double hi) { return lo * std::exp(uniform() * std::log(hi / lo)); }
  // Uniform integer in [0, n), n >= 1 (modulo bias below 2^-40 for the n used here).
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }
  // Uniform integer in [lo, hi], inclusive.
  int64_t uniform(int64_t lo, int64_t hi) { return lo + below(hi - lo + 1); }
  bool coin() { return (next() & 1) != 0; }
  float symmetric() { return static_cast<float>(2.0 * uniform() - 1.0); }  // [-1, 1)

 private:
  uint64_t state_;
};

}  // namespace dcp
