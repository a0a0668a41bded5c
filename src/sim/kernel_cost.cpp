// Attend cost models of the simulator (see kernel_cost.h).
#include "kernel_cost.h"

#include <algorithm>

namespace dcp::sim_detail {

SubtileCount count_subtiles(const BlockTable& table, const Tile& t, int64_t rows_per, int64_t keys_per) {
  const TokenBlock& qb = table.token_blocks[static_cast<size_t>(t.q_block)];
  const TokenBlock& kb = table.token_blocks[static_cast<size_t>(t.kv_block)];
  const int64_t nq = (qb.length + rows_per - 1) / rows_per;
  const int64_t nk = (kb.length + keys_per - 1) / keys_per;
  SubtileCount c;
  if (t.kind == TileKind::Full) {
    c.full = nq * nk;
    return c;
  }
  if (t.kind == TileKind::CausalDiagonal) {
    // Tile-local row i may see key j <= i (q and kv blocks coincide).
    for (int64_t qi = 0; qi < nq; ++qi) {
      const int64_t r_lo = qi * rows_per, r_hi = std::min(qb.length, r_lo + rows_per);
      for (int64_t kj = 0; kj < nk; ++kj) {
        const int64_t k_lo = kj * keys_per, k_hi = std::min(kb.length, k_lo + keys_per);
        if (r_hi - 1 < k_lo) continue;  // every pair above the diagonal
        (r_lo >= k_hi - 1 ? c.full : c.masked) += 1;
      }
    }
    return c;
  }
  // Partial: allowed pairs per sub-tile from the rows' ranges.
  std::vector<int64_t> allowed(static_cast<size_t>(nk));
  std::vector<Range> ranges;
  for (int64_t qi = 0; qi < nq; ++qi) {
    const int64_t r_lo = qi * rows_per, r_hi = std::min(qb.length, r_lo + rows_per);
    std::fill(allowed.begin(), allowed.end(), 0);
    for (int64_t r = r_lo; r < r_hi; ++r) {
      table.tile_row_ranges(t, qb.begin + r, ranges);
      for (const Range& g : ranges) {
        const int64_t b = g.begin - kb.begin, e = g.end - kb.begin;  // kv-block-local
        for (int64_t kj = b / keys_per; kj * keys_per < e; ++kj)
          allowed[static_cast<size_t>(kj)] += std::min(e, (kj + 1) * keys_per) - std::max(b, kj * keys_per);
      }
    }
    for (int64_t kj = 0; kj < nk; ++kj) {
      const int64_t a = allowed[static_cast<size_t>(kj)];
      if (a == 0) {
        ++c.empty;
        continue;
      }
      const int64_t dense = (r_hi - r_lo) * (std::min(kb.length, (kj + 1) * keys_per) - kj * keys_per);
      (a == dense ? c.full : c.masked) += 1;
    }
  }
  return c;
}

const SubtileCount& AttendCost::counts(const Tile& t, bool fwd) {
  auto& cache = fwd ? fwd_ : bwd_;
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(t.q_block)) << 32) |
                       static_cast<uint32_t>(t.kv_block);
  auto it = cache.find(key);
  if (it == cache.end())
    it = cache.emplace(key, count_subtiles(table_, t, fwd ? kFwdSubRows : kBwdSubRows, kSubKeys)).first;
  return it->second;
}

double AttendCost::overhead_s(const Attend& a) const {
  return cal_.tile_overhead_s * static_cast<double>(a.tiles.size()) + cal_.launch_overhead_s;
}

double AttendCost::seconds(const Attend& a, Pass pass) {
  const bool fwd = pass == Pass::Forward;
  const double rate = fwd ? cal_.attn_fwd_flops : cal_.attn_bwd_flops;
  double flops = 0;  // full-tile-rate equivalent
  if (!cal_.subtile_model) {
    const double diagonal = fwd ? cal_.fwd_diagonal_efficiency : cal_.bwd_diagonal_efficiency;
    const double partial = fwd ? cal_.fwd_partial_efficiency : cal_.bwd_partial_efficiency;
    for (const TileOp& op : a.tiles) {
      const Tile& tile = table_.tiles[static_cast<size_t>(op.tile)];
      const double f = fwd ? table_.tile_flops_fwd(tile) : table_.tile_flops_bwd(tile);
      flops += tile.kind == TileKind::Full ? f : f / (tile.kind == TileKind::CausalDiagonal ? diagonal : partial);
    }
    return flops / rate + overhead_s(a);
  }
  const double diagonal = fwd ? cal_.fwd_diagonal_masked_cost : cal_.bwd_diagonal_masked_cost;
  const double partial = fwd ? cal_.fwd_partial_masked_cost : cal_.bwd_partial_masked_cost;
  const double empty = fwd ? cal_.fwd_empty_subtile_cost : cal_.bwd_empty_subtile_cost;
  // Dense FLOPs of one sub-tile: the forward's 4 x rows x keys x d x q heads, 2.5x backward.
  const double per_pair = 4.0 * table_.shape.head_dim * table_.groups.q_heads_per_group * (fwd ? 1.0 : 2.5);
  const double sub = per_pair * static_cast<double>((fwd ? kFwdSubRows : kBwdSubRows) * kSubKeys);
  for (const TileOp& op : a.tiles) {
    const Tile& tile = table_.tiles[static_cast<size_t>(op.tile)];
    const SubtileCount& c = counts(tile, fwd);
    const double m = tile.kind == TileKind::CausalDiagonal ? diagonal : partial;
    flops += sub * (static_cast<double>(c.full) + m * static_cast<double>(c.masked) +
                    empty * static_cast<double>(c.empty));
  }
  return flops / rate + overhead_s(a);
}

}  // namespace dcp::sim_detail
