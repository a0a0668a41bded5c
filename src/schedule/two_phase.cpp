// Two-phase inter-node transfers and the schedule's consistency check.
#include <algorithm>
#include <map>
#include <string>
#include <tuple>

#include "dcp/error.h"
#include "schedule/schedule_internal.h"

namespace dcp {
namespace sched {

void apply_two_phase(const BlockTable& table, const Placement& placement, const Cluster& cluster,
                     bool relay_first_round, PassSchedule& ps) {
  std::vector<ScheduledTransfer>& in = ps.inputs;
  auto node = [&](int d) { return cluster.node_of(d); };
  const KeyPacker packer{kMaxDataKind, table.num_token_blocks() - 1,
                         std::max(table.groups.num_groups, table.groups.num_kv_sets()) - 1, cluster.nodes - 1,
                         ps.num_stages + 2, placement.num_devices - 1};
  sort_keyed(
      in, packer.fits(),
      [&](const ScheduledTransfer& x) {
        return packer.pack({static_cast<int64_t>(x.kind), x.token_block, x.group, node(x.dst), x.round, x.dst});
      },
      [&](const ScheduledTransfer& a, const ScheduledTransfer& b) {
        return std::make_tuple(a.kind, a.token_block, a.group, node(a.dst), a.round, a.dst) <
               std::make_tuple(b.kind, b.token_block, b.group, node(b.dst), b.round, b.dst);
      });
  // (device, side, block, group) whose delivery moved from the first round to the second.
  std::vector<std::tuple<int32_t, int, int32_t, int32_t>> delayed;
  const bool can_delay = relay_first_round && ps.num_stages >= 3;
  size_t i = 0;
  while (i < in.size()) {
    size_t j = i + 1;
    while (j < in.size() && in[j].kind == in[i].kind && in[j].token_block == in[i].token_block &&
           in[j].group == in[i].group && node(in[j].dst) == node(in[i].dst))
      ++j;
    if (j - i >= 2 && node(in[i].src) != node(in[i].dst)) {
      const int32_t r0 = in[i].round;
      const bool shared_first = in[i + 1].round == r0;
      // A block shared in the first round has no earlier round for the relay's leg: the others
      // then take it from the relay in the second (their tiles reading it move one stage later)
      // instead of each crossing the network from the home.
      const bool delay = shared_first && r0 == 1 && can_delay;
      const int32_t r1 = (shared_first && r0 >= 2) ? r0 - 1 : r0;
      const int32_t relay = in[i].dst;
      in[i].round = r1;  // first leg: the source to the relay
      for (size_t k = i + 1; k < j; ++k) {
        if (delay && in[k].round == 1) {
          in[k].round = 2;
          delayed.emplace_back(in[k].dst, static_cast<int>(side_of(in[k].kind)), in[k].token_block, in[k].group);
        }
        if (in[k].round > r1) {
          in[k].src = relay;
          in[k].via_relay = true;
        }
      }
    }
    i = j;
  }
  if (delayed.empty()) return;
  std::sort(delayed.begin(), delayed.end());
  auto is_delayed = [&](int32_t d, Side side, int32_t block, int32_t group) {
    return std::binary_search(delayed.begin(), delayed.end(), std::make_tuple(d, static_cast<int>(side), block, group));
  };
  for (size_t t = 0; t < table.tiles.size(); ++t) {
    if (ps.tile_stage[t] != 1) continue;
    const Tile& tile = table.tiles[t];
    const int32_t d = placement.tile_device[t];
    if (is_delayed(d, Side::Q, tile.q_block, tile.head_group) ||
        is_delayed(d, Side::KV, tile.kv_block, table.groups.kv_set(tile.head_group))) {
      ps.tile_stage[t] = 2;
      const double rate = ps.pass == Pass::Forward ? cluster.attn_fwd_flops : cluster.attn_bwd_flops;
      const double c_s = (ps.pass == Pass::Forward ? table.tile_flops_fwd(tile) : table.tile_flops_bwd(tile)) / rate;
      ps.stage_compute_s[d][1] -= c_s;
      ps.stage_compute_s[d][2] += c_s;
    }
  }
}

void reduce_outputs_per_node(const BlockTable& table, const Cluster& cluster, PassSchedule& ps) {
  std::vector<ScheduledTransfer>& out = ps.outputs;
  const int32_t final_round = ps.num_stages + 1;
  auto node = [&](int d) { return cluster.node_of(d); };
  auto side = [](DataKind k) { return static_cast<int>(side_of(k)); };
  // Per (side, block, group, home, source node): the sources, latest own round first. O and LSE
  // of one source travel together (same round, same destination).
  int64_t max_block = 0, max_group = 0, max_device = 0, max_round = 0;
  for (const ScheduledTransfer& x : out) {
    max_block = std::max<int64_t>(max_block, x.token_block);
    max_group = std::max<int64_t>(max_group, x.group);
    max_device = std::max<int64_t>(max_device, std::max(x.src, x.dst));
    max_round = std::max<int64_t>(max_round, x.round);
  }
  const KeyPacker packer{1, max_block, max_group, max_device, cluster.nodes - 1, max_round, max_device, kMaxDataKind};
  sort_keyed(
      out, packer.fits(),
      [&](const ScheduledTransfer& x) {  // the latest round first: max_round - round
        return packer.pack({side(x.kind), x.token_block, x.group, x.dst, node(x.src), max_round - x.round, x.src,
                            static_cast<int64_t>(x.kind)});
      },
      [&](const ScheduledTransfer& a, const ScheduledTransfer& b) {
        return std::make_tuple(side(a.kind), a.token_block, a.group, a.dst, node(a.src), -a.round, a.src, a.kind) <
               std::make_tuple(side(b.kind), b.token_block, b.group, b.dst, node(b.src), -b.round, b.src, b.kind);
      });
  auto group_end = [&](size_t i) {
    size_t j = i + 1;
    while (j < out.size() && side(out[j].kind) == side(out[i].kind) && out[j].token_block == out[i].token_block &&
           out[j].group == out[i].group && out[j].dst == out[i].dst && node(out[j].src) == node(out[i].src))
      ++j;
    return j;
  };
  // Bytes each device sends across nodes: a block's relay is, among the sources whose partials
  // are ready last, the one whose port carries least so far (crossings that no relay serves
  // counted first), so that the relays of several blocks spread over the node's ports.
  std::vector<int64_t> sent(static_cast<size_t>(max_device + 1), 0);
  auto relays = [&](size_t i, size_t j) { return node(out[i].src) != node(out[i].dst) && out[j - 1].src != out[i].src; };
  for (size_t i = 0, j = 0; i < out.size(); i = j) {
    j = group_end(i);
    if (node(out[i].src) != node(out[i].dst) && !relays(i, j))
      for (size_t k = i; k < j; ++k) sent[static_cast<size_t>(out[k].src)] += transfer_bytes(table, out[k]);
  }
  size_t i = 0;
  while (i < out.size()) {
    const size_t j = group_end(i);
    if (relays(i, j)) {
      const int32_t relay_round = out[i].round;  // the relay's own partial is ready for this round
      int32_t relay = out[i].src;
      for (size_t k = i; k < j && out[k].round == relay_round; ++k)
        if (sent[static_cast<size_t>(out[k].src)] < sent[static_cast<size_t>(relay)]) relay = out[k].src;
      std::stable_partition(out.begin() + static_cast<std::ptrdiff_t>(i), out.begin() + static_cast<std::ptrdiff_t>(j),
                            [&](const ScheduledTransfer& x) { return x.src == relay; });
      int32_t last_in = 0;
      for (size_t k = i; k < j; ++k) {
        if (out[k].src == relay) continue;
        // After the relay's last tile of the block (its own round - 1), and in time for a
        // forward no later than the final round.
        const int32_t round = std::max(out[k].round, relay_round - 1);
        if (round + 1 > final_round) {  // goes to the home directly
          sent[static_cast<size_t>(out[k].src)] += transfer_bytes(table, out[k]);
          continue;
        }
        out[k].dst = relay;
        out[k].round = round;
        last_in = std::max(last_in, round);
      }
      for (size_t k = i; k < j && out[k].src == relay; ++k) {
        if (last_in > 0) out[k].round = std::max(relay_round, last_in + 1);
        sent[static_cast<size_t>(relay)] += transfer_bytes(table, out[k]);
      }
    }
    i = j;
  }
}

}  // namespace sched

namespace {

[[noreturn]] void bad(Pass p, const std::string& what) {
  raise(ErrorKind::InvalidPlan, std::string("schedule (") + to_string(p) + "): " + what);
}
}  // namespace

void Schedule::validate(const BlockTable& table, const Placement& placement) const {
  for (const PassSchedule* ps : {&fwd, &bwd}) {
    const Pass p = ps->pass;
    if (ps->tile_stage.size() != table.tiles.size()) bad(p, "tile_stage size differs from the tile count");
    if (!ps->tile_tail.empty() && ps->tile_tail.size() != table.tiles.size())
      bad(p, "tile_tail size differs from the tile count");
    // (kind, block, group, device) -> round it is present (0 = home).
    std::map<std::tuple<int, int32_t, int32_t, int32_t>, int32_t> have;
    for (const ScheduledTransfer& t : ps->inputs) {
      if (t.round < 1 || t.round >= ps->num_stages) bad(p, "input transfer in round " + std::to_string(t.round));
      auto k = std::make_tuple(static_cast<int>(t.kind), t.token_block, t.group, t.dst);
      if (!have.emplace(k, t.round).second)
        bad(p, "block " + std::to_string(t.token_block) + " delivered twice to device " + std::to_string(t.dst));
    }
    for (const ScheduledTransfer& t : ps->inputs) {
      const bool from_home = placement.block_home[t.token_block] == t.src;
      if (from_home == t.via_relay) bad(p, "transfer source is neither the home nor a relay");
      if (t.via_relay) {
        auto it = have.find(std::make_tuple(static_cast<int>(t.kind), t.token_block, t.group, t.src));
        if (it == have.end() || it->second >= t.round) bad(p, "relay forwards a block before it has it");
      }
    }
    for (size_t ti = 0; ti < table.tiles.size(); ++ti) {
      const Tile& tile = table.tiles[ti];
      const int32_t d = placement.tile_device[ti];
      const int32_t s = ps->tile_stage[ti];
      if (s < 0 || s >= ps->num_stages) bad(p, "tile " + std::to_string(ti) + " has stage " + std::to_string(s));
      auto check = [&](Side side, int32_t block, int32_t group) {
        if (placement.block_home[block] == d) return;
        for (DataKind k : input_kinds(p, side)) {
          auto it = have.find(std::make_tuple(static_cast<int>(k), block, group, d));
          if (it == have.end() || it->second > s)
            bad(p, "tile " + std::to_string(ti) + " (stage " + std::to_string(s) + ") reads " +
                       to_string(k) + " of block " + std::to_string(block) + " not delivered in time");
        }
      };
      // A tail tile runs after the final round is posted: none of its outputs may leave.
      if (!ps->tile_tail.empty() && ps->tile_tail[ti] != 0 &&
          (placement.block_home[tile.q_block] != d ||
           (p == Pass::Backward && placement.block_home[tile.kv_block] != d)))
        bad(p, "tile " + std::to_string(ti) + " is in the tail but has an output to another device");
      check(Side::Q, tile.q_block, tile.head_group);
      check(Side::KV, tile.kv_block, table.groups.kv_set(tile.head_group));
    }
  }
}

}  // namespace dcp
