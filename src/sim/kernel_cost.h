// src/sim/kernel_cost.h — compute time of an Attend as the tile-list kernels spend it.
//
// Two models (Calibration::subtile_model):
//   area      mask-area FLOPs at the full-tile rate, divided by a per-kind efficiency for
//             causal-diagonal and partial tiles. Cheap, and right for tiles cut on the mask's
//             own structure (DCP's blocks).
//   subtiles  what the kernels actually do (AttendWork), priced in units of one fully allowed
//             sub-tile at the full-tile rate:
//               * a tile is a grid of sub-tiles (forward: 128 query rows x 128 keys; backward:
//                 64 query rows x 128 keys); one fully allowed costs 1, one mixing allowed and
//                 masked pairs its mask path's masked cost (masking work, and dense work on
//                 masked pairs); the kernels stop at a causal-diagonal tile's diagonal, but walk
//                 the sub-tiles of a Partial tile (their class comes from the host's cells) that
//                 lie between the first and last allowed pair of their q rows (forward) or key
//                 chunk (backward; chunks with none are not launched), so an empty one there
//                 costs the empty cost;
//               * every CTA work item costs the work-item cost on top (its prologue, pipeline
//                 fill and output). Forward, an item is 128 query rows of one output: the tiles
//                 of the Attend that write the same output partial run back to back in one
//                 CTA, so a long row of tiles pays it once. Backward, an item is 128 keys of one
//                 tile that have an allowed pair, or, for the whole key chunks of long Full
//                 tiles, of a run of tiles that share their keys (about 4096 q rows a run).
//             Static layouts that cut windows and blocks into slivers pay for whole sub-tiles of
//             little area and for many short items, which the area model cannot see.
// Sub-tile counts depend only on a tile's geometry (its q and kv blocks), shared by all head
// groups, so they are cached per (q block, kv block), and the cache can outlive one simulation:
// a planner simulates many plans over one block table (SimOptions::table_cache).
#pragma once

#include <cstdint>
#include <optional>
#include <tuple>
#include <unordered_map>
#include <variant>
#include <vector>

#include "dcp/plan.h"
#include "dcp/sim.h"

namespace dcp::sim_detail {

inline constexpr int64_t kFwdSubRows = 128, kBwdSubRows = 64, kSubKeys = 128;
// The backward's wide kernel and its runs (cuda::kWideBackwardMinRows, cuda::kWideBackwardRunRows).
inline constexpr int64_t kWideHeadDim = 128, kWideRunMinRows = 1024, kWideRunRows = 4096;

struct SubtileCount {
  int64_t full = 0;    // every pair allowed
  int64_t masked = 0;  // some allowed, some masked (or keys past a short kv block)
  int64_t empty = 0;   // Partial tiles: visited and classified, then skipped (no allowed pair)
  // Key sub-tiles (columns of the grid) with an allowed pair in some row, and the empty sub-tiles
  // the backward does not visit: every one of the other columns (no item is launched for them)
  // and, in a live column, those before its first or after its last allowed pair (the item walks
  // only that span: cuda::make_backward_work with cells).
  int64_t live_key_subtiles = 0;
  int64_t dead_empty = 0;
  // The empty sub-tiles the forward does not visit: those of a row of sub-tiles before its first
  // or after its last allowed pair (the host's key spans), and every one of a row without any.
  int64_t row_dead_empty = 0;
};

// Sub-tiles of `rows_per` query rows x `keys_per` keys of tile t, by class. The count follows
// t.kind (only a Partial tile counts its empty sub-tiles), so a caller may change a tile's kind to
// ask how the general mask path would treat the same geometry.
SubtileCount count_subtiles(const BlockTable& table, const Tile& t, int64_t rows_per, int64_t keys_per);

// Both passes' counts of tile t from one grid of its allowed pairs (a forward sub-tile row of 128
// query rows is two backward ones of 64): the same as count_subtiles with each pass's shape.
struct TileSubtiles {
  SubtileCount fwd, bwd;
};
// A sequence's mask pieces (Mask::pieces, sorted by first row) and their reach: reach[i] = the
// largest row_end of pieces 0..i, so the first piece that may meet a row is found by bisection.
struct SeqPieces {
  std::vector<MaskPiece> pieces;
  std::vector<int64_t> reach;
  static SeqPieces of(const Mask& mask, int64_t length);
};
// `pieces`: the tile's sequence's, to count by closed forms where few meet the tile; null: by the
// rows' ranges.
TileSubtiles count_tile_subtiles(const BlockTable& table, const Tile& t, const SeqPieces* pieces = nullptr);

// Counts per tile geometry of one block table. The first table bound to it is its table: binding
// one of another shape (block size, token blocks, tiles, sequences) is refused, and one of the
// same shape must be the same table (the caller's promise: a plan's table is a copy of the one
// its candidates were built from). Not thread-safe.
class SubtileCache {
 public:
  void bind(const BlockTable& table);
  // Pre: bind(table).
  const TileSubtiles& get(const BlockTable& table, const Tile& t);

 private:
  std::unordered_map<uint64_t, TileSubtiles> counts_;
  std::vector<std::optional<SeqPieces>> pieces_;  // per sequence, made on first use
  bool bound_ = false;
  std::tuple<int64_t, int64_t, int64_t, int64_t> shape_{};
};

// What one Attend asks of the kernels in one pass, summed over its head groups: sub-tiles (of the
// pass's shape) by class and CTA work items. The subtiles model's time is linear in it.
struct AttendWork {
  double full = 0;             // fully allowed sub-tiles
  double diagonal_masked = 0;  // mixed sub-tiles of the dense mask path: causal-diagonal tiles,
                               // and the short last key sub-tile of a Full tile
  double partial_masked = 0;   // mixed sub-tiles of Partial tiles
  double empty = 0;            // skipped sub-tiles of Partial tiles
  double items = 0;            // CTA work items
  AttendWork& operator+=(const AttendWork& o);
};

// Full sub-tiles' worth of `w` under `cal`'s costs for `pass`.
double work_units(const AttendWork& w, const Calibration& cal, Pass pass);

// Dense FLOPs of one sub-tile of `pass` for one head group of `table` (mask-area convention:
// 4 x rows x keys x head_dim x query heads forward, 2.5x backward).
double subtile_flops(const BlockTable& table, Pass pass);

// Whether instruction pc of `program` is a Merge that the executor runs in one launch with the
// Merge before it (it batches consecutive merges), so that it pays no launch overhead of its own.
inline bool joins_merge_batch(const Program& program, size_t pc) {
  return pc > 0 && std::holds_alternative<Merge>(program.code[pc]) && std::holds_alternative<Merge>(program.code[pc - 1]);
}

class AttendCost {
 public:
  // `cache`: counts kept beyond this object (they must be of `table`); null: its own.
  AttendCost(const BlockTable& table, const Calibration& cal, SubtileCache* cache = nullptr)
      : table_(table), cal_(cal), cache_(cache != nullptr ? cache : &own_) {
    cache_->bind(table);
  }
  AttendCost(const AttendCost&) = delete;
  AttendCost& operator=(const AttendCost&) = delete;
  // Compute-stream seconds of one Attend: its tiles plus the calibration's per-tile and launch
  // overheads.
  double seconds(const Attend& a, Pass pass);
  // What the kernels do for `a` (the subtiles model's input).
  AttendWork work(const Attend& a, Pass pass);

 private:
  const SubtileCount& counts(const Tile& t, Pass pass);
  double overhead_s(const Attend& a) const;
  const BlockTable& table_;
  const Calibration& cal_;
  SubtileCache own_;
  SubtileCache* cache_;
};

}  // namespace dcp::sim_detail
