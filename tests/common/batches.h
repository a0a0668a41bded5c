// tests/common/batches.h — a batch from parallel lists of lengths and masks (test fixtures).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <utility>

#include "dcp/batch.h"

namespace dcp::test {

// One sequence per (length, mask) pair, in order.
inline Batch batch_of(const AttentionShape& shape, std::initializer_list<std::pair<int64_t, Mask>> sequences) {
  Batch batch;
  batch.shape = shape;
  for (const auto& [length, mask] : sequences) {
    Sequence s;
    s.length = length;
    s.mask = mask;
    batch.sequences.push_back(s);
  }
  return batch;
}

}  // namespace dcp::test
