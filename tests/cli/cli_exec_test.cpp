// End-to-end checks of dcp validate, simulate and run: exit codes, messages, and the reports'
// numbers (run: the distributed result against the dense fp64 reference, within tolerance).
#include <fstream>
#include <iterator>
#include <string>
#include <variant>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli/run_cli.h"
#include "dcp/plan.h"

namespace {

using dcp::test::run_cli;

std::string temp(const std::string& name) { return ::testing::TempDir() + "dcp_cli_exec_" + name; }

// A small DCP plan for 4 devices on one node.
std::string save_small_plan(const std::string& name, int devices = 4) {
  const std::string path = temp(name);
  const auto r = run_cli("plan --tokens 2048 --dtype fp32 --q-heads 4 --kv-heads 2 --head-dim 64 --nodes 1 --devices-per-node " +
                         std::to_string(devices) + " --block 128 --method dcp --stages 2 --save-plan " + path);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  return path;
}

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

TEST(CliValidate, SavedPlanIsValid) {
  const std::string path = save_small_plan("valid.bin");
  auto r = run_cli("validate " + path);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("VALID"), std::string::npos) << r.out;
  r = run_cli("validate --json " + path, false);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["valid"].get<bool>());
  EXPECT_EQ(j["world_size"], 4);
  EXPECT_EQ(j["stages"], 3);
  EXPECT_EQ(j["method"], "dcp");
  EXPECT_TRUE(j["violations"].empty());
}

TEST(CliValidate, CorruptOrForeignFilesExitTwoWithAClearMessage) {
  const std::string path = save_small_plan("corrupt_src.bin");
  const std::vector<char> good = read_bytes(path);
  ASSERT_GT(good.size(), 100u);

  std::vector<char> flipped = good;
  flipped[flipped.size() / 2] = static_cast<char>(flipped[flipped.size() / 2] ^ 0x5a);
  write_bytes(temp("flipped.bin"), flipped);
  auto r = run_cli("validate " + temp("flipped.bin"));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("checksum"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("flipped.bin"), std::string::npos) << r.out;

  write_bytes(temp("truncated.bin"), std::vector<char>(good.begin(), good.begin() + static_cast<long>(good.size() / 3)));
  r = run_cli("validate " + temp("truncated.bin"));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("truncated.bin"), std::string::npos) << r.out;

  write_bytes(temp("not_a_plan.bin"), std::vector<char>{'{', '}', '\n'});
  r = run_cli("validate " + temp("not_a_plan.bin"));
  EXPECT_EQ(r.exit_code, 2) << r.out;

  r = run_cli("validate " + temp("does_not_exist.bin"));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_EQ(r.out.find("terminate called"), std::string::npos);
}

TEST(CliValidate, PlanWithAMissingTileExitsOneAndSaysWhy) {
  dcp::Plan plan = dcp::load_plan(save_small_plan("mutate_src.bin"));
  bool dropped = false;
  for (auto& ins : plan.devices[1].fwd.code)
    if (auto* a = std::get_if<dcp::Attend>(&ins); a && !a->tiles.empty() && !dropped) {
      a->tiles.pop_back();
      dropped = true;
    }
  ASSERT_TRUE(dropped);
  const std::string path = temp("mutated.bin");
  dcp::save_plan(plan, path);
  auto r = run_cli("validate " + path);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("INVALID"), std::string::npos) << r.out;
  r = run_cli("validate --json " + path, false);
  EXPECT_EQ(r.exit_code, 1);
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_FALSE(j["valid"].get<bool>());
  EXPECT_FALSE(j["violations"].empty());
}

// --search-reseed and --search-tighten add candidates to the planner's search: its choice is never
// predicted slower than without them.
TEST(CliSimulate, SearchWithMoreCandidatesIsNeverPredictedSlower) {
  const std::string base = "simulate --profile ldc --seed 4 --tokens 16384 --cluster a100-p4d --nodes 2 --batches 1 "
                           "--mask shared_question --method dcp --search --dcp-only --search-blocks 512 "
                           "--search-blocks 1024 --json";
  auto plain = run_cli(base, false);
  ASSERT_EQ(plain.exit_code, 0) << plain.out;
  auto more = run_cli(base + " --search-reseed 1 --search-tighten 2", false);
  ASSERT_EQ(more.exit_code, 0) << more.out;
  const double t_plain = nlohmann::json::parse(plain.out)["methods"][0]["total_ms"];
  const double t_more = nlohmann::json::parse(more.out)["methods"][0]["total_ms"];
  EXPECT_GT(t_more, 0.0);
  EXPECT_LE(t_more, t_plain + 1e-9);
  EXPECT_EQ(run_cli(base + " --search-tighten -1").exit_code, 2);
}

// --search-threads spreads one search over threads: the same choice and predicted time.
TEST(CliSimulate, SearchThreadsChooseTheSamePlan) {
  const std::string base = "simulate --profile ldc --seed 4 --tokens 16384 --cluster a100-p4d --nodes 2 --batches 1 "
                           "--mask lambda --method dcp --search --search-blocks 512 --search-blocks 1024 "
                           "--search-reseed 1 --search-tighten 1 --json";
  auto one = run_cli(base + " --search-threads 1", false);
  ASSERT_EQ(one.exit_code, 0) << one.out;
  auto three = run_cli(base + " --search-threads 3", false);
  ASSERT_EQ(three.exit_code, 0) << three.out;
  const auto j1 = nlohmann::json::parse(one.out)["methods"][0];
  const auto j3 = nlohmann::json::parse(three.out)["methods"][0];
  EXPECT_EQ(j1["total_ms"], j3["total_ms"]);
  EXPECT_EQ(j1["inter_bytes"], j3["inter_bytes"]);
  EXPECT_EQ(j1["planner_choices"], j3["planner_choices"]);
  EXPECT_FALSE(j1["planner_choices"].empty());
  EXPECT_EQ(run_cli(base + " --search-threads -1").exit_code, 2);
}

TEST(CliSimulate, EveryMethodHasAPositivePredictedTime) {
  const std::string trace = temp("trace.json");
  auto r = run_cli("simulate --profile ldc --seed 4 --tokens 32768 --cluster a100-p4d --nodes 2 --batches 2 --block 1024 "
                   "--json --trace " + trace,
                   false);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["batches"], 2);
  const auto& methods = j["methods"];
  ASSERT_EQ(methods.size(), 6u);
  EXPECT_EQ(methods[0]["method"], "dcp");
  const double dcp_total = methods[0]["total_ms"];
  EXPECT_GT(dcp_total, 0.0);
  for (const auto& m : methods) {
    EXPECT_GT(m["fwd_ms"].get<double>(), 0.0) << m["method"];
    EXPECT_GT(m["bwd_ms"].get<double>(), 0.0) << m["method"];
    EXPECT_NEAR(m["total_ms"].get<double>(), m["fwd_ms"].get<double>() + m["bwd_ms"].get<double>(), 1e-9);
    EXPECT_NEAR(m["dcp_speedup"].get<double>(), m["total_ms"].get<double>() / dcp_total, 1e-9) << m["method"];
    EXPECT_LE(m["dcp_speedup_min"].get<double>(), m["dcp_speedup"].get<double>() + 1e-12);
    EXPECT_GE(m["dcp_speedup_max"].get<double>(), m["dcp_speedup"].get<double>() - 1e-12);
    const double hidden = m["comm_hidden_fraction"];
    EXPECT_GE(hidden, 0.0);
    EXPECT_LE(hidden, 1.0);
    EXPECT_EQ(m["per_batch"].size(), 2u);
  }
  std::ifstream in(trace);
  const auto t = nlohmann::json::parse(in);
  EXPECT_FALSE(t.empty());

  r = run_cli("simulate --tokens 16384 --nodes 2 --batches 1");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  for (const char* name : {"dcp", "ring", "zigzag", "ulysses", "a2a_p2p", "packing", "speed-up"})
    EXPECT_NE(r.out.find(name), std::string::npos) << name;
}

TEST(CliSimulate, LayerMasksPredictEveryKindOnOnePlacement) {
  auto r = run_cli("simulate --layer-masks lambda*3+causal --profile ldc --seed 4 --tokens 32768 --cluster a100-p4d "
                   "--nodes 2 --batches 2 --block 1024 --json",
                   false);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["kinds"], nlohmann::json::array({"lambda", "causal"}));
  EXPECT_EQ(j["layers"], nlohmann::json::array({3.0, 1.0}));
  const auto& methods = j["methods"];
  ASSERT_EQ(methods.size(), 7u);  // dcp, the five static layouts, dcp with every kind alone
  EXPECT_EQ(methods[0]["method"], "dcp");
  EXPECT_EQ(methods[6]["method"], "dcp (each kind alone)");
  for (const auto& m : methods) {
    const double lambda = m["kind_ms"][0], causal = m["kind_ms"][1];
    EXPECT_GT(lambda, 0.0) << m["method"];
    EXPECT_GT(causal, lambda) << m["method"];  // a causal layer has more work than a lambda one
    EXPECT_NEAR(m["step_ms"].get<double>(), 3 * lambda + causal, 1e-9) << m["method"];
    EXPECT_NEAR(m["dcp_speedup"].get<double>(), m["step_ms"].get<double>() / methods[0]["step_ms"].get<double>(), 1e-9);
  }
  // Every kind on the lead's blocks: DCP's candidates are a subset, so never predicted faster.
  auto same = run_cli("simulate --layer-masks lambda*3+causal --profile ldc --seed 4 --tokens 32768 --cluster a100-p4d "
                      "--nodes 2 --batches 2 --block 1024 --json --same-kind-blocks",
                      false);
  ASSERT_EQ(same.exit_code, 0) << same.out;
  const auto js = nlohmann::json::parse(same.out);
  EXPECT_GE(js["methods"][0]["step_ms"].get<double>(), methods[0]["step_ms"].get<double>() * (1 - 1e-12));
  r = run_cli("simulate --layer-masks lambda*0+causal --tokens 8192 --nodes 1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("--layer-masks 'lambda*0+causal': '*0' must repeat a kind a positive number of times"),
            std::string::npos) << r.out;
  r = run_cli("simulate --layer-masks sliding+causal --tokens 8192 --nodes 1");
  EXPECT_NE(r.out.find("'sliding' is not a mask kind"), std::string::npos) << r.out;
}

TEST(CliSimulate, BlockSweepTablesAndChart) {
  const std::string svg = temp("sweep.svg");
  auto r = run_cli("simulate --sweep block --tokens 16384 --nodes 2 --batches 1 --json --svg " + svg, false);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["x"].size(), 4u);
  ASSERT_EQ(j["series"].size(), 4u);
  for (const auto& s : j["series"]) {
    ASSERT_EQ(s["points"].size(), 4u);
    for (const auto& p : s["points"]) EXPECT_GE(p["inter_bytes"].get<double>(), 0.0);
  }
  const std::vector<char> bytes = read_bytes(svg);
  const std::string text(bytes.begin(), bytes.end());
  EXPECT_EQ(text.rfind("<svg", 0), 0u);
  size_t polylines = 0;
  for (size_t at = text.find("<polyline"); at != std::string::npos; at = text.find("<polyline", at + 1)) ++polylines;
  EXPECT_EQ(polylines, 8u);  // 4 masks x (volume chart + planning-time chart)
  EXPECT_EQ(run_cli("simulate --sweep nope").exit_code, 2);
}

struct RunCase {
  std::string placement;
  std::string mask;
  std::string dtype;
  int stages;
};

TEST(CliRun, ThreeRanksMatchTheDenseReference) {
  const RunCase cases[] = {
      {"dcp", "causal", "fp32", 4},          {"dcp", "shared_question", "fp32", 2},
      {"dcp", "mixed", "bf16", 3},           {"ring", "lambda", "fp32", 1},
      {"zigzag", "causal", "bf16", 2},       {"ulysses", "causal_blockwise", "fp32", 3},
      {"a2a_p2p", "full", "fp32", 2},        {"packing", "causal", "fp32", 1},
  };
  for (const RunCase& c : cases) {
    const std::string args = "run --ranks 3 --tokens 1024 --block 64 --profile ldc --seed 5 --json --placement " +
                             c.placement + " --mask " + c.mask + " --dtype " + c.dtype + " --stages " +
                             std::to_string(c.stages);
    SCOPED_TRACE(args);
    const auto r = run_cli(args, false);
    ASSERT_EQ(r.exit_code, 0) << r.out;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_TRUE(j["pass"].get<bool>());
    EXPECT_EQ(j["ranks"], 3);
    EXPECT_EQ(j["comm"], "local");
    EXPECT_EQ(j["placement"], c.placement);
    const double tol = c.dtype == "bf16" ? 2e-2 : 1e-5;
    for (const char* t : {"O", "LSE", "dQ", "dK", "dV"}) {
      const double err = j["errors"][t]["max_rel"];
      EXPECT_LT(err, tol) << t;
      EXPECT_GE(err, 0.0) << t;
    }
    int64_t tokens = 0;
    for (const auto& rank : j["per_rank"]) tokens += rank["tokens"].get<int64_t>();
    EXPECT_EQ(tokens, j["batch"]["tokens"].get<int64_t>());
  }
}

TEST(CliRun, PlanForAnotherWorldSizeFailsClearly) {
  const std::string path = save_small_plan("four_ranks.bin");
  const auto r = run_cli("run --plan " + path + " --ranks 2");
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("world size 4"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("terminate called"), std::string::npos);
  // The same plan on its own world size runs and passes.
  const auto ok = run_cli("run --plan " + path + " --ranks 4 --json", false);
  ASSERT_EQ(ok.exit_code, 0) << ok.out;
  EXPECT_TRUE(nlohmann::json::parse(ok.out)["pass"].get<bool>());
}

TEST(CliRun, BadOptionsExitTwo) {
  EXPECT_EQ(run_cli("run --placement nope --ranks 2").exit_code, 2);
  EXPECT_EQ(run_cli("run --backend cuda --ranks 2").exit_code, 2);  // GPU ranks need mpirun
  EXPECT_EQ(run_cli("run --backend tpu --ranks 2").exit_code, 2);
  EXPECT_EQ(run_cli("run --ranks 3 --nodes 2").exit_code, 2);
  EXPECT_EQ(run_cli("run --ranks 0").exit_code, 2);
  EXPECT_EQ(run_cli("run --stages 0 --ranks 2").exit_code, 2);
}

}  // namespace

namespace {

// dcp bench --trace: the measured timeline of every instruction next to the simulator's.
TEST(CliBench, TraceWritesMeasuredAndSimulatedTimelines) {
  const std::string prefix = ::testing::TempDir() + "dcp_bench_trace";
  const auto r = dcp::test::run_cli("bench --backend cpu --profile ldc --tokens 2048 --q-heads 4 --kv-heads 2 "
                                    "--head-dim 64 --block 256 --layers 1 --iters 1 --warmup 0 --method dcp --trace " +
                                    prefix);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  std::ifstream measured(prefix + ".dcp.rank0.json"), simulated(prefix + ".dcp.sim.json");
  ASSERT_TRUE(measured.good());
  ASSERT_TRUE(simulated.good());
  const auto m = nlohmann::json::parse(measured);
  const auto s = nlohmann::json::parse(simulated);
  ASSERT_FALSE(m["traceEvents"].empty());
  EXPECT_FALSE(s["traceEvents"].empty());
  int fwd = 0, bwd = 0;
  for (const auto& e : m["traceEvents"]) {
    EXPECT_GE(e["dur"].get<double>(), 0.0);
    (e["tid"] == 0 ? fwd : bwd)++;
  }
  EXPECT_GT(fwd, 0);
  EXPECT_GT(bwd, 0);
}

}  // namespace

namespace {

// dcp bench --outputs-in-place: plans whose owned outputs accumulate in their local tensors run
// through the command, dcp and a static layout alike (--check compares with the CPU backend, which
// on a GPU is the CUDA backend's check; the executor tests compare these plans with the dense
// reference).
TEST(CliBench, OutputsInPlaceMatchTheReference) {
  const std::string json = ::testing::TempDir() + "dcp_bench_in_place.json";
  const auto r = dcp::test::run_cli("bench --backend cpu --profile ldc --tokens 2048 --q-heads 4 --kv-heads 2 "
                                    "--head-dim 64 --block 256 --layers 1 --iters 1 --warmup 0 --method dcp "
                                    "--method zigzag --check --outputs-in-place --json " + json);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  std::ifstream in(json);
  const auto j = nlohmann::json::parse(in);
  ASSERT_EQ(j["rows"].size(), 2u);
  for (const auto& row : j["rows"]) {
    EXPECT_GE(row["check_max_rel_err"].get<double>(), 0.0) << row["method"];
    EXPECT_LT(row["check_max_rel_err"].get<double>(), 1e-4) << row["method"];
  }
}

// dcp bench's cluster: auto (the default) is the GPU's measured preset, h200-nvl on the CPU backend;
// a named preset is taken as given. The JSON records the cluster and the simulator's calibration.
TEST(CliBench, ClusterAutoAndNamedPresetsAreRecorded) {
  const std::string common = "bench --backend cpu --profile ldc --tokens 2048 --q-heads 4 --kv-heads 2 --head-dim 64 "
                             "--block 256 --layers 1 --iters 1 --warmup 0 --method dcp";
  const struct {
    const char* flag;
    const char* cluster;
    const char* calibration;
  } cases[] = {{"", "h200-nvl", "h200-measured-subtiles"},
               {" --cluster auto", "h200-nvl", "h200-measured-subtiles"},
               {" --cluster h100-sxm", "h100-sxm", "h100-measured-subtiles"}};
  for (const auto& c : cases) {
    const std::string json = ::testing::TempDir() + "dcp_bench_cluster.json";
    const auto r = dcp::test::run_cli(common + c.flag + " --json " + json);
    ASSERT_EQ(r.exit_code, 0) << c.flag << ": " << r.out;
    EXPECT_NE(r.out.find(std::string("cluster ") + c.cluster), std::string::npos) << r.out;
    std::ifstream in(json);
    const auto j = nlohmann::json::parse(in);
    EXPECT_EQ(j["cluster"], c.cluster) << c.flag;
    EXPECT_EQ(j["sim_calibration"], c.calibration) << c.flag;
  }
  EXPECT_NE(dcp::test::run_cli(common + " --cluster h300").exit_code, 0);
}

// dcp bench --energy-iters: the further steps run, and without a GPU meter (the CPU backend; on a
// GPU machine without NVML) the command says why there are no energy figures and writes none.
TEST(CliBench, EnergyItersWithoutAMeterSaysWhy) {
  const std::string json = ::testing::TempDir() + "dcp_bench_energy.json";
  const auto r = dcp::test::run_cli("bench --backend cpu --profile ldc --tokens 2048 --q-heads 4 --kv-heads 2 "
                                    "--head-dim 64 --block 256 --layers 1 --iters 1 --warmup 0 --method dcp "
                                    "--energy-iters 2 --json " + json);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("--energy-iters: no energy figures: the CPU backend"), std::string::npos) << r.out;
  std::ifstream in(json);
  const auto j = nlohmann::json::parse(in);
  ASSERT_EQ(j["rows"].size(), 1u);
  EXPECT_FALSE(j["rows"][0].contains("fwd_energy"));
  EXPECT_NE(dcp::test::run_cli("bench --backend cpu --energy-iters -1").exit_code, 0);
}

// dcp bench --search: dcp runs the planner's choice (one of the candidates, DCP's or a static
// layout's; --dcp-only: DCP's), reported in the table and the JSON; a calibration file that does
// not exist is a clear error.
TEST(CliBench, SearchReportsThePlannersChoice) {
  const std::string json = ::testing::TempDir() + "dcp_bench_search.json";
  const std::string common = "bench --backend cpu --profile ldc --tokens 2048 --q-heads 4 --kv-heads 2 --head-dim 64 "
                             "--block 256 --layers 1 --iters 1 --warmup 0 --method dcp --search --search-blocks 256 "
                             "--search-blocks 512 --search-eps 0.05 --search-eps 0.1";
  // The static layouts are candidates too: the choice is one of DCP's or a static layout.
  const auto all = dcp::test::run_cli(common + " --json " + json);
  ASSERT_EQ(all.exit_code, 0) << all.out;
  EXPECT_NE(all.out.find("planner chose "), std::string::npos) << all.out;
  {
    std::ifstream in(json);
    const std::string chosen = nlohmann::json::parse(in)["rows"][0]["chosen"].get<std::string>();
    EXPECT_TRUE(chosen.rfind("B 256 ", 0) == 0 || chosen.rfind("B 512 ", 0) == 0 || chosen.rfind("static layout ", 0) == 0)
        << chosen;
  }
  // --dcp-only: DCP's own candidates alone.
  const auto r = dcp::test::run_cli(common + " --dcp-only --json " + json);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("planner chose B "), std::string::npos) << r.out;
  std::ifstream in(json);
  const auto j = nlohmann::json::parse(in);
  EXPECT_TRUE(j["search"].get<bool>());
  const std::string chosen = j["rows"][0]["chosen"].get<std::string>();
  EXPECT_TRUE(chosen.rfind("B 256 ", 0) == 0 || chosen.rfind("B 512 ", 0) == 0) << chosen;
  // Without --search, --balance-time weighs dcp's tiles by the calibration's per-kind rates.
  const auto timed = dcp::test::run_cli(
      "bench --backend cpu --profile ldc --tokens 2048 --q-heads 4 --kv-heads 2 --head-dim 64 --block 256 --layers 1 "
      "--iters 1 --warmup 0 --method dcp --balance-time --calibration " DCP_SOURCE_DIR "/data/calibration/h200_measured.json");
  EXPECT_EQ(timed.exit_code, 0) << timed.out;
  const auto bad = dcp::test::run_cli(common + " --calibration /nonexistent/cal.json");
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
  EXPECT_NE(bad.out.find("cal.json"), std::string::npos) << bad.out;
}

}  // namespace
