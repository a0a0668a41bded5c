// dcp/blocks.h — the block model of a batch: token blocks, head groups, data blocks and tiles.
//
// A token block is a run of consecutive tokens of one sequence (uniform size B except the last
// block of a sequence; no padding). A head group is the unit of head splitting. A data block is
// one tensor (Q, KV, O, ...) of one (token block, head group). A tile is the attention work of
// (sequence, head group, q block, kv block) and exists only where the mask allows a pair.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dcp/batch.h"

namespace dcp {

struct BlockOptions {
  int64_t block_size = 1024;  // B, tokens; a multiple of 16
  // Query heads per head group. 0 = default: one KV head with the query heads that share it
  // (q_heads / kv_heads). Smaller values split a KV head's query heads over several groups
  // (finer); larger multiples of the GQA ratio put several KV heads in one group (coarser).
  int q_heads_per_group = 0;
  // Give the sink of a sequence (the keys [0, s) that rows read at any distance: lambda's sink,
  // causal-blockwise's sink blocks) a token block of its own when s < B; the next block ends at
  // B, as in the uniform cut. The far rows' tiles then read those s keys, not a whole block of
  // B: every device that computes such a tile receives s keys' KV (and in backward returns a
  // dKV partial of s rows) instead of B. The table then counts as custom cuts (block_size 0).
  bool split_sink = false;
  void validate(const AttentionShape& shape) const;  // throws InvalidInput naming the option
};

struct TokenBlock {
  int32_t seq = 0;          // sequence index in the batch
  int32_t index = 0;        // block index inside its sequence
  int64_t begin = 0;        // first token, relative to the sequence
  int64_t length = 0;       // tokens (<= B)
  int64_t global_begin = 0; // first token in the packed batch (sum of earlier lengths + begin)
};

enum class TileKind : uint8_t {
  Full,            // every (q, k) pair allowed
  CausalDiagonal,  // square block on the diagonal, exactly keys <= row
  Partial,         // anything else: per-row ranges
};
const char* to_string(TileKind kind);

struct Tile {
  int32_t seq = 0;
  int32_t head_group = 0;
  int32_t q_block = 0;   // global token block id of the queries
  int32_t kv_block = 0;  // global token block id of the keys/values
  TileKind kind = TileKind::Full;
  int64_t area = 0;      // allowed (query, key) pairs, one head
};

// The tensors of the pipeline, per (token block, head group). Q-side tensors belong to the
// query block of a tile, KV-side ones to the key block.
enum class DataKind : uint8_t { Q, KV, O, LSE, dO, dQ, dKV, Delta };
const char* to_string(DataKind kind);

struct HeadGroups {
  int num_groups = 0;          // number of head groups
  int q_heads_per_group = 0;
  int kv_heads_per_group = 0;  // KV heads read by one group (>= 1)
  int groups_per_kv_set = 1;   // > 1 when several groups share one KV head (finer groups)
  // KV-side data of head group g lives in KV set g / groups_per_kv_set.
  int kv_set(int group) const { return group / groups_per_kv_set; }
  int num_kv_sets() const { return num_groups / groups_per_kv_set; }
};

struct BlockTable {
  AttentionShape shape;
  int64_t block_size = 0;           // B (0 for custom cuts)
  HeadGroups groups;
  std::vector<int32_t> seq_first_block;  // per sequence: first global token block; size S+1
  std::vector<int64_t> seq_length;
  std::vector<Mask> seq_mask;
  std::vector<TokenBlock> token_blocks;
  // Tiles ordered by (seq, head_group, q_block, kv_block). All head groups of a sequence
  // have the same geometry.
  std::vector<Tile> tiles;

  int num_sequences() const { return static_cast<int>(seq_length.size()); }
  int num_token_blocks() const { return static_cast<int>(token_blocks.size()); }
  int64_t total_tokens() const;
  int64_t total_area() const;  // sum of tile areas, all head groups

  // FLOPs of one tile: 4 * area * head_dim * q_heads_per_group (forward); backward 2.5x.
  double tile_flops_fwd(const Tile& t) const;
  double tile_flops_bwd(const Tile& t) const { return 2.5 * tile_flops_fwd(t); }
  // Bytes of one data block of `kind` for a token block of `tokens` tokens, one head group
  // (KV-side kinds: one KV set), as it lives at its home in the element type:
  //   Q, O, dO, dQ: tokens * q_heads_per_group * head_dim * element_bytes
  //   KV, dKV:      2 * tokens * kv_heads_per_group * head_dim * element_bytes (K and V)
  //   LSE, Delta:   tokens * q_heads_per_group * 4 (fp32 per row and query head)
  int64_t data_bytes(DataKind kind, int64_t tokens) const;
  // Bytes of a partial result on its way to its home: partials (O, dQ, dKV) move and are
  // merged in fp32, so these are data_bytes with 4-byte elements; other kinds as data_bytes.
  int64_t partial_bytes(DataKind kind, int64_t tokens) const;

  // Allowed ranges of query row `row` of tile `t` clipped to the kv block, in sequence
  // coordinates. For kernels and validators; O(ranges of the row).
  void tile_row_ranges(const Tile& t, int64_t row, std::vector<Range>& out) const;

  // Structural checks (block coverage, tile order, areas > 0); throws InvalidPlan.
  void validate() const;
};

// Checks that the tiles are exactly those the masks make for the token blocks (same blocks,
// kinds and areas, repeated for every head group) and that every mask fits its sequence; throws
// InvalidPlan naming the first difference. Pre: table.validate() passed. Costs what building
// the tiles costs, never more than the table's own tile count allows.
void check_tiles_against_masks(const BlockTable& table);

// Uniform token blocks of opts.block_size (but for a split sink); tiles and areas by interval
// arithmetic.
BlockTable build_block_table(const Batch& batch, const BlockOptions& opts);

// Custom cuts: cuts[s] are the block boundaries of sequence s, strictly increasing, starting at
// 0 and ending at its length. Static baselines use this (ring chunks, zigzag halves).
BlockTable build_block_table_with_cuts(const Batch& batch, const BlockOptions& opts,
                                       const std::vector<std::vector<int64_t>>& cuts);

}  // namespace dcp
