// Helpers shared by the schedule and plan builders (not part of the public interface).
#pragma once

#include <span>

#include "dcp/blocks.h"
#include "dcp/cluster.h"
#include "dcp/schedule.h"

namespace dcp::sched {

// Point-to-point bandwidth (B/s) and latency between two devices; inter-node links share the
// node's NICs evenly between its devices.
double link_bw(const Cluster& c, int src, int dst);
double link_latency(const Cluster& c, int src, int dst);

// Reroute inter-node inputs needed by several devices of one node through one relay there;
// with relay_first_round, also blocks shared in the first round (the others' copies and the tiles
// reading them move one round later; needs at least 3 stages).
void apply_two_phase(const BlockTable& table, const Placement& placement, const Cluster& cluster,
                     bool relay_first_round, PassSchedule& ps);
// Proxies (proxies.cpp): crossings of inputs (round >= 2) and of partial outputs (before the
// final round) moved off each node's busiest inter-node ports to its idlest ones, receiving ports
// first, then sending ports, each through a proxy one round apart.
void proxy_inputs(const BlockTable& table, const Cluster& cluster, double slack, PassSchedule& ps);
void proxy_outputs(const BlockTable& table, const Cluster& cluster, double slack, PassSchedule& ps);
// Reduce inter-node partial outputs of several devices of one node at one relay there.
void reduce_outputs_per_node(const Cluster& cluster, PassSchedule& ps);

}  // namespace dcp::sched
