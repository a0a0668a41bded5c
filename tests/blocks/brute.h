// Test helpers for masks and blocks: a seeded PRNG, random masks and per-token references.
//
// The references evaluate the mask formulas of mask.h directly, one (row, key) pair at a time,
// and share no code with the library.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/rng.h"
#include "dcp/mask.h"

namespace dcp::test {


// Per-token evaluation of the mask formulas.
inline bool allowed(const Mask& m, int64_t L, int64_t i, int64_t k) {
  const auto in = [k](int64_t b, int64_t e) { return k >= b && k < e; };
  switch (m.kind) {
    case MaskKind::Full: return in(0, L);
    case MaskKind::Causal: return in(0, i + 1);
    case MaskKind::Lambda:
      return in(0, std::min(m.sink, i + 1)) || in(std::max<int64_t>(0, i - m.window + 1), i + 1);
    case MaskKind::CausalBlockwise: {
      const int64_t b = i / m.block;
      const int64_t nb = (L + m.block - 1) / m.block;
      if (b < m.sink_blocks || b == nb - 1) return in(0, i + 1);
      const int64_t sink_end = m.sink_blocks * m.block;
      return in(0, sink_end) || in(std::max(sink_end, (b - m.local_blocks) * m.block), i + 1);
    }
    case MaskKind::SharedQuestion: {
      if (i < m.question) return in(0, i + 1);
      int64_t a = m.question;
      for (int64_t len : m.answers) {
        if (i < a + len) break;
        a += len;
      }
      return in(0, m.question) || in(a, i + 1);
    }
    case MaskKind::Ranges:
      for (const Range& r : (*m.rows)[static_cast<size_t>(i)])
        if (in(r.begin, r.end)) return true;
      return false;
    case MaskKind::Chunked: return k <= i && k / m.block == i / m.block;
  }
  return false;
}

// Dense L x L grid of allowed pairs (row-major).
inline std::vector<uint8_t> allowed_grid(const Mask& m, int64_t L) {
  std::vector<uint8_t> g(static_cast<size_t>(L * L));
  for (int64_t i = 0; i < L; ++i)
    for (int64_t k = 0; k < L; ++k) g[static_cast<size_t>(i * L + k)] = allowed(m, L, i, k) ? 1 : 0;
  return g;
}

// Canonical ranges of one row of a dense grid.
inline std::vector<Range> grid_row_ranges(const std::vector<uint8_t>& g, int64_t L, int64_t i, int64_t k0,
                                          int64_t k1) {
  std::vector<Range> out;
  for (int64_t k = k0; k < k1; ++k) {
    if (!g[static_cast<size_t>(i * L + k)]) continue;
    if (!out.empty() && out.back().end == k) {
      out.back().end = k + 1;
    } else {
      out.push_back({k, k + 1});
    }
  }
  return out;
}

// Random explicit ranges: random rows, rows copied from a named mask (to exercise coalescing
// into slope-0/1 pieces), empty rows, and touching ranges.
inline std::vector<std::vector<Range>> random_rows(Rng& rng, int64_t L, const Mask& pattern) {
  std::vector<std::vector<Range>> rows(static_cast<size_t>(L));
  int64_t mode = 0;
  for (int64_t i = 0; i < L; ++i) {
    if (rng.uniform(0, 15) == 0) mode = rng.uniform(0, 2);
    auto& row = rows[static_cast<size_t>(i)];
    if (mode == 0) {  // the pattern's row, written as (possibly touching) ranges
      int64_t k = 0;
      while (k < L) {
        if (!allowed(pattern, L, i, k)) {
          ++k;
          continue;
        }
        int64_t e = k;
        while (e < L && allowed(pattern, L, i, e)) ++e;
        if (e - k >= 2 && rng.uniform(0, 3) == 0) {  // split into two touching ranges
          const int64_t mid = rng.uniform(k + 1, e - 1);
          row.push_back({k, mid});
          row.push_back({mid, e});
        } else {
          row.push_back({k, e});
        }
        k = e;
      }
    } else if (mode == 1) {  // random disjoint ranges
      const int64_t n = rng.uniform(0, 4);
      int64_t k = 0;
      for (int64_t j = 0; j < n && k < L; ++j) {
        const int64_t b = rng.uniform(k, std::min(L - 1, k + L / 3 + 1));
        const int64_t e = rng.uniform(b + 1, std::min(L, b + L / 4 + 2));
        row.push_back({b, e});
        k = e + rng.uniform(0, 2);
      }
    }  // mode 2: empty row
  }
  return rows;
}

// A random mask of any kind for a sequence of length L (valid for L).
inline Mask random_mask(Rng& rng, int64_t L) {
  switch (rng.uniform(0, 6)) {
    case 0: return Mask::full();
    case 1: return Mask::causal();
    case 2: return Mask::lambda(rng.uniform(0, 20), rng.uniform(1, std::max<int64_t>(2, L / 2 + 3)));
    case 3:
      return Mask::causal_blockwise(rng.uniform(1, 48), rng.uniform(0, 4), rng.uniform(0, 3));
    case 4: {
      const int num_answers = static_cast<int>(rng.uniform(1, 6));
      const double fraction = static_cast<double>(rng.uniform(0, 100)) / 100.0;
      return Mask::shared_question_for(L, fraction, num_answers);
    }
    case 5: return Mask::chunked(rng.uniform(1, std::max<int64_t>(2, L / 2 + 3)));
    default: {
      Rng inner(rng.next());
      Mask pattern = random_mask(inner, L);
      while (pattern.kind == MaskKind::Ranges) pattern = random_mask(inner, L);
      return Mask::ranges(random_rows(rng, L, pattern));
    }
  }
}

}  // namespace dcp::test
