// Batch basics: element types, attention shape checks and whole-batch totals.
#include "dcp/batch.h"

#include <string>

#include "dcp/error.h"
#include "dcp/limits.h"

namespace dcp {

namespace {

// "heads" + "kv" -> "heads.kv"; an empty prefix leaves the bare field name.
std::string field(const std::string& where, const char* name) {
  return where.empty() ? std::string(name) : where + "." + name;
}

}  // namespace

const char* to_string(DType t) {
  switch (t) {
    case DType::BF16: return "bf16";
    case DType::FP16: return "fp16";
    case DType::FP32: return "fp32";
  }
  return "?";
}

int element_bytes(DType t) {
  switch (t) {
    case DType::BF16: return 2;
    case DType::FP16: return 2;
    case DType::FP32: return 4;
  }
  return 0;
}

DType parse_dtype(const std::string& s, const std::string& where) {
  for (DType t : {DType::BF16, DType::FP16, DType::FP32}) {
    if (s == to_string(t)) return t;
  }
  raise(ErrorKind::InvalidInput,
        (where.empty() ? std::string("dtype") : where) + ": unknown dtype '" + s +
            "' (expected one of bf16, fp16, fp32)");
}

void AttentionShape::validate(const std::string& where) const {
  const std::string q_name = field(where, "q");
  const std::string kv_name = field(where, "kv");
  const std::string dim_name = field(where, "dim");
  if (q_heads <= 0) {
    raise(ErrorKind::InvalidInput, q_name + ": must be > 0, got " + std::to_string(q_heads));
  }
  if (q_heads > kMaxHeads) {
    raise(ErrorKind::InvalidInput, q_name + ": must be <= " + std::to_string(kMaxHeads) + ", got " + std::to_string(q_heads));
  }
  if (kv_heads <= 0) {
    raise(ErrorKind::InvalidInput, kv_name + ": must be > 0, got " + std::to_string(kv_heads));
  }
  if (q_heads % kv_heads != 0) {
    raise(ErrorKind::InvalidInput, kv_name + ": " + std::to_string(kv_heads) + " does not divide " +
                                       q_name + " " + std::to_string(q_heads) +
                                       " (expected a divisor of the query heads, GQA/MQA)");
  }
  // Attention kernels load head vectors in 16-byte chunks: 8 bf16/fp16 elements.
  if (head_dim <= 0 || head_dim % 8 != 0 || head_dim > kMaxHeadDim) {
    raise(ErrorKind::InvalidInput, dim_name + ": must be a positive multiple of 8 up to " + std::to_string(kMaxHeadDim) +
                                       ", got " + std::to_string(head_dim));
  }
}

int64_t Batch::total_tokens() const {
  int64_t total = 0;
  for (const Sequence& s : sequences) total += s.length;
  return total;
}

int64_t Batch::mask_area() const {
  int64_t total = 0;
  for (const Sequence& s : sequences) total += s.mask.area(s.length);
  return total;
}

double Batch::forward_flops() const {
  return 4.0 * static_cast<double>(mask_area()) * static_cast<double>(shape.head_dim) *
         static_cast<double>(shape.q_heads);
}

void Batch::validate() const {
  shape.validate("heads");
  if (sequences.empty()) {
    raise(ErrorKind::InvalidInput, "sequences: must hold at least one sequence, got none");
  }
  if (static_cast<int64_t>(sequences.size()) > kMaxSequences) {
    raise(ErrorKind::InvalidInput, "sequences: " + std::to_string(sequences.size()) + " sequences exceed the limit of " +
                                       std::to_string(kMaxSequences));
  }
  for (size_t i = 0; i < sequences.size(); ++i) {
    const std::string where = "sequences[" + std::to_string(i) + "]";
    const Sequence& s = sequences[i];
    if (s.length <= 0) {
      raise(ErrorKind::InvalidInput, where + ".length: must be > 0, got " + std::to_string(s.length));
    }
    if (s.length > kMaxBatchTokens) {
      raise(ErrorKind::InvalidInput, where + ".length: must be <= " + std::to_string(kMaxBatchTokens) +
                                         ", got " + std::to_string(s.length));
    }
  }
  // Each length is below 2^31, so this sum cannot overflow before the check.
  if (total_tokens() > kMaxBatchTokens) {
    raise(ErrorKind::InvalidInput, "sequences: total length " + std::to_string(total_tokens()) +
                                       " exceeds the limit " + std::to_string(kMaxBatchTokens));
  }
  for (size_t i = 0; i < sequences.size(); ++i) {
    sequences[i].mask.validate(sequences[i].length, "sequences[" + std::to_string(i) + "].mask");
  }
}

}  // namespace dcp
