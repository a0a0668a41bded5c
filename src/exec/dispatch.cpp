// Token dispatch between the global packed layout and a rank's local layout.
#include "dcp/dispatch.h"

#include <cstring>
#include <string>

#include "dcp/error.h"

namespace dcp {

LocalTokens local_tokens(const BlockTable& table, std::span<const int32_t> owned_blocks) {
  LocalTokens t;
  std::vector<uint8_t> seen(static_cast<size_t>(table.num_token_blocks()), 0);
  t.block_offset.push_back(0);
  for (size_t i = 0; i < owned_blocks.size(); ++i) {
    const int32_t b = owned_blocks[i];
    if (b < 0 || b >= table.num_token_blocks())
      raise(ErrorKind::InvalidInput, "local_tokens: owned_blocks[" + std::to_string(i) + "] = " + std::to_string(b) +
                                         " is not a token block id in [0, " +
                                         std::to_string(table.num_token_blocks()) + ")");
    if (seen[static_cast<size_t>(b)]++)
      raise(ErrorKind::InvalidInput, "local_tokens: token block " + std::to_string(b) + " is owned twice");
    const TokenBlock& tb = table.token_blocks[static_cast<size_t>(b)];
    t.blocks.push_back(b);
    for (int64_t k = 0; k < tb.length; ++k) {
      t.global_row.push_back(tb.global_begin + k);
      t.seq.push_back(tb.seq);
      t.position.push_back(tb.begin + k);
    }
    t.block_offset.push_back(t.num_rows());
  }
  return t;
}

std::vector<int32_t> owned_blocks_of(std::span<const int32_t> block_home, int rank) {
  std::vector<int32_t> out;
  for (size_t b = 0; b < block_home.size(); ++b)
    if (block_home[b] == rank) out.push_back(static_cast<int32_t>(b));
  return out;
}

namespace {

void check_sizes(const char* where, size_t global_bytes, size_t local_bytes, int64_t row_bytes,
                 const LocalTokens& tokens) {
  if (row_bytes <= 0) raise(ErrorKind::InvalidInput, std::string(where) + ": row_bytes must be > 0");
  int64_t max_row = -1;
  for (int64_t r : tokens.global_row) max_row = std::max(max_row, r);
  const auto need_local = static_cast<size_t>(tokens.num_rows() * row_bytes);
  const auto need_global = static_cast<size_t>((max_row + 1) * row_bytes);
  if (local_bytes < need_local)
    raise(ErrorKind::InvalidInput, std::string(where) + ": local buffer has " + std::to_string(local_bytes) +
                                       " bytes, " + std::to_string(tokens.num_rows()) + " rows need " +
                                       std::to_string(need_local));
  if (global_bytes < need_global)
    raise(ErrorKind::InvalidInput, std::string(where) + ": global buffer has " + std::to_string(global_bytes) +
                                       " bytes, row " + std::to_string(max_row) + " needs " +
                                       std::to_string(need_global));
}

}  // namespace

void gather_rows(std::span<const std::byte> global, std::span<std::byte> local, int64_t row_bytes,
                 const LocalTokens& tokens) {
  check_sizes("gather_rows", global.size(), local.size(), row_bytes, tokens);
  const auto n = static_cast<size_t>(row_bytes);
  for (int64_t r = 0; r < tokens.num_rows(); ++r)
    std::memcpy(local.data() + static_cast<size_t>(r) * n,
                global.data() + static_cast<size_t>(tokens.global_row[static_cast<size_t>(r)]) * n, n);
}

void scatter_rows(std::span<const std::byte> local, std::span<std::byte> global, int64_t row_bytes,
                  const LocalTokens& tokens) {
  check_sizes("scatter_rows", global.size(), local.size(), row_bytes, tokens);
  const auto n = static_cast<size_t>(row_bytes);
  for (int64_t r = 0; r < tokens.num_rows(); ++r)
    std::memcpy(global.data() + static_cast<size_t>(tokens.global_row[static_cast<size_t>(r)]) * n,
                local.data() + static_cast<size_t>(r) * n, n);
}

}  // namespace dcp
