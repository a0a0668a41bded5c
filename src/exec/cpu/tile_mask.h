// Internal: per-row allowed keys of a tile and the classification of 64x64 sub-blocks, shared by
// the forward and backward CPU kernels.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>

#include "dcp/detail/attention_cpu.h"
#include "exec/cpu/microkernels.h"

namespace dcp::cpu::detail {

enum class BlockClass { Empty, Full, Mixed };

class TileRows {
 public:
  TileRows(const TileMaskView& mask, int64_t num_kv) : mask_(mask), num_kv_(num_kv) {}

  // Allowed key ranges of `row` (tile-local); `tmp` backs the closed forms.
  std::span<const Range> row(int64_t r, Range& tmp) const {
    switch (mask_.kind) {
      case TileKind::Full: tmp = Range{0, num_kv_}; return {&tmp, 1};
      case TileKind::CausalDiagonal: tmp = Range{0, r + 1}; return {&tmp, 1};
      case TileKind::Partial: break;
    }
    const int64_t b = mask_.row_offsets[r];
    const int64_t e = mask_.row_offsets[r + 1];
    return mask_.ranges.subspan(b, e - b);
  }

  // Rows [r0, r1) x keys [c0, c1).
  BlockClass classify(int64_t r0, int64_t r1, int64_t c0, int64_t c1) const {
    switch (mask_.kind) {
      case TileKind::Full: return BlockClass::Full;
      case TileKind::CausalDiagonal:
        if (c0 > r1 - 1) return BlockClass::Empty;
        return c1 - 1 <= r0 ? BlockClass::Full : BlockClass::Mixed;
      case TileKind::Partial: break;
    }
    bool any = false;
    bool all = true;
    Range tmp;
    for (int64_t r = r0; r < r1; ++r) {
      int64_t covered = 0;
      for (const Range& g : row(r, tmp)) {
        if (g.begin >= c1) break;
        covered += std::max<int64_t>(0, std::min(g.end, c1) - std::max(g.begin, c0));
      }
      any = any || covered > 0;
      all = all && covered == c1 - c0;
    }
    if (!any) return BlockClass::Empty;
    return all ? BlockClass::Full : BlockClass::Mixed;
  }

  // Sets s[j] = -inf for every key c0 + j (j < 64) that row r may not see.
  void mask_row(int64_t r, int64_t c0, float* s) const {
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    const int64_t c1 = c0 + kKeyBlock;
    int64_t pos = c0;
    Range tmp;
    for (const Range& g : row(r, tmp)) {
      if (g.end <= pos) continue;
      if (g.begin >= c1) break;
      for (int64_t j = pos; j < g.begin; ++j) s[j - c0] = kNegInf;
      pos = std::min(g.end, c1);
    }
    for (int64_t j = pos; j < c1; ++j) s[j - c0] = kNegInf;
  }

 private:
  const TileMaskView& mask_;
  int64_t num_kv_;
};

// Throws InvalidInput when the mask view does not fit a num_q x num_kv tile.
void validate_tile_mask(const TileMaskView& mask, int64_t num_q, int64_t num_kv, const char* where);

}  // namespace dcp::cpu::detail
