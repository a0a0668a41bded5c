// dcp/dispatch.h — token dispatch: which rows of the global batch a rank holds, and moving
// tensors between the global layout and a rank's local layout.
//
// The global layout packs the sequences of a batch one after the other (row = token, in
// BlockTable order: sequence 0's tokens, then sequence 1's, ...). A rank's local layout holds its
// owned token blocks in the order given (a plan's DeviceProgram::owned_blocks: ascending global
// token block id), each block's tokens consecutive. A row of any tensor is `row_bytes` bytes (e.g.
// heads x head_dim x element size), so one pair of helpers serves Q, K, V, O, dO, LSE, ...
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "dcp/blocks.h"

namespace dcp {

struct LocalTokens {
  std::vector<int32_t> blocks;         // owned global token block ids, in local order
  std::vector<int64_t> block_offset;   // per owned block: its first local row; size blocks + 1
  std::vector<int64_t> global_row;     // per local row: row in the global (packed) layout
  std::vector<int32_t> seq;            // per local row: sequence index
  std::vector<int64_t> position;       // per local row: position id (token index in its sequence)
  int64_t num_rows() const { return static_cast<int64_t>(global_row.size()); }
};

// The local rows of a rank that owns `owned_blocks` (in that order). Throws InvalidInput if an
// id is outside [0, num_token_blocks) or repeated.
LocalTokens local_tokens(const BlockTable& table, std::span<const int32_t> owned_blocks);

// Every token block's owner as given by `block_home` (size num_token_blocks, values in
// [0, world_size)): the owned blocks of `rank` in ascending id order, the dispatch order of plans.
std::vector<int32_t> owned_blocks_of(std::span<const int32_t> block_home, int rank);

// local[r] = global[tokens.global_row[r]], rows of row_bytes bytes. Throws InvalidInput when a
// buffer is smaller than its rows (global: table.total_tokens() rows).
void gather_rows(std::span<const std::byte> global, std::span<std::byte> local, int64_t row_bytes,
                 const LocalTokens& tokens);
// global[tokens.global_row[r]] = local[r]; rows of other ranks are left as they are.
void scatter_rows(std::span<const std::byte> local, std::span<std::byte> global, int64_t row_bytes,
                  const LocalTokens& tokens);

// Typed conveniences: rows of `row_elems` elements.
template <class T>
void gather_rows(std::span<const T> global, std::span<T> local, int64_t row_elems, const LocalTokens& tokens) {
  gather_rows(std::as_bytes(global), std::as_writable_bytes(local), row_elems * static_cast<int64_t>(sizeof(T)), tokens);
}
template <class T>
void scatter_rows(std::span<const T> local, std::span<T> global, int64_t row_elems, const LocalTokens& tokens) {
  scatter_rows(std::as_bytes(local), std::as_writable_bytes(global), row_elems * static_cast<int64_t>(sizeof(T)), tokens);
}

}  // namespace dcp
