// plan_step_kinds: the plans of several layer kinds (masks) over one token placement.
#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "dcp/error.h"
#include "dcp/planner.h"

namespace dcp {

namespace {

// Same sequences and shape as kind 0, or an error naming the first difference.
void check_same_sequences(const std::vector<Batch>& kinds) {
  const Batch& first = kinds.front();
  for (size_t k = 0; k < kinds.size(); ++k) {
    const Batch& b = kinds[k];
    const std::string where = "layer kind " + std::to_string(k);
    try {
      b.validate();
    } catch (const Error& e) {
      raise(e.kind(), where + ": " + e.what());
    }
    const AttentionShape &s = b.shape, &f = first.shape;
    if (s.q_heads != f.q_heads || s.kv_heads != f.kv_heads || s.head_dim != f.head_dim || s.dtype != f.dtype)
      raise(ErrorKind::InvalidInput, where + ": attention shape differs from layer kind 0's (every kind has the "
                                             "model's heads, head dim and dtype)");
    if (b.sequences.size() != first.sequences.size())
      raise(ErrorKind::InvalidInput, where + ": " + std::to_string(b.sequences.size()) + " sequences, layer kind 0 " +
                                         std::to_string(first.sequences.size()) + " (every kind holds the step's sequences)");
    for (size_t i = 0; i < b.sequences.size(); ++i)
      if (b.sequences[i].length != first.sequences[i].length)
        raise(ErrorKind::InvalidInput, where + ": sequence " + std::to_string(i) + " has " +
                                           std::to_string(b.sequences[i].length) + " tokens, layer kind 0 " +
                                           std::to_string(first.sequences[i].length));
  }
}

bool same_token_blocks(const BlockTable& a, const BlockTable& b) {
  if (a.token_blocks.size() != b.token_blocks.size()) return false;
  for (size_t i = 0; i < a.token_blocks.size(); ++i) {
    const TokenBlock &x = a.token_blocks[i], &y = b.token_blocks[i];
    if (x.seq != y.seq || x.begin != y.begin || x.length != y.length) return false;
  }
  return true;
}

// The lead table's token blocks, as cuts per sequence.
std::vector<std::vector<int64_t>> cuts_of(const BlockTable& table) {
  std::vector<std::vector<int64_t>> cuts(static_cast<size_t>(table.num_sequences()));
  for (const TokenBlock& tb : table.token_blocks) cuts[tb.seq].push_back(tb.begin);
  for (int s = 0; s < table.num_sequences(); ++s) cuts[s].push_back(table.seq_length[s]);
  return cuts;
}

// Where each tile of `table` starts: the lead's device for the same tile (tables are ordered by
// sequence, head group, q block, kv block), else the home of its query block (its output's home).
std::vector<int32_t> start_devices(const BlockTable& table, const Plan& lead) {
  const auto key = [](const Tile& t) { return std::tuple(t.seq, t.head_group, t.q_block, t.kv_block); };
  const std::vector<Tile>& lt = lead.table.tiles;
  std::vector<int32_t> dev(table.tiles.size());
  size_t j = 0;
  for (size_t i = 0; i < table.tiles.size(); ++i) {
    const auto k = key(table.tiles[i]);
    while (j < lt.size() && key(lt[j]) < k) ++j;
    dev[i] = j < lt.size() && key(lt[j]) == k ? lead.placement.tile_device[j]
                                              : lead.placement.block_home[table.tiles[i].q_block];
  }
  return dev;
}

// Each token block of `cuts` cut into `parts` pieces of equal length (a multiple of 64 tokens, the
// last piece the rest): a kind whose mask is sparse (a sliding window) wastes less of its tiles on
// finer blocks, and every piece stays on its block's device in the block's order, so the kind's
// plan holds the same tokens in the same order as the lead's on every device.
std::vector<std::vector<int64_t>> finer_cuts(const std::vector<std::vector<int64_t>>& cuts, int parts) {
  std::vector<std::vector<int64_t>> out(cuts.size());
  for (size_t s = 0; s < cuts.size(); ++s) {
    for (size_t i = 0; i + 1 < cuts[s].size(); ++i) {
      const int64_t a = cuts[s][i], b = cuts[s][i + 1];
      const int64_t piece = std::max<int64_t>(64, ((b - a + parts - 1) / parts + 63) / 64 * 64);
      for (int64_t x = a; x < b; x += piece) out[s].push_back(x);
    }
    out[s].push_back(cuts[s].back());
  }
  return out;
}

}  // namespace

namespace {

// The plan of `kind` on the token homes of `homes` (a plan of another kind of the same step), its
// token blocks each cut into `parts` pieces on their block's device, its tiles placed on those
// homes; scheduled as `homes` is.
Plan on_finer_blocks(const Batch& kind, const Plan& homes, int parts, const Cluster& cluster,
                     const PlacementOptions& placement) {
  BlockOptions blocks;
  blocks.q_heads_per_group = homes.table.groups.q_heads_per_group;
  const BlockTable table = build_block_table_with_cuts(kind, blocks, finer_cuts(cuts_of(homes.table), parts));
  Placement start;
  start.method = "dcp";
  start.num_devices = cluster.num_devices();
  // Both tables list their blocks by sequence and position: each piece lies in the block whose
  // range holds its first token.
  size_t parent = 0;
  for (const TokenBlock& tb : table.token_blocks) {
    while (homes.table.token_blocks[parent].seq != tb.seq ||
           homes.table.token_blocks[parent].begin + homes.table.token_blocks[parent].length <= tb.begin)
      ++parent;
    start.block_home.push_back(homes.placement.block_home[parent]);
  }
  for (const Tile& t : table.tiles) start.tile_device.push_back(start.block_home[t.q_block]);
  const DcpPlacement placed = place_tiles_on_homes(table, cluster, placement, start);
  return build_plan(table, placed.placement, cluster, homes.header.options);
}

// Every kind's plan given the lead's: the other kinds cut into the lead's token blocks and placed
// on its homes (or by the lead's static layout where that keeps them), scheduled as the lead is.
void plan_other_kinds(const std::vector<Batch>& kinds, size_t lead, const Cluster& cluster,
                      const StepPlanOptions& options, const PlacementOptions& placement, int64_t lead_block_size,
                      std::vector<Plan>& plans) {
  const Plan& lp = plans[lead];
  BlockOptions blocks;
  blocks.q_heads_per_group = lp.table.groups.q_heads_per_group;
  const std::vector<std::vector<int64_t>> cuts = cuts_of(lp.table);
  for (size_t k = 0; k < kinds.size(); ++k) {
    if (k == lead) continue;
    // A static layout places every kind by its own rule where that rule keeps the lead's token
    // blocks and homes (ring, zigzag, Ulysses and a2a_p2p cut by length alone; packing balances
    // compute, so its homes can move with the mask): the baseline stays what it claims to be.
    if (lp.header.method != "dcp") {
      BlockOptions own = options.blocks;
      own.block_size = lead_block_size;
      PlacedMethod placed = place_by_method(lp.header.method, kinds[k], own, cluster, placement);
      if (same_token_blocks(placed.placed.table, lp.table) && placed.placed.placement.block_home == lp.placement.block_home) {
        plans[k] = build_plan(placed.placed.table, placed.placed.placement, cluster, lp.header.options);
        continue;
      }
    }
    BlockTable table;
    if (lp.table.block_size > 0) {
      blocks.block_size = lp.table.block_size;
      table = build_block_table(kinds[k], blocks);
    } else {
      table = build_block_table_with_cuts(kinds[k], blocks, cuts);
    }
    Placement start;
    start.method = "dcp";
    start.num_devices = cluster.num_devices();
    start.block_home = lp.placement.block_home;
    start.tile_device = start_devices(table, lp);
    const DcpPlacement placed = place_tiles_on_homes(table, cluster, placement, start);
    plans[k] = build_plan(table, placed.placement, cluster, lp.header.options);
  }
}

// The homes refined for every kind at once (refine_homes_for_kinds), then each kind's tiles
// balanced on them again (place_tiles_on_homes); plans scheduled as `plans` were. Empty when the
// plans are not DCP's (a static layout's homes are its own) or run on one device.
std::vector<Plan> refined_for_all_kinds(const std::vector<Plan>& plans, const std::vector<double>& layers,
                                        const Cluster& cluster, const PlacementOptions& placement) {
  if (cluster.num_devices() <= 1) return {};
  for (const Plan& p : plans)
    if (p.header.method != "dcp") return {};
  std::vector<const BlockTable*> tables;
  std::vector<Placement> starts;
  for (const Plan& p : plans) {
    tables.push_back(&p.table);
    starts.push_back(p.placement);
  }
  const std::vector<Placement> refined = refine_homes_for_kinds(tables, layers, cluster, placement, starts);
  std::vector<Plan> out;
  for (size_t k = 0; k < plans.size(); ++k) {
    const DcpPlacement placed = place_tiles_on_homes(plans[k].table, cluster, placement, refined[k]);
    out.push_back(build_plan(plans[k].table, placed.placement, cluster, plans[k].header.options));
  }
  return out;
}

}  // namespace

namespace {

// Each kind but the lead, where DCP placed it, planned again on finer token blocks of the same
// homes (2 pieces per block), keeping the plan the simulator predicts fastest: the block size
// suits the lead, and another kind's tiles may fit its mask better on finer blocks.
void refine_kind_blocks(const std::vector<Batch>& kinds, size_t lead, const Cluster& cluster,
                        const PlacementOptions& placement, const SimOptions& sim, std::vector<Plan>& plans) {
  for (size_t k = 0; k < kinds.size(); ++k) {
    if (k == lead || plans[k].header.method != "dcp") continue;
    double best = simulate(plans[k], cluster, sim).total_s();
    for (const int parts : {2}) {
      Plan finer = on_finer_blocks(kinds[k], plans[k], parts, cluster, placement);
      const double t = simulate(finer, cluster, sim).total_s();
      if (t < best) {
        best = t;
        plans[k] = std::move(finer);
      }
    }
  }
}

}  // namespace

std::vector<Plan> plan_step_kinds(const std::vector<Batch>& kinds, const Cluster& cluster,
                                  const StepPlanOptions& options, const std::vector<double>& layers) {
  if (kinds.empty()) raise(ErrorKind::InvalidInput, "plan_step_kinds: no layer kinds");
  if (!layers.empty() && layers.size() != kinds.size())
    raise(ErrorKind::InvalidInput, "plan_step_kinds: " + std::to_string(layers.size()) + " layer counts for " +
                                       std::to_string(kinds.size()) + " layer kinds");
  for (size_t k = 0; k < layers.size(); ++k)
    if (!(layers[k] > 0) || !std::isfinite(layers[k]))
      raise(ErrorKind::InvalidInput, "plan_step_kinds: layer kind " + std::to_string(k) + " has " +
                                         std::to_string(layers[k]) + " layers (must be > 0)");
  options.validate();
  cluster.validate("cluster");
  check_same_sequences(kinds);
  const auto weight = [&](size_t k) { return layers.empty() ? 1.0 : layers[k]; };
  std::vector<double> weights;
  for (size_t k = 0; k < kinds.size(); ++k) weights.push_back(weight(k));
  // Leads tried: on one device the homes are all on it and the lead sets only the block size, so
  // the kind with the most attention work (mask area x layers) alone; on several, every kind, that
  // one first. The homes that suit one kind's tiles can cost another's dearly (the paper setting,
  // 4 x 8 A100, 131072 tokens, three lambda layers per causal one: with causal's homes a lambda
  // layer predicted 2.0x its time alone, with lambda's a causal layer 1.7x; lambda's homes won the
  // step by 6 %), so the simulator decides.
  size_t first = 0;
  for (size_t k = 1; k < kinds.size(); ++k)
    if (weight(k) * static_cast<double>(kinds[k].mask_area()) > weight(first) * static_cast<double>(kinds[first].mask_area()))
      first = k;
  std::vector<size_t> leads{first};
  if (cluster.num_devices() > 1)
    for (size_t k = 0; k < kinds.size(); ++k)
      if (k != first) leads.push_back(k);
  const PlannerOptions& so = options.search;
  const Calibration calibration = so.calibration ? *so.calibration : calibration_from_cluster(cluster);
  SimOptions sim;
  sim.calibration = calibration;
  // Every kind's predicted forward + backward times its layers; `lead_s`: the lead's, known.
  const auto predicted = [&](const std::vector<Plan>& plans, size_t lead, double lead_s) {
    double total = weight(lead) * lead_s;
    for (size_t k = 0; k < plans.size(); ++k)
      if (k != lead) total += weight(k) * simulate(plans[k], cluster, sim).total_s();
    return total;
  };
  std::vector<Plan> plans;
  bool have = false;
  double best = 0;
  const auto keep = [&](std::vector<Plan>& trial, double total) {
    if (!have || total < best) {  // earlier leads and sizes win ties
      have = true;
      best = total;
      plans = std::move(trial);
    }
  };
  for (const size_t lead : leads) {
    if (!options.search_candidates) {
      std::vector<Plan> trial(kinds.size());
      trial[lead] = plan_step(kinds[lead], cluster, options);
      plan_other_kinds(kinds, lead, cluster, options, options.placement, options.blocks.block_size, trial);
      std::vector<Plan> joint;
      if (options.kinds_joint_homes && leads.size() > 1)
        joint = refined_for_all_kinds(trial, weights, cluster, options.placement);
      if (options.kinds_finer_blocks) {
        refine_kind_blocks(kinds, lead, cluster, options.placement, sim, trial);
        if (!joint.empty()) refine_kind_blocks(kinds, lead, cluster, options.placement, sim, joint);
      }
      if (leads.size() == 1) return trial;
      const double lead_s = simulate(trial[lead], cluster, sim).total_s();
      keep(trial, predicted(trial, lead, lead_s));
      if (!joint.empty()) keep(joint, predicted(joint, lead, simulate(joint[lead], cluster, sim).total_s()));
      continue;
    }
    // The search: each block size's best plan of the lead (plan_batch over that size), the other
    // kinds on its placement, and the size whose plans the simulator predicts fastest over all
    // layers wins. With one kind this is plan_batch's own choice.
    options.blocks.validate(kinds[lead].shape);
    PlacementOptions placement = so.placement;
    if (so.balance_time && placement.tile_cost.is_flops()) placement.tile_cost = tile_cost_from(calibration);
    // The block sizes tried, one at a time, under the search's tile budget
    // (PlannerOptions::max_tiles_per_device: a size over it is skipped, never the largest).
    std::vector<std::vector<int64_t>> sizes;
    if (kinds.size() == 1) {
      sizes.push_back(so.block_sizes);
    } else {
      const int64_t coarsest = *std::max_element(so.block_sizes.begin(), so.block_sizes.end());
      const int64_t budget = std::max(so.max_tiles_per_device * int64_t{cluster.num_devices()}, so.min_tile_budget);
      for (int64_t b : so.block_sizes) {
        BlockOptions bo;
        bo.block_size = b;
        bo.q_heads_per_group = so.q_heads_per_group;
        if (so.max_tiles_per_device > 0 && b != coarsest && std::ssize(build_block_table(kinds[lead], bo).tiles) > budget)
          continue;
        sizes.push_back({b});
      }
    }
    for (const std::vector<int64_t>& b : sizes) {
      PlannerOptions one = so;
      one.block_sizes = b;
      PlannedBatch planned = plan_batch(kinds[lead], cluster, one);
      std::vector<Plan> trial(kinds.size());
      PlacementOptions kind_placement = placement;
      kind_placement.eps_compute = planned.chosen.eps_compute;
      const int64_t lead_block_size = planned.chosen.block_size > 0 ? planned.chosen.block_size  // 0: a layout's own cuts
                                                                    : options.blocks.block_size;
      trial[lead] = std::move(planned.plan);
      plan_other_kinds(kinds, lead, cluster, options, kind_placement, lead_block_size, trial);
      std::vector<Plan> joint;
      if (options.kinds_joint_homes) joint = refined_for_all_kinds(trial, weights, cluster, kind_placement);
      if (options.kinds_finer_blocks) {
        refine_kind_blocks(kinds, lead, cluster, kind_placement, sim, trial);
        if (!joint.empty()) refine_kind_blocks(kinds, lead, cluster, kind_placement, sim, joint);
      }
      keep(trial, predicted(trial, lead, planned.chosen.predicted_s));
      if (!joint.empty()) keep(joint, predicted(joint, lead, simulate(joint[lead], cluster, sim).total_s()));
    }
  }
  return plans;
}

}  // namespace dcp
