// Regression tests of the dcp command for every class of bad input and edge case that once got
// through: crashes on well-checksummed but wrong plans, validator misses, overflow, silent
// acceptances, unclear messages, wrong labels, wrong verdicts on valid input, and the exit-code
// convention (exit_codes.h) in every launcher mode.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "cli/run_cli.h"

namespace {

using Result = dcp::test::CliResult;
Result run(const std::string& args) { return dcp::test::run_cli(args); }

std::string source(const std::string& rel) { return std::string(DCP_SOURCE_DIR) + "/" + rel; }
std::string bad_plan(const std::string& name) { return source("tests/fuzz/corpus/plan/bad/" + name + ".plan"); }

// A file under the test's temporary folder holding `text`.
std::string temp_file(const std::string& name, const std::string& text) {
  const auto dir = std::filesystem::temp_directory_path() / "dcp_cli_hardening";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / name).string();
  std::ofstream(path) << text;
  return path;
}

void expect(const Result& r, int code, const std::string& text, const std::string& what) {
  EXPECT_EQ(r.exit_code, code) << what << "\n" << r.out;
  EXPECT_NE(r.out.find(text), std::string::npos) << what << ": expected '" << text << "' in\n" << r.out;
  EXPECT_EQ(r.out.find("terminate called"), std::string::npos) << what;
  EXPECT_EQ(r.out.find("std::"), std::string::npos) << what << ": library wording leaked\n" << r.out;
}

TEST(CliHardening, HelpDocumentsTheExitCodes) {
  for (const char* cmd : {"--help", "plan --help", "run --help", "validate --help", "simulate --help", "bench --help"}) {
    const Result r = run(cmd);
    EXPECT_EQ(r.exit_code, 0) << cmd;
    EXPECT_NE(r.out.find("3  a peer rank failed"), std::string::npos) << cmd << "\n" << r.out;
  }
}

TEST(CliHardening, RunRefusesWhatValidateRefuses) {
  // Checksums are right; the contents are not. validate says INVALID (1), run refuses it (2).
  for (const char* name : {"mixed-dcp-1x1-attend-tile-out-of-range", "mixed-dcp-1x1-head-dim-0",
                           "mixed-dcp-1x1-q-heads-disagree", "mixed-dcp-1x1-slots-huge",
                           "mixed-dcp-1x1-tile-area-plus-1", "mixed-dcp-1x1-merge-removed",
                           "ranges-dcp-1x2-transfer-peer-out-of-range", "ranges-dcp-1x2-wait-removed"}) {
    const std::string plan = bad_plan(name);
    ASSERT_TRUE(std::filesystem::exists(plan)) << plan;
    const Result v = run("validate " + plan);
    EXPECT_EQ(v.exit_code, 1) << name << "\n" << v.out;
    EXPECT_NE(v.out.find("INVALID"), std::string::npos) << name << "\n" << v.out;
    const int ranks = std::string(name).find("1x2") != std::string::npos ? 2 : 1;
    const Result r = run("run --ranks " + std::to_string(ranks) + " --plan " + plan);
    EXPECT_EQ(r.exit_code, 2) << name << "\n" << r.out;
    EXPECT_NE(r.out.find(plan), std::string::npos) << name << "\n" << r.out;
  }
  const Result ok = run("validate " + source("tests/fuzz/corpus/plan/good/mixed-dcp-1x1.plan"));
  EXPECT_EQ(ok.exit_code, 0) << ok.out;
}

TEST(CliHardening, UnreadablePlansExitTwoFromEveryCommand) {
  const std::string dir = std::filesystem::temp_directory_path().string();
  expect(run("validate " + dir), 2, "it is a directory", "validate a directory");
  expect(run("run --plan " + dir), 2, "it is a directory", "run a directory");
  expect(run("validate /nonexistent/plan.bin"), 2, "/nonexistent/plan.bin", "validate a missing file");
  expect(run("run --plan /nonexistent/plan.bin"), 2, "/nonexistent/plan.bin", "run a missing file");
}

TEST(CliHardening, SilentAcceptancesAreRefused) {
  struct Case {
    std::string args, text;
  };
  const Case cases[] = {
      {"plan --method foo --tokens 4096", "--method: unknown placement 'foo'"},
      {"plan --method ring --method bar --tokens 4096", "'bar'"},
      {"simulate --method foo --tokens 4096", "'foo'"},
      {"plan --devices-per-node 0", "--devices-per-node"},
      {"plan --devices-per-node -4", "--devices-per-node"},
      {"plan --seed -1", "--seed"},
      {"run --data-seed -1", "--data-seed"},
      {"plan --placement-seed -3", "--placement-seed"},
      {"plan --placement-threads 0", "--placement-threads"},
      {"run --threads -1", "--threads"},
      {"run --timeout 0", "--timeout"},
      {"run --timeout -1", "--timeout"},
      {"run --timeout nan", "--timeout"},
      {"run --timeout inf", "--timeout"},
      {"bench --timeout 0 --backend cpu", "--timeout"},
      {"run --ranks 0", "--ranks"},
      {"plan --stages 0", "--stages"},
      {"simulate --batches 0", "--batches"},
      {"plan --partitioner nope --tokens 4096", "nope"},
      {"plan --batch " + source("examples/batch_example.json") + " --dtype fp16", "--dtype"},
      {"run --batch " + source("examples/batch_example.json") + " --q-heads 8", "--q-heads"},
      {"simulate --dataset x.jsonl --tokens 100", "--tokens"},
      {"plan --batch " + source("examples/batch_example.json") + " --index 2", "--index"},
  };
  for (const Case& c : cases) expect(run(c.args), 2, c.text, c.args);
}

TEST(CliHardening, ClusterFileHonoursNodesAndMissingFilesAreNamed) {
  const std::string cluster = temp_file("cluster.json", R"({"preset": "a100-p4d", "nodes": 2})");
  const Result two = run("plan --tokens 8192 --block 512 --method packing --cluster " + cluster);
  ASSERT_EQ(two.exit_code, 0) << two.out;
  EXPECT_NE(two.out.find("cluster: 2 x 8 devices"), std::string::npos) << two.out;
  const Result three = run("plan --tokens 8192 --block 512 --method packing --nodes 3 --cluster " + cluster);
  ASSERT_EQ(three.exit_code, 0) << three.out;
  EXPECT_NE(three.out.find("cluster: 3 x 8 devices"), std::string::npos) << three.out;
  expect(run("plan --cluster /nonexistent/cluster.json"), 2, "/nonexistent/cluster.json: cannot read file",
         "missing cluster file");
  expect(run("plan --cluster missing_cluster.json"), 2, "missing_cluster.json: cannot read file", "relative path");
}

TEST(CliHardening, JsonDuplicatesAndOverflowAreNamed) {
  const std::string dup = temp_file("dup.json", R"({"sequences": [{"length": 64, "length": 128}]})");
  expect(run("plan --batch " + dup), 2, "duplicate key 'length' in sequences[0]", "duplicate key");
  const std::string dup_top = temp_file("dup_top.json", R"({"dtype": "fp32", "sequences": [{"length": 8}], "dtype": "bf16"})");
  expect(run("plan --batch " + dup_top), 2, "duplicate key 'dtype' in the top-level object", "duplicate top key");
  const std::string ovf = temp_file("ovf.json", R"({"sequences": [{"length": 1e400}]})");
  expect(run("plan --batch " + ovf), 2, "ovf.json: malformed JSON: number overflow", "number overflow");
  const std::string cl = temp_file("dup_cluster.json", R"({"preset": "a100-p4d", "nodes": 1, "nodes": 2})");
  expect(run("plan --cluster " + cl), 2, "duplicate key 'nodes'", "duplicate cluster key");
}

TEST(CliHardening, OutOfRangeOptionsGiveShortMessages) {
  for (const char* args : {"plan --index -1", "validate --max-violations 0 x.plan", "plan --nodes 100000",
                           "plan --tokens 99999999999999999999", "plan --block 0"}) {
    const Result r = run(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.out;
    EXPECT_LT(r.out.size(), 400u) << args << "\n" << r.out;
  }
}

TEST(CliHardening, LimitsAreEnforcedQuickly) {
  const auto t0 = std::chrono::steady_clock::now();
  expect(run("plan --nodes 100000"), 2, "--nodes", "--nodes 100000");
  expect(run("plan --nodes 1024 --devices-per-node 16 --tokens 4096"), 2, "exceed the limit of 8192", "devices");
  expect(run("plan --q-heads 4096 --kv-heads 8"), 2, "q: must be <= 1024", "heads");
  expect(run("plan --head-dim 4096"), 2, "dim: must be a positive multiple of 8 up to 1024", "head dim");
  const std::string huge = temp_file("huge_heads.json", R"({"heads": {"q": 1000000, "kv": 1, "dim": 100000}, "sequences": [{"length": 100000}]})");
  expect(run("plan --batch " + huge), 2, "heads.q: must be <= 1024", "huge heads in a file");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 30.0);
}

TEST(CliHardening, Fp16IsBlamedOnTheFileThatSaysSo) {
  const std::string f = temp_file("fp16.json", R"({"dtype": "fp16", "sequences": [{"length": 64}]})");
  const Result r = run("run --ranks 1 --batch " + f);
  expect(r, 2, "fp16.json: dtype fp16", "fp16 from a file");
  EXPECT_EQ(r.out.find("--dtype"), std::string::npos) << r.out;
  expect(run("run --ranks 1 --dtype fp16"), 2, "--dtype fp16", "fp16 from the option");
}

TEST(CliHardening, SimulateLabelsTheMasksOfTheBatchFile) {
  const std::string f = temp_file(
      "masks.json",
      R"({"heads": {"q": 4, "kv": 2, "dim": 64}, "sequences": [{"length": 2048, "mask": {"kind": "lambda", "sink": 4, "window": 256}}, {"length": 1024, "mask": {"kind": "shared_question"}}]})");
  const Result r = run("simulate --batch " + f + " --nodes 1 --devices-per-node 2 --block 256");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("mixed (lambda 1, shared_question 1) mask"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("causal mask"), std::string::npos) << r.out;
}

TEST(CliHardening, ZeroReferenceGradientsPass) {
  // One token: O = V, dQ = dK = 0 exactly. Each query sees only its own key: dQ = dK = 0 too.
  const std::string one = temp_file("one_token.json", R"({"heads": {"q": 4, "kv": 2, "dim": 64}, "dtype": "fp32", "sequences": [{"length": 1}]})");
  expect(run("run --ranks 1 --block 16 --batch " + one), 0, "PASS", "one token");
  std::string rows;
  for (int i = 0; i < 200; ++i) {
    if (i > 0) rows += ",";
    rows.append("[[").append(std::to_string(i)).append(",").append(std::to_string(i + 1)).append("]]");
  }
  const std::string diag = temp_file(
      "own_key.json", R"({"heads": {"q": 4, "kv": 2, "dim": 64}, "dtype": "fp32", "sequences": [{"length": 200, "mask": {"kind": "ranges", "rows": [)" +
                          rows + "]}}]}");
  expect(run("run --ranks 2 --block 64 --batch " + diag), 0, "PASS", "own key only");
}

// AddressSanitizer reserves terabytes of shadow address space at start, so a dcp built with it
// cannot start under a small `ulimit -v` (the build under test and the dcp command share flags).
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif
#else
constexpr bool kAddressSanitizer = false;
#endif

// Runs dcp with its address space limited to `kib` KiB.
Result run_limited(int kib, const std::string& args) {
  const std::string cmd =
      "sh -c 'ulimit -v " + std::to_string(kib) + "; " + std::string(DCP_CLI_PATH) + " " + args + "' 2>&1";
  Result r;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return r;
  char buf[4096];
  size_t n = 0;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) r.out.append(buf, n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(CliHardening, FailedThreadCreationJoinsAndExitsFour) {
  // A small address space lets only a few rank threads start; the rest of the world must be
  // stopped and joined, and the process must end with a message, not std::terminate.
  if (kAddressSanitizer) GTEST_SKIP() << "an address-space limit stops AddressSanitizer's start";
  expect(run_limited(400000, "run --ranks 1000 --tokens 64 --block 16"), 4, "cannot start in-process rank",
         "thread creation failure");
}

TEST(CliHardening, OutOfMemoryIsSaidInWords) {
  if (kAddressSanitizer) GTEST_SKIP() << "an address-space limit stops AddressSanitizer's start";
  expect(run_limited(600000, "run --ranks 1 --tokens 2000000 --block 4096 --q-heads 8 --kv-heads 8 --head-dim 128"), 4,
         "out of memory", "out of memory");
}

TEST(CliHardening, ShortSequencesPlanFast) {
  // Many short sequences in ring: every sequence is cut into one chunk per device.
  std::string seqs;
  for (int i = 0; i < 20000; ++i) {
    if (i > 0) seqs += ",";
    seqs.append("{\"length\": ").append(std::to_string(1 + i % 8)).append("}");
  }
  const std::string f = temp_file("short.json", R"({"heads": {"q": 4, "kv": 1, "dim": 64}, "sequences": [)" + seqs + "]}");
  const auto t0 = std::chrono::steady_clock::now();
  const Result r = run("plan --batch " + f + " --method ring --method packing");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_LT(s, 60.0);
}

}  // namespace

namespace {

// The kernel variables the command reads for the CUDA backend: a bad value is named, whether or
// not this machine has a GPU (they are read before the backend is made).
TEST(CliHardening, KernelVariablesAreCheckedAndNamed) {
  for (const char* var : {"DCP_ATTN_FORWARD", "DCP_ATTN_DETERMINISTIC", "DCP_ATTN_DETERMINISTIC_ONE_PASS", "DCP_ATTN_DETERMINISTIC_ORDERED",
                          "DCP_ATTN_DETERMINISTIC_UNIT_ROWS",
                          "DCP_ATTN_PARTIAL_CELLS", "DCP_ATTN_PERSISTENT", "DCP_ATTN_WIDE_BACKWARD", "DCP_ATTN_BACKWARD_RUN_ROWS"}) {
    setenv(var, "many", 1);
    const Result r = run("run --backend cuda --tokens 256 --block 128");
    unsetenv(var);
    expect(r, 2, var, var);
  }
}

}  // namespace
