// Plan validator: symbolic execution of all programs (see dcp/validate.h). Partials are
// tracked as multisets of tiles through an order-independent hash (sum of per-tile 64-bit
// hashes) plus a count, so a duplicated, missing or foreign tile changes the result.
#include "dcp/validate.h"

#include <map>
#include <sstream>
#include <tuple>

#include "dcp/error.h"
#include "dcp/detail/plan_check.h"

namespace dcp {

std::string PlanViolation::to_string() const {
  std::ostringstream s;
  if (device >= 0) s << "device " << device << " " << dcp::to_string(pass);
  if (instruction >= 0) s << " #" << instruction;
  if (device >= 0 || instruction >= 0) s << ": ";
  s << what;
  return s.str();
}

namespace {

uint64_t mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct Content {
  bool valid = false;
  bool partial = false;
  DataKind kind = DataKind::Q;
  int32_t block = -1, group = -1;
  uint64_t hash = 0;  // partials: sum of tile hashes
  int64_t count = 0;  // partials: tiles accumulated
  bool consumed = true;
  int32_t recv_round = 0;  // > 0: being received in that round until its wait
  int32_t send_round = 0;  // > 0: being sent in that round until its wait
  bool operator==(const Content& o) const {
    return valid == o.valid && partial == o.partial && kind == o.kind && block == o.block &&
           group == o.group && hash == o.hash && count == o.count;
  }
};

std::string describe(const Content& c) {
  if (!c.valid) return "nothing";
  std::string s = std::string(to_string(c.kind)) + " of block " + std::to_string(c.block) + " group " +
                  std::to_string(c.group);
  if (c.partial) s += " (partial of " + std::to_string(c.count) + " tiles)";
  return s;
}

bool is_output_kind(Pass p, DataKind k) {
  return k == DataKind::O || k == DataKind::dQ || k == DataKind::dKV || (p == Pass::Forward && k == DataKind::LSE);
}

struct PendingOp {
  int device;
  int32_t round;
  const Transfer* op;
  Content payload;  // sends: snapshot at post
  Content* buf;     // receives: where the payload lands
  size_t group;     // index in the device's posted groups
  bool matched = false;
};

struct Group {
  int32_t round;
  std::vector<size_t> ops;  // indices into ops_
  size_t unmatched = 0;
  bool waited = false;
};

class Validator {
 public:
  Validator(const Plan& plan, size_t max) : plan_(plan), t_(plan.table), max_(max) {}
  std::vector<PlanViolation> run();

 private:
  void fail(int dev, int instr, const std::string& what) {
    if (out_.size() < max_) out_.push_back(PlanViolation{dev, pass_, instr, what});
  }
  bool full() const { return out_.size() >= max_; }
  void run_pass(Pass pass);
  bool step(int d);                 // runs device d until blocked; true if it advanced
  bool match();                     // matches head groups; true if anything matched
  Content* buffer(int d, const BufRef& r, int instr, const char* role);
  Content expect_input(DataKind k, int32_t block, int32_t group) const {
    Content c;
    c.valid = true;
    c.kind = k;
    c.block = block;
    c.group = group;
    return c;
  }
  void write(int d, int instr, Content* dst, const Content& value, const char* role);

  const Plan& plan_;
  const BlockTable& t_;
  size_t max_;
  std::vector<PlanViolation> out_;
  Pass pass_ = Pass::Forward;
  // Per device state of the current pass.
  std::vector<const Program*> prog_;
  std::vector<size_t> pc_;
  std::vector<std::array<std::vector<Content>, kNumDataKinds>> slots_;
  std::vector<std::map<std::tuple<DataKind, int32_t, int32_t>, Content>> local_out_;
  std::vector<std::vector<Group>> groups_;   // posted, in order
  std::vector<size_t> head_;                 // first incomplete group
  std::vector<PendingOp> ops_;
  std::map<std::pair<int, int>, std::vector<size_t>> sends_, recvs_;  // (src, dst) -> ops in order
  std::map<std::pair<int, int>, size_t> next_send_, next_recv_;
  std::vector<int32_t> tile_count_;
  Content local_tmp_;
};

Content* Validator::buffer(int d, const BufRef& r, int instr, const char* role) {
  const DeviceProgram& dp = plan_.devices[d];
  if (r.space == Space::Slot) {
    auto& arr = slots_[d][static_cast<int>(r.kind)];
    if (r.index < 0 || r.index >= static_cast<int32_t>(arr.size())) {
      fail(d, instr, std::string(role) + ": " + to_string(r.kind) + " slot " + std::to_string(r.index) +
                         " out of range (num_slots " + std::to_string(arr.size()) + ")");
      return nullptr;
    }
    return &arr[r.index];
  }
  if (r.space == Space::Local) {
    if (r.index < 0 || r.index >= static_cast<int32_t>(dp.owned_blocks.size())) {
      fail(d, instr, std::string(role) + ": local block position " + std::to_string(r.index) + " out of range");
      return nullptr;
    }
    return nullptr;  // local inputs are handled by the caller
  }
  fail(d, instr, std::string(role) + ": missing buffer");
  return nullptr;
}

void Validator::write(int d, int instr, Content* dst, const Content& value, const char* role) {
  if (dst->recv_round > 0 || dst->send_round > 0)
    fail(d, instr, std::string(role) + " overwrites a buffer in use by round " +
                       std::to_string(std::max(dst->recv_round, dst->send_round)));
  if (dst->valid && dst->partial && !dst->consumed)
    fail(d, instr, std::string(role) + " overwrites an unconsumed " + describe(*dst));
  *dst = value;
}

std::vector<PlanViolation> Validator::run() {
  // Symbolic execution indexes tiles, blocks and slots: a plan whose numbers do not all point
  // somewhere is reported as one violation before any of that.
  try {
    check_plan_structure(plan_, "plan");
  } catch (const Error& e) {
    fail(-1, -1, e.what());
    return out_;
  }
  const PlanHeader& h = plan_.header;
  const int P = h.world_size;
  if (static_cast<int>(plan_.devices.size()) != P || plan_.placement.num_devices != P)
    fail(-1, -1, "world size " + std::to_string(P) + " but " + std::to_string(plan_.devices.size()) + " programs");
  if (plan_.placement.block_home.size() != t_.token_blocks.size() || plan_.placement.tile_device.size() != t_.tiles.size())
    fail(-1, -1, "placement sizes do not match the block table");
  if (!out_.empty()) return out_;
  for (int d = 0; d < P; ++d) {
    const DeviceProgram& dp = plan_.devices[d];
    std::vector<int32_t> expect;
    for (int32_t b = 0; b < t_.num_token_blocks(); ++b)
      if (plan_.placement.block_home[b] == d) expect.push_back(b);
    if (dp.owned_blocks != expect) fail(d, -1, "owned_blocks differ from the placement's homes");
    if (dp.fwd.pass != Pass::Forward || dp.bwd.pass != Pass::Backward) fail(d, -1, "programs in the wrong pass");
  }
  if (!out_.empty()) return out_;
  run_pass(Pass::Forward);
  if (!full()) run_pass(Pass::Backward);
  return out_;
}

void Validator::run_pass(Pass pass) {
  pass_ = pass;
  const int P = plan_.header.world_size;
  prog_.assign(P, nullptr);
  pc_.assign(P, 0);
  slots_.assign(P, {});
  local_out_.assign(P, {});
  groups_.assign(P, {});
  head_.assign(P, 0);
  ops_.clear();
  sends_.clear();
  recvs_.clear();
  next_send_.clear();
  next_recv_.clear();
  tile_count_.assign(t_.tiles.size(), 0);
  for (int d = 0; d < P; ++d) {
    prog_[d] = pass == Pass::Forward ? &plan_.devices[d].fwd : &plan_.devices[d].bwd;
    for (int k = 0; k < kNumDataKinds; ++k) slots_[d][k].assign(std::max(prog_[d]->num_slots[k], 0), Content{});
  }
  ops_.reserve(1 << 12);
  bool progress = true;
  while (progress && !full()) {
    progress = false;
    for (int d = 0; d < P; ++d) progress |= step(d);
    progress |= match();
  }
  for (int d = 0; d < P; ++d)
    if (pc_[d] < prog_[d]->code.size()) {
      const auto* w = std::get_if<CommWait>(&prog_[d]->code[pc_[d]]);
      fail(d, static_cast<int>(pc_[d]),
           "deadlock: blocked at CommWait(" + std::to_string(w ? w->id : -1) + ") whose transfers never complete");
    }
  // A round left pending would collide with the same round of the next pass or layer.
  for (int d = 0; d < P; ++d)
    for (const Group& g : groups_[d])
      if (!g.waited && pc_[d] >= prog_[d]->code.size())
        fail(d, -1, "round " + std::to_string(g.round) + " is started but never waited for");
  for (const PendingOp& op : ops_)
    if (!op.matched && out_.size() < max_)
      fail(op.device, -1, std::string("unmatched ") + (op.op->send ? "send to " : "receive from ") +
                              std::to_string(op.op->peer) + " in round " + std::to_string(op.round) + ": " +
                              to_string(op.op->kind) + " of block " + std::to_string(op.op->token_block));
  // Every tile exactly once; every owned output merged from exactly its tiles.
  for (size_t i = 0; i < t_.tiles.size(); ++i)
    if (tile_count_[i] != 1)
      fail(plan_.placement.tile_device[i], -1,
           "tile " + std::to_string(i) + " computed " + std::to_string(tile_count_[i]) + " times");
  std::map<std::tuple<DataKind, int32_t, int32_t>, std::pair<uint64_t, int64_t>> expect;
  for (size_t i = 0; i < t_.tiles.size(); ++i) {
    const Tile& tile = t_.tiles[i];
    const uint64_t th = mix(i);
    auto add = [&](DataKind k, int32_t b, int32_t g) {
      auto& e = expect[{k, b, g}];
      e.first += th;
      ++e.second;
    };
    add(pass == Pass::Forward ? DataKind::O : DataKind::dQ, tile.q_block, tile.head_group);
    if (pass == Pass::Backward) add(DataKind::dKV, tile.kv_block, t_.groups.kv_set(tile.head_group));
  }
  for (int d = 0; d < P && !full(); ++d) {
    for (int32_t b : plan_.devices[d].owned_blocks) {
      auto check = [&](DataKind k, int32_t g) {
        auto it = local_out_[d].find({k, b, g});
        if (it == local_out_[d].end()) {
          fail(d, -1, std::string("output ") + to_string(k) + " of block " + std::to_string(b) + " group " +
                          std::to_string(g) + " never merged");
          return;
        }
        auto e = expect.find({k, b, g});
        const uint64_t eh = e == expect.end() ? 0 : e->second.first;
        const int64_t ec = e == expect.end() ? 0 : e->second.second;
        if (it->second.hash != eh || it->second.count != ec)
          fail(d, -1, std::string("output ") + to_string(k) + " of block " + std::to_string(b) + " group " +
                          std::to_string(g) + " merged from " + std::to_string(it->second.count) +
                          " tiles, not exactly its " + std::to_string(ec) + " tiles");
      };
      for (int g = 0; g < t_.groups.num_groups; ++g) check(pass == Pass::Forward ? DataKind::O : DataKind::dQ, g);
      if (pass == Pass::Backward)
        for (int k = 0; k < t_.groups.num_kv_sets(); ++k) check(DataKind::dKV, k);
    }
  }
}

bool Validator::step(int d) {
  const Program& prog = *prog_[d];
  const DeviceProgram& dp = plan_.devices[d];
  bool advanced = false;
  auto owned_block = [&](const BufRef& r) { return dp.owned_blocks[r.index]; };
  // Checks that `r` holds input `k` of (block, group); returns false (after reporting) if not.
  auto check_input = [&](int pc, const BufRef& r, DataKind k, int32_t block, int32_t group, const char* role) {
    if (r.kind != k) {
      fail(d, pc, std::string(role) + ": buffer of kind " + to_string(r.kind) + ", expected " + to_string(k));
      return;
    }
    if (r.space == Space::Local) {
      if (buffer(d, r, pc, role) == nullptr && (r.index < 0 || r.index >= static_cast<int32_t>(dp.owned_blocks.size())))
        return;
      if (owned_block(r) != block)
        fail(d, pc, std::string(role) + ": local block " + std::to_string(owned_block(r)) + ", expected block " +
                        std::to_string(block));
      return;
    }
    Content* c = buffer(d, r, pc, role);
    if (c == nullptr) return;
    if (c->recv_round > 0) fail(d, pc, std::string(role) + ": reads a slot still being received");
    if (!(*c == expect_input(k, block, group)))
      fail(d, pc, std::string(role) + ": slot holds " + describe(*c) + ", expected " +
                      describe(expect_input(k, block, group)));
  };
  // An owned output block accumulates in its local tensor: tiles and merges of received partials
  // add to it (the first overwrites), and at the end it must hold exactly its tiles.
  auto local_partial = [&](int pc, const BufRef& r, DataKind k, int32_t block, int32_t group, bool accumulate,
                           uint64_t th, int64_t tc, const char* role) {
    if (r.index < 0 || r.index >= static_cast<int32_t>(dp.owned_blocks.size()) || owned_block(r) != block) {
      fail(d, pc, std::string(role) + ": not the local " + to_string(k) + " of block " + std::to_string(block));
      return;
    }
    if (k == DataKind::LSE) return;  // travels with O (paired by the caller)
    const auto key = std::make_tuple(k, block, group);
    auto it = local_out_[d].find(key);
    if (accumulate) {
      if (it == local_out_[d].end()) {
        fail(d, pc, std::string(role) + ": accumulates into the local " + to_string(k) + " of block " +
                        std::to_string(block) + ", which holds nothing yet");
        return;
      }
      it->second.hash += th;
      it->second.count += tc;
      return;
    }
    if (it != local_out_[d].end()) {
      fail(d, pc, std::string(role) + ": overwrites the local " + to_string(k) + " of block " + std::to_string(block) +
                      ", which already holds partials");
      return;
    }
    Content v = expect_input(k, block, group);
    v.partial = true;
    v.hash = th;
    v.count = tc;
    local_out_[d].emplace(key, v);
  };
  auto partial_into = [&](int pc, const BufRef& r, DataKind k, int32_t block, int32_t group, bool accumulate,
                          uint64_t th, int64_t tc, const char* role) {
    if (r.kind != k || (r.space != Space::Slot && r.space != Space::Local)) {
      fail(d, pc, std::string(role) + ": partials must go to a " + to_string(k) + " slot or local tensor");
      return;
    }
    if (r.space == Space::Local) {
      local_partial(pc, r, k, block, group, accumulate, th, tc, role);
      return;
    }
    Content* c = buffer(d, r, pc, role);
    if (c == nullptr) return;
    Content v = expect_input(k, block, group);
    v.partial = true;
    v.consumed = false;
    v.hash = th;
    v.count = tc;
    if (accumulate) {
      Content want = expect_input(k, block, group);
      if (!c->valid || !c->partial || c->kind != k || c->block != block || c->group != group || c->recv_round > 0) {
        fail(d, pc, std::string(role) + ": accumulates into a slot holding " + describe(*c) + ", expected a partial " +
                        describe(want));
        return;
      }
      if (c->send_round > 0) fail(d, pc, std::string(role) + ": accumulates into a slot being sent");
      c->hash += th;
      c->count += tc;
      c->consumed = false;
    } else {
      write(d, pc, c, v, role);
    }
  };
  while (pc_[d] < prog.code.size() && !full()) {
    const int pc = static_cast<int>(pc_[d]);
    const Instruction& ins = prog.code[pc_[d]];
    if (const auto* a = std::get_if<Attend>(&ins)) {
      for (const TileOp& op : a->tiles) {
        if (op.tile < 0 || op.tile >= static_cast<int32_t>(t_.tiles.size())) {
          fail(d, pc, "tile id " + std::to_string(op.tile) + " out of range");
          continue;
        }
        const Tile& tile = t_.tiles[op.tile];
        if (plan_.placement.tile_device[op.tile] != d)
          fail(d, pc, "tile " + std::to_string(op.tile) + " belongs to device " +
                          std::to_string(plan_.placement.tile_device[op.tile]));
        ++tile_count_[op.tile];
        const int32_t set = t_.groups.kv_set(tile.head_group);
        check_input(pc, op.q, DataKind::Q, tile.q_block, tile.head_group, "Attend q");
        check_input(pc, op.kv, DataKind::KV, tile.kv_block, set, "Attend kv");
        const uint64_t th = mix(static_cast<uint64_t>(op.tile));
        if (pass_ == Pass::Forward) {
          partial_into(pc, op.out, DataKind::O, tile.q_block, tile.head_group, op.accumulate_q, th, 1, "Attend out");
          partial_into(pc, op.out_lse, DataKind::LSE, tile.q_block, tile.head_group, op.accumulate_q, th, 1,
                       "Attend out_lse");
          if ((op.out.space == Space::Local || op.out_lse.space == Space::Local) &&
              !(op.out.space == op.out_lse.space && op.out.index == op.out_lse.index))
            fail(d, pc, "Attend: the local LSE does not pair with the local O");
        } else {
          check_input(pc, op.d_o, DataKind::dO, tile.q_block, tile.head_group, "Attend dO");
          check_input(pc, op.lse_in, DataKind::LSE, tile.q_block, tile.head_group, "Attend lse");
          check_input(pc, op.delta, DataKind::Delta, tile.q_block, tile.head_group, "Attend delta");
          partial_into(pc, op.out, DataKind::dQ, tile.q_block, tile.head_group, op.accumulate_q, th, 1, "Attend dQ");
          partial_into(pc, op.out_kv, DataKind::dKV, tile.kv_block, set, op.accumulate_kv, th, 1, "Attend dKV");
        }
      }
    } else if (const auto* m = std::get_if<Merge>(&ins)) {
      const bool fwd = pass_ == Pass::Forward;
      if (fwd ? m->kind != DataKind::O : (m->kind != DataKind::dQ && m->kind != DataKind::dKV)) {
        fail(d, pc, std::string("Merge of kind ") + to_string(m->kind) + " in this pass");
      } else {
        uint64_t h = 0;
        int64_t n = 0;
        auto take = [&](DataKind k, const std::vector<int32_t>& srcs, bool count) {
          for (int32_t s : srcs) {
            Content* c = buffer(d, BufRef{Space::Slot, k, s}, pc, "Merge source");
            if (c == nullptr) continue;
            if (!c->valid || !c->partial || c->kind != k || c->block != m->token_block || c->group != m->group ||
                c->recv_round > 0) {
              fail(d, pc, "Merge source slot " + std::to_string(s) + " holds " + describe(*c));
              continue;
            }
            c->consumed = true;
            if (count) {
              h += c->hash;
              n += c->count;
            }
          }
        };
        take(m->kind, m->src_slots, true);
        if (fwd) {
          if (m->src_lse_slots.size() != m->src_slots.size()) fail(d, pc, "Merge: LSE sources do not pair with O sources");
          take(DataKind::LSE, m->src_lse_slots, false);
        }
        if (m->dst.space == Space::Local) {
          if (m->dst.kind != m->kind || m->dst.index < 0 || m->dst.index >= static_cast<int32_t>(dp.owned_blocks.size()) ||
              owned_block(m->dst) != m->token_block) {
            fail(d, pc, "Merge destination is not the local output of block " + std::to_string(m->token_block));
          } else {
            if (fwd && !(m->dst_lse.space == Space::Local && m->dst_lse.kind == DataKind::LSE && m->dst_lse.index == m->dst.index))
              fail(d, pc, "Merge: LSE destination does not pair with the O destination");
            local_partial(pc, m->dst, m->kind, m->token_block, m->group, m->accumulate, h, n, "Merge destination");
          }
        } else {
          partial_into(pc, m->dst, m->kind, m->token_block, m->group, m->accumulate, h, n, "Merge destination");
          if (fwd) partial_into(pc, m->dst_lse, DataKind::LSE, m->token_block, m->group, m->accumulate, h, n, "Merge LSE");
        }
      }
    } else if (const auto* c = std::get_if<Copy>(&ins)) {
      Content v;
      if (c->src.space == Space::Local) {
        check_input(pc, c->src, c->kind, c->token_block, c->group, "Copy source");
        v = expect_input(c->kind, c->token_block, c->group);
      } else if (Content* s = buffer(d, c->src, pc, "Copy source")) {
        if (s->recv_round > 0) fail(d, pc, "Copy reads a slot still being received");
        v = *s;
        v.recv_round = v.send_round = 0;
        if (v.partial) s->consumed = true;
      }
      if (c->dst.space != Space::Slot) fail(d, pc, "Copy destination must be a slot");
      else if (Content* dst = buffer(d, c->dst, pc, "Copy destination")) write(d, pc, dst, v, "Copy");
    } else if (const auto* cs = std::get_if<CommStart>(&ins)) {
      if (!groups_[d].empty() && groups_[d].back().round >= cs->id)
        fail(d, pc, "CommStart(" + std::to_string(cs->id) + ") after round " + std::to_string(groups_[d].back().round));
      Group g{cs->id, {}, 0};
      for (const Transfer& x : cs->ops) {
        if (x.peer < 0 || x.peer >= plan_.header.world_size || x.peer == d) {
          fail(d, pc, "transfer to bad peer " + std::to_string(x.peer));
          continue;
        }
        if (x.token_block < 0 || x.token_block >= t_.num_token_blocks() || x.buf.kind != x.kind) {
          fail(d, pc, "transfer of a bad block or buffer kind");
          continue;
        }
        const int64_t want = plan_block_bytes(t_, x.kind, t_.token_blocks[x.token_block].length);
        if (x.bytes != want)
          fail(d, pc, "transfer of " + std::to_string(x.bytes) + " bytes, block needs " + std::to_string(want));
        PendingOp op{d, cs->id, &x, {}, nullptr, groups_[d].size()};
        const bool out_kind = is_output_kind(pass_, x.kind);
        if (x.send) {
          if (x.buf.space == Space::Local) {
            if (out_kind) fail(d, pc, "sends a local output");
            check_input(pc, x.buf, x.kind, x.token_block, x.group, "send");
            op.payload = expect_input(x.kind, x.token_block, x.group);
          } else if (Content* b = buffer(d, x.buf, pc, "send")) {
            if (b->recv_round > 0 || !b->valid || b->kind != x.kind || b->block != x.token_block ||
                b->group != x.group || b->partial != out_kind)
              fail(d, pc, "send of " + std::string(to_string(x.kind)) + " block " + std::to_string(x.token_block) +
                              " from a slot holding " + describe(*b));
            op.payload = *b;
            op.payload.recv_round = op.payload.send_round = 0;
            b->send_round = cs->id;
            if (b->partial) b->consumed = true;
          }
          sends_[{d, x.peer}].push_back(ops_.size());
        } else {
          if (x.buf.space != Space::Slot) {
            fail(d, pc, "receives into a local tensor");
          } else if (Content* b = buffer(d, x.buf, pc, "receive")) {
            write(d, pc, b, Content{}, "receive");
            b->recv_round = cs->id;
            op.buf = b;
          }
          recvs_[{x.peer, d}].push_back(ops_.size());
        }
        g.ops.push_back(ops_.size());
        ops_.push_back(op);
      }
      g.unmatched = g.ops.size();
      groups_[d].push_back(std::move(g));
    } else if (const auto* w = std::get_if<CommWait>(&ins)) {
      size_t gi = groups_[d].size();
      for (size_t i = 0; i < groups_[d].size(); ++i)
        if (groups_[d][i].round == w->id) gi = i;
      if (gi == groups_[d].size()) {
        fail(d, pc, "CommWait(" + std::to_string(w->id) + ") without a CommStart");
      } else {
        Group& g = groups_[d][gi];
        if (g.unmatched > 0) return advanced;  // blocked
        if (g.waited) fail(d, pc, "CommWait(" + std::to_string(w->id) + ") of a round already waited for");
        g.waited = true;
        for (size_t oi : g.ops) {
          PendingOp& op = ops_[oi];
          if (op.op->send) {
            if (op.op->buf.space == Space::Slot) {
              Content* b = &slots_[d][static_cast<int>(op.op->buf.kind)][op.op->buf.index];
              if (b->send_round == w->id) b->send_round = 0;
            }
          } else if (op.buf != nullptr) {
            *op.buf = op.payload;
            if (op.buf->partial) op.buf->consumed = false;
          }
        }
      }
    }
    ++pc_[d];
    advanced = true;
  }
  return advanced;
}

bool Validator::match() {
  bool any = false;
  for (auto& [pair, sends] : sends_) {
    auto rit = recvs_.find(pair);
    if (rit == recvs_.end()) continue;
    const auto& recvs = rit->second;
    size_t& k = next_send_[pair];
    while (k < sends.size() && k < recvs.size()) {
      PendingOp& s = ops_[sends[k]];
      PendingOp& r = ops_[recvs[k]];
      if (s.group != head_[s.device] || r.group != head_[r.device]) break;
      if (s.round != r.round)
        fail(s.device, -1, "send to " + std::to_string(r.device) + " in round " + std::to_string(s.round) +
                               " meets a receive posted in round " + std::to_string(r.round));
      else if (s.op->kind != r.op->kind || s.op->token_block != r.op->token_block || s.op->group != r.op->group ||
               s.op->bytes != r.op->bytes)
        fail(s.device, -1, "send to " + std::to_string(r.device) + " of " + to_string(s.op->kind) + " block " +
                               std::to_string(s.op->token_block) + " meets a receive of " + to_string(r.op->kind) +
                               " block " + std::to_string(r.op->token_block) + " (round " + std::to_string(s.round) + ")");
      r.payload = s.payload;
      s.matched = r.matched = true;
      --groups_[s.device][s.group].unmatched;
      --groups_[r.device][r.group].unmatched;
      ++k;
      any = true;
    }
  }
  for (size_t d = 0; d < groups_.size(); ++d)
    while (head_[d] < groups_[d].size() && groups_[d][head_[d]].unmatched == 0) {
      ++head_[d];
      any = true;
    }
  return any;
}

}  // namespace

std::vector<PlanViolation> validate_plan(const Plan& plan, size_t max_violations) {
  return Validator(plan, max_violations).run();
}

void check_plan(const Plan& plan) {
  auto v = validate_plan(plan, 5);
  if (v.empty()) return;
  std::string msg = "plan is invalid:";
  for (const PlanViolation& x : v) msg += "\n  " + x.to_string();
  raise(ErrorKind::InvalidPlan, msg);
}

}  // namespace dcp
