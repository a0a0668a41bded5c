// Test helpers: random per-row masks of one sequence and their cut into tiles (kind + CSR ranges).
#pragma once

#include <cstdint>
#include <vector>

#include "dcp/detail/attention_cpu.h"
#include "exec/reference_attention.h"

namespace dcp::test {

using RowRanges = std::vector<std::vector<Range>>;

enum class MaskStyle { Full, Causal, Window, Random };

// Per-row allowed keys of a num_q x num_kv problem (query row i sits at key position i for the
// causal styles). Random rows have 0..4 ranges, some rows empty.
inline RowRanges random_rows(SplitMix64& rng, MaskStyle style, int64_t num_q, int64_t num_kv) {
  RowRanges rows(static_cast<size_t>(num_q));
  for (int64_t i = 0; i < num_q; ++i) {
    auto& out = rows[static_cast<size_t>(i)];
    const int64_t diag = std::min(i + 1, num_kv);
    switch (style) {
      case MaskStyle::Full: out.push_back({0, num_kv}); break;
      case MaskStyle::Causal: out.push_back({0, diag}); break;
      case MaskStyle::Window: {
        const int64_t sink = std::min<int64_t>(5, diag);
        const int64_t lo = std::max(sink, diag - 37);
        if (sink > 0) out.push_back({0, sink});
        if (lo < diag) {
          if (!out.empty() && out.back().end == lo) out.back().end = diag;
          else out.push_back({lo, diag});
        }
        break;
      }
      case MaskStyle::Random: {
        if (rng.below(6) == 0) break;  // an empty row
        const int n = static_cast<int>(rng.below(5));
        int64_t pos = 0;
        for (int r = 0; r < n && pos < num_kv; ++r) {
          const int64_t b = pos + rng.below(std::max<int64_t>(1, (num_kv - pos) / 2 + 1));
          if (b >= num_kv) break;
          const int64_t e = b + 1 + rng.below(num_kv - b);
          out.push_back({b, e});
          pos = e + 1;
        }
        break;
      }
    }
  }
  return rows;
}

inline std::vector<uint8_t> to_allowed(const RowRanges& rows, int64_t num_kv) {
  std::vector<uint8_t> allowed(rows.size() * static_cast<size_t>(num_kv), 0);
  for (size_t i = 0; i < rows.size(); ++i)
    for (const Range& g : rows[i])
      for (int64_t j = g.begin; j < g.end; ++j) allowed[i * static_cast<size_t>(num_kv) + j] = 1;
  return allowed;
}

// One tile cut out of per-row ranges: rows [q0, q1) x keys [k0, k1).
struct BuiltTile {
  int64_t q0 = 0, q1 = 0, k0 = 0, k1 = 0;
  TileKind kind = TileKind::Full;
  std::vector<int64_t> offsets;
  std::vector<Range> ranges;
  bool empty = true;
  cpu::TileMaskView view() const {
    cpu::TileMaskView v;
    v.kind = kind;
    if (kind == TileKind::Partial) {
      v.row_offsets = offsets;
      v.ranges = ranges;
    }
    return v;
  }
};

inline BuiltTile build_tile(const RowRanges& rows, int64_t q0, int64_t q1, int64_t k0, int64_t k1) {
  BuiltTile t;
  t.q0 = q0;
  t.q1 = q1;
  t.k0 = k0;
  t.k1 = k1;
  t.offsets.push_back(0);
  bool full = true;
  bool causal = q0 == k0 && q1 == k1;
  for (int64_t i = q0; i < q1; ++i) {
    int64_t covered = 0;
    const size_t before = t.ranges.size();
    for (const Range& g : rows[static_cast<size_t>(i)]) {
      const int64_t b = std::max(g.begin, k0);
      const int64_t e = std::min(g.end, k1);
      if (b >= e) continue;
      t.ranges.push_back({b - k0, e - k0});
      covered += e - b;
    }
    t.offsets.push_back(static_cast<int64_t>(t.ranges.size()));
    if (covered > 0) t.empty = false;
    full = full && covered == k1 - k0;
    causal = causal && t.ranges.size() == before + 1 && t.ranges.back() == Range{0, i - q0 + 1};
  }
  t.kind = full ? TileKind::Full : causal ? TileKind::CausalDiagonal : TileKind::Partial;
  return t;
}

// Random cut of [0, n) into blocks of 1..max_block tokens.
inline std::vector<int64_t> random_cuts(SplitMix64& rng, int64_t n, int64_t max_block) {
  std::vector<int64_t> cuts{0};
  while (cuts.back() < n) cuts.push_back(std::min(n, cuts.back() + 1 + rng.below(max_block)));
  return cuts;
}

}  // namespace dcp::test
