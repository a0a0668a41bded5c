// dcp/batch.h — what a trainer hands us each step: sequences with masks and the attention shape.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dcp/mask.h"

namespace dcp {

enum class DType { BF16, FP16, FP32 };
const char* to_string(DType t);          // "bf16", "fp16", "fp32"
int element_bytes(DType t);
DType parse_dtype(const std::string& s, const std::string& where);  // throws InvalidInput

struct AttentionShape {
  int q_heads = 32;
  int kv_heads = 8;   // GQA: q_heads % kv_heads == 0 (MQA: kv_heads == 1)
  int head_dim = 128;
  DType dtype = DType::BF16;

  int group_ratio() const { return q_heads / kv_heads; }
  void validate(const std::string& where) const;  // throws InvalidInput naming the field
};

// Longest batch (all sequences together) we accept: keeps every mask area below 2^62, so
// areas and FLOP counts never overflow int64.
inline constexpr int64_t kMaxBatchTokens = (int64_t{1} << 31) - 1;

struct Sequence {
  int64_t length = 0;
  Mask mask;
  std::string id;  // optional, carried through for the user
};

struct Batch {
  AttentionShape shape;
  std::vector<Sequence> sequences;

  int64_t total_tokens() const;
  // Allowed (query, key) pairs summed over sequences, counted for one head.
  int64_t mask_area() const;
  // Forward FLOPs over all query heads: 4 * area * head_dim * q_heads (backward is 2.5x).
  double forward_flops() const;
  // Checks shape and every sequence (at least one; length > 0; total <= kMaxBatchTokens; mask
  // fits); throws InvalidInput naming the field, e.g. "sequences[3].length: must be > 0, got -5".
  void validate() const;
};

}  // namespace dcp
