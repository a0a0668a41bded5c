// bench_placement: quality and speed of the DCP placement against the static baselines.
//
// Settings (issue 3): "dryrun" = 65536 tokens on 16 devices (8 nodes x 2, a100-p4d links),
// "micro" = 131072 tokens on 32 devices (4 nodes x 8, a100-p4d). Attention shape 8 query / 2 KV
// heads, head dim 128, bf16; B = 1024. Instances: profiles ldc and longalign (generate_batches,
// fixed seeds) at scales 0.5/1/2/4 with masks causal, lambda, causal_blockwise, shared_question.
// Per instance: median planning time (block table + place_dcp, one core), DCP inter-node bytes
// against the best static baseline (min of a2a_p2p and zigzag, by compute_metrics), balance,
// and the connectivity objective of the built-in backend against METIS. Sweeps: inter-node
// bytes vs B and vs eps_compute on the dry-run setting (ldc, scale 1 and 4, causal + lambda).
//
// Usage: bench_placement [--quick] [--batches N] [--json PATH] [--no-sweeps] [--no-metis] [--no-zoltan]
//                        [--only SETTING] [--profile P] [--mask M] [--scale S] [--threads T]
// --threads: PlacementOptions::threads (default 1, the one-core budgets); with more, the wall
// time is the figure (the process CPU time sums every thread).
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "dcp/baselines.h"
#include "dcp/blocks.h"
#include "dcp/metrics.h"
#include "dcp/partition.h"
#include "dcp/profiles.h"

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

struct Setting {
  std::string name;
  int64_t tokens;
  dcp::Cluster cluster;
  double target_ms;
};

std::vector<Setting> settings() {
  dcp::Cluster dry = dcp::cluster_preset("a100-p4d", 8);
  dry.devices_per_node = 2;
  return {{"dryrun", 65536, dry, 50.0},
          {"micro", 131072, dcp::cluster_preset("a100-p4d", 4), 200.0},
          {"large", 1048576, dcp::cluster_preset("a100-p4d", 32), 1000.0}};
}

dcp::AttentionShape shape() {
  return {.q_heads = 8, .kv_heads = 2, .head_dim = 128, .dtype = dcp::DType::BF16};
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Instance {
  std::string setting, profile, mask;
  double scale = 1;
};

struct Row {
  Instance inst;
  int batches = 0;
  double plan_ms = 0;            // median wall time
  double plan_cpu_ms = 0;        // median CPU time of the process (robust to other jobs)
  double dcp_inter = 0;          // sums over batches, bytes
  double dcp_intra = 0;
  double base_inter = 0;         // best static baseline per batch, summed
  double a2a_inter = 0, zigzag_inter = 0;
  double ratio_max = 0;          // worst per-batch dcp / best baseline
  double compute_imb = 0, memory_imb = 0;  // worst over batches
  double full_memory_imb = 0;              // worst over batches: owned + copies + partials
  int violated = 0;              // batches with a violated bound
  int infeasible = 0;            // of those, batches where no placement can meet eps_memory
  double builtin_obj = 0, metis_obj = 0;   // connectivity objective sums
  double metis_inter = 0;
  int metis_violated = 0;
  double zoltan_obj = 0, zoltan_inter = 0;  // only on the instances Zoltan runs on
  int zoltan_violated = 0;
};

std::vector<dcp::Batch> make_batches(const Setting& st, const std::string& profile, double scale,
                                     const std::string& mask, int count) {
  dcp::ProfileOptions po;
  po.profile = dcp::parse_profile(profile);
  po.seed = 20251129;
  po.token_budget = st.tokens;
  po.scale = scale;
  po.mask = mask;
  po.shape = shape();
  return dcp::generate_batches(po, count);
}

int64_t baseline_inter(dcp::BaselineKind kind, const dcp::Batch& b, const dcp::BlockOptions& bo,
                       const dcp::Cluster& c) {
  const dcp::PlacedBatch pb = dcp::make_baseline(kind, b, bo, c);
  return dcp::compute_metrics(pb.table, pb.placement, c).inter_bytes();
}

double g_node_eps_factor = dcp::PlacementOptions{}.node_eps_factor;
int g_initial_starts = dcp::PlacementOptions{}.initial_starts;
int g_threads = 1;

// True when no placement can meet the memory bound: token blocks are indivisible and a device
// holds at most floor(cap / s) blocks of the largest size s, so more such blocks than
// devices x that count cannot be placed.
bool memory_bound_infeasible(const dcp::BlockTable& t, const dcp::Cluster& c,
                             const dcp::PlacementOptions& po) {
  const dcp::PlacementHypergraph h = dcp::build_placement_hypergraph(t);
  int64_t total = 0, largest = 0;
  for (int b = 0; b < h.num_token_blocks; ++b) {
    total += h.memory_bytes[h.block_vertex(b)];
    largest = std::max(largest, h.memory_bytes[h.block_vertex(b)]);
  }
  const double cap = (1 + po.eps_memory) * static_cast<double>(total) / c.num_devices();
  int64_t num_largest = 0;
  for (int b = 0; b < h.num_token_blocks; ++b) num_largest += h.memory_bytes[h.block_vertex(b)] == largest;
  const auto per_device = static_cast<int64_t>(cap / static_cast<double>(largest));
  return num_largest > per_device * c.num_devices();
}

Row run_instance(const Setting& st, const Instance& inst, int count, bool with_metis,
                 int64_t block_size, double eps_c, bool with_zoltan = false) {
  Row row;
  row.inst = inst;
  const auto batches = make_batches(st, inst.profile, inst.scale, inst.mask, count);
  const dcp::BlockOptions bo{.block_size = block_size, .q_heads_per_group = 0};
  dcp::PlacementOptions po;
  po.eps_compute = eps_c;
  po.node_eps_factor = g_node_eps_factor;
  po.initial_starts = g_initial_starts;
  po.threads = g_threads;
  std::vector<double> ms, cpu_ms;
  for (const dcp::Batch& b : batches) {
    const auto t0 = Clock::now();
    const std::clock_t c0 = std::clock();
    const dcp::BlockTable table = dcp::build_block_table(b, bo);
    const dcp::DcpPlacement d = dcp::place_dcp(table, st.cluster, po);
    cpu_ms.push_back(1e3 * static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC);
    ms.push_back(ms_since(t0));
    const dcp::PlacementReport& r = d.report;
    const double a2a = static_cast<double>(baseline_inter(dcp::BaselineKind::A2AP2P, b, bo, st.cluster));
    const double zz = static_cast<double>(baseline_inter(dcp::BaselineKind::Zigzag, b, bo, st.cluster));
    const double best = std::min(a2a, zz);
    row.dcp_inter += static_cast<double>(r.inter_bytes);
    row.dcp_intra += static_cast<double>(r.intra_bytes);
    row.base_inter += best;
    row.a2a_inter += a2a;
    row.zigzag_inter += zz;
    row.ratio_max = std::max(row.ratio_max, best > 0 ? static_cast<double>(r.inter_bytes) / best : 0.0);
    row.compute_imb = std::max(row.compute_imb, r.compute_imbalance);
    row.memory_imb = std::max(row.memory_imb, r.memory_imbalance);
    row.full_memory_imb = std::max(row.full_memory_imb, r.full_memory_imbalance);
    row.violated += r.balanced() ? 0 : 1;
    if (!r.balanced() && memory_bound_infeasible(table, st.cluster, po)) ++row.infeasible;
    row.builtin_obj += r.objective;
    if (with_metis) {
      dcp::PlacementOptions pm = po;
      pm.partitioner = dcp::PartitionerKind::Metis;
      const dcp::DcpPlacement m = dcp::place_dcp(table, st.cluster, pm);
      row.metis_obj += m.report.objective;
      row.metis_inter += static_cast<double>(m.report.inter_bytes);
      row.metis_violated += m.report.balanced() ? 0 : 1;
    }
    if (with_zoltan) {
      dcp::PlacementOptions pz = po;
      pz.partitioner = dcp::PartitionerKind::Zoltan;
      const dcp::DcpPlacement z = dcp::place_dcp(table, st.cluster, pz);
      row.zoltan_obj += z.report.objective;
      row.zoltan_inter += static_cast<double>(z.report.inter_bytes);
      row.zoltan_violated += z.report.balanced() ? 0 : 1;
    }
    ++row.batches;
  }
  row.plan_ms = median(ms);
  row.plan_cpu_ms = median(cpu_ms);
  return row;
}

nlohmann::json to_json(const Row& r) {
  return {{"setting", r.inst.setting}, {"profile", r.inst.profile}, {"scale", r.inst.scale},
          {"mask", r.inst.mask}, {"batches", r.batches}, {"plan_ms_median", r.plan_ms},
          {"plan_cpu_ms_median", r.plan_cpu_ms},
          {"dcp_inter_bytes", r.dcp_inter}, {"dcp_intra_bytes", r.dcp_intra},
          {"best_static_inter_bytes", r.base_inter}, {"a2a_p2p_inter_bytes", r.a2a_inter},
          {"zigzag_inter_bytes", r.zigzag_inter},
          {"ratio", r.base_inter > 0 ? r.dcp_inter / r.base_inter : 0.0},
          {"ratio_worst_batch", r.ratio_max}, {"compute_imbalance_max", r.compute_imb},
          {"memory_imbalance_max", r.memory_imb},
          {"full_memory_imbalance_max", r.full_memory_imb}, {"batches_violated", r.violated},
          {"batches_memory_infeasible", r.infeasible},
          {"builtin_objective", r.builtin_obj}, {"metis_objective", r.metis_obj},
          {"metis_inter_bytes", r.metis_inter}, {"metis_batches_violated", r.metis_violated},
          {"zoltan_objective", r.zoltan_obj}, {"zoltan_inter_bytes", r.zoltan_inter},
          {"zoltan_batches_violated", r.zoltan_violated}};
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path, only, only_profile, only_mask;
  double only_scale = 0;
  int count = 20;
  bool sweeps = true, with_metis = true;
  // Zoltan (when built) runs on the scale-1 instances only: it is a reference point, and slower.
  bool with_zoltan = false;
  for (auto k : dcp::available_partitioners()) with_zoltan = with_zoltan || k == dcp::PartitionerKind::Zoltan;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--quick") count = 3;
    else if (a == "--batches") count = std::stoi(next());
    else if (a == "--json") json_path = next();
    else if (a == "--no-sweeps") sweeps = false;
    else if (a == "--no-metis") with_metis = false;
    else if (a == "--no-zoltan") with_zoltan = false;
    else if (a == "--only") only = next();
    else if (a == "--profile") only_profile = next();
    else if (a == "--mask") only_mask = next();
    else if (a == "--scale") only_scale = std::stod(next());
    else if (a == "--node-eps-factor") g_node_eps_factor = std::stod(next());
    else if (a == "--starts") g_initial_starts = std::stoi(next());
    else if (a == "--threads") g_threads = std::stoi(next());
    else {
      std::fprintf(stderr,
                   "usage: %s [--quick] [--batches N] [--json PATH] [--no-sweeps] [--no-metis] [--no-zoltan] "
                   "[--only dryrun|micro|large] [--profile P] [--mask M] [--scale S] [--threads T]\n",
                   argv[0]);
      return 2;
    }
  }
#ifndef NDEBUG
  fmt::print("warning: assertions are on (not a Release build); timings are not representative\n");
#endif
  const std::vector<std::string> profiles{"ldc", "longalign"};
  const std::vector<double> scales{0.5, 1, 2, 4};
  const std::vector<std::string> masks{"causal", "lambda", "causal_blockwise", "shared_question"};
  nlohmann::json rows = nlohmann::json::array();
  fmt::print("{:<7} {:<10} {:>5} {:<17} {:>7} {:>7} {:>10} {:>10} {:>6} {:>6} {:>6} {:>6} {:>6} {:>5} {:>8} {:>9}\n",
             "setting", "profile", "scale", "mask", "plan_ms", "cpu_ms", "dcp_GB", "static_GB", "ratio",
             "worst", "c_imb", "m_imb", "f_imb", "viol", "bi/metis", "bi/zoltan");
  fmt::print("(viol = batches violating a bound / of which provably infeasible for eps_memory)\n");
  std::map<std::string, std::vector<double>> plan_ms_by_setting, plan_cpu_ms_by_setting;
  for (const Setting& st : settings()) {
    // The large setting (1M tokens on 256 devices) runs only when asked for by name.
    if (only.empty() ? st.name == "large" : only != st.name) continue;
    for (const auto& prof : profiles) {
      if (!only_profile.empty() && only_profile != prof) continue;
      for (double sc : scales) {
        if (only_scale > 0 && only_scale != sc) continue;
        for (const auto& mask : masks) {
          if (!only_mask.empty() && only_mask != mask) continue;
          const Row r = run_instance(st, {st.name, prof, mask, sc}, count, with_metis, 1024, 0.1,
                                     with_zoltan && sc == 1.0);
          plan_ms_by_setting[st.name].push_back(r.plan_ms);
          plan_cpu_ms_by_setting[st.name].push_back(r.plan_cpu_ms);
          fmt::print("{:<7} {:<10} {:>5} {:<17} {:>7.2f} {:>7.2f} {:>10.3f} {:>10.3f} {:>6.3f} {:>6.3f} {:>6.3f} "
                     "{:>6.3f} {:>6.3f} {:>2}/{:<2} {:>8.3f} {:>9.3f}\n",
                     st.name, prof, sc, mask, r.plan_ms, r.plan_cpu_ms, r.dcp_inter / 1e9, r.base_inter / 1e9,
                     r.base_inter > 0 ? r.dcp_inter / r.base_inter : 0.0, r.ratio_max,
                     r.compute_imb, r.memory_imb, r.full_memory_imb, r.violated, r.infeasible,
                     r.metis_obj > 0 ? r.builtin_obj / r.metis_obj : 0.0,
                     r.zoltan_obj > 0 ? r.builtin_obj / r.zoltan_obj : 0.0);
          std::fflush(stdout);
          rows.push_back(to_json(r));
        }
      }
    }
  }
  nlohmann::json sweep_rows = nlohmann::json::array();
  if (sweeps) {
    const Setting st = settings()[0];
    fmt::print("\nsweeps (dryrun, ldc): inter-node GB vs B and vs eps_compute\n");
    fmt::print("{:<6} {:>6} {:<8} {:>5} {:>10} {:>10} {:>6} {:>4}\n", "sweep", "value", "mask", "scale",
               "dcp_GB", "static_GB", "ratio", "viol");
    for (const std::string mask : {"causal", "lambda"}) {
      for (double sc : {1.0, 4.0}) {
        for (int64_t bs : {512, 1024, 2048, 4096}) {
          const Row r = run_instance(st, {st.name, "ldc", mask, sc}, count, false, bs, 0.1);
          fmt::print("{:<6} {:>6} {:<8} {:>5} {:>10.3f} {:>10.3f} {:>6.3f} {:>4}\n", "B", bs, mask, sc,
                     r.dcp_inter / 1e9, r.base_inter / 1e9, r.dcp_inter / std::max(1.0, r.base_inter),
                     r.violated);
          nlohmann::json j = to_json(r);
          j["sweep"] = "block_size";
          j["value"] = bs;
          sweep_rows.push_back(j);
        }
        for (double eps : {0.05, 0.1, 0.2, 0.4}) {
          const Row r = run_instance(st, {st.name, "ldc", mask, sc}, count, false, 1024, eps);
          fmt::print("{:<6} {:>6} {:<8} {:>5} {:>10.3f} {:>10.3f} {:>6.3f} {:>4}\n", "eps_c", eps, mask,
                     sc, r.dcp_inter / 1e9, r.base_inter / 1e9,
                     r.dcp_inter / std::max(1.0, r.base_inter), r.violated);
          nlohmann::json j = to_json(r);
          j["sweep"] = "eps_compute";
          j["value"] = eps;
          sweep_rows.push_back(j);
        }
      }
    }
  }
  for (const Setting& st : settings()) {
    const auto it = plan_ms_by_setting.find(st.name);
    if (it == plan_ms_by_setting.end()) continue;
    const double worst = *std::max_element(it->second.begin(), it->second.end());
    const auto& cpu = plan_cpu_ms_by_setting[st.name];
    fmt::print("RESULT {}_worst_instance_median_plan_ms={:.3f} cpu_ms={:.3f} target={:.0f}\n", st.name,
               worst, *std::max_element(cpu.begin(), cpu.end()), st.target_ms);
  }
  if (!json_path.empty()) {
    std::ofstream(json_path) << nlohmann::json{{"bench", "placement"}, {"batches", count},
                                               {"block_size", 1024}, {"rows", rows},
                                               {"sweeps", sweep_rows}}
                                    .dump(2)
                             << "\n";
  }
  return 0;
}
