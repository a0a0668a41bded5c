// Shared test helpers for the batch part: expected errors and field-by-field comparison.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "dcp/batch.h"
#include "dcp/error.h"

namespace dcp::test {

// Runs `fn`, expects an InvalidInput error whose message contains every one of `parts`.
inline void expect_invalid_input(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidInput) << e.what();
    const std::string msg = e.what();
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
    return;
  }
  ADD_FAILURE() << "expected an InvalidInput error containing '" << (parts.empty() ? "" : parts[0]) << "'";
}

inline void expect_same_mask(const Mask& a, const Mask& b, const std::string& where) {
  SCOPED_TRACE(where);
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.sink, b.sink);
  EXPECT_EQ(a.window, b.window);
  EXPECT_EQ(a.block, b.block);
  EXPECT_EQ(a.local_blocks, b.local_blocks);
  EXPECT_EQ(a.sink_blocks, b.sink_blocks);
  EXPECT_EQ(a.question, b.question);
  EXPECT_EQ(a.answers, b.answers);
  ASSERT_EQ(a.rows == nullptr, b.rows == nullptr);
  if (a.rows) {
    EXPECT_EQ(*a.rows, *b.rows);
  }
}

inline void expect_same_batch(const Batch& a, const Batch& b) {
  EXPECT_EQ(a.shape.q_heads, b.shape.q_heads);
  EXPECT_EQ(a.shape.kv_heads, b.shape.kv_heads);
  EXPECT_EQ(a.shape.head_dim, b.shape.head_dim);
  EXPECT_EQ(a.shape.dtype, b.shape.dtype);
  ASSERT_EQ(a.sequences.size(), b.sequences.size());
  for (size_t i = 0; i < a.sequences.size(); ++i) {
    EXPECT_EQ(a.sequences[i].length, b.sequences[i].length) << "sequence " << i;
    EXPECT_EQ(a.sequences[i].id, b.sequences[i].id) << "sequence " << i;
    expect_same_mask(a.sequences[i].mask, b.sequences[i].mask, "sequence " + std::to_string(i));
  }
}

}  // namespace dcp::test
