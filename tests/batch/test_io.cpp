// Batch JSON and dataset JSONL: the documented example, defaults, exact round trips.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "batch/test_helpers.h"
#include "dcp/io.h"
#include "dcp/profiles.h"

namespace dcp {
namespace {

TEST(BatchJson, ReadsTheDocumentedExample) {
  const Batch b = load_batch(std::string(DCP_EXAMPLES_DIR) + "/batch_example.json");
  EXPECT_EQ(b.shape.q_heads, 32);
  EXPECT_EQ(b.shape.kv_heads, 8);
  EXPECT_EQ(b.shape.head_dim, 128);
  EXPECT_EQ(b.shape.dtype, DType::BF16);
  ASSERT_EQ(b.sequences.size(), 6u);
  EXPECT_EQ(b.total_tokens(), 5000 + 3000 + 20000 + 9000 + 12000 + 3);
  EXPECT_EQ(b.sequences[0].mask.kind, MaskKind::Causal);
  EXPECT_EQ(b.sequences[1].mask.kind, MaskKind::Full);
  EXPECT_EQ(b.sequences[2].mask.kind, MaskKind::Lambda);
  EXPECT_EQ(b.sequences[2].mask.window, 4096);
  EXPECT_EQ(b.sequences[3].mask.kind, MaskKind::CausalBlockwise);
  EXPECT_EQ(b.sequences[3].mask.local_blocks, 2);
  EXPECT_EQ(b.sequences[4].mask.question, 2400);
  EXPECT_EQ(b.sequences[4].mask.answers, (std::vector<int64_t>{2400, 2400, 2400, 2400}));
  const auto& rows = *b.sequences[5].mask.rows;
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0], (std::vector<Range>{{0, 1}}));
  EXPECT_TRUE(rows[1].empty());
  EXPECT_EQ(rows[2], (std::vector<Range>{{0, 1}, {2, 3}}));
}

TEST(BatchJson, MissingParametersTakePaperDefaults) {
  const Batch b = parse_batch(R"({"sequences": [
      {"length": 100, "id": "doc-7"},
      {"length": 20000, "mask": {"kind": "lambda"}},
      {"length": 9000, "mask": {"kind": "causal_blockwise", "block": 128}},
      {"length": 12000, "mask": {"kind": "shared_question"}},
      {"length": 1000, "mask": {"kind": "shared_question", "question": 200}},
      {"length": 1000, "mask": {"kind": "shared_question", "answers": [300, 300]}},
      {"length": 20000, "mask": {"kind": "chunked"}}]})",
                              "defaults.json");
  const AttentionShape shape;
  EXPECT_EQ(b.shape.q_heads, shape.q_heads);
  EXPECT_EQ(b.shape.dtype, DType::BF16);
  EXPECT_EQ(b.sequences[0].id, "doc-7");
  EXPECT_EQ(b.sequences[0].mask.kind, MaskKind::Causal);
  EXPECT_EQ(b.sequences[1].mask.sink, 64);
  EXPECT_EQ(b.sequences[1].mask.window, 4096);
  EXPECT_EQ(b.sequences[2].mask.block, 128);
  EXPECT_EQ(b.sequences[2].mask.local_blocks, 2);
  EXPECT_EQ(b.sequences[2].mask.sink_blocks, 1);
  test::expect_same_mask(b.sequences[3].mask, Mask::shared_question_for(12000), "default shared question");
  EXPECT_EQ(b.sequences[3].mask.answers.size(), 4u);
  EXPECT_EQ(b.sequences[4].mask.answers, (std::vector<int64_t>{200, 200, 200, 200}));
  EXPECT_EQ(b.sequences[5].mask.question, 400);
  test::expect_same_mask(b.sequences[6].mask, Mask::chunked(8192), "default chunked");
}

// Generated batches of every mask kind, plus ranges masks copied row by row from them.
std::vector<Batch> batches_of_every_kind() {
  std::vector<Batch> out;
  for (const char* kind : {"full", "causal", "lambda", "causal_blockwise", "shared_question", "mixed"}) {
    ProfileOptions o;
    o.token_budget = 16384;
    o.mask = kind;
    o.seed = 11;
    o.shape.q_heads = 16;
    o.shape.kv_heads = 4;
    o.shape.head_dim = 64;
    o.shape.dtype = DType::FP16;
    for (Batch& b : generate_batches(o, 2)) out.push_back(std::move(b));
  }
  Batch ranges;
  std::vector<Range> row;
  for (const Mask& m : {Mask::lambda(3, 5), Mask::causal_blockwise(4, 1, 1), Mask::shared_question_for(40),
                        Mask::chunked(7)}) {
    std::vector<std::vector<Range>> rows;
    for (int64_t i = 0; i < 40; ++i) {
      m.row_ranges(i, 40, row);
      rows.push_back(row);
    }
    ranges.sequences.push_back(Sequence{.length = 40, .mask = Mask::ranges(std::move(rows)), .id = "r"});
  }
  ranges.sequences.push_back(Sequence{.length = 3, .mask = Mask::ranges({{}, {}, {}}), .id = {}});
  ranges.sequences.push_back(Sequence{.length = 40, .mask = Mask::chunked(7), .id = "c"});
  out.push_back(ranges);
  return out;
}

TEST(BatchJson, RoundTripsExactly) {
  for (const Batch& b : batches_of_every_kind()) {
    for (bool pretty : {true, false}) {
      const std::string text = batch_to_json(b, pretty);
      const Batch back = parse_batch(text, "roundtrip.json");
      test::expect_same_batch(b, back);
      EXPECT_EQ(batch_to_json(back, pretty), text);
    }
  }
}

TEST(DatasetJsonl, SaveAndLoad) {
  const std::vector<Batch> batches = batches_of_every_kind();
  const std::string path =
      (std::filesystem::temp_directory_path() / ("dcp_test_dataset_" + std::to_string(::getpid()) + ".jsonl")).string();
  save_dataset(batches, path);
  const std::vector<Batch> back = load_dataset(path);
  ASSERT_EQ(back.size(), batches.size());
  for (size_t i = 0; i < batches.size(); ++i) test::expect_same_batch(batches[i], back[i]);
  save_batch(batches[0], path);
  test::expect_same_batch(load_batch(path), batches[0]);
  std::filesystem::remove(path);
}

TEST(DatasetJsonl, ErrorsNameTheLine) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("dcp_test_bad_" + std::to_string(::getpid()) + ".jsonl")).string();
  {
    std::vector<Batch> one(1);
    one[0].sequences.push_back(Sequence{.length = 5, .mask = Mask::causal(), .id = {}});
    save_dataset(one, path);
  }
  // Append a line with a wrong type.
  {
    FILE* f = std::fopen(path.c_str(), "a");
    ASSERT_NE(f, nullptr);
    std::fputs("{\"sequences\": [{\"length\": true}]}\n", f);
    std::fclose(f);
  }
  test::expect_invalid_input([&] { load_dataset(path); },
                             {path + ":line 2: sequences[0].length: expected an integer, got boolean true"});
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace dcp
