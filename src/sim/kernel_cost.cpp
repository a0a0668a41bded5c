// Attend cost models of the simulator (see kernel_cost.h).
#include "kernel_cost.h"

#include <algorithm>
#include <compare>
#include <tuple>

#include "dcp/detail/area.h"
#include "dcp/error.h"

namespace dcp::sim_detail {

namespace {

// A Partial tile's allowed pairs per sub-tile of rows_per query rows x keys_per keys, row-major
// (nq x nk). From the mask's pieces (`pieces`: its sequence's) where few meet the tile's rows:
// each piece's exact area in each sub-tile it reaches (area.h), a few closed forms per sub-tile
// instead of one range query per row. Otherwise (a mask of explicit ranges, whose pieces may be
// one per row, or no pieces given) from every row's ranges.
std::vector<int64_t> allowed_grid(const BlockTable& table, const Tile& t, int64_t rows_per, int64_t keys_per, int64_t nq,
                                  int64_t nk, const SeqPieces* pieces = nullptr) {
  const TokenBlock& qb = table.token_blocks[static_cast<size_t>(t.q_block)];
  const TokenBlock& kb = table.token_blocks[static_cast<size_t>(t.kv_block)];
  std::vector<int64_t> grid(static_cast<size_t>(nq * nk), 0);
  const int64_t q_end = qb.begin + qb.length, k_end = kb.begin + kb.length;
  if (pieces != nullptr) {
    // The pieces that may meet rows [qb.begin, q_end): from the first whose reach passes
    // qb.begin to the last that starts before q_end. At most one per 64 rows, or the rows are
    // cheaper.
    const std::vector<MaskPiece>& all = pieces->pieces;
    const auto from = static_cast<size_t>(
        std::partition_point(pieces->reach.begin(), pieces->reach.end(), [&](int64_t r) { return r <= qb.begin; }) -
        pieces->reach.begin());
    std::vector<const MaskPiece*> meeting;
    for (size_t i = from; i < all.size() && all[i].row_begin < q_end && std::ssize(meeting) * 64 <= qb.length; ++i)
      if (all[i].row_end > qb.begin) meeting.push_back(&all[i]);
    if (std::ssize(meeting) * 64 <= qb.length) {
      for (const MaskPiece* p : meeting) {
        const int64_t ra = std::max(qb.begin, p->row_begin), rb = std::min(q_end, p->row_end);
        for (int64_t qi = (ra - qb.begin) / rows_per; qi * rows_per + qb.begin < rb; ++qi) {
          const int64_t r0 = std::max(ra, qb.begin + qi * rows_per), r1 = std::min(rb, qb.begin + (qi + 1) * rows_per);
          // Slopes are 0 or 1, so the piece's keys over rows [r0, r1) lie in [lo(r0), hi(r1 - 1)).
          const int64_t klo = std::max(kb.begin, p->lo.at(r0)), khi = std::min(k_end, p->hi.at(r1 - 1));
          for (int64_t kj = (klo - kb.begin) / keys_per; klo < khi && kb.begin + kj * keys_per < khi; ++kj)
            grid[static_cast<size_t>(qi * nk + kj)] +=
                piece_area(*p, r0, r1, kb.begin + kj * keys_per, std::min(k_end, kb.begin + (kj + 1) * keys_per));
        }
      }
      return grid;
    }
  }
  std::vector<Range> ranges;
  for (int64_t r = 0; r < qb.length; ++r) {
    int64_t* allowed = grid.data() + (r / rows_per) * nk;
    table.tile_row_ranges(t, qb.begin + r, ranges);
    for (const Range& g : ranges) {
      const int64_t b = g.begin - kb.begin, e = g.end - kb.begin;  // kv-block-local
      for (int64_t kj = b / keys_per; kj * keys_per < e; ++kj)
        allowed[kj] += std::min(e, (kj + 1) * keys_per) - std::max(b, kj * keys_per);
    }
  }
  return grid;
}

// A Partial tile's counts from its grid of allowed pairs (sub-tile rows of rows_per query rows).
SubtileCount classify_partial(const std::vector<int64_t>& grid, int64_t nq, int64_t nk, int64_t q_len, int64_t kv_len,
                              int64_t rows_per, int64_t keys_per) {
  SubtileCount c;
  // Per key sub-tile (column): the first and last q sub-tile with an allowed pair, and how many.
  std::vector<int64_t> first(static_cast<size_t>(nk), -1), last(static_cast<size_t>(nk), -1), nonempty(static_cast<size_t>(nk), 0);
  for (int64_t qi = 0; qi < nq; ++qi) {
    const int64_t rows = std::min(q_len, (qi + 1) * rows_per) - qi * rows_per;
    int64_t row_first = -1, row_last = -1, row_nonempty = 0;  // this row of sub-tiles' key span
    for (int64_t kj = 0; kj < nk; ++kj) {
      const int64_t a = grid[static_cast<size_t>(qi * nk + kj)];
      // The kernels load the keys past a short kv block as zeros and must mask them, so a
      // sub-tile with fewer than keys_per keys is masked whatever the mask allows.
      const bool whole = (kj + 1) * keys_per <= kv_len;
      if (a == 0) ++c.empty;
      else (a == rows * keys_per && whole ? c.full : c.masked) += 1;
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
  for (size_t k = 0; k < static_cast<size_t>(nk); ++k) {
    if (first[k] < 0) continue;
    ++c.live_key_subtiles;
    walked_empty += last[k] - first[k] + 1 - nonempty[k];
  }
  c.dead_empty = c.empty - walked_empty;
  return c;
}

}  // namespace

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
  return classify_partial(allowed_grid(table, t, rows_per, keys_per, nq, nk), nq, nk, qb.length, kb.length, rows_per,
                          keys_per);
}

TileSubtiles count_tile_subtiles(const BlockTable& table, const Tile& t, const SeqPieces* pieces) {
  static_assert(kFwdSubRows == 2 * kBwdSubRows, "a forward sub-tile row is two backward ones");
  if (t.kind != TileKind::Partial)
    return {count_subtiles(table, t, kFwdSubRows, kSubKeys), count_subtiles(table, t, kBwdSubRows, kSubKeys)};
  const TokenBlock& qb = table.token_blocks[static_cast<size_t>(t.q_block)];
  const TokenBlock& kb = table.token_blocks[static_cast<size_t>(t.kv_block)];
  const int64_t nk = (kb.length + kSubKeys - 1) / kSubKeys;
  const int64_t nq_bwd = (qb.length + kBwdSubRows - 1) / kBwdSubRows;
  const int64_t nq_fwd = (qb.length + kFwdSubRows - 1) / kFwdSubRows;
  const std::vector<int64_t> bwd = allowed_grid(table, t, kBwdSubRows, kSubKeys, nq_bwd, nk, pieces);
  // A forward sub-tile's allowed pairs are those of the two backward sub-tiles it spans.
  std::vector<int64_t> fwd(static_cast<size_t>(nq_fwd * nk), 0);
  for (int64_t qi = 0; qi < nq_bwd; ++qi)
    for (int64_t kj = 0; kj < nk; ++kj) fwd[static_cast<size_t>((qi / 2) * nk + kj)] += bwd[static_cast<size_t>(qi * nk + kj)];
  return {classify_partial(fwd, nq_fwd, nk, qb.length, kb.length, kFwdSubRows, kSubKeys),
          classify_partial(bwd, nq_bwd, nk, qb.length, kb.length, kBwdSubRows, kSubKeys)};
}

SeqPieces SeqPieces::of(const Mask& mask, int64_t length) {
  SeqPieces out{mask.pieces(length), {}};
  out.reach.reserve(out.pieces.size());
  int64_t reach = 0;
  for (const MaskPiece& p : out.pieces) out.reach.push_back(reach = std::max(reach, p.row_end));
  return out;
}

void SubtileCache::bind(const BlockTable& table) {
  const auto shape = std::make_tuple(table.block_size, std::ssize(table.token_blocks), std::ssize(table.tiles),
                                     std::ssize(table.seq_length));
  if (!bound_) {
    shape_ = shape;
    bound_ = true;
    pieces_.resize(table.seq_length.size());
  } else if (shape != shape_) {
    raise(ErrorKind::InvalidInput,
          "simulate: SimOptions::table_cache holds the sub-tile counts of another block table (one cache per table)");
  }
}

const TileSubtiles& SubtileCache::get(const BlockTable& table, const Tile& t) {
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(t.q_block)) << 32) | static_cast<uint32_t>(t.kv_block);
  auto it = counts_.find(key);
  if (it == counts_.end()) {
    // The sequence's mask pieces, made once per sequence (Partial tiles only need them).
    const SeqPieces* pieces = nullptr;
    if (t.kind == TileKind::Partial) {
      auto& seq_pieces = pieces_[static_cast<size_t>(t.seq)];
      if (!seq_pieces) seq_pieces = SeqPieces::of(table.seq_mask[static_cast<size_t>(t.seq)], table.seq_length[static_cast<size_t>(t.seq)]);
      pieces = &*seq_pieces;
    }
    it = counts_.emplace(key, count_tile_subtiles(table, t, pieces)).first;
  }
  return it->second;
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
  const TileSubtiles& c = cache_->get(table_, t);
  return pass == Pass::Forward ? c.fwd : c.bwd;
}

AttendWork AttendCost::work(const Attend& a, Pass pass) {
  const bool fwd = pass == Pass::Forward;
  AttendWork w;
  // Forward items: the tiles writing one output partial form one run, cut into 128-row items
  // (kFwdSubRows: one row of sub-tiles). Backward items: 128 keys (kSubKeys) of one tile, but the
  // whole key chunks of Full tiles of at least kWideRunMinRows rows (head dim 128: the wide kernel)
  // are walked in runs of the tiles that share a key block, head group and length, about
  // kWideRunRows q rows a run (cuda::make_backward_runs, which cuts at multiples of it).
  struct Run {
    Space space;
    int32_t index, group, q_block;
    auto operator<=>(const Run&) const = default;
  };
  std::vector<Run> runs;
  if (fwd) runs.reserve(a.tiles.size());
  struct KeyBlock {
    int32_t kv_block, group;
    int64_t q_rows;
    auto operator<=>(const KeyBlock&) const = default;
  };
  std::vector<std::pair<KeyBlock, int64_t>> wide;  // (key block, its whole key chunks) per tile
  const bool wide_kernel = table_.shape.head_dim == kWideHeadDim;
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
      const int64_t q_rows = table_.token_blocks[static_cast<size_t>(tile.q_block)].length;
      const int64_t chunks = table_.token_blocks[static_cast<size_t>(tile.kv_block)].length / kSubKeys;
      if (wide_kernel && tile.kind == TileKind::Full && q_rows >= kWideRunMinRows && chunks > 0) {
        wide.push_back({{tile.kv_block, tile.head_group, q_rows}, chunks});
        w.items += static_cast<double>(c.live_key_subtiles - chunks);
      } else {
        w.items += static_cast<double>(c.live_key_subtiles);
      }
    }
  }
  if (!wide.empty()) {
    std::sort(wide.begin(), wide.end());
    for (size_t i = 0; i < wide.size();) {
      size_t j = i;
      while (j < wide.size() && wide[j].first == wide[i].first) ++j;
      const int64_t rows = static_cast<int64_t>(j - i) * wide[i].first.q_rows;
      w.items += static_cast<double>(wide[i].second * ((rows + kWideRunRows - 1) / kWideRunRows));
      i = j;
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
