// Attend cost models of the simulator (see kernel_cost.h).
#include "kernel_cost.h"

#include <algorithm>
#include <compare>

namespace dcp::sim_detail {

SubtileCount count_subtiles(const BlockTable& table, const Tile& t, int64_t rows_per, int64_t keys_per) {
  const TokenBlock& qb = table.token_blocks[static_cast<size_t>(t.q_block)];
  const TokenBlock& kb = table.token_blocks[static_cast<size_t>(t.kv_block)];
  const int64_t nq = (qb.length + rows_per - 1) / rows_per;
  const int64_t nk = (kb.length + keys_per - 1) / keys_per;
  // The kernels load the keys past a short kv block as zeros and must mask them, so a sub-tile
  // with fewer than keys_per keys is masked whatever the mask allows.
  auto whole = [&](int64_t kj) { return (kj + 1) * keys_per <= kb.length; };
  SubtileCount c;
  c.live_key_subtiles = nk;
  if (t.kind == TileKind::Full) {
    c.masked = whole(nk - 1) ? 0 : nq;
    c.full = nq * nk - c.masked;
    return c;
  }
  if (t.kind == TileKind::CausalDiagonal) {
    // Tile-local row i may see key j <= i (q and kv blocks coincide).
    for (int64_t qi = 0; qi < nq; ++qi) {
      const int64_t r_lo = qi * rows_per, r_hi = std::min(qb.length, r_lo + rows_per);
      for (int64_t kj = 0; kj < nk; ++kj) {
        const int64_t k_lo = kj * keys_per, k_hi = std::min(kb.length, k_lo + keys_per);
        if (r_hi - 1 < k_lo) continue;  // every pair above the diagonal
        (r_lo >= k_hi - 1 && whole(kj) ? c.full : c.masked) += 1;
      }
    }
    return c;
  }
  // Partial: allowed pairs per sub-tile from the rows' ranges.
  std::vector<int64_t> allowed(static_cast<size_t>(nk));
  // Per key sub-tile (column): the first and last q sub-tile with an allowed pair, and how many.
  std::vector<int64_t> first(static_cast<size_t>(nk), -1), last(static_cast<size_t>(nk), -1), nonempty(static_cast<size_t>(nk), 0);
  std::vector<Range> ranges;
  for (int64_t qi = 0; qi < nq; ++qi) {
    const int64_t r_lo = qi * rows_per, r_hi = std::min(qb.length, r_lo + rows_per);
    std::fill(allowed.begin(), allowed.end(), 0);
    int64_t row_first = -1, row_last = -1, row_nonempty = 0;  // this row of sub-tiles' key span
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
      if (a == 0) ++c.empty;
      else (a == (r_hi - r_lo) * keys_per && whole(kj) ? c.full : c.masked) += 1;
      if (a != 0) {
        const auto k = static_cast<size_t>(kj);
        if (first[k] < 0) first[k] = qi;
        last[k] = qi;
        ++nonempty[k];
        if (row_first < 0) row_first = kj;
        row_last = kj;
        ++row_nonempty;
      }
    }
    // The forward walks a row's sub-tiles from its first to its last allowed one.
    c.row_dead_empty += nk - row_nonempty - (row_first < 0 ? 0 : row_last - row_first + 1 - row_nonempty);
  }
  // The backward walks a live column's sub-tiles from its first to its last allowed one.
  int64_t walked_empty = 0;
  c.live_key_subtiles = 0;
  for (size_t k = 0; k < static_cast<size_t>(nk); ++k) {
    if (first[k] < 0) continue;
    ++c.live_key_subtiles;
    walked_empty += last[k] - first[k] + 1 - nonempty[k];
  }
  c.dead_empty = c.empty - walked_empty;
  return c;
}

AttendWork& AttendWork::operator+=(const AttendWork& o) {
  full += o.full;
  diagonal_masked += o.diagonal_masked;
  partial_masked += o.partial_masked;
  empty += o.empty;
  items += o.items;
  return *this;
}

double work_units(const AttendWork& w, const Calibration& cal, Pass pass) {
  const bool fwd = pass == Pass::Forward;
  return w.full + (fwd ? cal.fwd_diagonal_masked_cost : cal.bwd_diagonal_masked_cost) * w.diagonal_masked +
         (fwd ? cal.fwd_partial_masked_cost : cal.bwd_partial_masked_cost) * w.partial_masked +
         (fwd ? cal.fwd_empty_subtile_cost : cal.bwd_empty_subtile_cost) * w.empty +
         (fwd ? cal.fwd_work_item_cost : cal.bwd_work_item_cost) * w.items;
}

double subtile_flops(const BlockTable& table, Pass pass) {
  const bool fwd = pass == Pass::Forward;
  const double per_pair = 4.0 * table.shape.head_dim * table.groups.q_heads_per_group * (fwd ? 1.0 : 2.5);
  return per_pair * static_cast<double>((fwd ? kFwdSubRows : kBwdSubRows) * kSubKeys);
}

const SubtileCount& AttendCost::counts(const Tile& t, Pass pass) {
  const bool fwd = pass == Pass::Forward;
  auto& cache = fwd ? fwd_ : bwd_;
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(t.q_block)) << 32) |
                       static_cast<uint32_t>(t.kv_block);
  auto it = cache.find(key);
  if (it == cache.end())
    it = cache.emplace(key, count_subtiles(table_, t, fwd ? kFwdSubRows : kBwdSubRows, kSubKeys)).first;
  return it->second;
}

AttendWork AttendCost::work(const Attend& a, Pass pass) {
  const bool fwd = pass == Pass::Forward;
  AttendWork w;
  // Forward items: the tiles writing one output partial form one run, cut into 128-row items
  // (kFwdSubRows: one row of sub-tiles); backward items: 128 keys (kSubKeys) of one tile.
  struct Run {
    Space space;
    int32_t index, group, q_block;
    auto operator<=>(const Run&) const = default;
  };
  std::vector<Run> runs;
  if (fwd) runs.reserve(a.tiles.size());
  for (const TileOp& op : a.tiles) {
    const Tile& tile = table_.tiles[static_cast<size_t>(op.tile)];
    const SubtileCount& c = counts(tile, pass);
    w.full += static_cast<double>(c.full);
    (tile.kind == TileKind::Partial ? w.partial_masked : w.diagonal_masked) += static_cast<double>(c.masked);
    if (fwd) {
      w.empty += static_cast<double>(c.empty - c.row_dead_empty);
      runs.push_back({op.out.space, op.out.index, tile.head_group, tile.q_block});
    } else {
      w.empty += static_cast<double>(c.empty - c.dead_empty);
      w.items += static_cast<double>(c.live_key_subtiles);
    }
  }
  if (fwd) {
    std::sort(runs.begin(), runs.end());
    runs.erase(std::unique(runs.begin(), runs.end()), runs.end());
    for (const Run& r : runs) {
      const int64_t rows = table_.token_blocks[static_cast<size_t>(r.q_block)].length;
      w.items += static_cast<double>((rows + kFwdSubRows - 1) / kFwdSubRows);
    }
  }
  return w;
}

double AttendCost::overhead_s(const Attend& a) const {
  return cal_.tile_overhead_s * static_cast<double>(a.tiles.size()) + cal_.launch_overhead_s;
}

double AttendCost::seconds(const Attend& a, Pass pass) {
  const bool fwd = pass == Pass::Forward;
  const double rate = fwd ? cal_.attn_fwd_flops : cal_.attn_bwd_flops;
  if (cal_.subtile_model) return work_units(work(a, pass), cal_, pass) * subtile_flops(table_, pass) / rate + overhead_s(a);
  const double diagonal = fwd ? cal_.fwd_diagonal_efficiency : cal_.bwd_diagonal_efficiency;
  const double partial = fwd ? cal_.fwd_partial_efficiency : cal_.bwd_partial_efficiency;
  double flops = 0;  // full-tile-rate equivalent
  for (const TileOp& op : a.tiles) {
    const Tile& tile = table_.tiles[static_cast<size_t>(op.tile)];
    const double f = fwd ? table_.tile_flops_fwd(tile) : table_.tile_flops_bwd(tile);
    flops += tile.kind == TileKind::Full ? f : f / (tile.kind == TileKind::CausalDiagonal ? diagonal : partial);
  }
  return flops / rate + overhead_s(a);
}

}  // namespace dcp::sim_detail
