// `dcp plan --json` against recorded outputs: a refactor must not change what the planner
// decides. Timings (keys ending in _ms or _s) are dropped before comparing; everything else
// (placements, bytes, memory, balance) must match exactly.
//
// To re-record after an intended change of behaviour (a better placement, say), run the test
// binary with DCP_UPDATE_GOLDEN=1 and commit the new files with the change that explains them.
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli/run_cli.h"

namespace {

using nlohmann::json;

json without_timings(const json& j) {
  if (j.is_object()) {
    json out = json::object();
    for (const auto& [k, v] : j.items()) {
      const bool timing = (k.size() > 3 && k.ends_with("_ms")) || (k.size() > 2 && k.ends_with("_s"));
      if (!timing) out[k] = without_timings(v);
    }
    return out;
  }
  if (j.is_array()) {
    json out = json::array();
    for (const auto& v : j) out.push_back(without_timings(v));
    return out;
  }
  return j;
}

struct GoldenCase {
  const char* name;
  std::string args;
};

class Golden : public ::testing::TestWithParam<GoldenCase> {};

TEST_P(Golden, PlanJsonMatchesRecording) {
  const GoldenCase& c = GetParam();
  const auto r = dcp::test::run_cli("plan --json " + c.args, /*merge_stderr=*/false);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const json got = without_timings(json::parse(r.out));
  const std::string path = std::string(DCP_GOLDEN_DIR) + "/" + c.name + ".json";
  if (std::getenv("DCP_UPDATE_GOLDEN") != nullptr) {
    std::ofstream(path) << got.dump(1) << "\n";
    GTEST_SKIP() << "recorded " << path;
  }
  std::ifstream in(path);
  ASSERT_TRUE(in) << "no recording " << path << " (run with DCP_UPDATE_GOLDEN=1 to make it)";
  const json want = json::parse(in);
  if (got == want) return;
  // Name the first differing field, so a failure says what changed.
  const json diff = json::diff(want, got);
  FAIL() << c.name << ": " << diff.size() << " fields differ from " << path << "; first: " << diff[0].dump();
}

const std::string kExamples = DCP_EXAMPLES_DIR;

INSTANTIATE_TEST_SUITE_P(
    Examples, Golden,
    ::testing::Values(GoldenCase{"example_a100_4x8", "--batch " + kExamples + "/batch_example.json"},
                      GoldenCase{"demo_ldc_seed1", "--profile ldc --seed 1 --cluster a100-p4d --nodes 4 --block 1024"},
                      GoldenCase{"longalign_lambda_8x2",
                                 "--profile longalign --seed 2 --mask lambda --tokens 65536 --cluster a100-p4d "
                                 "--nodes 8 --devices-per-node 2 --block 1024"},
                      GoldenCase{"ldc_shared_question_h200",
                                 "--profile ldc --seed 3 --mask shared_question --tokens 65536 --cluster h200-nvl "
                                 "--nodes 1 --block 2048 --stages 2"}),
    [](const auto& param_info) { return std::string(param_info.param.name); });

}  // namespace
