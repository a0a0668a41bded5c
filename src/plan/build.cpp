// Program builder: (BlockTable, Placement, Schedule) -> Plan. Instructions are first emitted
// over virtual buffers (one per residency), then virtual buffers are coloured into slots by
// interval liveness, per pool (kinds that always travel together share slot numbers).
#include <algorithm>
#include <functional>
#include <queue>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "dcp/error.h"
#include "dcp/limits.h"
#include "dcp/plan.h"

namespace dcp {

int64_t plan_block_bytes(const BlockTable& table, DataKind kind, int64_t tokens) {
  // The block table's formula (partials in fp32), so metrics, placement and plans agree.
  return table.partial_bytes(kind, tokens);
}

int64_t slot_bytes(const BlockTable& table, DataKind kind) {
  int64_t max_tokens = 0;
  for (const TokenBlock& b : table.token_blocks) max_tokens = std::max(max_tokens, b.length);
  return plan_block_bytes(table, kind, max_tokens);
}

DeviceMemory plan_memory(const Plan& plan, int device) {
  if (device < 0 || device >= static_cast<int>(plan.devices.size()))
    raise(ErrorKind::InvalidInput, "plan_memory: device " + std::to_string(device) + " out of range");
  const DeviceProgram& dp = plan.devices[device];
  const BlockTable& t = plan.table;
  DeviceMemory m;
  // Local tensors hold all heads of the owned tokens: the inputs in the dtype, the outputs (the
  // accumulators of owned blocks), LSE and Delta in fp32.
  const int64_t e = element_bytes(t.shape.dtype);
  const int64_t qd = int64_t{t.shape.q_heads} * t.shape.head_dim;
  const int64_t kvd = int64_t{t.shape.kv_heads} * t.shape.head_dim;
  const int64_t per_token = (qd * e) * 2 /* Q, dO */ + (qd * 4) * 2 /* O, dQ */ + (2 * kvd * e) /* KV */ +
                            (2 * kvd * 4) /* dKV */ + int64_t{t.shape.q_heads} * 4 * 2 /* LSE, Delta */;
  const char* what = "plan memory";
  m.local_bytes = checked_mul(dp.owned_tokens, per_token, what);
  for (auto [prog, pm] : {std::pair{&dp.fwd, &m.fwd}, std::pair{&dp.bwd, &m.bwd}}) {
    for (int k = 0; k < kNumDataKinds; ++k) {
      const int64_t slot = plan_block_bytes(t, static_cast<DataKind>(k), plan.header.max_block_tokens);
      pm->slot_bytes[k] = checked_mul(prog->num_slots[k], slot, what);
      pm->slots_total_bytes = checked_add(pm->slots_total_bytes, pm->slot_bytes[k], what);
    }
  }
  m.peak_bytes = checked_add(m.local_bytes, std::max(m.fwd.slots_total_bytes, m.bwd.slots_total_bytes), what);
  return m;
}

void PlanOptions::validate() const { schedule.validate(); }

namespace {


enum Pool : int { kQIn, kKVIn, kOutQ, kOutKV, kNumPools };

int pool_of(Pass pass, DataKind k) {
  switch (k) {
    case DataKind::Q:
    case DataKind::dO:
    case DataKind::Delta: return kQIn;
    case DataKind::KV: return kKVIn;
    case DataKind::LSE: return pass == Pass::Forward ? kOutQ : kQIn;
    case DataKind::O:
    case DataKind::dQ: return kOutQ;
    case DataKind::dKV: return kOutKV;
  }
  return kQIn;
}

// (round, key, pool, source) -> virtual buffer of a received partial (-1: none), per round.
class VBufIndex {
 public:
  int32_t& at(int64_t key) { return map_.try_emplace(key, -1).first->second; }

 private:
  std::unordered_map<int64_t, int32_t> map_;
};

// Per-key state of one device's program, in dense arrays over every key of the table that the
// builders of one plan share: a builder records the keys it sets and resets them when it ends,
// so each device's program costs time in proportion to its own work, not to the whole batch
// (the arrays are filled once per plan).
class KeyScratch {
 public:
  explicit KeyScratch(int64_t keys)
      : input_(static_cast<size_t>(keys), -1),
        acc_(static_cast<size_t>(keys), -1),
        local_out_(static_cast<size_t>(keys), 0) {}
  // key -> virtual buffer of a remote input bundle (-1: none); a reference the caller may set.
  int32_t& input(int64_t key) { return mark(input_, key); }
  int32_t find_input(int64_t key) const { return input_[key]; }
  // key -> virtual buffer of an output accumulator (-1: none).
  int32_t& acc(int64_t key) { return mark(acc_, key); }
  int32_t find_acc(int64_t key) const { return acc_[key]; }
  // With outputs_in_place: whether the owned output block's local tensor already holds a partial
  // (returns the old state and sets it).
  bool local_out_seen(int64_t key) {
    touched_.push_back(key);
    return std::exchange(local_out_[key], uint8_t{1}) != 0;
  }
  bool local_out_has(int64_t key) const { return local_out_[key] != 0; }
  // Forgets every key set since the last reset.
  void reset() {
    for (int64_t k : touched_) {
      input_[k] = -1;
      acc_[k] = -1;
      local_out_[k] = 0;
    }
    touched_.clear();
  }

 private:
  int32_t& mark(std::vector<int32_t>& v, int64_t key) {
    if (v[key] < 0) touched_.push_back(key);
    return v[key];
  }
  std::vector<int32_t> input_, acc_;
  std::vector<uint8_t> local_out_;
  std::vector<int64_t> touched_;
};

struct VBuf {
  int pool;
  int32_t block, group;
  int32_t first = -1, last = -1;
  int32_t slot = -1;
};

class ProgramBuilder {
 public:
  // `mine`: the schedule's transfers with this device at either end, inputs before outputs.
  ProgramBuilder(const BlockTable& t, const Placement& pl, const PassSchedule& ps, int device,
                 const std::vector<int32_t>& pos_of, const std::vector<int32_t>& owned, bool reuse, bool in_place,
                 const std::vector<const ScheduledTransfer*>& mine, const std::vector<int32_t>& my_tiles,
                 KeyScratch& keys)
      : t_(t), pl_(pl), ps_(ps), d_(device), pos_of_(pos_of), owned_(owned), reuse_(reuse), in_place_(in_place),
        mine_(mine), my_tiles_(my_tiles), keys_(keys) {
    key_q_ = t.groups.num_groups;
    key_kv_base_ = t.num_token_blocks() * key_q_;
    const auto rounds = static_cast<size_t>(ps.num_stages) + 3;  // rounds 0 .. num_stages + 2
    pending_.resize(rounds);
    received_.resize(rounds);
    received_at_.resize(rounds);
  }
  ProgramBuilder(const ProgramBuilder&) = delete;
  ProgramBuilder& operator=(const ProgramBuilder&) = delete;
  ~ProgramBuilder() { keys_.reset(); }
  // Every key of the table: Q-side (block, head group) keys, then KV-side (block, KV set) keys.
  static int64_t num_keys(const BlockTable& t) {
    return t.num_token_blocks() * (int64_t{t.groups.num_groups} + t.groups.num_kv_sets());
  }

  Program build();

 private:
  int32_t here() const { return static_cast<int32_t>(prog_.code.size()); }
  int32_t new_vbuf(int pool, int32_t block, int32_t group) {
    vbufs_.push_back(VBuf{pool, block, group});
    return static_cast<int32_t>(vbufs_.size() - 1);
  }
  void touch(int32_t v, int32_t at) {
    VBuf& b = vbufs_[v];
    if (b.first < 0) b.first = at;
    b.last = std::max(b.last, at);
  }
  BufRef slot_ref(DataKind k, int32_t v) { return BufRef{Space::Slot, k, v}; }
  BufRef local_ref(DataKind k, int32_t block) { return BufRef{Space::Local, k, pos_of_[block]}; }
  bool home(int32_t block) const { return pl_.block_home[block] == d_; }
  // Whether the outputs of `block` accumulate in the local tensors here.
  bool in_place(int32_t block) const { return in_place_ && home(block); }
  int32_t kv_set(int32_t hg) const { return t_.groups.kv_set(hg); }
  void emit_comm(int32_t round);
  void emit_wait(int32_t round);
  void emit_final_merges();
  void color();

  const BlockTable& t_;
  const Placement& pl_;
  const PassSchedule& ps_;
  int d_;
  const std::vector<int32_t>& pos_of_;
  const std::vector<int32_t>& owned_;
  bool reuse_;
  bool in_place_;  // PlanOptions::outputs_in_place
  const std::vector<const ScheduledTransfer*>& mine_;
  const std::vector<int32_t>& my_tiles_;
  int64_t key_q_ = 0, key_kv_base_ = 0;
  int64_t key(Side side, int32_t block, int32_t group) const {
    return side == Side::Q ? block * key_q_ + group : key_kv_base_ + block * int64_t{t_.groups.num_kv_sets()} + group;
  }
  // Inputs, accumulators and, with outputs_in_place, the owned output blocks whose local tensor
  // already holds a partial (tiles and received partials accumulate there: no slot, no final
  // merge), by key.
  KeyScratch& keys_;
  Program prog_;
  std::vector<VBuf> vbufs_;
  std::vector<std::vector<int32_t>> pending_;   // round -> vbufs busy until wait
  std::vector<std::vector<int32_t>> received_;  // round -> received partials
  std::vector<VBufIndex> received_at_;          // round -> (key, pool, source) -> received partial
  std::vector<int32_t> peer_of_;                                   // vbuf -> sending device
  std::vector<int32_t> posted_;                                    // rounds with a CommStart
};

void ProgramBuilder::emit_comm(int32_t round) {
  CommStart cs{round, {}};
  const int32_t at = here();
  auto add = [&](const ScheduledTransfer& x, bool send) {
    const Side side = side_of(x.kind);
    const int32_t peer = send ? x.dst : x.src;
    const int64_t bytes = plan_block_bytes(t_, x.kind, t_.token_blocks[x.token_block].length);
    BufRef buf;
    const int64_t k = key(side, x.token_block, x.group);
    const bool is_output = x.kind == DataKind::O || x.kind == DataKind::dQ || x.kind == DataKind::dKV ||
                           (x.kind == DataKind::LSE && ps_.pass == Pass::Forward);
    if (!is_output) {
      if (send && !x.via_relay) {
        buf = local_ref(x.kind, x.token_block);
      } else {
        int32_t& in = keys_.input(k);
        if (in < 0) {
          DCP_ASSERT(!send);
          in = new_vbuf(pool_of(ps_.pass, x.kind), x.token_block, x.group);
        }
        buf = slot_ref(x.kind, in);
        touch(in, at);
        pending_[round].push_back(in);
      }
    } else if (send) {
      const int32_t v = keys_.find_acc(k);
      DCP_ASSERT(v >= 0);
      buf = slot_ref(x.kind, v);
      touch(v, at);
      pending_[round].push_back(v);
    } else {
      // One received partial per (source, block, group); O and LSE share it.
      const int pool = pool_of(ps_.pass, x.kind);
      int32_t& v = received_at_[round].at((k * kNumPools + pool) * pl_.num_devices + peer);
      if (v < 0) {
        v = new_vbuf(pool, x.token_block, x.group);
        peer_of_.resize(vbufs_.size(), -1);
        peer_of_[v] = peer;
        received_[round].push_back(v);
      }
      buf = slot_ref(x.kind, v);
      touch(v, at);
    }
    cs.ops.push_back(Transfer{peer, send, x.kind, x.token_block, x.group, buf, bytes});
  };
  for (const ScheduledTransfer* x : mine_) {
    if (x->round != round) continue;
    if (x->src == d_) add(*x, true);
    if (x->dst == d_) add(*x, false);
  }
  if (cs.ops.empty()) return;
  std::stable_sort(cs.ops.begin(), cs.ops.end(), [](const Transfer& a, const Transfer& b) {
    return std::tie(a.peer, a.kind, a.token_block, a.group, a.send) <
           std::tie(b.peer, b.kind, b.token_block, b.group, b.send);
  });
  posted_.push_back(round);
  prog_.code.emplace_back(std::move(cs));
}

void ProgramBuilder::emit_wait(int32_t round) {
  if (std::find(posted_.begin(), posted_.end(), round) == posted_.end()) return;
  const int32_t at = here();
  prog_.code.emplace_back(CommWait{round});
  for (int32_t v : pending_[round]) touch(v, at);
  // Fold the partials that just arrived into the accumulator of their output block.
  auto& got = received_[round];
  std::stable_sort(got.begin(), got.end(), [&](int32_t a, int32_t b) {
    return std::tie(vbufs_[a].pool, vbufs_[a].block, vbufs_[a].group, peer_of_[a]) <
           std::tie(vbufs_[b].pool, vbufs_[b].block, vbufs_[b].group, peer_of_[b]);
  });
  for (size_t i = 0; i < got.size();) {
    size_t j = i + 1;
    while (j < got.size() && vbufs_[got[j]].pool == vbufs_[got[i]].pool &&
           vbufs_[got[j]].block == vbufs_[got[i]].block && vbufs_[got[j]].group == vbufs_[got[i]].group)
      ++j;
    const VBuf& first = vbufs_[got[i]];
    const Side side = first.pool == kOutKV ? Side::KV : Side::Q;
    const DataKind kind = ps_.pass == Pass::Forward ? DataKind::O : (side == Side::Q ? DataKind::dQ : DataKind::dKV);
    if (in_place(first.block)) {  // into the local tensor, on top of what the tiles here put there
      const bool accumulate = keys_.local_out_seen(key(side, first.block, first.group));
      Merge m{kind, first.block, first.group, {}, {}, local_ref(kind, first.block), {}, accumulate};
      if (ps_.pass == Pass::Forward) m.dst_lse = local_ref(DataKind::LSE, first.block);
      const int32_t at_m = here();
      for (size_t k = i; k < j; ++k) {
        m.src_slots.push_back(got[k]);
        if (ps_.pass == Pass::Forward) m.src_lse_slots.push_back(got[k]);
        touch(got[k], at_m);
      }
      prog_.code.emplace_back(std::move(m));
      i = j;
      continue;
    }
    int32_t& acc = keys_.acc(key(side, first.block, first.group));
    size_t from = i;
    if (acc < 0) {  // adopt the first received partial as the accumulator
      acc = got[i];
      ++from;
    }
    if (from < j) {
      Merge m{kind, first.block, first.group, {}, {}, slot_ref(kind, acc), {}, true};
      if (ps_.pass == Pass::Forward) m.dst_lse = slot_ref(DataKind::LSE, acc);
      const int32_t at_m = here();
      for (size_t k = from; k < j; ++k) {
        m.src_slots.push_back(got[k]);
        if (ps_.pass == Pass::Forward) m.src_lse_slots.push_back(got[k]);
        touch(got[k], at_m);
      }
      touch(acc, at_m);
      prog_.code.emplace_back(std::move(m));
    }
    i = j;
  }
}

void ProgramBuilder::emit_final_merges() {
  // Each owned output: nothing if it accumulated in place, else its accumulator slot merged into
  // the local tensor, or the empty merge (O = 0, LSE = -inf, or zero gradients) of a block that
  // nothing contributed to.
  const int num_sets = t_.groups.num_kv_sets();
  for (int32_t block : owned_) {
    for (int g = 0; g < t_.groups.num_groups; ++g) {
      if (keys_.local_out_has(key(Side::Q, block, g))) continue;
      const DataKind kind = ps_.pass == Pass::Forward ? DataKind::O : DataKind::dQ;
      Merge m{kind, block, g, {}, {}, local_ref(kind, block), {}, false};
      if (ps_.pass == Pass::Forward) m.dst_lse = local_ref(DataKind::LSE, block);
      if (const int32_t acc = keys_.find_acc(key(Side::Q, block, g)); acc >= 0) {
        m.src_slots.push_back(acc);
        if (ps_.pass == Pass::Forward) m.src_lse_slots.push_back(acc);
        touch(acc, here());
      }
      prog_.code.emplace_back(std::move(m));
    }
    if (ps_.pass == Pass::Backward) {
      for (int k = 0; k < num_sets; ++k) {
        if (keys_.local_out_has(key(Side::KV, block, k))) continue;
        Merge m{DataKind::dKV, block, k, {}, {}, local_ref(DataKind::dKV, block), {}, false};
        if (const int32_t acc = keys_.find_acc(key(Side::KV, block, k)); acc >= 0) {
          m.src_slots.push_back(acc);
          touch(acc, here());
        }
        prog_.code.emplace_back(std::move(m));
      }
    }
  }
}

void ProgramBuilder::color() {
  // Interval colouring per pool: earliest start first, lowest free slot first (deterministic).
  std::vector<int32_t> order(vbufs_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return vbufs_[a].first < vbufs_[b].first; });
  std::array<int32_t, kNumPools> count{};
  using Busy = std::pair<int32_t, int32_t>;  // (last, slot), earliest end on top
  std::array<std::priority_queue<Busy, std::vector<Busy>, std::greater<>>, kNumPools> busy;
  std::array<std::priority_queue<int32_t, std::vector<int32_t>, std::greater<>>, kNumPools> free_slots;
  for (int32_t v : order) {
    VBuf& b = vbufs_[v];
    DCP_ASSERT(b.first >= 0);
    auto& bz = busy[b.pool];
    auto& fr = free_slots[b.pool];
    while (reuse_ && !bz.empty() && bz.top().first < b.first) {
      fr.push(bz.top().second);
      bz.pop();
    }
    if (!fr.empty()) {
      b.slot = fr.top();
      fr.pop();
    } else {
      b.slot = count[b.pool]++;
    }
    bz.emplace(b.last, b.slot);
  }
  for (int k = 0; k < kNumDataKinds; ++k) {
    const auto kind = static_cast<DataKind>(k);
    const bool used = ps_.pass == Pass::Forward
                          ? (kind == DataKind::Q || kind == DataKind::KV || kind == DataKind::O || kind == DataKind::LSE)
                          : (kind != DataKind::O);
    prog_.num_slots[k] = used ? count[pool_of(ps_.pass, kind)] : 0;
  }
  auto fix = [&](BufRef& r) {
    if (r.space == Space::Slot) r.index = vbufs_[r.index].slot;
  };
  for (Instruction& ins : prog_.code) {
    if (auto* a = std::get_if<Attend>(&ins)) {
      for (TileOp& op : a->tiles)
        for (BufRef* r : {&op.q, &op.kv, &op.d_o, &op.lse_in, &op.delta, &op.out, &op.out_lse, &op.out_kv}) fix(*r);
    } else if (auto* m = std::get_if<Merge>(&ins)) {
      for (int32_t& s : m->src_slots) s = vbufs_[s].slot;
      for (int32_t& s : m->src_lse_slots) s = vbufs_[s].slot;
      fix(m->dst);
      fix(m->dst_lse);
    } else if (auto* c = std::get_if<CommStart>(&ins)) {
      for (Transfer& x : c->ops) fix(x.buf);
    }
  }
  for (const VBuf& b : vbufs_) {
    for (int k = 0; k < kNumDataKinds; ++k) {
      if (prog_.num_slots[k] == 0 || pool_of(ps_.pass, static_cast<DataKind>(k)) != b.pool) continue;
      prog_.slot_uses.push_back(SlotUse{static_cast<DataKind>(k), b.slot, b.block, b.group, b.first, b.last});
    }
  }
  std::sort(prog_.slot_uses.begin(), prog_.slot_uses.end(), [](const SlotUse& a, const SlotUse& b) {
    return std::tie(a.first, a.kind, a.slot) < std::tie(b.first, b.kind, b.slot);
  });
}

Program ProgramBuilder::build() {
  prog_.pass = ps_.pass;
  prog_.num_stages = ps_.num_stages;
  const int S = ps_.num_stages;
  const bool fwd = ps_.pass == Pass::Forward;
  std::vector<std::vector<int32_t>> by_stage(S);
  std::vector<int32_t> tail;  // tiles without outputs to send, run while the final round moves
  for (int32_t i : my_tiles_) {
    if (!ps_.tile_tail.empty() && ps_.tile_tail[i] != 0) tail.push_back(i);
    else by_stage[ps_.tile_stage[i]].push_back(i);
  }
  auto emit_attend = [&](int32_t s, const std::vector<int32_t>& tiles) {
    if (tiles.empty()) return;
    Attend att{s, {}};
    att.tiles.reserve(tiles.size());
    const int32_t at = here();
    for (int32_t ti : tiles) {
      const Tile& tile = t_.tiles[ti];
      TileOp op;
      op.tile = ti;
      auto input = [&](DataKind k, Side side, int32_t block, int32_t group) {
        if (home(block)) return local_ref(k, block);
        const int32_t v = keys_.find_input(key(side, block, group));
        DCP_ASSERT(v >= 0);
        touch(v, at);
        return slot_ref(k, v);
      };
      const int32_t set = kv_set(tile.head_group);
      op.q = input(DataKind::Q, Side::Q, tile.q_block, tile.head_group);
      op.kv = input(DataKind::KV, Side::KV, tile.kv_block, set);
      // An output's partial: with outputs_in_place the local tensor of an owned block, else a
      // slot accumulator (its vbuf; LSE shares it). `lse`: where the forward writes the LSE beside
      // it (null: backward).
      auto output = [&](DataKind kind, Side side, int32_t block, int32_t group, bool& accumulate, BufRef* lse) {
        const int64_t k = key(side, block, group);
        if (in_place(block)) {
          accumulate = keys_.local_out_seen(k);
          if (lse != nullptr) *lse = local_ref(DataKind::LSE, block);
          return local_ref(kind, block);
        }
        int32_t& v = keys_.acc(k);
        accumulate = v >= 0;
        if (!accumulate) v = new_vbuf(side == Side::Q ? kOutQ : kOutKV, block, group);
        touch(v, at);
        if (lse != nullptr) *lse = slot_ref(DataKind::LSE, v);
        return slot_ref(kind, v);
      };
      if (fwd) {
        op.out = output(DataKind::O, Side::Q, tile.q_block, tile.head_group, op.accumulate_q, &op.out_lse);
      } else {
        op.d_o = input(DataKind::dO, Side::Q, tile.q_block, tile.head_group);
        op.lse_in = input(DataKind::LSE, Side::Q, tile.q_block, tile.head_group);
        op.delta = input(DataKind::Delta, Side::Q, tile.q_block, tile.head_group);
        op.out = output(DataKind::dQ, Side::Q, tile.q_block, tile.head_group, op.accumulate_q, nullptr);
        op.out_kv = output(DataKind::dKV, Side::KV, tile.kv_block, set, op.accumulate_kv, nullptr);
      }
      att.tiles.push_back(op);
    }
    prog_.code.emplace_back(std::move(att));
  };
  for (int s = 0; s < S; ++s) {
    if (s >= 1) emit_wait(s);
    emit_comm(s + 1);
    emit_attend(s, by_stage[s]);
  }
  emit_wait(S);
  emit_comm(S + 1);
  emit_attend(S - 1, tail);  // after every input round: the tail may hold tiles of any stage
  emit_wait(S + 1);
  emit_final_merges();
  color();
  return std::move(prog_);
}

}  // namespace

Plan build_plan(const BlockTable& table, const Placement& placement, const Cluster& cluster,
                const Schedule& schedule, const PlanOptions& opts) {
  opts.validate();
  placement.validate(table);
  Plan plan;
  PlanHeader& h = plan.header;
  h.world_size = placement.num_devices;
  h.shape = table.shape;
  h.block_size = table.block_size;
  for (const TokenBlock& b : table.token_blocks) h.max_block_tokens = std::max(h.max_block_tokens, b.length);
  h.groups = table.groups;
  h.cluster = cluster;
  h.options = opts;
  h.method = placement.method;
  plan.table = table;
  plan.placement = placement;
  const int P = placement.num_devices;
  plan.devices.resize(P);
  std::vector<int32_t> pos_of(table.token_blocks.size(), -1);
  auto bucket = [&](const PassSchedule& ps) {
    std::vector<std::vector<const ScheduledTransfer*>> mine(P);
    for (const auto* list : {&ps.inputs, &ps.outputs})
      for (const ScheduledTransfer& x : *list) {
        mine[x.src].push_back(&x);
        mine[x.dst].push_back(&x);
      }
    return mine;
  };
  const auto mine_fwd = bucket(schedule.fwd);
  const auto mine_bwd = bucket(schedule.bwd);
  std::vector<std::vector<int32_t>> tiles_of(P);
  for (size_t i = 0; i < table.tiles.size(); ++i) tiles_of[placement.tile_device[i]].push_back(static_cast<int32_t>(i));
  for (int32_t b = 0; b < table.num_token_blocks(); ++b) {  // ascending ids: dispatch order
    DeviceProgram& dp = plan.devices[placement.block_home[b]];
    pos_of[b] = static_cast<int32_t>(dp.owned_blocks.size());
    dp.owned_blocks.push_back(b);
    dp.owned_token_offset.push_back(dp.owned_tokens);
    dp.owned_tokens += table.token_blocks[b].length;
  }
  KeyScratch keys(ProgramBuilder::num_keys(table));
  for (int d = 0; d < P; ++d) {
    DeviceProgram& dp = plan.devices[d];
    dp.device = d;
    dp.fwd = ProgramBuilder(table, placement, schedule.fwd, d, pos_of, dp.owned_blocks, opts.reuse_slots,
                            opts.outputs_in_place, mine_fwd[d], tiles_of[d], keys)
                 .build();
    dp.bwd = ProgramBuilder(table, placement, schedule.bwd, d, pos_of, dp.owned_blocks, opts.reuse_slots,
                            opts.outputs_in_place, mine_bwd[d], tiles_of[d], keys)
                 .build();
  }
  return plan;
}

Plan build_plan(const BlockTable& table, const Placement& placement, const Cluster& cluster,
                const PlanOptions& opts) {
  opts.validate();
  Schedule s = build_schedule(table, placement, cluster, opts.schedule);
  return build_plan(table, placement, cluster, s, opts);
}

}  // namespace dcp
