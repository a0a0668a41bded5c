// dcp/schedule.h — stages: when each device computes each of its tiles and when every block
// it needs (or produces for another device) moves.
//
// Stage model (the same for forward and backward; backward reuses the forward placement but is
// scheduled with its own costs: 2.5x compute, Q-side inputs Q+dO+LSE+Delta, outputs dQ+dKV):
//   * Stage 0 computes the tiles whose inputs are all home on the device; no transfer waits.
//   * Communication round r (1 <= r <= num_stages) is posted when stage r-1 starts computing;
//     rounds r < num_stages deliver the inputs of stage r and are waited before stage r, so
//     the transfer for stage r overlaps the compute of stage r-1. Round num_stages carries only
//     outputs and round num_stages+1 (the final round) is posted after the last stage.
//   * Output transfers (partial O/LSE forward, dQ/dKV partials backward) of a block whose last
//     tile on the device ran in stage f travel in round f+2, i.e. overlapped with the compute
//     of later stages; only the outputs of the last stage wait for the final round.
//   * Two-phase inter-node forwarding: a block needed by several devices of another node
//     crosses the network once, to one relay device of that node (the round before it is
//     needed), and the relay forwards it over the intra-node links (the round it is needed). A
//     block first needed in the first round has no round before it: the relay takes it in the
//     first round and the others in the second, their tiles reading it moving one stage later
//     (relay_first_round, with at least 3 stages).
//   * Proxies: a device's inter-node port serves its own traffic alone, so a block or partial
//     crossing at a port busier than its node's mean may go through the node's idlest port
//     instead, one round apart: an input reaches the proxy a round before it is needed and the
//     proxy passes it on over the node's links; a partial output reaches the proxy in its own
//     round and the proxy, which merges what it gets, sends it on the round after.
//   * Per-node reduction of outputs: partials of one output block computed by several devices
//     of a node other than the home's are sent to one of them (the relay: among those whose own
//     partial is ready last, the one whose port carries the fewest bytes across nodes so far,
//     so relays spread over the node's ports and memory), merged there into its
//     partial, and cross the network once, as a ring accumulates partials along the ring. A
//     partial reaches the relay no earlier than the round after the relay's last tile of the
//     block (so the merge follows it) and the relay forwards the round after the last partial
//     arrives; partials that could not arrive in time for the final round go to the home
//     directly.
//   * Leveling (level_stage_compute): a tile may run later than its inputs allow, so that no
//     stage of a device carries much more than its mean stage.
//   * Tail: nothing else overlaps the final round, so some of a device's tiles whose outputs
//     are all home (forward: the q block; backward: the q and kv blocks) are held back and run
//     after the final round is posted, while its outputs move. How much: the predicted final
//     round (the device's own final sends and receives, and the incoming final traffic of the
//     devices it sends to, since a send completes only when its receiver has taken it), taking
//     from the latest stage first, and from each stage no more than its compute left once the
//     round it hides (that round's inputs and outputs) is covered.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "dcp/blocks.h"
#include "dcp/cluster.h"
#include "dcp/placement.h"

namespace dcp {

enum class Pass : uint8_t { Forward, Backward };
const char* to_string(Pass pass);  // "fwd", "bwd"

// The two sides of a tile: its q block (Q-side kinds) and its kv block (KV-side kinds).
enum class Side : uint8_t { Q, KV };
inline Side side_of(DataKind k) { return (k == DataKind::KV || k == DataKind::dKV) ? Side::KV : Side::Q; }
// Kinds a tile reads on one side in a pass, and those it writes (empty: none; forward writes
// nothing for its kv block).
std::span<const DataKind> input_kinds(Pass pass, Side side);
std::span<const DataKind> output_kinds(Pass pass, Side side);

struct ScheduleOptions {
  // Communication stages after the local stage 0 (the paper's divisions); total stages =
  // num_comm_stages + 1. At least 1.
  int num_comm_stages = 4;
  // Split the transfers evenly over the rounds by predicted time (bytes / link bandwidth of
  // the source, with per-node NIC sharing, plus latency), re-balancing what is left after each
  // round. false = the paper's even split of bytes.
  bool balance_by_time = true;
  // Relay inter-node blocks needed by several devices of one node through one of them.
  bool two_phase = true;
  // Reduce the partial outputs of several devices of one node at one of them before they cross
  // the network (applies with two_phase).
  bool reduce_outputs_per_node = true;
  // Hold back tiles without outputs to send to overlap the final round (the stage model above).
  bool tail_overlaps_final_round = true;
  // Order the remote tiles of a device so that those with an output to another node (forward:
  // a far q block; backward: a far q or kv block) take the first rounds, the rest after; each
  // part cheapest transfer per FLOP first. None of them runs in the last stage (with at least 3
  // stages): those the rounds' budget left there run one stage earlier, their inputs arriving
  // one round earlier, and leveling does not move them into it. Their outputs then leave early
  // enough to be reduced per node and to overlap later stages, at the price of the first round
  // carrying slow transfers; the final round, which nothing but the tail overlaps, carries no
  // partial of theirs but what a per-node relay forwards.
  bool far_outputs_first = false;
  // Two-phase for blocks shared in the first round too (the stage model above). Each crossing of a
  // shared block otherwise queues on the home's one inter-node port.
  bool relay_first_round = true;
  // Proxies (the stage model above). A device's inter-node port serves only its own traffic
  // (inter_bw_device), so traffic piled on a few ports of a node waits while the others idle.
  // Per node and pass, the busiest receiving port, then the busiest sending port, hands
  // crossings to the idlest one while that brings both closer to the node's mean; ports within
  // (1 + proxy_slack) x the mean are left alone. Inputs of round >= 2 (latest first) take the
  // proxy a round before they are needed; partials that leave before the final round (earliest
  // first) take it in their round and go on the round after. Measured on fixed plans of the
  // paper micro-benchmark (bench/results/plan_sim.md): 0.928x the time on the geometric mean,
  // 0.55-1.02x. The planner also tries its chosen placement without (PlannerOptions::retry_proxies).
  bool proxies = true;
  double proxy_slack = 0.1;
  // Share of an even round that the last input round gets (balance_by_time; in (0, 1]): the
  // last stage's outputs travel in the final round, which nothing but the tail overlaps, so a
  // smaller last stage can pay for larger earlier ones. Every other round stays even.
  double last_round_share = 1.0;
  // Level each device's stage compute: tiles of a stage over the mean stage (+5 %) move to the
  // next stage. A long early stage delays the device's next rounds and, since a send completes
  // only when both ends have posted, its peers'. Not a default: on the paper micro-benchmark it
  // takes DCP's causal cell at scale 4 from 24.98 to 22.85 ms but the static layouts' from
  // 28.95 to 36.57 (bench/results/plan_sim.md); the planner tries it.
  bool level_stage_compute = false;
  // Rounds filled per link class: the inputs from the device's node and those from other nodes
  // each fill the rounds as above on their own (own round, budget and share), since the two
  // classes cross different resources at the same time; a tile runs once the last of its inputs
  // is in. Without it one budget counts both classes, so rounds of slow crossings (far outputs
  // first) carry few of the node's own inputs, and the compute they unlock waits for later
  // rounds. On one node (one class) it changes nothing.
  bool rounds_per_link_class = false;
  // The four choices above that shape a pass's rounds and stages, for the backward where they
  // differ from the forward's (unset: the backward takes the same). The passes are scheduled apart
  // and run one after the other, each from idle devices, so each may take its own best: the
  // planner picks them per pass (PlannerOptions::mix_passes).
  struct PassChoices {
    bool far_outputs_first = false;
    double last_round_share = 1.0;
    bool level_stage_compute = false;
    bool rounds_per_link_class = false;
    friend bool operator==(const PassChoices&, const PassChoices&) = default;
  };
  std::optional<PassChoices> backward;
  // The forward's choices (the four fields above), and those fields set to `c`.
  PassChoices choices() const { return {far_outputs_first, last_round_share, level_stage_compute, rounds_per_link_class}; }
  void set_choices(const PassChoices& c) {
    far_outputs_first = c.far_outputs_first;
    last_round_share = c.last_round_share;
    level_stage_compute = c.level_stage_compute;
    rounds_per_link_class = c.rounds_per_link_class;
  }
  // These options with the backward's choices in place of the forward's.
  ScheduleOptions for_backward() const;
  void validate() const;  // throws InvalidInput naming the option
};

// One movement of one data block (one token block x one head group, or KV set for KV-side
// kinds) from `src` to `dst` in communication round `round`. For two-phase transfers the first
// leg goes to the relay and the second leg starts from it (src = relay, via_relay = true).
struct ScheduledTransfer {
  DataKind kind = DataKind::Q;
  int32_t token_block = 0;
  int32_t group = 0;   // head group (Q-side kinds) or KV set (KV-side kinds)
  int32_t src = 0;
  int32_t dst = 0;
  int32_t round = 1;   // 1..num_stages+1 (inputs: 1..num_stages-1)
  bool via_relay = false;  // second leg of a two-phase transfer
  friend bool operator==(const ScheduledTransfer&, const ScheduledTransfer&) = default;
};

struct PassSchedule {
  Pass pass = Pass::Forward;
  int num_stages = 1;                    // stages 0..num_stages-1
  std::vector<int32_t> tile_stage;       // per tile (BlockTable order)
  // Per tile: 1 = run after the final round is posted (the tail; its stage says when its inputs
  // arrive), else 0.
  std::vector<uint8_t> tile_tail;
  std::vector<ScheduledTransfer> inputs; // Q-side/KV-side inputs, sorted by (round, src, dst, ...)
  std::vector<ScheduledTransfer> outputs;// partial outputs to the owners, same order
  // Predicted per device and stage: compute seconds and incoming transfer seconds (cost model).
  std::vector<std::vector<double>> stage_compute_s;   // [device][stage]
  std::vector<std::vector<double>> round_transfer_s;  // [device][round]; index 0 is unused
  friend bool operator==(const PassSchedule&, const PassSchedule&) = default;
};

struct Schedule {
  PassSchedule fwd;
  PassSchedule bwd;
  // Sizes and ids consistent with the table and placement; every tile reads only data that is
  // home or delivered by a round <= its stage. Throws InvalidPlan naming the first violation.
  void validate(const BlockTable& table, const Placement& placement) const;
  friend bool operator==(const Schedule&, const Schedule&) = default;
};

// Pre: placement.validate(table) holds; cluster.num_devices() == placement.num_devices.
// Post: deterministic (no randomness); every tile gets a stage; each (block, dst device) input
// is delivered exactly once per pass.
Schedule build_schedule(const BlockTable& table, const Placement& placement,
                        const Cluster& cluster, const ScheduleOptions& opts);

}  // namespace dcp
