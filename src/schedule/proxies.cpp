// Proxies: crossings moved off busy inter-node ports (ScheduleOptions::proxies, dcp/schedule.h).
//
// A device's inter-node port serves its own traffic alone (inter_bw_device), so a node whose
// traffic piles on a few ports waits on them while its other ports idle. Per node and pass the
// busiest port hands one bundle at a time (the kinds of one block and group crossing together in
// one round) to the idlest port, as long as the bundle is smaller than their gap, until the
// busiest is within (1 + slack) x the node's mean. Receiving ports are balanced first, then
// sending ports. A bundle handed over takes two legs in consecutive rounds, one of them inside the
// node: an input reaches the proxy a round before it is needed, a partial output goes on from the
// proxy the round after its own.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "schedule/schedule_internal.h"

namespace dcp::sched {
namespace {

// (kind or side, block, group, device) in one word: kinds < 16, blocks < 2^28 (tokens < 2^31 in
// blocks of >= 16), groups < 1024 heads, devices < 2^14 (limits.h).
uint64_t held_key(int kind, int32_t block, int32_t group, int32_t device) {
  return (static_cast<uint64_t>(kind) << 60) | (static_cast<uint64_t>(block) << 32) |
         (static_cast<uint64_t>(group) << 16) | static_cast<uint64_t>(device);
}

struct Bundle {
  int32_t port = 0, side = 0, block = 0, group = 0, round = 0;
  std::vector<size_t> legs;  // transfers of its kinds
  double bytes = 0;
  bool taken = false;
};

// What differs between inputs and outputs.
struct Rules {
  std::function<bool(const ScheduledTransfer&)> eligible;  // may take a proxy
  bool later_first = true;  // which bundle of the busiest port goes first: the latest round, or the earliest
  // The two legs: the transfer at `i` and a new one, through `proxy`.
  std::function<void(std::vector<ScheduledTransfer>&, size_t, int32_t)> split;
};

// Balances the receiving (or sending) ports of every node over `transfers`. `holders`: (side,
// block, group, device) that may not proxy the block (they hold or handle it already); the
// proxies chosen here join it.
void balance(const BlockTable& table, const Cluster& cluster, double slack, bool receiving, const Rules& rules,
             std::unordered_set<uint64_t>& holders, std::vector<ScheduledTransfer>& transfers) {
  auto bytes_of = [&](const ScheduledTransfer& t) { return static_cast<double>(transfer_bytes(table, t)); };
  const int devices = cluster.num_devices();
  std::vector<double> load(static_cast<size_t>(devices), 0.0);
  std::vector<Bundle> bundles;
  std::vector<std::vector<size_t>> of_port(static_cast<size_t>(devices));
  struct KeyHash {
    size_t operator()(const std::pair<uint64_t, uint64_t>& k) const {
      return std::hash<uint64_t>()(k.first * 0x9E3779B97F4A7C15ULL ^ k.second);
    }
  };
  // ((side, block, group, port), (round, far end)) -> bundle
  std::unordered_map<std::pair<uint64_t, uint64_t>, size_t, KeyHash> index;
  for (size_t i = 0; i < transfers.size(); ++i) {
    const ScheduledTransfer& t = transfers[i];
    if (cluster.node_of(t.src) == cluster.node_of(t.dst)) continue;
    const int32_t port = receiving ? t.dst : t.src;
    load[static_cast<size_t>(port)] += bytes_of(t);
    if (!rules.eligible(t)) continue;
    const int side = static_cast<int>(side_of(t.kind));
    const int32_t far = receiving ? t.src : t.dst;
    const std::pair<uint64_t, uint64_t> k{held_key(side, t.token_block, t.group, port),
                                          (static_cast<uint64_t>(t.round) << 32) | static_cast<uint64_t>(far)};
    auto [it, fresh] = index.try_emplace(k, bundles.size());
    if (fresh) {
      bundles.push_back(Bundle{port, side, t.token_block, t.group, t.round, {}, 0.0, false});
      of_port[static_cast<size_t>(port)].push_back(it->second);
    }
    Bundle& b = bundles[it->second];
    b.legs.push_back(i);
    b.bytes += bytes_of(t);
  }
  const int dpn = cluster.devices_per_node;
  for (int n = 0; n < cluster.nodes; ++n) {
    const int first = n * dpn;
    double mean = 0;
    for (int d = first; d < first + dpn; ++d) mean += load[static_cast<size_t>(d)];
    mean /= dpn;
    for (;;) {
      int hot = first, cold = first;
      for (int d = first; d < first + dpn; ++d) {
        if (load[static_cast<size_t>(d)] > load[static_cast<size_t>(hot)]) hot = d;
        if (load[static_cast<size_t>(d)] < load[static_cast<size_t>(cold)]) cold = d;
      }
      if (load[static_cast<size_t>(hot)] <= (1 + slack) * mean) break;
      const double gap = load[static_cast<size_t>(hot)] - load[static_cast<size_t>(cold)];
      Bundle* pick = nullptr;
      for (const size_t bi : of_port[static_cast<size_t>(hot)]) {
        Bundle& b = bundles[bi];
        if (b.taken || b.bytes >= gap || holders.count(held_key(b.side, b.block, b.group, cold))) continue;
        if (pick == nullptr || (rules.later_first ? b.round > pick->round : b.round < pick->round)) pick = &b;
      }
      if (pick == nullptr) break;
      for (const size_t i : pick->legs) rules.split(transfers, i, cold);
      pick->taken = true;
      holders.insert(held_key(pick->side, pick->block, pick->group, cold));
      load[static_cast<size_t>(hot)] -= pick->bytes;
      load[static_cast<size_t>(cold)] += pick->bytes;
    }
  }
}

}  // namespace

void proxy_inputs(const BlockTable& table, const Cluster& cluster, double slack, PassSchedule& ps) {
  std::vector<ScheduledTransfer>& in = ps.inputs;
  // A relay's crossing stays where it is (the relay forwards it), and a device that receives a
  // block (for its tiles, as a relay or as a proxy) cannot proxy it.
  std::unordered_set<uint64_t> relays;
  for (const ScheduledTransfer& t : in)
    if (t.via_relay) relays.insert(held_key(static_cast<int>(t.kind), t.token_block, t.group, t.src));
  std::unordered_set<uint64_t> holders;
  for (const ScheduledTransfer& t : in)
    holders.insert(held_key(static_cast<int>(side_of(t.kind)), t.token_block, t.group, t.dst));
  Rules rules;
  rules.eligible = [&](const ScheduledTransfer& t) {
    return t.round >= 2 && !relays.count(held_key(static_cast<int>(t.kind), t.token_block, t.group, t.dst));
  };
  rules.later_first = true;  // its proxy leg then falls in a round that carries less already
  rules.split = [](std::vector<ScheduledTransfer>& transfers, size_t i, int32_t proxy) {
    ScheduledTransfer first = transfers[i];  // to the proxy, one round earlier
    first.round -= 1;
    first.dst = proxy;
    transfers[i].src = proxy;  // from the proxy, in the round it is needed
    transfers[i].via_relay = true;
    transfers.push_back(first);
  };
  balance(table, cluster, slack, true, rules, holders, in);
  balance(table, cluster, slack, false, rules, holders, in);
}

void proxy_outputs(const BlockTable& table, const Cluster& cluster, double slack, PassSchedule& ps) {
  std::vector<ScheduledTransfer>& out = ps.outputs;
  // A proxy merges what it gets into one partial and sends it on, as a per-node relay does: it
  // must not compute, relay or receive another partial of the block.
  std::unordered_set<uint64_t> holders;
  for (const ScheduledTransfer& t : out) {
    holders.insert(held_key(static_cast<int>(side_of(t.kind)), t.token_block, t.group, t.src));
    holders.insert(held_key(static_cast<int>(side_of(t.kind)), t.token_block, t.group, t.dst));
  }
  const int32_t final_round = ps.num_stages + 1;
  std::unordered_set<uint64_t> proxies;  // (side, block, group, proxy) of the receiving pass
  Rules rules;
  // A crossing to a proxy stays: the proxy sends the round after it arrives.
  rules.eligible = [&](const ScheduledTransfer& t) {
    return t.round + 1 <= final_round &&
           !proxies.count(held_key(static_cast<int>(side_of(t.kind)), t.token_block, t.group, t.dst));
  };
  rules.later_first = false;  // the second leg then lands well before the final round
  rules.split = [&](std::vector<ScheduledTransfer>& transfers, size_t i, int32_t proxy) {
    ScheduledTransfer second = transfers[i];  // from the proxy, the round after
    second.src = proxy;
    second.round += 1;
    transfers[i].dst = proxy;  // to the proxy, in the partial's own round
    proxies.insert(held_key(static_cast<int>(side_of(second.kind)), second.token_block, second.group, proxy));
    transfers.push_back(second);
  };
  balance(table, cluster, slack, true, rules, holders, out);
  balance(table, cluster, slack, false, rules, holders, out);
}

}  // namespace dcp::sched
