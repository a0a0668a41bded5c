// One broken file per error message under tests/inputs/: each must fail with InvalidInput and
// a message naming the file, the field and the value at fault.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "batch/test_helpers.h"
#include "dcp/io.h"

namespace dcp {
namespace {

struct BadInput {
  const char* file;
  std::vector<std::string> expected;  // substrings of the message, besides the file name
};

const std::vector<BadInput>& bad_inputs() {
  static const std::vector<BadInput> cases = {
      {"bad_batch_malformed.json", {"malformed JSON", "line 3"}},
      {"bad_batch_unknown_mask_kind.json",
       {"sequences[2].mask.kind: unknown mask kind 'foo' (expected one of full, causal, lambda, causal_blockwise, "
        "chunked, shared_question, ranges)"}},
      {"bad_batch_negative_length.json", {"sequences[3].length: must be > 0, got -5"}},
      {"bad_batch_zero_length.json", {"sequences[0].length: must be > 0, got 0"}},
      {"bad_batch_kv_not_dividing.json", {"heads.kv: 3 does not divide heads.q 32"}},
      {"bad_batch_head_dim.json", {"heads.dim", "got 100"}},
      {"bad_batch_ranges_unsorted.json", {"sequences[0].mask.rows[1][1]", "[0, 1]", "sorted"}},
      {"bad_batch_ranges_outside.json", {"sequences[0].mask.rows[2][0]", "[2, 4]", "end <= 3"}},
      {"bad_batch_ranges_row_count.json", {"sequences[0].mask.rows", "got 2 rows", "(3)"}},
      {"bad_batch_shared_question_exceeds.json",
       {"sequences[0].mask", "question 2400 + answers 10000 = 12400 exceeds the sequence length 12000"}},
      {"bad_batch_shared_question_too_long.json", {"sequences[0].mask.question", "20000", "12000"}},
      {"bad_batch_length_type.json", {"sequences[0].length: expected an integer, got string '5000'"}},
      {"bad_batch_heads_type.json", {"heads.q: expected an integer, got number 32.5"}},
      {"bad_batch_sequences_type.json", {"sequences: expected an array, got object"}},
      {"bad_batch_unknown_key.json", {"sequences[0]: unknown key 'lenght'"}},
      {"bad_batch_unknown_dtype.json", {"dtype: unknown dtype 'int8'", "bf16, fp16, fp32"}},
      {"bad_batch_no_sequences.json", {"sequences", "at least one"}},
      {"bad_batch_lambda_sink.json", {"sequences[0].mask.sink", "got -1"}},
      {"bad_cluster_unknown_preset.json", {"preset: unknown preset 'tpu-v5'", "a100-p4d", "h200-nvl"}},
      {"bad_cluster_zero_nodes.json", {"nodes: must be in [1, 1024], got 0"}},
      {"bad_cluster_zero_devices.json", {"devices_per_node: must be in [1, 1024], got 0"}},
      {"bad_cluster_unknown_key.json", {"unknown key 'nodess'"}},
      {"bad_cluster_missing_field.json", {"nic_bw_node_GBps: missing"}},
      {"bad_cluster_negative_bandwidth.json", {"intra_bw_GBps: must be > 0, got -1"}},
      {"bad_dataset_line3.jsonl", {":line 3: sequences[0].length: must be > 0, got 0"}},
  };
  return cases;
}

std::string input_path(const std::string& file) { return std::string(DCP_TEST_INPUTS_DIR) + "/" + file; }

void load_any(const std::string& file) {
  const std::string path = input_path(file);
  if (file.rfind("bad_cluster_", 0) == 0) {
    load_cluster(path);
  } else if (file.rfind("bad_dataset_", 0) == 0) {
    load_dataset(path);
  } else {
    load_batch(path);
  }
}

TEST(BadInputs, EachFileGivesItsMessage) {
  for (const BadInput& c : bad_inputs()) {
    SCOPED_TRACE(c.file);
    std::vector<std::string> parts = c.expected;
    parts.push_back(input_path(c.file));  // the message starts with its source
    test::expect_invalid_input([&] { load_any(c.file); }, parts);
  }
}

// A broken file without an expected message would test nothing: every bad_batch_*,
// bad_cluster_* and bad_dataset_* file must be listed above.
TEST(BadInputs, EveryFileIsListed) {
  std::set<std::string> listed;
  for (const BadInput& c : bad_inputs()) listed.insert(c.file);
  int num_files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(DCP_TEST_INPUTS_DIR)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("bad_batch_", 0) != 0 && name.rfind("bad_cluster_", 0) != 0 && name.rfind("bad_dataset_", 0) != 0) {
      continue;
    }
    ++num_files;
    EXPECT_TRUE(listed.count(name)) << name << " has no expected message in test_bad_inputs.cpp";
  }
  EXPECT_EQ(num_files, static_cast<int>(listed.size()));
}

TEST(BadInputs, UnreadableFiles) {
  test::expect_invalid_input([] { load_batch(input_path("no_such_file.json")); }, {"no_such_file.json", "cannot read"});
  test::expect_invalid_input([] { load_batch(DCP_TEST_INPUTS_DIR); }, {"directory"});
}

TEST(BadInputs, EmptyAndTruncatedText) {
  test::expect_invalid_input([] { parse_batch("", "empty.json"); }, {"empty.json: malformed JSON"});
  test::expect_invalid_input([] { parse_batch("{\"sequences\": [", "cut.json"); }, {"cut.json: malformed JSON", "line 1"});
  test::expect_invalid_input([] { parse_batch("[1, 2]", "arr.json"); }, {"arr.json: expected an object, got array"});
}

}  // namespace
}  // namespace dcp
