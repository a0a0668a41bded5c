// End-to-end checks of the dcp command: exit codes, error messages on bad input, and the JSON
// report agreeing with the library and with itself.
#include <array>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli/run_cli.h"
#include "dcp/plan.h"

namespace {

using Result = dcp::test::CliResult;
Result run(const std::string& args) { return dcp::test::run_cli(args); }

std::string input(const std::string& name) { return std::string(DCP_INPUTS_DIR) + "/" + name; }

TEST(Cli, HelpExplainsSubcommands) {
  Result r = run("--help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("plan"), std::string::npos);
  Result p = run("plan --help");
  EXPECT_EQ(p.exit_code, 0);
  EXPECT_NE(p.out.find("--block"), std::string::npos);
  EXPECT_NE(p.out.find("--json"), std::string::npos);
}

TEST(Cli, BadInputExitsTwoAndNamesTheField) {
  struct Case {
    std::string args;
    std::string expect;
  };
  const Case cases[] = {
      {"plan --batch " + input("bad_batch_unknown_mask_kind.json"), "kind"},
      {"plan --batch " + input("bad_batch_malformed.json"), "bad_batch_malformed.json"},
      {"plan --batch " + input("bad_batch_negative_length.json"), "length"},
      {"plan --batch " + input("bad_batch_kv_not_dividing.json"), "kv"},
      {"plan --batch " + input("bad_batch_ranges_unsorted.json"), "rows"},
      {"plan --batch " + input("bad_batch_shared_question_exceeds.json"), "question"},
      {"plan --block 100", "100"},
      {"plan --cluster a100-p4d --nodes 0", "nodes"},
      {"plan --cluster " + input("bad_cluster_zero_devices.json"), "devices_per_node"},
      {"plan --cluster no-such-cluster", "no-such-cluster"},
      {"plan --profile nope", "nope"},
      {"plan --eps-compute -1", "eps"},
      {"plan --batch /nonexistent/batch.json", "/nonexistent/batch.json"},
  };
  for (const auto& c : cases) {
    Result r = run(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.expect), std::string::npos) << c.args << "\n" << r.out;
    EXPECT_EQ(r.out.find("terminate called"), std::string::npos) << c.args;
  }
}

TEST(Cli, JsonReportIsConsistent) {
  Result r = run("plan --profile ldc --seed 2 --tokens 32768 --cluster a100-p4d --nodes 2 --block 512 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  const int64_t tokens = j["batch"]["tokens"];
  EXPECT_GT(tokens, 32768 * 3 / 4);
  EXPECT_LE(tokens, 32768);
  EXPECT_GT(j["batch"]["mask_area"].get<int64_t>(), 0);
  const double fwd = j["batch"]["forward_flops"];
  const auto& placements = j["placements"];
  ASSERT_GE(placements.size(), 6u);  // dcp + five baselines
  for (const auto& p : placements) {
    const auto& devs = p["devices"];
    ASSERT_EQ(devs.size(), 16u) << p["method"];
    double sum_fwd = 0;
    int64_t sum_tokens = 0, sent = 0, received = 0;
    for (const auto& d : devs) {
      sum_fwd += d["fwd_flops"].get<double>();
      sum_tokens += d["tokens"].get<int64_t>();
      sent += d["send_bytes"].get<int64_t>();
      received += d["recv_bytes"].get<int64_t>();
    }
    // Every placement computes the whole mask once and owns every token once.
    EXPECT_NEAR(sum_fwd / fwd, 1.0, 1e-9) << p["method"];
    EXPECT_EQ(sum_tokens, tokens) << p["method"];
    EXPECT_EQ(sent, received) << p["method"];
    EXPECT_EQ(sent, p["intra_bytes"].get<int64_t>() + p["inter_bytes"].get<int64_t>()) << p["method"];
    EXPECT_GE(p["compute_imbalance"].get<double>(), 1.0 - 1e-12) << p["method"];
  }
}

TEST(Cli, WritesTheBatchItUsedAndReadsItBack) {
  const std::string path = ::testing::TempDir() + "dcp_cli_batch.json";
  Result a = run("plan --profile longalign --seed 5 --tokens 65536 --nodes 1 --method ring --json --write-batch " + path);
  ASSERT_EQ(a.exit_code, 0) << a.out;
  Result b = run("plan --batch " + path + " --nodes 1 --method ring --json");
  ASSERT_EQ(b.exit_code, 0) << b.out;
  auto ja = nlohmann::json::parse(a.out), jb = nlohmann::json::parse(b.out);
  EXPECT_EQ(ja["batch"], jb["batch"]);
  EXPECT_EQ(ja["placements"][0]["inter_bytes"], jb["placements"][0]["inter_bytes"]);
  EXPECT_EQ(ja["placements"][0]["devices"], jb["placements"][0]["devices"]);
}

// --cluster auto is the preset measured on this machine's GPU, h200-nvl without one: a Hopper
// preset, sized by --nodes / --devices-per-node like any other.
TEST(Cli, ClusterAutoIsAMeasuredHopperPreset) {
  Result r = run("simulate --profile ldc --tokens 8192 --mask causal --cluster auto --nodes 1 --devices-per-node 2 "
                 "--batches 1 --method dcp");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const bool h200 = r.out.find("1 x 2 devices (h200-nvl), calibration h200-measured-subtiles") != std::string::npos;
  const bool h100 = r.out.find("1 x 2 devices (h100-sxm), calibration h100-measured-subtiles") != std::string::npos;
  EXPECT_TRUE(h200 || h100) << r.out;
}

// A corpus's document lengths packed into batches: in the file's order, next-fit to --tokens.
TEST(Cli, PacksTheDocumentLengthsOfAFile) {
  const std::string lengths = ::testing::TempDir() + "dcp_cli_lengths.txt";
  const std::string batch = ::testing::TempDir() + "dcp_cli_lengths_batch.json";
  std::FILE* f = std::fopen(lengths.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("# document lengths\n4000\n3000\n2500\n6000\n2000\n", f);
  std::fclose(f);
  Result a = run("plan --lengths " + lengths + " --lengths-in-order --tokens 10000 --nodes 1 --method ring --json "
                 "--write-batch " + batch);
  ASSERT_EQ(a.exit_code, 0) << a.out;
  EXPECT_EQ(nlohmann::json::parse(a.out)["batch"]["tokens"], 9500);
  std::vector<int64_t> got;
  std::ifstream written(batch);
  const nlohmann::json used = nlohmann::json::parse(written);
  for (const auto& s : used["sequences"]) got.push_back(s["length"]);
  EXPECT_EQ(got, (std::vector<int64_t>{4000, 3000, 2500}));
  // The second batch (--index 1) starts where the first stopped.
  Result b = run("plan --lengths " + lengths + " --lengths-in-order --tokens 10000 --index 1 --nodes 1 --method ring --json");
  ASSERT_EQ(b.exit_code, 0) << b.out;
  EXPECT_EQ(nlohmann::json::parse(b.out)["batch"]["tokens"], 8000);  // 6000 + 2000, then 4000 does not fit
  // Shuffled epochs (the default) and a simulation run too.
  Result c = run("simulate --lengths " + lengths + " --tokens 10000 --batches 2 --nodes 1 --json");
  ASSERT_EQ(c.exit_code, 0) << c.out;

  Result both = run("plan --lengths " + lengths + " --profile ldc");
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_NE(both.out.find("--profile excludes --lengths"), std::string::npos) << both.out;
  f = std::fopen(lengths.c_str(), "w");
  std::fputs("4000\nlots\n", f);
  std::fclose(f);
  Result bad = run("plan --lengths " + lengths);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.out.find(lengths + ":line 2"), std::string::npos) << bad.out;
}

TEST(Cli, ExampleBatchPlans) {
  Result r = run(std::string("plan --batch ") + DCP_EXAMPLES_DIR + "/batch_example.json --nodes 1 --block 256");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("zigzag"), std::string::npos);
}

TEST(Cli, SameSeedSameReport) {
  const std::string args = "plan --profile ldc --seed 9 --tokens 65536 --nodes 2 --block 1024 --json";
  Result a = run(args), b = run(args);
  ASSERT_EQ(a.exit_code, 0);
  auto ja = nlohmann::json::parse(a.out), jb = nlohmann::json::parse(b.out);
  for (auto* j : {&ja, &jb}) {
    j->erase("block_table_ms");
    for (auto& p : (*j)["placements"]) p.erase("plan_ms");
  }
  EXPECT_EQ(ja, jb);
}

}  // namespace

namespace {

// The memory `dcp plan` reports for a plan is what the executor allocates: plan_memory() of the
// very plan it saves (the executor tests assert allocation == plan_memory).
TEST(Cli, ReportedPlanMemoryIsTheExecutorsSizing) {
  const std::string path = ::testing::TempDir() + "dcp_cli_mem.plan";
  Result r = run("plan --profile ldc --seed 4 --tokens 32768 --q-heads 8 --kv-heads 2 --nodes 2 --block 512 "
                 "--method dcp --method zigzag --save-plan " + path + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  const dcp::Plan plan = dcp::load_plan(path);
  bool found = false;
  for (const auto& p : j["placements"]) {
    if (p["method"] != "dcp") continue;
    found = true;
    const auto& devs = p["devices"];
    ASSERT_EQ(static_cast<int>(devs.size()), plan.header.world_size);
    double sum = 0, mx = 0;
    for (int d = 0; d < plan.header.world_size; ++d) {
      const int64_t want = dcp::plan_memory(plan, d).peak_bytes;
      EXPECT_EQ(devs[static_cast<size_t>(d)]["plan_memory_bytes"].get<int64_t>(), want) << "device " << d;
      sum += static_cast<double>(want);
      mx = std::max(mx, static_cast<double>(want));
    }
    EXPECT_NEAR(p["plan_memory_imbalance"].get<double>(), mx / (sum / plan.header.world_size), 1e-9);
  }
  EXPECT_TRUE(found);
}

}  // namespace
