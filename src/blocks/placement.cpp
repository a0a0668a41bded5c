// Placement::validate — the structural contract every placement producer must meet.
#include "dcp/placement.h"

#include <string>

#include "dcp/error.h"

namespace dcp {

namespace {

void check_ids(const std::vector<int32_t>& ids, int num_devices, const std::string& method,
               const char* what) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= num_devices) {
      raise(ErrorKind::InvalidPlan, "placement '" + method + "': " + what + "[" +
                                        std::to_string(i) + "] = " + std::to_string(ids[i]) +
                                        " is not a device (expected 0.." +
                                        std::to_string(num_devices - 1) + ")");
    }
  }
}

}  // namespace

void Placement::validate(const BlockTable& table) const {
  if (num_devices <= 0) {
    raise(ErrorKind::InvalidPlan, "placement '" + method + "': num_devices = " +
                                      std::to_string(num_devices) + " (expected >= 1)");
  }
  if (block_home.size() != table.token_blocks.size()) {
    raise(ErrorKind::InvalidPlan, "placement '" + method + "': block_home has " +
                                      std::to_string(block_home.size()) +
                                      " entries but the block table has " +
                                      std::to_string(table.token_blocks.size()) +
                                      " token blocks");
  }
  if (tile_device.size() != table.tiles.size()) {
    raise(ErrorKind::InvalidPlan, "placement '" + method + "': tile_device has " +
                                      std::to_string(tile_device.size()) +
                                      " entries but the block table has " +
                                      std::to_string(table.tiles.size()) + " tiles");
  }
  check_ids(block_home, num_devices, method, "block_home");
  check_ids(tile_device, num_devices, method, "tile_device");
}

}  // namespace dcp
