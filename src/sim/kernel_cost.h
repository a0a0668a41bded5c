// src/sim/kernel_cost.h — compute time of an Attend as the tile-list kernels spend it.
//
// Two models (Calibration::subtile_model):
//   area      mask-area FLOPs at the full-tile rate, divided by a per-kind efficiency for
//             causal-diagonal and partial tiles. Cheap, and right for tiles cut on the mask's
//             own structure (DCP's blocks).
//   subtiles  what the kernels actually iterate: a tile is a grid of sub-tiles (forward:
//             128 query rows x 128 keys; backward: 64 query rows x 128 keys); a sub-tile with
//             no allowed pair is skipped, one fully allowed costs its dense FLOPs at the full
//             rate, one that mixes allowed and masked pairs costs that times the kind's
//             masked cost (masking work, and dense work on masked pairs); in a Partial tile
//             the kernels also classify every sub-tile they skip (empty_cost each). Static layouts that
//             cut windows and blocks into slivers pay for whole sub-tiles of little area, which
//             the area model cannot see.
// Counts depend only on a tile's geometry (its q and kv blocks), shared by all head groups, so
// they are cached per (q block, kv block).
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "dcp/plan.h"
#include "dcp/sim.h"

namespace dcp::sim_detail {

inline constexpr int64_t kFwdSubRows = 128, kBwdSubRows = 64, kSubKeys = 128;

struct SubtileCount {
  int64_t full = 0;    // every pair allowed
  int64_t masked = 0;  // some allowed, some masked
  int64_t empty = 0;   // Partial tiles: visited and classified, then skipped (no allowed pair)
};

// Sub-tiles of `rows_per` query rows x `keys_per` keys of tile t that hold an allowed pair.
SubtileCount count_subtiles(const BlockTable& table, const Tile& t, int64_t rows_per, int64_t keys_per);

class AttendCost {
 public:
  AttendCost(const BlockTable& table, const Calibration& cal) : table_(table), cal_(cal) {}
  // Compute-stream seconds of one Attend: its tiles plus the calibration's per-tile and launch
  // overheads.
  double seconds(const Attend& a, Pass pass);

 private:
  const SubtileCount& counts(const Tile& t, bool fwd);
  double overhead_s(const Attend& a) const;
  const BlockTable& table_;
  const Calibration& cal_;
  std::unordered_map<uint64_t, SubtileCount> fwd_, bwd_;
};

}  // namespace dcp::sim_detail
