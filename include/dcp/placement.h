// dcp/placement.h — where every token block lives (its home, all heads) and where every tile
// is computed. Produced by the static baselines and by the DCP partitioner alike.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dcp/blocks.h"

namespace dcp {

struct Placement {
  std::string method;                // "dcp", "ring", "zigzag", ...
  int num_devices = 0;
  std::vector<int32_t> block_home;   // per token block: home device
  std::vector<int32_t> tile_device;  // per tile: device that computes it
  std::string note;                  // how the method handled this batch (remainders, fallbacks)

  // Sizes match the table and every id is in [0, num_devices); throws InvalidPlan.
  void validate(const BlockTable& table) const;
};

// A placement together with the block table it refers to (baselines cut sequences their own
// way, so the table belongs to the placement).
struct PlacedBatch {
  BlockTable table;
  Placement placement;
};

}  // namespace dcp
