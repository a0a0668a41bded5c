// Fuzz target: the batch JSON reader (docs/formats.md), then what reads a batch next.
// Accepted batches must survive a write/read round trip unchanged, and small ones must cut into
// a block table whose tiles are exactly those their masks make.
#include <string>

#include "dcp/blocks.h"
#include "dcp/io.h"
#include "fuzz/fuzz_common.h"

using namespace dcp;

namespace {

bool same(const Batch& a, const Batch& b) {
  if (a.shape.q_heads != b.shape.q_heads || a.shape.kv_heads != b.shape.kv_heads ||
      a.shape.head_dim != b.shape.head_dim || a.shape.dtype != b.shape.dtype || a.sequences.size() != b.sequences.size())
    return false;
  for (size_t i = 0; i < a.sequences.size(); ++i) {
    const Sequence& x = a.sequences[i];
    const Sequence& y = b.sequences[i];
    if (x.length != y.length || x.id != y.id || x.mask.kind != y.mask.kind || x.mask.area(x.length) != y.mask.area(y.length))
      return false;
  }
  return true;
}

}  // namespace

fuzz::Outcome dcp_fuzz_one(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  return fuzz::guarded([&] {
    const Batch batch = parse_batch(text, "fuzz.json");
    fuzz::require(same(batch, parse_batch(batch_to_json(batch, true), "round trip")), "batch changed by a round trip");
    fuzz::require(same(batch, parse_batch(batch_to_json(batch, false), "round trip")), "batch changed by a round trip");
    // Cut small batches into blocks (large ones are the planner's business, not the reader's).
    if (batch.total_tokens() <= (1 << 14) && batch.sequences.size() <= 64) {
      const BlockTable table = build_block_table(batch, BlockOptions{.block_size = 64, .q_heads_per_group = 0});
      table.validate();
      check_tiles_against_masks(table);
      fuzz::require(table.total_area() == batch.mask_area() * table.groups.num_groups, "tile areas differ from the masks");
    }
  });
}
