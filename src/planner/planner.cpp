#include "dcp/planner.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "core/task_pool.h"
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
  if (threads < 1 || threads > 256)
    raise(ErrorKind::InvalidInput, "planner: threads must be in [1, 256] (got " + std::to_string(threads) + ")");
  if (reseed_best < 0)
    raise(ErrorKind::InvalidInput, "planner: reseed_best must be >= 0 (got " + std::to_string(reseed_best) + ")");
  if (tighten_best < 0)
    raise(ErrorKind::InvalidInput, "planner: tighten_best must be >= 0 (got " + std::to_string(tighten_best) + ")");
  for (double e : tighten_eps)
    if (!(e >= 0)) raise(ErrorKind::InvalidInput, "planner: tighten_eps must be >= 0 (got " + std::to_string(e) + ")");
  if (split_sink.empty()) raise(ErrorKind::InvalidInput, "planner: split_sink needs at least one candidate");
  if (far_outputs_first.empty() || last_round_share.empty() || level_stage_compute.empty() ||
      rounds_per_link_class.empty())
    raise(ErrorKind::InvalidInput,
          "planner: the schedule candidates (far_outputs_first, last_round_share, level_stage_compute, "
          "rounds_per_link_class) need one each");
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
  const auto choices = [&](const ScheduleOptions::PassChoices& p) {
    return std::string("far-first ") + (p.far_outputs_first ? "on" : "off") + " last-round share " +
           num(p.last_round_share) + " leveling " + (p.level_stage_compute ? "on" : "off") +
           (p.rounds_per_link_class ? " rounds per link class" : "");
  };
  out += " " + choices(c.choices);
  if (c.backward) out += " (backward: " + choices(*c.backward) + ")";
  out += " stages " + std::to_string(c.num_comm_stages);
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
  TaskPool pool(opts.threads, "PlannerOptions::threads");
  TaskPool* const par = pool.threads() > 1 ? &pool : nullptr;
  PlannedBatch best;
  // The schedules tried on every placement: plan.schedule with each combination of the candidates.
  std::vector<ScheduleOptions> schedule_variants;
  const std::vector<int> stage_counts =
      opts.num_comm_stages.empty() ? std::vector<int>{opts.plan.schedule.num_comm_stages} : opts.num_comm_stages;
  const auto tried_value = [](const std::vector<bool>& list, bool value) {
    return std::find(list.begin(), list.end(), value) != list.end();
  };
  const bool plain_rounds_tried = tried_value(opts.rounds_per_link_class, false);
  const bool far_first_tried = tried_value(opts.far_outputs_first, true);
  for (int stages : stage_counts)
    for (bool per_class : opts.rounds_per_link_class)
      for (bool level : opts.level_stage_compute)
        for (double share : opts.last_round_share)
          for (bool far_first : opts.far_outputs_first) {
            // Rounds per link class only across nodes (on one node there is one class) and where
            // crossings come first (otherwise the tiles whose inputs stay in the node already
            // lead the rounds).
            if (per_class && plain_rounds_tried && (cluster.nodes == 1 || (!far_first && far_first_tried))) continue;
            ScheduleOptions so = opts.plan.schedule;
            so.far_outputs_first = far_first;
            so.last_round_share = share;
            so.level_stage_compute = level;
            so.rounds_per_link_class = per_class;
            so.num_comm_stages = stages;
            schedule_variants.push_back(so);
          }

  // A placement and the schedules it is planned with. `counts`: the simulator's sub-tile counts
  // of its table, shared by every plan over the table (placements, schedules, seeds) and filled
  // before any of them is simulated, so that simulations on several threads only read it.
  struct Placed {
    PlanCandidate c;  // its placement's fields and time
    std::shared_ptr<const BlockTable> table;
    DcpPlacement placed;
    std::shared_ptr<SimTableCache> counts;
    std::vector<ScheduleOptions> schedules;
  };
  std::vector<std::unique_ptr<Placed>> placed_all;  // every placement planned, in the order tried
  // A placement still to be made (or filled in) over `table`, planned with `schedules`.
  auto unplaced = [](PlanCandidate c, const std::shared_ptr<const BlockTable>& table,
                     const std::shared_ptr<SimTableCache>& counts, const std::vector<ScheduleOptions>& schedules) {
    auto p = std::make_unique<Placed>();
    p->c = std::move(c);
    p->table = table;
    p->counts = counts;
    p->schedules = schedules;
    return p;
  };
  std::vector<PlanCandidate> tried;
  // The winner so far: a balanced candidate beats an unbalanced one; otherwise the faster
  // prediction wins (the earlier on ties). Its plan is built again at the end.
  const Placed* best_placed = nullptr;
  size_t best_schedule = 0;
  // The best placements so far, fastest first (at most tighten_best; kept only when tightening
  // is on), each with its fastest candidate.
  struct KeptPlacement {
    const Placed* placed;
    PlanCandidate fastest;
  };
  std::vector<KeptPlacement> kept;
  bool keeping = opts.tighten_best > 0 && cluster.num_devices() > 1;  // one device: nothing to balance
  auto plan_options = [&](const ScheduleOptions& schedule) {
    PlanOptions plan_opts = opts.plan;
    plan_opts.schedule = schedule;
    return plan_opts;
  };
  auto sim_options = [&](const Placed& p) {
    SimOptions so;
    so.calibration = calibration;
    so.table_cache = p.counts.get();
    return so;
  };
  // mix_passes: per stage count (and proxy setting) of a placement's schedules, the one fastest
  // in the forward and the one fastest in the backward, where they differ and their passes
  // together beat every schedule tried, planned as one (their passes as already built).
  struct Mixed {
    ScheduleOptions schedule;
    PlanCandidate c;
  };
  auto mix = [&](const Placed& p, const std::vector<Schedule>& schedules, const PlanCandidate* out,
                 const std::array<double, 2>* pass_s, std::vector<Mixed>& mixed) {
    const size_t n = p.schedules.size();
    std::vector<uint8_t> done(n, 0);
    for (size_t k = 0; k < n; ++k) {
      const ScheduleOptions& lead = p.schedules[k];
      if (done[k] || lead.backward) continue;
      size_t f = k, b = k, t = k;  // fastest forward, backward, and both together
      for (size_t j = k; j < n; ++j) {
        const ScheduleOptions& so = p.schedules[j];
        if (so.backward || so.num_comm_stages != lead.num_comm_stages || so.proxies != lead.proxies) continue;
        done[j] = 1;
        if (pass_s[j][0] < pass_s[f][0]) f = j;
        if (pass_s[j][1] < pass_s[b][1]) b = j;
        if (out[j].predicted_s < out[t].predicted_s) t = j;
      }
      if (!(pass_s[f][0] + pass_s[b][1] < out[t].predicted_s)) continue;
      Mixed m{p.schedules[f], out[f]};
      m.schedule.backward = p.schedules[b].choices();
      m.c.backward = m.schedule.backward;
      const auto t0 = Clock::now();
      const Plan plan = build_plan(*p.table, p.placed.placement, cluster, Schedule{schedules[f].fwd, schedules[b].bwd},
                                   plan_options(m.schedule));
      m.c.planning_s = p.c.planning_s + seconds_since(t0);
      m.c.predicted_s = simulate(plan, cluster, sim_options(p)).total_s();
      mixed.push_back(std::move(m));
    }
  };
  // Plans and simulates every placement of `group` with each of its schedules, all at once on
  // the pool, then takes the candidates in order: the same choice as one at a time. Schedule
  // options that make the same schedule of a placement (on one node far_outputs_first changes
  // nothing, on one device no option does) share one plan and simulation.
  auto evaluate = [&](std::vector<std::unique_ptr<Placed>> group) {
    std::vector<size_t> first_unit(group.size() + 1, 0);  // the placement's candidates in `results`
    for (size_t i = 0; i < group.size(); ++i) first_unit[i + 1] = first_unit[i] + group[i]->schedules.size();
    std::vector<PlanCandidate> results(first_unit.back());
    std::vector<std::array<double, 2>> pass_s(first_unit.back());  // simulated forward, backward
    std::vector<std::vector<Mixed>> mixed(group.size());              // mix_passes' candidates
    run_each(par, static_cast<int>(group.size()), [&](int gi) {
      const Placed& p = *group[static_cast<size_t>(gi)];
      const size_t n = p.schedules.size();
      PlanCandidate* const out = results.data() + first_unit[static_cast<size_t>(gi)];
      std::vector<Schedule> schedules(n);
      run_each(par, static_cast<int>(n), [&](int j) {
        const ScheduleOptions& so = p.schedules[static_cast<size_t>(j)];
        PlanCandidate& c = out[j];
        c = p.c;
        const auto t0 = Clock::now();
        schedules[static_cast<size_t>(j)] = build_schedule(*p.table, p.placed.placement, cluster, so);
        c.planning_s += seconds_since(t0);
        c.choices = so.choices();
        c.backward = so.backward;
        c.num_comm_stages = so.num_comm_stages;
        c.proxies = so.proxies && cluster.nodes > 1;
      });
      std::vector<int> twin(n, -1);  // an earlier schedule equal to this one
      for (size_t j = 1; j < n; ++j)
        for (size_t k = 0; k < j && twin[j] < 0; ++k)
          if (twin[k] < 0 && schedules[k] == schedules[j]) twin[j] = static_cast<int>(k);
      run_each(par, static_cast<int>(n), [&](int j) {
        if (twin[static_cast<size_t>(j)] >= 0) return;
        PlanCandidate& c = out[j];
        const auto t0 = Clock::now();
        const Plan plan = build_plan(*p.table, p.placed.placement, cluster, schedules[static_cast<size_t>(j)],
                                     plan_options(p.schedules[static_cast<size_t>(j)]));
        c.planning_s += seconds_since(t0);
        const SimResult r = simulate(plan, cluster, sim_options(p));
        c.predicted_s = r.total_s();
        pass_s[first_unit[static_cast<size_t>(gi)] + static_cast<size_t>(j)] = {r.fwd_s, r.bwd_s};
      });
      for (size_t j = 0; j < n; ++j)
        if (twin[j] >= 0) {
          out[j].predicted_s = out[twin[j]].predicted_s;
          out[j].planning_s = out[twin[j]].planning_s;
          pass_s[first_unit[static_cast<size_t>(gi)] + j] = pass_s[first_unit[static_cast<size_t>(gi)] + static_cast<size_t>(twin[j])];
        }
      if (opts.mix_passes) mix(p, schedules, out, pass_s.data() + first_unit[static_cast<size_t>(gi)], mixed[static_cast<size_t>(gi)]);
    });
    size_t u = 0;
    for (size_t gi = 0; gi < group.size(); ++gi) {
      std::unique_ptr<Placed>& p = group[gi];
      const size_t first = tried.size();
      const size_t n = p->schedules.size();
      for (const Mixed& m : mixed[gi]) p->schedules.push_back(m.schedule);
      for (size_t j = 0; j < p->schedules.size(); ++j) {
        const PlanCandidate& c = j < n ? results[u++] : mixed[gi][j - n].c;
        tried.push_back(c);
        const bool better = best_placed == nullptr || (c.balanced && !best.chosen.balanced) ||
                            (c.balanced == best.chosen.balanced && c.predicted_s < best.chosen.predicted_s);
        if (better) {
          best.chosen = c;
          best_placed = p.get();
          best_schedule = j;
        }
      }
      // The placement's fastest schedule decides its rank among the kept ones (ties keep the
      // earlier ahead).
      const auto fastest = std::min_element(tried.begin() + static_cast<std::ptrdiff_t>(first), tried.end(),
                                            [](const PlanCandidate& a, const PlanCandidate& b) {
                                              return a.predicted_s < b.predicted_s;
                                            });
      if (keeping && fastest != tried.end() && fastest->balanced) {
        const auto at = std::find_if(kept.begin(), kept.end(), [&](const KeptPlacement& o) {
          return fastest->predicted_s < o.fastest.predicted_s;
        });
        if (at - kept.begin() < opts.tighten_best) {
          kept.insert(at, KeptPlacement{p.get(), *fastest});
          if (std::ssize(kept) > opts.tighten_best) kept.pop_back();
        }
      }
      placed_all.push_back(std::move(p));
    }
  };
  auto placement_options = [&](double eps, uint64_t seed) {
    PlacementOptions po = opts.placement;
    po.eps_compute = eps;
    po.seed = seed;
    if (opts.balance_time && po.tile_cost.is_flops()) po.tile_cost = tile_cost_from(calibration);
    return po;
  };
  // DCP's placement of `p->table` at p->c's eps and seed, timed into p->c.planning_s.
  auto place = [&](Placed& p) {
    const auto t0 = Clock::now();
    p.placed = place_dcp(*p.table, cluster, placement_options(p.c.eps_compute, p.c.placement_seed));
    p.c.planning_s += seconds_since(t0);
    p.c.balanced = p.placed.report.balanced();
  };

  // The block tables: every block size, with and without a split sink.
  struct Table {
    int64_t block;
    bool split;
    std::shared_ptr<const BlockTable> table;
    double table_s = 0;
  };
  std::vector<Table> tables;
  for (int64_t block : opts.block_sizes)
    for (bool split : opts.split_sink) {
      BlockOptions bo;
      bo.block_size = block;
      bo.q_heads_per_group = opts.q_heads_per_group;
      bo.split_sink = split;
      bo.validate(batch.shape);
      tables.push_back(Table{block, split, nullptr, 0});
    }
  run_each(par, static_cast<int>(tables.size()), [&](int i) {
    Table& t = tables[static_cast<size_t>(i)];
    BlockOptions bo;
    bo.block_size = t.block;
    bo.q_heads_per_group = opts.q_heads_per_group;
    bo.split_sink = t.split;
    const auto t0 = Clock::now();
    t.table = std::make_shared<const BlockTable>(build_block_table(batch, bo));
    t.table_s = seconds_since(t0);
  });
  const int64_t coarsest = *std::max_element(opts.block_sizes.begin(), opts.block_sizes.end());
  const int64_t tile_budget = std::max(opts.max_tiles_per_device * int64_t{cluster.num_devices()}, opts.min_tile_budget);
  std::vector<std::unique_ptr<Placed>> fresh;
  std::vector<std::shared_ptr<SimTableCache>> to_fill;
  std::vector<const BlockTable*> to_fill_table;
  bool planned_unsplit = false;
  for (size_t i = 0; i < tables.size(); ++i) {
    const Table& t = tables[i];
    if (i > 0 && tables[i - 1].block != t.block) planned_unsplit = false;
    // A split that cut nothing gives the unsplit table: plan it once.
    const bool cut = t.table->block_size == 0;
    if (!cut && planned_unsplit) continue;
    planned_unsplit |= !cut;
    if (opts.max_tiles_per_device > 0 && t.block != coarsest && std::ssize(t.table->tiles) > tile_budget) {
      if (best.skipped_block_sizes.empty() || best.skipped_block_sizes.back() != t.block)
        best.skipped_block_sizes.push_back(t.block);
      continue;
    }
    const auto counts = std::make_shared<SimTableCache>();
    to_fill.push_back(counts);
    to_fill_table.push_back(t.table.get());
    for (double eps : opts.eps_compute) {
      PlanCandidate c;
      c.block_size = t.block;
      c.split_sink = cut;
      c.eps_compute = eps;
      c.placement_seed = opts.placement.seed;
      c.planning_s = t.table_s;
      fresh.push_back(unplaced(c, t.table, counts, schedule_variants));
    }
  }
  // The tables' counts and the placements are independent pieces: all of them at once.
  run_each(par, static_cast<int>(to_fill.size() + fresh.size()), [&](int i) {
    const auto k = static_cast<size_t>(i);
    if (k < to_fill.size()) to_fill[k]->fill(*to_fill_table[k]);
    else place(*fresh[k - to_fill.size()]);
  });
  evaluate(std::move(fresh));
  // The placement depends on its seed as much as on eps: the best candidate's block table and
  // eps are placed again with the next seeds, each with every schedule.
  if (best_placed != nullptr && opts.reseed_best > 0) {
    std::vector<std::unique_ptr<Placed>> reseeded;
    for (int k = 1; k <= opts.reseed_best; ++k) {
      PlanCandidate c;
      c.block_size = best.chosen.block_size;
      c.split_sink = best.chosen.split_sink;
      c.eps_compute = best.chosen.eps_compute;
      c.placement_seed = opts.placement.seed + static_cast<uint64_t>(k);
      reseeded.push_back(unplaced(c, best_placed->table, best_placed->counts, schedule_variants));
    }
    run_each(par, static_cast<int>(reseeded.size()), [&](int i) { place(*reseeded[static_cast<size_t>(i)]); });
    evaluate(std::move(reseeded));
  }
  // The best placements walked down to tighter compute bounds, homes kept (tighten_best).
  keeping = false;
  {
    std::vector<std::unique_ptr<Placed>> tightened;
    std::vector<const Placed*> source;  // the placement each one is tightened from
    for (const KeptPlacement& k : kept)
      for (double eps : opts.tighten_eps) {
        if (!(eps < k.fastest.eps_compute)) continue;
        PlanCandidate c = k.fastest;
        c.tightened_from = k.fastest.tightened_from > 0 ? k.fastest.tightened_from : k.fastest.eps_compute;
        c.eps_compute = eps;
        c.planning_s = 0;
        tightened.push_back(unplaced(c, k.placed->table, k.placed->counts, schedule_variants));
        source.push_back(k.placed);
      }
    run_each(par, static_cast<int>(tightened.size()), [&](int i) {
      Placed& p = *tightened[static_cast<size_t>(i)];
      const auto t0 = Clock::now();
      p.placed = place_tiles_on_homes(*p.table, cluster, placement_options(p.c.eps_compute, p.c.placement_seed),
                                      source[static_cast<size_t>(i)]->placed.placement);
      p.c.planning_s = seconds_since(t0);
      p.c.balanced = p.placed.report.balanced();
    });
    kept.clear();
    evaluate(std::move(tightened));
  }
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
    std::vector<ScheduleOptions> static_schedules;
    for (int stages : stage_counts) {
      static_schedules.push_back(opts.plan.schedule);
      static_schedules.back().num_comm_stages = stages;
    }
    struct StaticJob {
      size_t layout;
      int64_t block;
      bool skipped = false;
      std::unique_ptr<Placed> placed;
    };
    std::vector<StaticJob> jobs;
    std::vector<uint8_t> over_bound(opts.static_layouts.size(), 0);
    for (size_t li = 0; li < opts.static_layouts.size(); ++li) {
      const bool per_block = opts.static_layouts[li] == "packing";
      over_bound[li] = !per_block && budget && chunk_tiles_bound > tile_budget;
      for (size_t bi = 0; !over_bound[li] && bi < (per_block ? opts.block_sizes.size() : 1); ++bi)
        jobs.push_back(StaticJob{li, opts.block_sizes[bi], false, nullptr});
    }
    run_each(par, static_cast<int>(jobs.size()), [&](int i) {
      StaticJob& job = jobs[static_cast<size_t>(i)];
      const std::string& name = opts.static_layouts[job.layout];
      BlockOptions bo;
      bo.block_size = job.block;
      bo.q_heads_per_group = opts.q_heads_per_group;
      const auto t0 = Clock::now();
      PlacedMethod pm = place_by_method(name, batch, bo, cluster, opts.placement);
      const double placement_s = seconds_since(t0);
      if (budget && std::ssize(pm.placed.table.tiles) > tile_budget) {
        job.skipped = true;
        return;
      }
      const PlacementMetrics metrics = compute_metrics(pm.placed.table, pm.placed.placement, cluster);
      auto p = std::make_unique<Placed>();
      p->c.method = name;
      p->c.block_size = name == "packing" ? job.block : 0;
      p->c.planning_s = placement_s;
      p->c.balanced = metrics.memory_imbalance <= 1 + opts.placement.eps_memory + 1e-12;
      p->table = std::make_shared<const BlockTable>(std::move(pm.placed.table));
      p->placed = DcpPlacement{std::move(pm.placed.placement), {}};
      p->placed.report.partitioner = name;
      p->counts = std::make_shared<SimTableCache>();
      p->counts->fill(*p->table);
      p->schedules = static_schedules;
      job.placed = std::move(p);
    });
    std::vector<std::unique_ptr<Placed>> statics;
    std::vector<uint8_t> skipped = over_bound;
    for (StaticJob& job : jobs) {
      if (job.skipped) skipped[job.layout] = 1;
      if (job.placed) statics.push_back(std::move(job.placed));
    }
    evaluate(std::move(statics));
    for (size_t li = 0; li < opts.static_layouts.size(); ++li)
      if (skipped[li]) best.skipped_static_layouts.push_back(opts.static_layouts[li]);
  }
  // The chosen placement with the other proxy setting, with every schedule (a static layout: its
  // stage counts), kept where predicted faster.
  if (best_placed != nullptr && opts.retry_proxies && cluster.nodes > 1) {
    // Its schedules as tried (DCP's: every variant; a static layout's: its stage counts).
    auto p = std::make_unique<Placed>(*best_placed);
    p->c = best.chosen;
    std::erase_if(p->schedules, [](const ScheduleOptions& so) { return so.backward.has_value(); });  // mixed again
    for (ScheduleOptions& schedule : p->schedules) schedule.proxies = !best.chosen.proxies;
    std::vector<std::unique_ptr<Placed>> retry;
    retry.push_back(std::move(p));
    evaluate(std::move(retry));
  }
  if (best_placed != nullptr) {
    // The winner's plan and simulation, made again (both are deterministic).
    const ScheduleOptions& schedule = best_placed->schedules[best_schedule];
    best.table = *best_placed->table;
    best.placement = best_placed->placed;
    best.plan = build_plan(best.table, best.placement.placement, cluster, plan_options(schedule));
    best.predicted = simulate(best.plan, cluster, sim_options(*best_placed));
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
