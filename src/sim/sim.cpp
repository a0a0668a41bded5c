// Event-driven simulator of a plan on a cluster (model in dcp/sim.h).
#include "dcp/sim.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <queue>
#include <tuple>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "dcp/detail/comm_order.h"
#include "dcp/error.h"
#include "kernel_cost.h"

namespace dcp {
namespace {

struct Xfer {
  int src = 0, dst = 0;
  size_t src_pc = 0, dst_pc = 0;  // CommStart instructions posting it
  const Transfer* op = nullptr;  // the sender's op
  int32_t round = 0;
  double post_src = -1, post_dst = -1;
  double ready = 0, start = 0, end = -1;
};

struct DevState {
  size_t pc = 0;
  double now = 0;   // compute stream
  double host = 0;  // the issuing host: ahead of the stream, blocked only by CommWait
  CommOrder order;  // what each CommStart waits for
  std::vector<double> end_of;  // per instruction: when its compute ended
  std::vector<std::vector<int32_t>> group_xfers;  // per instruction index (CommStart): transfer ids
  struct GroupState {
    size_t remaining = 0;  // transfers not yet scheduled
    double done = 0;       // latest arrival so far
    double ready = 0;      // latest readiness so far
    int32_t last = -1;     // transfer arriving last
  };
  std::vector<GroupState> group;  // per instruction index
  std::map<int32_t, size_t> group_of_round;       // round -> CommStart instruction index
  // Per instruction index (CommWait): its round's CommStart index, resolved once (kNoGroup: the
  // round has no CommStart; group_of_round.at then reports it).
  static constexpr size_t kNoGroup = static_cast<size_t>(-1);
  std::vector<size_t> wait_group;
};

class PassSim {
 public:
  PassSim(const Plan& plan, const Cluster& c, const Calibration& cal, Pass pass, SimResult& res,
          nlohmann::json* trace, sim_detail::SubtileCache& counts)
      : plan_(plan), c_(c), cal_(cal), pass_(pass), res_(res), trace_(trace), attend_cost_(plan.table, cal, &counts) {}
  void run();

 private:
  const Program& prog(int d) const { return pass_ == Pass::Forward ? plan_.devices[d].fwd : plan_.devices[d].bwd; }
  bool step(int d);
  void post(int d, size_t pc, double at);
  void schedule(int32_t x);
  // Trace events only (callers build the names only when tracing).
  void event(int pid, int tid, const std::string& name, double t0, double t1) {
    if (trace_ == nullptr || t1 <= t0) return;
    trace_->push_back({{"name", name}, {"ph", "X"}, {"pid", pid}, {"tid", tid},
                       {"ts", (t0 + trace_offset_s_) * 1e6}, {"dur", (t1 - t0) * 1e6},
                       {"cat", to_string(pass_)}});
  }

  const Plan& plan_;
  const Cluster& c_;
  const Calibration& cal_;
  Pass pass_;
  SimResult& res_;
  nlohmann::json* trace_;
  double t0_ = 0;  // pass start
  double trace_offset_s_ = 0;
  std::vector<DevState> dev_;
  std::vector<Xfer> x_;
  std::priority_queue<std::pair<double, int32_t>, std::vector<std::pair<double, int32_t>>, std::greater<>> ready_;
  std::vector<double> eg_intra_, in_intra_, eg_inter_, in_inter_;
  std::vector<double> nic_out_, nic_in_;  // per node
  struct Stall {
    double s = 0;
    int32_t round = 0;
    int32_t xfer = -1;
  };
  std::vector<Stall> longest_stall_;
  sim_detail::AttendCost attend_cost_;
};

void PassSim::run() {
  const int P = plan_.header.world_size;
  const int pi = pass_ == Pass::Forward ? 0 : 1;
  // Each pass has its own timeline from 0; the trace shows backward after forward.
  trace_offset_s_ = pass_ == Pass::Forward ? 0.0 : res_.fwd_s;
  dev_.assign(P, DevState{});
  longest_stall_.assign(P, Stall{});
  eg_intra_.assign(P, t0_);
  in_intra_.assign(P, t0_);
  eg_inter_.assign(P, t0_);
  in_inter_.assign(P, t0_);
  nic_out_.assign(c_.nodes, t0_);
  nic_in_.assign(c_.nodes, t0_);
  // Pair the k-th send from a to b with the k-th receive on b from a (plans are validated).
  // Both lists are collected in program order and stably sorted by (src, dst), so transfer ids
  // run by (src, dst, k).
  struct End {
    int src, dst;
    size_t pc;
    const Transfer* op;
  };
  std::vector<End> sends, recvs;
  for (int d = 0; d < P; ++d) {
    dev_[d].now = t0_;
    dev_[d].host = t0_;
    const Program& p = prog(d);
    dev_[d].order = comm_order(p);
    dev_[d].end_of.assign(p.code.size(), t0_);
    dev_[d].group_xfers.assign(p.code.size(), {});
    for (size_t pc = 0; pc < p.code.size(); ++pc)
      if (const auto* cs = std::get_if<CommStart>(&p.code[pc])) {
        dev_[d].group_of_round[cs->id] = pc;
        for (const Transfer& t : cs->ops) {
          if (t.send) sends.push_back(End{d, t.peer, pc, &t});
          else recvs.push_back(End{t.peer, d, pc, &t});
        }
      }
  }
  auto by_pair = [](const End& a, const End& b) { return std::tie(a.src, a.dst) < std::tie(b.src, b.dst); };
  // Stable by (src, dst): a stable counting sort by dst, then one by src (P buckets each, linear
  // in the transfers; a table over all (src, dst) pairs would grow as P^2).
  std::vector<size_t> first(static_cast<size_t>(P) + 1);
  std::vector<End> sorted;
  auto sort_by = [&](std::vector<End>& v, int End::*field) {
    std::fill(first.begin(), first.end(), 0);
    for (const End& e : v) ++first[static_cast<size_t>(e.*field) + 1];
    for (size_t i = 1; i < first.size(); ++i) first[i] += first[i - 1];
    sorted.resize(v.size());
    for (const End& e : v) sorted[first[static_cast<size_t>(e.*field)]++] = e;
    v.swap(sorted);
  };
  auto sort_by_pair = [&](std::vector<End>& v) {
    sort_by(v, &End::dst);
    sort_by(v, &End::src);
  };
  sort_by_pair(sends);
  sort_by_pair(recvs);
  x_.reserve(sends.size());
  size_t r = 0;
  for (size_t i = 0; i < sends.size();) {
    size_t j = i;
    while (j < sends.size() && sends[j].src == sends[i].src && sends[j].dst == sends[i].dst) ++j;
    while (r < recvs.size() && by_pair(recvs[r], sends[i])) ++r;
    size_t q = r;
    while (q < recvs.size() && recvs[q].src == sends[i].src && recvs[q].dst == sends[i].dst) ++q;
    if (q - r != j - i)
      raise(ErrorKind::InvalidPlan, fmt::format("simulate: {} sends from {} to {} but {} receives", j - i,
                                                sends[i].src, sends[i].dst, q - r));
    for (size_t k = 0; k < j - i; ++k) {
      const End& se = sends[i + k];
      Xfer x;
      x.src = se.src;
      x.dst = se.dst;
      x.op = se.op;
      x.round = std::get<CommStart>(prog(x.src).code[se.pc]).id;
      x.src_pc = se.pc;
      x.dst_pc = recvs[r + k].pc;
      const auto id = static_cast<int32_t>(x_.size());
      x_.push_back(x);
      dev_[x.src].group_xfers[x.src_pc].push_back(id);
      dev_[x.dst].group_xfers[x.dst_pc].push_back(id);
    }
    i = j;
    r = q;
  }
  for (int d = 0; d < P; ++d) {
    const Program& p = prog(d);
    dev_[d].wait_group.assign(p.code.size(), DevState::kNoGroup);
    for (size_t pc = 0; pc < p.code.size(); ++pc)
      if (const auto* w = std::get_if<CommWait>(&p.code[pc])) {
        const auto it = dev_[d].group_of_round.find(w->id);
        if (it != dev_[d].group_of_round.end()) dev_[d].wait_group[pc] = it->second;
      }
    dev_[d].group.assign(dev_[d].group_xfers.size(), {});
    for (size_t pc = 0; pc < dev_[d].group_xfers.size(); ++pc) dev_[d].group[pc].remaining = dev_[d].group_xfers[pc].size();
  }
  // Every device runs until it blocks in a CommWait; then transfers are served in order of
  // readiness. Serving one changes only the rounds of its two ends, so only they can go on
  // (posting never unblocks a wait).
  for (int d = 0; d < P; ++d) step(d);
  while (!ready_.empty()) {
    const int32_t x = ready_.top().second;
    ready_.pop();
    schedule(x);
    step(x_[x].src);
    step(x_[x].dst);
  }
  for (int d = 0; d < P; ++d) {
    if (dev_[d].pc < prog(d).code.size())
      raise(ErrorKind::InvalidPlan, fmt::format("simulate: device {} {} blocked forever at instruction {}", d,
                                                to_string(pass_), dev_[d].pc));
    DeviceSim& ds = res_.devices[d];
    ds.finish_s[pi] = dev_[d].now - t0_;
    res_.exposed_comm_s += ds.exposed_comm_s[pi];
    res_.comm_s += ds.comm_in_s[pi];
  }
  double& pass_s = pass_ == Pass::Forward ? res_.fwd_s : res_.bwd_s;
  int slow = 0;
  for (int d = 0; d < P; ++d) {
    if (res_.devices[d].finish_s[pi] > res_.devices[slow].finish_s[pi]) slow = d;
  }
  pass_s = P > 0 ? res_.devices[slow].finish_s[pi] : 0.0;
  const DeviceSim& s = res_.devices[slow];
  std::string step_text = fmt::format("{}: device {} is slowest: {:.3f} ms = compute {:.3f} ms + stalls {:.3f} ms",
                                      to_string(pass_), slow, pass_s * 1e3, s.compute_s[pi] * 1e3,
                                      s.stall_s[pi] * 1e3);
  res_.critical_path.push_back(step_text);
  const Stall& ls = longest_stall_[slow];
  if (ls.xfer >= 0) {
    const Xfer& x = x_[ls.xfer];
    res_.critical_path.push_back(fmt::format(
        "{}: longest stall {:.3f} ms before round {}, last to arrive: {} of block {} from device {} ({})",
        to_string(pass_), ls.s * 1e3, ls.round, to_string(x.op->kind), x.op->token_block, x.src,
        c_.node_of(x.src) == c_.node_of(x.dst) ? "intra-node" : "inter-node"));
  }
}

void PassSim::post(int d, size_t pc, double at) {
  for (int32_t id : dev_[d].group_xfers[pc]) {
    Xfer& x = x_[id];
    (x.src == d ? x.post_src : x.post_dst) = at;
    if (x.post_src >= 0 && x.post_dst >= 0) {
      x.ready = std::max(x.post_src, x.post_dst);
      ready_.emplace(x.ready, id);
    }
  }
}

void PassSim::schedule(int32_t id) {
  Xfer& x = x_[id];
  const double bytes = static_cast<double>(x.op->bytes);
  // Every resource on the path is a FIFO server at its own rate, all working on the transfer
  // at once (cut-through); the transfer is done when the slowest has served it.
  double done = x.ready;
  auto serve = [&](double& free_at, double bw) {
    free_at = std::max(free_at, x.ready) + bytes / bw;
    done = std::max(done, free_at);
  };
  double latency = c_.intra_latency_s;
  if (c_.node_of(x.src) == c_.node_of(x.dst)) {
    serve(eg_intra_[x.src], c_.intra_bw);
    serve(in_intra_[x.dst], c_.intra_bw);
  } else {
    serve(eg_inter_[x.src], c_.inter_bw_device);
    serve(in_inter_[x.dst], c_.inter_bw_device);
    serve(nic_out_[c_.node_of(x.src)], c_.nic_bw_node);
    serve(nic_in_[c_.node_of(x.dst)], c_.nic_bw_node);
    latency = c_.inter_latency_s;
  }
  x.start = x.ready;
  x.end = done + latency;
  for (auto [d, pc] : {std::pair{x.src, x.src_pc}, std::pair{x.dst, x.dst_pc}}) {
    auto& g = dev_[d].group[pc];
    --g.remaining;
    g.ready = std::max(g.ready, x.ready);
    if (x.end > g.done) {
      g.done = x.end;
      g.last = id;
    }
  }
  res_.devices[x.dst].comm_in_s[pass_ == Pass::Forward ? 0 : 1] += x.end - x.start;
  if (trace_ != nullptr)
    event(x.dst, 1, fmt::format("recv {} b{} from {}", to_string(x.op->kind), x.op->token_block, x.src), x.start, x.end);
}

bool PassSim::step(int d) {
  DevState& s = dev_[d];
  const Program& p = prog(d);
  const int pi = pass_ == Pass::Forward ? 0 : 1;
  bool advanced = false;
  while (s.pc < p.code.size()) {
    const Instruction& ins = p.code[s.pc];
    if (std::holds_alternative<CommStart>(ins)) {
      const int32_t after = s.order.after[s.pc];
      post(d, s.pc, std::max(s.host, after == kPassStartPoint ? t0_ : s.end_of[static_cast<size_t>(after)]));
    } else if (const auto* w = std::get_if<CommWait>(&ins)) {
      const size_t gi = s.wait_group[s.pc];
      const auto& g = s.group[gi != DevState::kNoGroup ? gi : s.group_of_round.at(w->id)];
      if (g.remaining > 0) return advanced;  // blocked
      const double done = std::max(s.now, g.done), ready = g.ready;
      const int32_t last = g.last;
      const double stall = done - s.now;
      res_.devices[d].stall_s[pi] += stall;
      // Waiting for a peer to post (it is still computing) is imbalance, not communication.
      res_.devices[d].exposed_comm_s[pi] += std::max(0.0, done - std::max(s.now, ready));
      if (stall > longest_stall_[d].s) longest_stall_[d] = Stall{stall, w->id, last};
      if (trace_ != nullptr) event(d, 0, fmt::format("wait round {}", w->id), s.now, done);
      s.now = done;
      s.host = std::max(s.host, g.done);
    } else {
      const auto* attend = std::get_if<Attend>(&ins);
      double t = attend != nullptr ? attend_cost_.seconds(*attend, pass_) : instruction_time_s(plan_, ins, pass_, cal_);
      if (sim_detail::joins_merge_batch(p, s.pc)) t -= cal_.launch_overhead_s;
      if (trace_ != nullptr) {
        std::string name = "merge";
        if (attend != nullptr) name = fmt::format("attend stage {} ({} tiles)", attend->stage, attend->tiles.size());
        else if (std::holds_alternative<Copy>(ins)) name = "copy";
        event(d, 0, name, s.now, s.now + t);
      }
      s.now += t;
      s.end_of[s.pc] = s.now;
      res_.devices[d].compute_s[pi] += t;
    }
    ++s.pc;
    advanced = true;
  }
  return advanced;
}

}  // namespace

double instruction_time_s(const Plan& plan, const Instruction& ins, Pass pass, const Calibration& cal) {
  const BlockTable& t = plan.table;
  if (const auto* a = std::get_if<Attend>(&ins)) {
    return sim_detail::AttendCost(t, cal).seconds(*a, pass);
  }
  if (const auto* m = std::get_if<Merge>(&ins)) {
    const int64_t tokens = t.token_blocks[m->token_block].length;
    double bytes = static_cast<double>(plan_block_bytes(t, m->kind, tokens)) *
                   static_cast<double>(m->src_slots.size() + 1 + (m->accumulate ? 1 : 0));
    if (m->kind == DataKind::O)
      bytes += static_cast<double>(plan_block_bytes(t, DataKind::LSE, tokens)) *
               static_cast<double>(m->src_lse_slots.size() + 1 + (m->accumulate ? 1 : 0));
    return bytes / cal.memory_bw + cal.launch_overhead_s;
  }
  if (const auto* c = std::get_if<Copy>(&ins))
    return 2.0 * static_cast<double>(plan_block_bytes(t, c->kind, t.token_blocks[c->token_block].length)) /
               cal.memory_bw + cal.launch_overhead_s;
  return 0.0;
}

struct SimTableCache::Impl {
  sim_detail::SubtileCache counts;
};
SimTableCache::SimTableCache() : impl_(std::make_unique<Impl>()) {}
SimTableCache::~SimTableCache() = default;
SimTableCache::SimTableCache(SimTableCache&&) noexcept = default;
SimTableCache& SimTableCache::operator=(SimTableCache&&) noexcept = default;
void SimTableCache::fill(const BlockTable& table) {
  impl_->counts.bind(table);
  for (const Tile& t : table.tiles) impl_->counts.get(table, t);
}

SimResult simulate(const Plan& plan, const Cluster& cluster, const SimOptions& opts) {
  cluster.validate("simulate: cluster");
  opts.calibration.validate("simulate: calibration");
  if (cluster.num_devices() != plan.header.world_size)
    raise(ErrorKind::InvalidInput, fmt::format("simulate: plan for world size {}, cluster has {} devices",
                                               plan.header.world_size, cluster.num_devices()));
  SimResult res;
  res.devices.assign(plan.header.world_size, DeviceSim{});
  nlohmann::json events = nlohmann::json::array();
  nlohmann::json* trace = opts.trace ? &events : nullptr;
  // Sub-tile counts per tile geometry, for both passes: the caller's (kept across plans over one
  // table) or this call's.
  SimTableCache local;
  sim_detail::SubtileCache& counts = (opts.table_cache != nullptr ? *opts.table_cache : local).impl().counts;
  PassSim(plan, cluster, opts.calibration, Pass::Forward, res, trace, counts).run();
  PassSim(plan, cluster, opts.calibration, Pass::Backward, res, trace, counts).run();
  res.hidden_fraction = res.comm_s > 0 ? std::clamp(1.0 - res.exposed_comm_s / res.comm_s, 0.0, 1.0) : 1.0;
  if (opts.trace) {
    for (int d = 0; d < plan.header.world_size; ++d) {
      events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", d}, {"args", {{"name", fmt::format("device {}", d)}}}});
      events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", d}, {"tid", 0}, {"args", {{"name", "compute"}}}});
      events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", d}, {"tid", 1}, {"args", {{"name", "comm in"}}}});
    }
    res.trace_json = nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump();
  }
  return res;
}

}  // namespace dcp
