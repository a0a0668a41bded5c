// Stage scheduling: per device and pass, a greedy that fills communication rounds so that each
// round's predicted transfer time matches the compute it hides (see dcp/schedule.h).
#include "dcp/schedule.h"

#include <algorithm>
#include <array>
#include <numeric>

#include "dcp/error.h"
#include "schedule/schedule_internal.h"

namespace dcp {

const char* to_string(Pass pass) { return pass == Pass::Forward ? "fwd" : "bwd"; }

void ScheduleOptions::validate() const {
  if (num_comm_stages < 1 || num_comm_stages > 64)
    raise(ErrorKind::InvalidInput, "schedule options: --stages must be in [1, 64] (got " +
                                       std::to_string(num_comm_stages) + ")");
  if (!(proxy_slack >= 0 && proxy_slack < 1e6))
    raise(ErrorKind::InvalidInput, "schedule options: proxy_slack must be a number >= 0 (got " +
                                       std::to_string(proxy_slack) + ")");
  auto check_share = [](double share, const std::string& which) {
    if (!(share > 0 && share <= 1))
      raise(ErrorKind::InvalidInput, "schedule options: " + which + "last_round_share must be in (0, 1] (got " +
                                         std::to_string(share) + ")");
  };
  check_share(last_round_share, "");
  if (backward) check_share(backward->last_round_share, "the backward's ");
}

ScheduleOptions ScheduleOptions::for_backward() const {
  ScheduleOptions o = *this;
  if (backward) o.set_choices(*backward);
  o.backward.reset();
  return o;
}

std::span<const DataKind> input_kinds(Pass pass, Side side) {
  static constexpr DataKind kFwdQ[] = {DataKind::Q};
  static constexpr DataKind kBwdQ[] = {DataKind::Q, DataKind::dO, DataKind::LSE, DataKind::Delta};
  static constexpr DataKind kKv[] = {DataKind::KV};
  if (side == Side::KV) return kKv;
  return pass == Pass::Forward ? std::span<const DataKind>(kFwdQ) : std::span<const DataKind>(kBwdQ);
}

std::span<const DataKind> output_kinds(Pass pass, Side side) {
  static constexpr DataKind kFwdQ[] = {DataKind::O, DataKind::LSE};
  static constexpr DataKind kBwdQ[] = {DataKind::dQ};
  static constexpr DataKind kBwdKv[] = {DataKind::dKV};
  if (pass == Pass::Forward)
    return side == Side::Q ? std::span<const DataKind>(kFwdQ) : std::span<const DataKind>();
  return side == Side::Q ? std::span<const DataKind>(kBwdQ) : std::span<const DataKind>(kBwdKv);
}

namespace sched {

double link_bw(const Cluster& c, int src, int dst) {
  if (c.node_of(src) == c.node_of(dst)) return c.intra_bw;
  return std::min(c.inter_bw_device, c.nic_bw_node / c.devices_per_node);
}

double link_latency(const Cluster& c, int src, int dst) {
  return c.node_of(src) == c.node_of(dst) ? c.intra_latency_s : c.inter_latency_s;
}

}  // namespace sched

namespace {



struct Item {  // a remote input of one device: one side of one (block, group)
  Side side;
  int32_t block;
  int32_t group;
  double time_s;   // what rounds are balanced by: predicted seconds, or bytes (paper policy)
  double seconds;  // predicted transfer time of all its kinds
  int32_t uses;    // tiles of this device reading it
  int32_t round;   // 0 = not yet delivered
};

// The tail (schedule.h): per device, the final round's predicted time; then tiles whose outputs
// are all home, latest stage first and from the end of the device's list, while they fit under
// it and under their stage's slack (its compute less the round it hides: that round's inputs
// and outputs).
void hold_back_tail(const BlockTable& table, const Placement& placement, const Cluster& cluster,
                    const std::vector<std::vector<int32_t>>& tiles_of, double rate, PassSchedule& ps) {
  const int num_devices = static_cast<int>(tiles_of.size());
  const int num_stages = ps.num_stages;
  const int32_t final_round = num_stages + 1;
  // Predicted output seconds per device and round: received, sent.
  std::vector<std::vector<double>> in_s(num_devices, std::vector<double>(num_stages + 2, 0.0));
  std::vector<std::vector<double>> out_s = in_s;
  for (const ScheduledTransfer& x : ps.outputs) {
    const auto bytes = static_cast<double>(sched::transfer_bytes(table, x));
    const double secs = bytes / sched::link_bw(cluster, x.src, x.dst) + sched::link_latency(cluster, x.src, x.dst);
    in_s[x.dst][x.round] += secs;
    out_s[x.src][x.round] += secs;
  }
  std::vector<double> final_s(num_devices, 0.0);
  for (int d = 0; d < num_devices; ++d) final_s[d] = std::max(in_s[d][final_round], out_s[d][final_round]);
  for (const ScheduledTransfer& x : ps.outputs)
    if (x.round == final_round) final_s[x.src] = std::max(final_s[x.src], in_s[x.dst][final_round]);
  std::vector<double> slack(num_stages);
  for (int d = 0; d < num_devices; ++d) {
    double budget = final_s[d];
    if (budget <= 0) continue;
    for (int st = 0; st < num_stages; ++st)
      slack[st] = ps.stage_compute_s[d][st] - ps.round_transfer_s[d][st + 1] -
                  std::max(in_s[d][st + 1], out_s[d][st + 1]);
    const std::vector<int32_t>& mine = tiles_of[d];
    for (int st = num_stages - 1; st >= 0 && budget > 0; --st) {
      for (auto it = mine.rbegin(); it != mine.rend(); ++it) {
        if (ps.tile_stage[*it] != st) continue;
        const Tile& tile = table.tiles[*it];
        const bool q_home = placement.block_home[tile.q_block] == d;
        const bool kv_home = placement.block_home[tile.kv_block] == d;
        if (!q_home || (ps.pass == Pass::Backward && !kv_home)) continue;  // an output leaves
        const double c_s =
            (ps.pass == Pass::Forward ? table.tile_flops_fwd(tile) : table.tile_flops_bwd(tile)) / rate;
        if (c_s > budget || c_s > slack[st]) continue;
        budget -= c_s;
        slack[st] -= c_s;
        ps.tile_tail[*it] = 1;
      }
    }
  }
}

PassSchedule schedule_pass(const BlockTable& table, const Placement& placement,
                           const Cluster& cluster, const ScheduleOptions& opts, Pass pass) {
  const int num_devices = placement.num_devices;
  const int num_stages = opts.num_comm_stages + 1;
  const int num_groups = table.groups.num_groups;
  const int num_sets = table.groups.num_kv_sets();
  const int64_t nb = table.num_token_blocks();
  const double rate = pass == Pass::Forward ? cluster.attn_fwd_flops : cluster.attn_bwd_flops;

  PassSchedule out;
  out.pass = pass;
  out.num_stages = num_stages;
  out.tile_stage.assign(table.tiles.size(), 0);
  out.stage_compute_s.assign(num_devices, std::vector<double>(num_stages, 0.0));
  out.round_transfer_s.assign(num_devices, std::vector<double>(num_stages + 2, 0.0));

  std::vector<std::vector<int32_t>> tiles_of(num_devices);
  for (size_t t = 0; t < table.tiles.size(); ++t)
    tiles_of[placement.tile_device[t]].push_back(static_cast<int32_t>(t));

  auto side_bytes = [&](Side side, int32_t block) {
    int64_t bytes = 0;
    for (DataKind k : input_kinds(pass, side))
      bytes += table.partial_bytes(k, table.token_blocks[block].length);
    return bytes;
  };
  // item index lookup per device: dense keys, reset through a touch list.
  const int64_t num_keys = nb * (num_groups + num_sets);
  std::vector<int32_t> item_of(static_cast<size_t>(num_keys), -1);
  auto key = [&](Side side, int32_t block, int32_t group) -> int64_t {
    return side == Side::Q ? block * int64_t{num_groups} + group
                           : nb * num_groups + block * int64_t{num_sets} + group;
  };

  std::vector<Item> items;
  std::vector<int32_t> remote;
  std::vector<std::array<int32_t, 2>> tile_items;
  std::vector<double> prio;
  for (int d = 0; d < num_devices; ++d) {
    items.clear();
    remote.clear();
    tile_items.clear();
    auto item_for = [&](Side side, int32_t block, int32_t group) -> int32_t {
      if (placement.block_home[block] == d) return -1;
      int64_t k = key(side, block, group);
      if (item_of[k] < 0) {
        item_of[k] = static_cast<int32_t>(items.size());
        int src = placement.block_home[block];
        const auto bytes = static_cast<double>(side_bytes(side, block));
        // The paper's policy measures rounds in bytes; ours in predicted transfer seconds.
        const double secs = bytes / sched::link_bw(cluster, src, d) + sched::link_latency(cluster, src, d);
        items.push_back(Item{side, block, group, opts.balance_by_time ? secs : bytes, secs, 0, 0});
      }
      ++items[item_of[k]].uses;
      return item_of[k];
    };
    for (int32_t t : tiles_of[d]) {
      const Tile& tile = table.tiles[t];
      double c_s = (pass == Pass::Forward ? table.tile_flops_fwd(tile) : table.tile_flops_bwd(tile)) / rate;
      int32_t qi = item_for(Side::Q, tile.q_block, tile.head_group);
      int32_t ki = item_for(Side::KV, tile.kv_block, table.groups.kv_set(tile.head_group));
      if (qi < 0 && ki < 0) {
        out.tile_stage[t] = 0;
        out.stage_compute_s[d][0] += c_s;
      } else {
        remote.push_back(t);
        tile_items.push_back({qi, ki});
      }
    }
    // Order remote tiles by amortised transfer time per unit of compute (cheapest first), so
    // early rounds unlock the most compute per byte; ties keep table order (deterministic).
    prio.assign(remote.size(), 0.0);
    for (size_t i = 0; i < remote.size(); ++i) {
      double cost = 0;
      for (int32_t ii : tile_items[i])
        if (ii >= 0) cost += items[ii].time_s / items[ii].uses;
      double flops = table.tile_flops_fwd(table.tiles[remote[i]]);
      prio[i] = cost / std::max(flops, 1.0);
    }
    std::vector<int32_t> order(remote.size());
    std::iota(order.begin(), order.end(), 0);
    // Optionally, tiles whose partial outputs cross the network go first: their outputs then
    // leave early enough to be reduced per node and to overlap later stages.
    auto far_output = [&](const Tile& tile) {
      const bool q_far = cluster.node_of(placement.block_home[tile.q_block]) != cluster.node_of(d);
      const bool kv_far = cluster.node_of(placement.block_home[tile.kv_block]) != cluster.node_of(d);
      return q_far || (pass == Pass::Backward && kv_far);
    };
    std::vector<uint8_t> cross(remote.size(), 0);
    for (size_t i = 0; i < remote.size(); ++i)
      cross[i] = opts.far_outputs_first && far_output(table.tiles[remote[i]]) ? 1 : 0;
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return std::tie(cross[b], prio[a]) < std::tie(cross[a], prio[b]);
    });

    // Round r gets an even share of what is left to move, measured in predicted seconds
    // (link bandwidth by source, NIC sharing, latency) or, as in the paper, in bytes. Matching
    // each round to the previous stage's compute was tried and simulated slower: rounds act
    // as loose barriers between peers, so uneven rounds propagate stalls.
    // The last input round counts as last_round_share of a round: a smaller last stage sends
    // fewer outputs in the final round, which nothing overlaps.
    // With rounds_per_link_class the inputs from the device's own node and those from other
    // nodes fill the rounds each on its own (round, budget and share): they cross different
    // resources (its ingress inside the node; ports and NICs between nodes) at the same time, so a
    // round lasts about the longer of the two, not their sum, and a device whose first rounds
    // carry slow crossings still gets inputs from its node, and the compute they unlock, in them.
    // A tile runs once the last of its inputs is in.
    auto link_class = [&](const Item& it) {
      return opts.rounds_per_link_class && cluster.node_of(placement.block_home[it.block]) != cluster.node_of(d) ? 1 : 0;
    };
    std::array<double, 2> remaining{0.0, 0.0};
    for (const Item& it : items) remaining[link_class(it)] += it.time_s;
    auto budget_for = [&](int c, int r) {
      const int rounds_left = num_stages - r;
      if (rounds_left <= 1) return remaining[c];
      return remaining[c] / (rounds_left - 1 + opts.last_round_share);
    };
    std::array<int, 2> round{1, 1};
    std::array<double, 2> round_s{0.0, 0.0};
    std::array<double, 2> budget{budget_for(0, 1), budget_for(1, 1)};
    for (int32_t oi : order) {
      std::array<double, 2> new_s{0.0, 0.0};
      for (int32_t ii : tile_items[oi])
        if (ii >= 0 && items[ii].round == 0) new_s[link_class(items[ii])] += items[ii].time_s;
      for (int c = 0; c < 2; ++c) {
        if (round[c] < num_stages - 1 && round_s[c] > 0 && new_s[c] > 0 && round_s[c] + new_s[c] > budget[c]) {
          ++round[c];
          round_s[c] = 0;
          budget[c] = budget_for(c, round[c]);
        }
      }
      // A tile whose inputs all arrived earlier can run in the earliest such stage.
      int need = 0;
      for (int32_t ii : tile_items[oi]) {
        if (ii < 0) continue;
        Item& it = items[ii];
        if (it.round == 0) {
          const int c = link_class(it);
          it.round = round[c];
          round_s[c] += it.time_s;
          remaining[c] -= it.time_s;
        }
        need = std::max(need, it.round);
      }
      const int32_t t = remote[oi];
      out.tile_stage[t] = need;
      const Tile& tile = table.tiles[t];
      out.stage_compute_s[d][need] +=
          (pass == Pass::Forward ? table.tile_flops_fwd(tile) : table.tile_flops_bwd(tile)) / rate;
    }
    // With far outputs first, none of those tiles stays in the last stage: the outputs of the
    // last stage travel in the final round, after every device's compute, where the partials of
    // many devices would queue on the home's one inter-node port. The tile runs one stage
    // earlier and its inputs still due in the last round arrive one round earlier (other tiles
    // reading them keep their stage).
    const int last = num_stages - 1;
    const bool keep_far_out_of_last = opts.far_outputs_first && num_stages >= 3;
    if (keep_far_out_of_last) {
      for (size_t i = 0; i < remote.size(); ++i) {
        const int32_t t = remote[i];
        if (out.tile_stage[t] != last || cross[i] == 0) continue;
        for (int32_t ii : tile_items[i])
          if (ii >= 0 && items[ii].round == last) items[ii].round = last - 1;
        const Tile& tile = table.tiles[t];
        const double c_s = (pass == Pass::Forward ? table.tile_flops_fwd(tile) : table.tile_flops_bwd(tile)) / rate;
        out.tile_stage[t] = last - 1;
        out.stage_compute_s[d][last] -= c_s;
        out.stage_compute_s[d][last - 1] += c_s;
      }
    }
    // Round r is posted when stage r-1 starts, and a send completes only once its receiver has
    // posted; a device whose early stage is long (a round that unlocks many tiles) therefore
    // holds back every peer of its next rounds. Leveling moves tiles past a stage over the mean
    // (plus 5 %) to the next one, latest in the device's order first (their inputs are there
    // by then, so this only delays them).
    if (opts.level_stage_compute) {
      std::vector<double>& sc = out.stage_compute_s[d];
      const double cap = 1.05 * std::accumulate(sc.begin(), sc.end(), 0.0) / num_stages;
      for (int st = 0; st + 1 < num_stages; ++st) {
        for (auto it = tiles_of[d].rbegin(); it != tiles_of[d].rend() && sc[st] > cap; ++it) {
          if (out.tile_stage[*it] != st) continue;
          const Tile& tile = table.tiles[*it];
          if (keep_far_out_of_last && st + 1 == last && far_output(tile)) continue;
          const double c_s = (pass == Pass::Forward ? table.tile_flops_fwd(tile) : table.tile_flops_bwd(tile)) / rate;
          out.tile_stage[*it] = st + 1;
          sc[st] -= c_s;
          sc[st + 1] += c_s;
        }
      }
    }
    for (const Item& it : items) {
      out.round_transfer_s[d][it.round] += it.seconds;
      for (DataKind k : input_kinds(pass, it.side))
        out.inputs.push_back(ScheduledTransfer{k, it.block, it.group, placement.block_home[it.block],
                                               d, it.round, false});
      item_of[key(it.side, it.block, it.group)] = -1;
    }
  }
  if (opts.two_phase && cluster.nodes > 1)
    sched::apply_two_phase(table, placement, cluster, opts.relay_first_round, out);
  if (opts.proxies && cluster.nodes > 1) sched::proxy_inputs(table, cluster, opts.proxy_slack, out);
  // Outputs (after two-phase, which may move tiles to a later stage): each remote-owned output
  // block leaves in the round after its last tile's stage.
  // Per device: the latest stage of a tile writing each remote output (item_of's dense keys,
  // -1 = none; reset through the list of keys set), emitted in key order.
  std::vector<int32_t>& last_stage = item_of;
  std::vector<int64_t> keys_set;
  for (int d = 0; d < num_devices; ++d) {
    keys_set.clear();
    for (int32_t t : tiles_of[d]) {
      const Tile& tile = table.tiles[t];
      for (Side side : {Side::Q, Side::KV}) {
        if (output_kinds(pass, side).empty()) continue;
        int32_t block = side == Side::Q ? tile.q_block : tile.kv_block;
        if (placement.block_home[block] == d) continue;
        int32_t group = side == Side::Q ? tile.head_group : table.groups.kv_set(tile.head_group);
        int32_t& s = last_stage[key(side, block, group)];
        if (s < 0) keys_set.push_back(key(side, block, group));
        s = std::max(s, out.tile_stage[t]);
      }
    }
    std::sort(keys_set.begin(), keys_set.end());
    for (const int64_t k : keys_set) {
      const Side side = k < nb * num_groups ? Side::Q : Side::KV;
      const int64_t rel = side == Side::Q ? k : k - nb * num_groups;
      const int gs = side == Side::Q ? num_groups : num_sets;
      const auto block = static_cast<int32_t>(rel / gs);
      const auto group = static_cast<int32_t>(rel % gs);
      for (DataKind kind : output_kinds(pass, side))
        out.outputs.push_back(ScheduledTransfer{kind, block, group, d, placement.block_home[block],
                                                last_stage[k] + 2, false});
      last_stage[k] = -1;
    }
  }
  if (opts.two_phase && cluster.nodes > 1 && opts.reduce_outputs_per_node)
    sched::reduce_outputs_per_node(table, cluster, out);
  if (opts.proxies && cluster.nodes > 1) sched::proxy_outputs(table, cluster, opts.proxy_slack, out);
  out.tile_tail.assign(table.tiles.size(), 0);
  if (opts.tail_overlaps_final_round) hold_back_tail(table, placement, cluster, tiles_of, rate, out);
  auto order = [](const ScheduledTransfer& a, const ScheduledTransfer& b) {
    return std::tie(a.round, a.src, a.dst, a.kind, a.token_block, a.group) <
           std::tie(b.round, b.src, b.dst, b.kind, b.token_block, b.group);
  };
  const sched::KeyPacker packer{num_stages + 2, num_devices - 1, num_devices - 1, sched::kMaxDataKind, nb - 1,
                                std::max(num_groups, num_sets) - 1};
  auto packed = [&](const ScheduledTransfer& x) {
    return packer.pack({x.round, x.src, x.dst, static_cast<int64_t>(x.kind), x.token_block, x.group});
  };
  sched::sort_keyed(out.inputs, packer.fits(), packed, order);
  sched::sort_keyed(out.outputs, packer.fits(), packed, order);
  return out;
}

}  // namespace

Schedule build_schedule(const BlockTable& table, const Placement& placement, const Cluster& cluster,
                        const ScheduleOptions& opts) {
  opts.validate();
  placement.validate(table);
  if (cluster.num_devices() != placement.num_devices)
    raise(ErrorKind::InvalidInput, "build_schedule: cluster has " + std::to_string(cluster.num_devices()) +
                                       " devices, placement has " + std::to_string(placement.num_devices));
  Schedule s;
  s.fwd = schedule_pass(table, placement, cluster, opts, Pass::Forward);
  s.bwd = schedule_pass(table, placement, cluster, opts.for_backward(), Pass::Backward);
  return s;
}

}  // namespace dcp
