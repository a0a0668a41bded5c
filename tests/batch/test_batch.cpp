// Batch basics: dtypes, shape checks, totals against per-row brute force.
#include <gtest/gtest.h>

#include <vector>

#include "batch/test_helpers.h"
#include "dcp/batch.h"

namespace dcp {
namespace {

using test::expect_invalid_input;

TEST(DType, NamesSizesAndParsing) {
  EXPECT_STREQ(to_string(DType::BF16), "bf16");
  EXPECT_STREQ(to_string(DType::FP16), "fp16");
  EXPECT_STREQ(to_string(DType::FP32), "fp32");
  EXPECT_EQ(element_bytes(DType::BF16), 2);
  EXPECT_EQ(element_bytes(DType::FP16), 2);
  EXPECT_EQ(element_bytes(DType::FP32), 4);
  for (DType t : {DType::BF16, DType::FP16, DType::FP32}) EXPECT_EQ(parse_dtype(to_string(t), "dtype"), t);
  expect_invalid_input([] { parse_dtype("float8", "opts.dtype"); },
                       {"opts.dtype", "'float8'", "bf16, fp16, fp32"});
}

TEST(AttentionShape, AcceptsGqaAndMqa) {
  AttentionShape s;
  EXPECT_NO_THROW(s.validate("heads"));
  s.kv_heads = 1;
  EXPECT_NO_THROW(s.validate("heads"));
  EXPECT_EQ(s.group_ratio(), 32);
}

TEST(AttentionShape, KvHeadsNotDividingQueryHeads) {
  AttentionShape s;
  s.kv_heads = 3;
  expect_invalid_input([&] { s.validate("heads"); }, {"heads.kv: 3 does not divide heads.q 32"});
}

TEST(AttentionShape, NonPositiveHeadsAndBadHeadDim) {
  AttentionShape s;
  s.q_heads = 0;
  expect_invalid_input([&] { s.validate("heads"); }, {"heads.q", "got 0"});
  s = AttentionShape{};
  s.kv_heads = -2;
  expect_invalid_input([&] { s.validate("heads"); }, {"heads.kv", "got -2"});
  s = AttentionShape{};
  s.head_dim = 100;
  expect_invalid_input([&] { s.validate("heads"); }, {"heads.dim", "multiple of 8", "got 100"});
  s.head_dim = 0;
  expect_invalid_input([&] { s.validate("heads"); }, {"heads.dim", "got 0"});
}

TEST(Batch, ValidateNamesTheSequence) {
  Batch b;
  expect_invalid_input([&] { b.validate(); }, {"sequences", "at least one"});
  for (int64_t len : {10, 20, 30, -5}) b.sequences.push_back(Sequence{.length = len, .mask = Mask::causal(), .id = {}});
  expect_invalid_input([&] { b.validate(); }, {"sequences[3].length: must be > 0, got -5"});
  b.sequences[3].length = 0;
  expect_invalid_input([&] { b.validate(); }, {"sequences[3].length: must be > 0, got 0"});
  b.sequences[3].length = kMaxBatchTokens + 1;
  expect_invalid_input([&] { b.validate(); }, {"sequences[3].length", "2147483648"});
  b.sequences[3].length = 40;
  EXPECT_NO_THROW(b.validate());
  b.shape.kv_heads = 5;
  expect_invalid_input([&] { b.validate(); }, {"heads.kv: 5 does not divide heads.q 32"});
}

TEST(Batch, ValidateChecksMasks) {
  Batch b;
  Mask sq = Mask::shared_question_for(100);
  b.sequences.push_back(Sequence{.length = 120, .mask = sq, .id = {}});  // parts cover 100, not 120
  expect_invalid_input([&] { b.validate(); }, {"sequences[0].mask"});
}

TEST(Batch, TotalsMatchPerRowCounts) {
  Batch b;
  b.shape.q_heads = 8;
  b.shape.kv_heads = 2;
  b.shape.head_dim = 64;
  const std::vector<Sequence> seqs = {
      {.length = 300, .mask = Mask::causal(), .id = {}},
      {.length = 77, .mask = Mask::full(), .id = {}},
      {.length = 1000, .mask = Mask::lambda(16, 100), .id = {}},
      {.length = 900, .mask = Mask::causal_blockwise(64, 2, 1), .id = {}},
      {.length = 500, .mask = Mask::shared_question_for(500), .id = {}},
      {.length = 3, .mask = Mask::ranges({{{0, 1}}, {}, {{0, 1}, {2, 3}}}), .id = {}},
  };
  b.sequences = seqs;
  int64_t tokens = 0;
  int64_t area = 0;
  std::vector<Range> row;
  for (const Sequence& s : seqs) {
    tokens += s.length;
    for (int64_t i = 0; i < s.length; ++i) {
      s.mask.row_ranges(i, s.length, row);
      for (const Range& r : row) area += r.end - r.begin;
    }
  }
  EXPECT_EQ(b.total_tokens(), tokens);
  EXPECT_EQ(b.mask_area(), area);
  EXPECT_EQ(b.forward_flops(), 4.0 * static_cast<double>(area) * 64.0 * 8.0);
  // Closed forms that do not depend on the mask code: causal and full.
  EXPECT_EQ(seqs[0].mask.area(300), 300 * 301 / 2);
  EXPECT_EQ(seqs[1].mask.area(77), 77 * 77);
  EXPECT_EQ(seqs[5].mask.area(3), 3);
}

}  // namespace
}  // namespace dcp
