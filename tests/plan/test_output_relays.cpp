// Partial outputs reduced per node (src/schedule/two_phase.cpp): a node's partials of one output
// block meet at a relay, which alone crosses to the home. Among the sources whose partials are
// ready last, the relay is the one whose inter-node port carries the fewest bytes so far, so that
// relays of several blocks spread over a node's ports.
#include <gtest/gtest.h>

#include <map>
#include <utility>
#include <vector>

#include "schedule/schedule_internal.h"

namespace dcp {
namespace {

BlockTable blocks_of(int count, int64_t tokens) {
  BlockTable t;
  t.shape.head_dim = 128;
  t.groups = HeadGroups{1, 4, 1, 1};
  for (int b = 0; b < count; ++b) t.token_blocks.push_back(TokenBlock{0, b, b * tokens, tokens, b * tokens});
  return t;
}

Cluster two_nodes(int devices_per_node) {
  Cluster c;
  c.nodes = 2;
  c.devices_per_node = devices_per_node;
  return c;
}

// (source, round) of every crossing of `ps`'s outputs.
std::map<std::pair<int32_t, int32_t>, int> crossings(const Cluster& c, const PassSchedule& ps) {
  std::map<std::pair<int32_t, int32_t>, int> n;
  for (const ScheduledTransfer& x : ps.outputs)
    if (c.node_of(x.src) != c.node_of(x.dst)) ++n[{x.src, x.round}];
  return n;
}

TEST(OutputRelays, SpreadOverTheNodesPortsAmongSourcesReadyLast) {
  // Four output blocks homed on device 0 (node 0); devices 4-7 of node 1 each hold a partial of
  // every block, all ready for round 2 of 4. One relay per block crosses, in round 3; the four
  // relays take four different ports (by device number alone all four would be device 4).
  const BlockTable table = blocks_of(4, 1024);
  const Cluster c = two_nodes(4);
  PassSchedule ps;
  ps.pass = Pass::Forward;
  ps.num_stages = 3;
  for (int32_t b = 0; b < 4; ++b)
    for (int32_t d = 4; d < 8; ++d)
      for (DataKind k : {DataKind::O, DataKind::LSE}) ps.outputs.push_back(ScheduledTransfer{k, b, 0, d, 0, 2, false});
  const size_t count = ps.outputs.size();
  sched::reduce_outputs_per_node(table, c, ps);
  EXPECT_EQ(ps.outputs.size(), count);  // rerouted, none dropped
  const auto cross = crossings(c, ps);
  ASSERT_EQ(cross.size(), 4u);
  for (const auto& [at, n] : cross) {
    EXPECT_EQ(at.second, 3) << "device " << at.first;
    EXPECT_EQ(n, 2) << "device " << at.first << ": O and LSE of one block";
  }
  // Each block: its relay gets the other three partials in round 2, inside the node.
  std::map<int32_t, int32_t> relay_of;
  for (const ScheduledTransfer& x : ps.outputs)
    if (x.dst == 0) relay_of[x.token_block] = x.src;
  for (const ScheduledTransfer& x : ps.outputs) {
    if (x.dst == 0) continue;
    EXPECT_EQ(x.dst, relay_of[x.token_block]);
    EXPECT_EQ(x.round, 2);
  }
}

TEST(OutputRelays, TheSourceReadyLastRelaysWhateverItsLoad) {
  // Device 5's partial is ready only for the final round: it cannot forward to another relay in
  // time, so it relays (and crosses) for every block although its port then carries them all.
  const BlockTable table = blocks_of(2, 1024);
  const Cluster c = two_nodes(4);
  PassSchedule ps;
  ps.num_stages = 3;
  for (int32_t b = 0; b < 2; ++b) {
    ps.outputs.push_back(ScheduledTransfer{DataKind::dKV, b, 0, 4, 0, 2, false});
    ps.outputs.push_back(ScheduledTransfer{DataKind::dKV, b, 0, 5, 0, 4, false});
  }
  sched::reduce_outputs_per_node(table, c, ps);
  const auto cross = crossings(c, ps);
  ASSERT_EQ(cross.size(), 1u);
  EXPECT_EQ(cross.begin()->first, (std::pair<int32_t, int32_t>{5, 4}));
  EXPECT_EQ(cross.begin()->second, 2);
}

}  // namespace
}  // namespace dcp
