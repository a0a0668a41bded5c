#include "dcp/planner.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "dcp/error.h"
#include "dcp/metrics.h"

namespace dcp {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

void PlannerOptions::validate() const {
  if (block_sizes.empty()) raise(ErrorKind::InvalidInput, "planner: --block needs at least one candidate");
  if (eps_compute.empty()) raise(ErrorKind::InvalidInput, "planner: --eps-compute needs at least one candidate");
  if (min_tile_budget < 0)
    raise(ErrorKind::InvalidInput, "planner: min_tile_budget must be >= 0 (got " + std::to_string(min_tile_budget) + ")");
  if (max_tiles_per_device < 0)
    raise(ErrorKind::InvalidInput, "planner: max_tiles_per_device must be >= 0 (got " +
                                       std::to_string(max_tiles_per_device) + ")");
  if (reseed_best < 0)
    raise(ErrorKind::InvalidInput, "planner: reseed_best must be >= 0 (got " + std::to_string(reseed_best) + ")");
  if (tighten_best < 0)
    raise(ErrorKind::InvalidInput, "planner: tighten_best must be >= 0 (got " + std::to_string(tighten_best) + ")");
  for (double e : tighten_eps)
    if (!(e >= 0)) raise(ErrorKind::InvalidInput, "planner: tighten_eps must be >= 0 (got " + std::to_string(e) + ")");
  if (split_sink.empty()) raise(ErrorKind::InvalidInput, "planner: split_sink needs at least one candidate");
  if (far_outputs_first.empty() || last_round_share.empty() || level_stage_compute.empty())
    raise(ErrorKind::InvalidInput,
          "planner: the schedule candidates (far_outputs_first, last_round_share, level_stage_compute) need "
          "one each");
  for (double share : last_round_share) {
    PlanOptions p = plan;
    p.schedule.last_round_share = share;
    p.validate();
  }
  for (int stages : num_comm_stages) {
    PlanOptions p = plan;
    p.schedule.num_comm_stages = stages;
    p.validate();
  }
  for (double e : eps_compute)
    if (!(e >= 0)) raise(ErrorKind::InvalidInput, "planner: --eps-compute must be >= 0 (got " + std::to_string(e) + ")");
  for (size_t i = 0; i < static_layouts.size(); ++i) {
    const std::string& name = static_layouts[i];
    if (name == "dcp") raise(ErrorKind::InvalidInput, "planner: static_layouts lists 'dcp', which is not a static layout");
    check_placement_method(name, "planner: static_layouts");
    if (std::find(static_layouts.begin(), static_layouts.begin() + static_cast<std::ptrdiff_t>(i), name) !=
        static_layouts.begin() + static_cast<std::ptrdiff_t>(i))
      raise(ErrorKind::InvalidInput, "planner: static_layouts lists '" + name + "' twice");
  }
  placement.validate();
  plan.validate();
  if (calibration) calibration->validate("planner calibration");
}

std::string describe(const PlanCandidate& c) {
  std::string out;
  const auto num = [](double x) {
    std::string s = std::to_string(x);
    s.erase(s.find_last_not_of('0') + 1);
    if (!s.empty() && s.back() == '.') s.pop_back();
    return s;
  };
  if (c.method != "dcp") {
    out = "static layout " + c.method;
    if (c.block_size > 0) out += " B " + std::to_string(c.block_size);
    return out + " stages " + std::to_string(c.num_comm_stages) + (c.proxies ? "" : " no proxies");
  }
  out = "B " + std::to_string(c.block_size) + (c.split_sink ? " (split sink)" : "") + " eps " + num(c.eps_compute);
  if (c.tightened_from > 0) out += " (tightened from " + num(c.tightened_from) + ")";
  out += std::string(" far-first ") + (c.far_outputs_first ? "on" : "off") + " last-round share " + num(c.last_round_share);
  out += std::string(" leveling ") + (c.level_stage_compute ? "on" : "off") + " stages " + std::to_string(c.num_comm_stages);
  return out + (c.proxies ? "" : " no proxies");
}

std::vector<std::string> PlannerOptions::default_static_layouts() {
  std::vector<std::string> out;
  for (BaselineKind kind : all_baselines()) out.emplace_back(to_string(kind));
  return out;
}

TileCost tile_cost_from(const Calibration& c) {
  TileCost cost;
  const double fwd_eff[3] = {1.0, c.fwd_diagonal_efficiency, c.fwd_partial_efficiency};
  const double bwd_eff[3] = {1.0, c.bwd_diagonal_efficiency, c.bwd_partial_efficiency};
  for (size_t k = 0; k < 3; ++k) {
    cost.fwd[k] = 1.0 / fwd_eff[k];
    cost.bwd[k] = c.attn_fwd_flops / (c.attn_bwd_flops * bwd_eff[k]);
  }
  return cost;
}

PlannedBatch plan_batch(const Batch& batch, const Cluster& cluster, const PlannerOptions& opts) {
  opts.validate();
  const Calibration calibration = opts.calibration ? *opts.calibration : calibration_from_cluster(cluster);
  const auto t_search = Clock::now();
  PlannedBatch best;
  bool have = false;
  // The schedules tried on every placement: plan.schedule with each combination of the candidates.
  std::vector<ScheduleOptions> schedule_variants;
  const std::vector<int> stage_counts =
      opts.num_comm_stages.empty() ? std::vector<int>{opts.plan.schedule.num_comm_stages} : opts.num_comm_stages;
  for (int stages : stage_counts)
    for (bool level : opts.level_stage_compute)
      for (double share : opts.last_round_share)
        for (bool far_first : opts.far_outputs_first) {
          ScheduleOptions so = opts.plan.schedule;
          so.far_outputs_first = far_first;
          so.last_round_share = share;
          so.level_stage_compute = level;
          so.num_comm_stages = stages;
          schedule_variants.push_back(so);
        }
  std::vector<PlanCandidate> tried;
  // The best placements so far, fastest first (at most tighten_best; kept only when tightening
  // is on): each with its table, its fastest candidate and its table's simulator counts.
  struct KeptPlacement {
    std::shared_ptr<const BlockTable> table;
    DcpPlacement placed;
    PlanCandidate fastest;
    std::shared_ptr<SimTableCache> counts;
  };
  std::vector<KeptPlacement> kept;
  bool keeping = opts.tighten_best > 0 && cluster.num_devices() > 1;  // one device: nothing to balance
  auto keep = [&](KeptPlacement k) {
    if (!keeping) return;
    const auto at = std::find_if(kept.begin(), kept.end(), [&](const KeptPlacement& o) {
      return k.fastest.predicted_s < o.fastest.predicted_s;  // ties keep the earlier ahead
    });
    if (at - kept.begin() >= opts.tighten_best) return;
    kept.insert(at, std::move(k));
    if (std::ssize(kept) > opts.tighten_best) kept.pop_back();
  };
  // Plans a placement with `schedule`, simulates the plan and keeps it if it is the best so far:
  // a balanced candidate beats an unbalanced one; otherwise the faster prediction wins (the
  // earlier on ties). `c` comes with its placement's fields and time. `counts`: the simulator's
  // sub-tile counts of `table`, shared by every plan over it (placements, schedules, seeds).
  std::shared_ptr<SimTableCache> best_counts;
  auto consider = [&](PlanCandidate c, const BlockTable& table, const DcpPlacement& placed,
                      const ScheduleOptions& schedule, const std::shared_ptr<SimTableCache>& counts) {
    const auto t_plan = Clock::now();
    PlanOptions plan_opts = opts.plan;
    plan_opts.schedule = schedule;
    Plan plan = build_plan(table, placed.placement, cluster, plan_opts);
    c.far_outputs_first = schedule.far_outputs_first;
    c.last_round_share = schedule.last_round_share;
    c.level_stage_compute = schedule.level_stage_compute;
    c.num_comm_stages = schedule.num_comm_stages;
    c.proxies = schedule.proxies && cluster.nodes > 1;
    c.planning_s += seconds_since(t_plan);
    SimOptions so;
    so.calibration = calibration;
    so.table_cache = counts.get();
    SimResult sim = simulate(plan, cluster, so);
    c.predicted_s = sim.total_s();
    tried.push_back(c);
    const bool better = !have || (c.balanced && !best.chosen.balanced) ||
                        (c.balanced == best.chosen.balanced && c.predicted_s < best.chosen.predicted_s);
    if (better) {
      best.table = table;
      best.placement = placed;
      best.plan = std::move(plan);
      best.predicted = std::move(sim);
      best.chosen = c;
      best_counts = counts;
      have = true;
    }
  };
  // A placement planned and simulated with every schedule (the tile orders of the schedule share
  // the placement: only plan and simulation repeat); `c` carries its fields.
  auto try_schedules = [&](const PlanCandidate& c, const std::shared_ptr<const BlockTable>& table,
                           DcpPlacement placed, const std::shared_ptr<SimTableCache>& counts) {
    const size_t first = tried.size();
    for (const ScheduleOptions& schedule : schedule_variants) consider(c, *table, placed, schedule, counts);
    const auto fastest = std::min_element(tried.begin() + static_cast<std::ptrdiff_t>(first), tried.end(),
                                          [](const PlanCandidate& a, const PlanCandidate& b) {
                                            return a.predicted_s < b.predicted_s;
                                          });
    if (fastest != tried.end() && fastest->balanced) keep({table, std::move(placed), *fastest, counts});
  };
  auto placement_options = [&](double eps, uint64_t seed) {
    PlacementOptions po = opts.placement;
    po.eps_compute = eps;
    po.seed = seed;
    if (opts.balance_time && po.tile_cost.is_flops()) po.tile_cost = tile_cost_from(calibration);
    return po;
  };
  // One placement of `table` (blocks of `block`, its split sink cut or not) at `eps` and `seed`,
  // planned and simulated with every schedule.
  auto try_placement = [&](const std::shared_ptr<const BlockTable>& table, double table_s, int64_t block, bool cut,
                           double eps, uint64_t seed, const std::shared_ptr<SimTableCache>& counts) {
    const auto t0 = Clock::now();
    DcpPlacement placed = place_dcp(*table, cluster, placement_options(eps, seed));
    PlanCandidate c;
    c.block_size = block;
    c.split_sink = cut;
    c.eps_compute = eps;
    c.placement_seed = seed;
    c.planning_s = table_s + seconds_since(t0);
    c.balanced = placed.report.balanced();
    try_schedules(c, table, std::move(placed), counts);
  };
  const int64_t coarsest = *std::max_element(opts.block_sizes.begin(), opts.block_sizes.end());
  const int64_t tile_budget = std::max(opts.max_tiles_per_device * int64_t{cluster.num_devices()}, opts.min_tile_budget);
  for (int64_t block : opts.block_sizes) {
    bool planned_unsplit = false;
    for (bool split : opts.split_sink) {
      BlockOptions bo;
      bo.block_size = block;
      bo.q_heads_per_group = opts.q_heads_per_group;
      bo.split_sink = split;
      bo.validate(batch.shape);
      const auto t_table = Clock::now();
      const auto table = std::make_shared<const BlockTable>(build_block_table(batch, bo));
      const double table_s = seconds_since(t_table);
      // A split that cut nothing gives the unsplit table: plan it once.
      const bool cut = table->block_size == 0;
      if (!cut && planned_unsplit) continue;
      planned_unsplit |= !cut;
      if (opts.max_tiles_per_device > 0 && block != coarsest && std::ssize(table->tiles) > tile_budget) {
        if (best.skipped_block_sizes.empty() || best.skipped_block_sizes.back() != block)
          best.skipped_block_sizes.push_back(block);
        continue;
      }
      const auto counts = std::make_shared<SimTableCache>();
      for (double eps : opts.eps_compute) try_placement(table, table_s, block, cut, eps, opts.placement.seed, counts);
    }
  }
  // The placement depends on its seed as much as on eps: the best candidate's block table and
  // eps are placed again with the next seeds, each with every schedule.
  if (have && opts.reseed_best > 0) {
    const auto table = std::make_shared<const BlockTable>(best.table);
    const PlanCandidate first = best.chosen;
    const std::shared_ptr<SimTableCache> counts = best_counts;
    for (int k = 1; k <= opts.reseed_best; ++k)
      try_placement(table, 0.0, first.block_size, first.split_sink, first.eps_compute,
                    opts.placement.seed + static_cast<uint64_t>(k), counts);
  }
  // The best placements walked down to tighter compute bounds, homes kept (tighten_best).
  keeping = false;
  for (const KeptPlacement& k : kept)
    for (double eps : opts.tighten_eps) {
      if (!(eps < k.fastest.eps_compute)) continue;
      const auto t0 = Clock::now();
      DcpPlacement placed =
          place_tiles_on_homes(*k.table, cluster, placement_options(eps, k.fastest.placement_seed), k.placed.placement);
      PlanCandidate c = k.fastest;
      c.tightened_from = k.fastest.tightened_from > 0 ? k.fastest.tightened_from : k.fastest.eps_compute;
      c.eps_compute = eps;
      c.planning_s = seconds_since(t0);
      c.balanced = placed.report.balanced();
      try_schedules(c, k.table, std::move(placed), k.counts);
    }
  kept.clear();  // the tables and placements are not needed past here
  // The static layouts, each with the default schedule at every stage count (packing, which cuts
  // sequences into token blocks, at every block size; the others cut their own chunks). Their
  // plans run on the same executor, so where one is predicted fastest it is the plan to run. On
  // one device every layout places everything there and differs only in how it cuts sequences,
  // which the block sizes above already cover.
  if (cluster.num_devices() > 1) {
    // The layouts that cut each sequence into chunks (at most 2 per device) hold at most chunks^2
    // tiles per sequence and head group: over the budget, they are not built at all (on hundreds
    // of devices a table would take seconds).
    int64_t chunk_tiles_bound = 0;
    const int64_t chunks = 2 * int64_t{cluster.num_devices()};
    for (const Sequence& s : batch.sequences) {
      const int64_t c = std::min(s.length, chunks);
      chunk_tiles_bound += c * c;
    }
    const int q_per_group = opts.q_heads_per_group > 0 ? opts.q_heads_per_group : batch.shape.group_ratio();
    chunk_tiles_bound *= batch.shape.q_heads / std::max(q_per_group, 1);
    const bool budget = opts.max_tiles_per_device > 0;
    for (const std::string& name : opts.static_layouts) {
      const bool per_block = name == "packing";
      const bool over_bound = !per_block && budget && chunk_tiles_bound > tile_budget;
      bool skipped = over_bound;
      for (size_t bi = 0; !over_bound && bi < (per_block ? opts.block_sizes.size() : 1); ++bi) {
        BlockOptions bo;
        bo.block_size = opts.block_sizes[bi];
        bo.q_heads_per_group = opts.q_heads_per_group;
        const auto t0 = Clock::now();
        PlacedMethod pm = place_by_method(name, batch, bo, cluster, opts.placement);
        const double placement_s = seconds_since(t0);
        if (budget && std::ssize(pm.placed.table.tiles) > tile_budget) {
          skipped = true;
          continue;
        }
        const PlacementMetrics metrics = compute_metrics(pm.placed.table, pm.placed.placement, cluster);
        const auto counts = std::make_shared<SimTableCache>();
        DcpPlacement placed{std::move(pm.placed.placement), {}};
        placed.report.partitioner = name;
        for (int stages : stage_counts) {
          PlanCandidate c;
          c.method = name;
          c.block_size = per_block ? bo.block_size : 0;
          c.planning_s = placement_s;
          c.balanced = metrics.memory_imbalance <= 1 + opts.placement.eps_memory + 1e-12;
          ScheduleOptions schedule = opts.plan.schedule;
          schedule.num_comm_stages = stages;
          consider(c, pm.placed.table, placed, schedule, counts);
        }
      }
      if (skipped) best.skipped_static_layouts.push_back(name);
    }
  }
  // The chosen placement with the other proxy setting, with every schedule (a static layout: its
  // stage counts), kept where predicted faster.
  if (have && opts.retry_proxies && cluster.nodes > 1) {
    const BlockTable table = best.table;
    const DcpPlacement placed = best.placement;
    const PlanCandidate first = best.chosen;
    const std::shared_ptr<SimTableCache> counts = best_counts;
    std::vector<ScheduleOptions> schedules = schedule_variants;
    if (first.method != "dcp") {  // a static layout: its default schedule at each stage count
      schedules.clear();
      for (int stages : stage_counts) {
        schedules.push_back(opts.plan.schedule);
        schedules.back().num_comm_stages = stages;
      }
    }
    for (ScheduleOptions& schedule : schedules) {
      schedule.proxies = !first.proxies;
      consider(first, table, placed, schedule, counts);
    }
  }
  best.candidates = std::move(tried);
  best.search_s = seconds_since(t_search);
  return best;
}

}  // namespace dcp

namespace dcp {

std::vector<std::string> placement_methods() {
  std::vector<std::string> out{"dcp"};
  for (BaselineKind kind : all_baselines()) out.emplace_back(to_string(kind));
  return out;
}

void check_placement_method(const std::string& name, const std::string& where) {
  const auto methods = placement_methods();
  if (std::find(methods.begin(), methods.end(), name) != methods.end()) return;
  std::string list;
  for (const auto& m : methods) list += (list.empty() ? "" : ", ") + m;
  raise(ErrorKind::InvalidInput, where + ": unknown placement '" + name + "' (expected one of " + list + ")");
}

PlacedMethod place_by_method(const std::string& method, const Batch& batch, const BlockOptions& blocks,
                             const Cluster& cluster, const PlacementOptions& placement) {
  check_placement_method(method, "placement method");
  PlacedMethod out;
  out.method = method;
  const auto t0 = Clock::now();
  if (method == "dcp") {
    out.placed.table = build_block_table(batch, blocks);
    DcpPlacement dcp = place_dcp(out.placed.table, cluster, placement);
    out.placed.placement = std::move(dcp.placement);
    out.violations = std::move(dcp.report.violations);
  } else {
    for (BaselineKind kind : all_baselines())
      if (method == to_string(kind)) out.placed = make_baseline(kind, batch, blocks, cluster);
  }
  out.placement_ms = seconds_since(t0) * 1e3;
  return out;
}

void StepPlanOptions::validate() const {
  check_placement_method(method, "plan options: method");
  placement.validate();
  plan.validate();
  if (search_candidates) {
    if (method != "dcp") raise(ErrorKind::InvalidInput, "plan options: the candidate search plans method dcp only");
    search.validate();
  }
}

Plan plan_step(const Batch& batch, const Cluster& cluster, const StepPlanOptions& options) {
  options.validate();
  batch.validate();
  cluster.validate("cluster");
  options.blocks.validate(batch.shape);
  if (options.search_candidates) return plan_batch(batch, cluster, options.search).plan;
  PlacedMethod placed = place_by_method(options.method, batch, options.blocks, cluster, options.placement);
  return build_plan(placed.placed.table, placed.placed.placement, cluster, options.plan);
}

}  // namespace dcp
