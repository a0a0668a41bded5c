// Token dispatch: local rows of each rank, gather/scatter round trips, position ids.
#include <gtest/gtest.h>

#include <vector>

#include "dcp/batch.h"
#include "dcp/blocks.h"
#include "dcp/dispatch.h"
#include "dcp/error.h"
#include "exec/reference_attention.h"

namespace dcp::test {
namespace {

BlockTable small_table() {
  Batch batch;
  batch.shape = AttentionShape{4, 2, 16, DType::FP32};
  for (int64_t len : {100, 37, 250}) {
    Sequence s;
    s.length = len;
    s.mask = Mask::causal();
    batch.sequences.push_back(s);
  }
  BlockOptions opts;
  opts.block_size = 32;
  return build_block_table(batch, opts);
}

TEST(Dispatch, RanksPartitionTheBatchAndRoundTrip) {
  const BlockTable table = small_table();
  const int world = 3;
  SplitMix64 rng(31);
  std::vector<int32_t> home(static_cast<size_t>(table.num_token_blocks()));
  for (int32_t& h : home) h = static_cast<int32_t>(rng.below(world));
  const int64_t total = table.total_tokens();
  const int64_t width = 5;  // elements per row
  std::vector<float> global(static_cast<size_t>(total * width));
  for (size_t i = 0; i < global.size(); ++i) global[i] = static_cast<float>(i);
  std::vector<float> rebuilt(global.size(), -1.0f);
  std::vector<int> covered(static_cast<size_t>(total), 0);
  for (int r = 0; r < world; ++r) {
    const std::vector<int32_t> owned = owned_blocks_of(home, r);
    const LocalTokens tok = local_tokens(table, owned);
    ASSERT_EQ(tok.block_offset.size(), owned.size() + 1);
    std::vector<float> local(static_cast<size_t>(tok.num_rows() * width));
    gather_rows<float>(global, local, width, tok);
    for (int64_t row = 0; row < tok.num_rows(); ++row) {
      const int64_t g = tok.global_row[static_cast<size_t>(row)];
      ++covered[static_cast<size_t>(g)];
      EXPECT_EQ(local[static_cast<size_t>(row * width)], static_cast<float>(g * width));
      // Position id: the row's offset inside its sequence.
      int64_t seq_start = 0;
      for (int s = 0; s < tok.seq[static_cast<size_t>(row)]; ++s) seq_start += table.seq_length[static_cast<size_t>(s)];
      EXPECT_EQ(tok.position[static_cast<size_t>(row)], g - seq_start);
    }
    // Blocks keep their order and their tokens are consecutive.
    for (size_t i = 0; i < owned.size(); ++i) {
      const TokenBlock& tb = table.token_blocks[static_cast<size_t>(owned[i])];
      EXPECT_EQ(tok.block_offset[i + 1] - tok.block_offset[i], tb.length);
      EXPECT_EQ(tok.global_row[static_cast<size_t>(tok.block_offset[i])], tb.global_begin);
    }
    scatter_rows<float>(local, rebuilt, width, tok);
  }
  for (int c : covered) EXPECT_EQ(c, 1);
  EXPECT_EQ(rebuilt, global);
}

TEST(Dispatch, BadInputIsRejected) {
  const BlockTable table = small_table();
  const std::vector<int32_t> twice{0, 0};
  EXPECT_THROW(local_tokens(table, twice), Error);
  const std::vector<int32_t> outside{table.num_token_blocks()};
  EXPECT_THROW(local_tokens(table, outside), Error);
  const std::vector<int32_t> one{1};
  const LocalTokens tok = local_tokens(table, one);
  std::vector<float> global(10), local(10);
  EXPECT_THROW(gather_rows<float>(global, local, 4, tok), Error);  // global too small for block 1
}

}  // namespace
}  // namespace dcp::test
