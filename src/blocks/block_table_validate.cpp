// BlockTable::validate: structural checks of a block table, whoever built or loaded it.
//
// Checks what can be checked without re-deriving areas from the mask: block coverage of every
// sequence, head groups consistent with the shape, tile order and bounds, and kinds consistent
// with areas. O(blocks + tiles).
#include <string>
#include <tuple>

#include "dcp/blocks.h"
#include "dcp/error.h"
#include "dcp/limits.h"

namespace dcp {
namespace {

[[noreturn]] void invalid(const std::string& what) { raise(ErrorKind::InvalidPlan, "block table: " + what); }

std::string tile_name(size_t i, const Tile& t) {
  return "tiles[" + std::to_string(i) + "] (seq " + std::to_string(t.seq) + ", group " + std::to_string(t.head_group) +
         ", q " + std::to_string(t.q_block) + ", kv " + std::to_string(t.kv_block) + ")";
}

void check_groups(const BlockTable& bt) {
  const HeadGroups& g = bt.groups;
  const AttentionShape& sh = bt.shape;
  if (sh.q_heads < 1 || sh.kv_heads < 1 || sh.q_heads % sh.kv_heads != 0 || sh.q_heads > kMaxHeads ||
      sh.head_dim < 1 || sh.head_dim > kMaxHeadDim) {
    invalid("shape " + std::to_string(sh.q_heads) + " q heads, " + std::to_string(sh.kv_heads) + " KV heads, head dim " +
            std::to_string(sh.head_dim) + " (expected 1 <= KV heads dividing q heads <= " + std::to_string(kMaxHeads) +
            ", 1 <= head dim <= " + std::to_string(kMaxHeadDim) + ")");
  }
  if (g.num_groups < 1 || g.q_heads_per_group < 1 || g.kv_heads_per_group < 1 || g.groups_per_kv_set < 1) {
    invalid("head groups must have positive counts");
  }
  if (static_cast<int64_t>(g.num_groups) * g.q_heads_per_group != bt.shape.q_heads) {
    invalid("num_groups * q_heads_per_group (" + std::to_string(g.num_groups) + " * " +
            std::to_string(g.q_heads_per_group) + ") must equal q_heads " + std::to_string(bt.shape.q_heads));
  }
  if (g.num_groups % g.groups_per_kv_set != 0 ||
      static_cast<int64_t>(g.num_kv_sets()) * g.kv_heads_per_group != bt.shape.kv_heads) {
    invalid("KV sets times kv_heads_per_group must equal kv_heads " + std::to_string(bt.shape.kv_heads));
  }
  // A group is either a part of the query heads of one KV head (several groups per KV set) or
  // whole GQA sets (several KV heads per group), never both.
  const int ratio = sh.q_heads / sh.kv_heads;
  const bool finer = g.q_heads_per_group <= ratio && ratio % g.q_heads_per_group == 0 && g.kv_heads_per_group == 1 &&
                     g.groups_per_kv_set == ratio / g.q_heads_per_group;
  const bool coarser = g.q_heads_per_group > ratio && g.q_heads_per_group % ratio == 0 &&
                       g.kv_heads_per_group == g.q_heads_per_group / ratio && g.groups_per_kv_set == 1;
  if (!finer && !coarser) invalid("head groups do not follow the query heads' sharing of KV heads");
}

void check_blocks(const BlockTable& bt) {
  const size_t num_seqs = bt.seq_length.size();
  if (bt.seq_mask.size() != num_seqs) invalid("seq_mask must have one mask per sequence");
  if (bt.seq_first_block.size() != num_seqs + 1) invalid("seq_first_block must have num_sequences + 1 entries");
  if (num_seqs < 1) invalid("no sequences");
  if (bt.seq_first_block.front() != 0 ||
      bt.seq_first_block.back() != static_cast<int32_t>(bt.token_blocks.size())) {
    invalid("seq_first_block must start at 0 and end at the number of token blocks");
  }
  int64_t global = 0;
  for (size_t s = 0; s < num_seqs; ++s) {
    const int32_t first = bt.seq_first_block[s];
    const int32_t last = bt.seq_first_block[s + 1];
    if (last <= first) invalid("sequence " + std::to_string(s) + " has no token block");
    if (last > static_cast<int32_t>(bt.token_blocks.size()))
      invalid("seq_first_block[" + std::to_string(s + 1) + "] = " + std::to_string(last) + " is past the last token block");
    if (bt.seq_length[s] < 1 || bt.seq_length[s] > kMaxBatchTokens)
      invalid("sequence " + std::to_string(s) + " has length " + std::to_string(bt.seq_length[s]) + " (expected 1.." +
              std::to_string(kMaxBatchTokens) + ")");
    int64_t pos = 0;
    for (int32_t b = first; b < last; ++b) {
      const TokenBlock& tb = bt.token_blocks[static_cast<size_t>(b)];
      const std::string name = "token_blocks[" + std::to_string(b) + "]";
      if (tb.seq != static_cast<int32_t>(s) || tb.index != b - first) invalid(name + " has the wrong seq or index");
      if (tb.begin != pos || tb.global_begin != global + pos) {
        invalid(name + " must begin where the previous block ends (expected " + std::to_string(pos) + ", got " +
                std::to_string(tb.begin) + ")");
      }
      if (tb.length < 1 || tb.length > bt.seq_length[s] - pos) invalid(name + " is empty or runs past its sequence");
      if (bt.block_size > 0 && (tb.length > bt.block_size || (b + 1 < last && tb.length != bt.block_size))) {
        invalid(name + " has length " + std::to_string(tb.length) + " for block size " + std::to_string(bt.block_size));
      }
      pos += tb.length;
    }
    if (pos != bt.seq_length[s]) {
      invalid("blocks of sequence " + std::to_string(s) + " cover " + std::to_string(pos) + " tokens, expected " +
              std::to_string(bt.seq_length[s]));
    }
    global += pos;
    if (global > kMaxBatchTokens) invalid("sequences hold more than " + std::to_string(kMaxBatchTokens) + " tokens");
  }
  if (bt.token_blocks.size() != static_cast<size_t>(bt.seq_first_block.back()))
    invalid("token blocks past the last sequence");
}

void check_tiles(const BlockTable& bt) {
  const int num_seqs = bt.num_sequences();
  for (size_t i = 0; i < bt.tiles.size(); ++i) {
    const Tile& t = bt.tiles[i];
    if (t.seq < 0 || t.seq >= num_seqs) invalid(tile_name(i, t) + ": sequence out of range");
    if (t.head_group < 0 || t.head_group >= bt.groups.num_groups) invalid(tile_name(i, t) + ": head group out of range");
    const int32_t first = bt.seq_first_block[static_cast<size_t>(t.seq)];
    const int32_t last = bt.seq_first_block[static_cast<size_t>(t.seq) + 1];
    if (t.q_block < first || t.q_block >= last || t.kv_block < first || t.kv_block >= last) {
      invalid(tile_name(i, t) + ": blocks outside its sequence");
    }
    const int64_t rows = bt.token_blocks[static_cast<size_t>(t.q_block)].length;
    const int64_t cols = bt.token_blocks[static_cast<size_t>(t.kv_block)].length;
    if (t.area < 1 || t.area > rows * cols) {
      invalid(tile_name(i, t) + ": area " + std::to_string(t.area) + " outside [1, " + std::to_string(rows * cols) + "]");
    }
    if (t.kind == TileKind::Full && t.area != rows * cols) invalid(tile_name(i, t) + ": full tile with a partial area");
    if (t.kind == TileKind::CausalDiagonal && (t.q_block != t.kv_block || t.area != rows * (rows + 1) / 2)) {
      invalid(tile_name(i, t) + ": causal-diagonal tile off the diagonal or with a non-triangular area");
    }
    if (i > 0) {
      const Tile& p = bt.tiles[i - 1];
      if (std::tie(p.seq, p.head_group, p.q_block, p.kv_block) >= std::tie(t.seq, t.head_group, t.q_block, t.kv_block)) {
        invalid(tile_name(i, t) + ": tiles must be strictly ordered by (seq, head_group, q_block, kv_block)");
      }
    }
  }
}

}  // namespace

void BlockTable::validate() const {
  check_groups(*this);
  check_blocks(*this);
  check_tiles(*this);
}

}  // namespace dcp
