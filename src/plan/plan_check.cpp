// Structural check of a plan (dcp/detail/plan_check.h): every index in range, every shape consistent.
// Cheap checks first (header, sizes), then the block table against its masks, then every
// instruction of every program. Each failure names the device, pass and instruction.
#include "dcp/detail/plan_check.h"

#include <algorithm>
#include <string>
#include <variant>

#include "dcp/error.h"
#include "dcp/limits.h"

namespace dcp {
namespace {

class Checker {
 public:
  Checker(const Plan& plan, const std::string& source) : plan_(plan), t_(plan.table), source_(source) {}
  void run();

 private:
  [[noreturn]] void fail(const std::string& what) const { raise(ErrorKind::InvalidPlan, source_ + ": " + what); }
  void header();
  void table();
  void devices();
  void program(int d, const Program& p, Pass pass);

  // Where an instruction's problem is reported: "device 3 bwd #17".
  std::string at(int d, Pass pass, size_t pc) const {
    return "device " + std::to_string(d) + " " + to_string(pass) + " #" + std::to_string(pc);
  }
  bool kv_side(DataKind k) const { return k == DataKind::KV || k == DataKind::dKV; }
  void block(int32_t b, const std::string& where) const {
    if (b < 0 || b >= t_.num_token_blocks())
      fail(where + ": token block " + std::to_string(b) + " out of range (" + std::to_string(t_.num_token_blocks()) +
           " blocks)");
  }
  void group(DataKind k, int32_t g, const std::string& where) const {
    const int n = kv_side(k) ? t_.groups.num_kv_sets() : t_.groups.num_groups;
    if (g < 0 || g >= n)
      fail(where + ": " + (kv_side(k) ? "KV set " : "head group ") + std::to_string(g) + " out of range (" +
           std::to_string(n) + ")");
  }
  void ref(const BufRef& r, const Program& p, size_t owned, const std::string& where) const {
    if (r.space == Space::Slot && (r.index < 0 || r.index >= p.num_slots[static_cast<size_t>(r.kind)]))
      fail(where + ": " + to_string(r.kind) + " slot " + std::to_string(r.index) + " out of range (" +
           std::to_string(p.num_slots[static_cast<size_t>(r.kind)]) + " slots)");
    if (r.space == Space::Local && (r.index < 0 || static_cast<size_t>(r.index) >= owned))
      fail(where + ": local block position " + std::to_string(r.index) + " out of range (" + std::to_string(owned) +
           " owned blocks)");
  }

  const Plan& plan_;
  const BlockTable& t_;
  const std::string& source_;
};

void Checker::run() {
  header();
  table();
  devices();
}

void Checker::header() {
  const PlanHeader& h = plan_.header;
  if (h.world_size < 1 || h.world_size > kMaxDevices)
    fail("world size " + std::to_string(h.world_size) + " outside [1, " + std::to_string(kMaxDevices) + "]");
  try {
    h.shape.validate("header.heads");
    h.cluster.validate("header.cluster");
  } catch (const Error& e) {
    fail(e.what());
  }
  const AttentionShape& s = h.shape;
  if (s.q_heads > kMaxHeads || s.head_dim > kMaxHeadDim)
    fail("header: " + std::to_string(s.q_heads) + " query heads of dim " + std::to_string(s.head_dim) +
         " exceed the limits (" + std::to_string(kMaxHeads) + " heads, head dim " + std::to_string(kMaxHeadDim) + ")");
  if (s.q_heads != t_.shape.q_heads || s.kv_heads != t_.shape.kv_heads || s.head_dim != t_.shape.head_dim ||
      s.dtype != t_.shape.dtype)
    fail("header shape (" + std::to_string(s.q_heads) + "/" + std::to_string(s.kv_heads) + " heads x " +
         std::to_string(s.head_dim) + ", " + to_string(s.dtype) + ") differs from the block table's (" +
         std::to_string(t_.shape.q_heads) + "/" + std::to_string(t_.shape.kv_heads) + " heads x " +
         std::to_string(t_.shape.head_dim) + ", " + to_string(t_.shape.dtype) + ")");
  const HeadGroups& g = h.groups;
  const HeadGroups& tg = t_.groups;
  if (g.num_groups != tg.num_groups || g.q_heads_per_group != tg.q_heads_per_group ||
      g.kv_heads_per_group != tg.kv_heads_per_group || g.groups_per_kv_set != tg.groups_per_kv_set)
    fail("header head groups differ from the block table's");
  if (h.block_size != t_.block_size || h.block_size < 0)
    fail("header block size " + std::to_string(h.block_size) + " differs from the block table's " +
         std::to_string(t_.block_size));
  const int64_t devices = int64_t{h.cluster.nodes} * h.cluster.devices_per_node;
  if (devices != h.world_size)
    fail("header cluster has " + std::to_string(h.cluster.nodes) + " x " + std::to_string(h.cluster.devices_per_node) +
         " devices, world size is " + std::to_string(h.world_size));
  try {
    h.options.validate();
  } catch (const Error& e) {
    fail(std::string("header options: ") + e.what());
  }
  if (plan_.devices.size() != static_cast<size_t>(h.world_size) || plan_.placement.num_devices != h.world_size)
    fail("world size " + std::to_string(h.world_size) + " but " + std::to_string(plan_.devices.size()) +
         " programs and a placement over " + std::to_string(plan_.placement.num_devices) + " devices");
}

void Checker::table() {
  try {
    t_.validate();
    check_tiles_against_masks(t_);
    plan_.placement.validate(t_);
  } catch (const Error& e) {
    fail(e.what());
  }
  if (t_.num_sequences() > kMaxSequences)
    fail(std::to_string(t_.num_sequences()) + " sequences exceed the limit " + std::to_string(kMaxSequences));
  int64_t longest = 0;
  for (const TokenBlock& b : t_.token_blocks) longest = std::max(longest, b.length);
  if (plan_.header.max_block_tokens != longest)
    fail("header max_block_tokens " + std::to_string(plan_.header.max_block_tokens) + " but the longest token block has " +
         std::to_string(longest) + " tokens");
}

void Checker::devices() {
  const int P = plan_.header.world_size;
  // Owned blocks: every block of the device's home, in ascending order, with prefix offsets.
  std::vector<std::vector<int32_t>> owned(static_cast<size_t>(P));
  for (int32_t b = 0; b < t_.num_token_blocks(); ++b)
    owned[static_cast<size_t>(plan_.placement.block_home[static_cast<size_t>(b)])].push_back(b);
  for (int d = 0; d < P; ++d) {
    const DeviceProgram& dp = plan_.devices[static_cast<size_t>(d)];
    const std::string where = "device " + std::to_string(d);
    if (dp.device != d) fail(where + ": program says device " + std::to_string(dp.device));
    if (dp.owned_blocks != owned[static_cast<size_t>(d)])
      fail(where + ": owned blocks differ from the blocks the placement homes there");
    if (dp.owned_token_offset.size() != dp.owned_blocks.size())
      fail(where + ": " + std::to_string(dp.owned_token_offset.size()) + " token offsets for " +
           std::to_string(dp.owned_blocks.size()) + " owned blocks");
    int64_t rows = 0;
    for (size_t i = 0; i < dp.owned_blocks.size(); ++i) {
      if (dp.owned_token_offset[i] != rows)
        fail(where + ": owned block " + std::to_string(i) + " starts at row " + std::to_string(dp.owned_token_offset[i]) +
             ", expected " + std::to_string(rows));
      rows += t_.token_blocks[static_cast<size_t>(dp.owned_blocks[i])].length;
    }
    if (dp.owned_tokens != rows)
      fail(where + ": owned_tokens " + std::to_string(dp.owned_tokens) + " but its blocks hold " + std::to_string(rows));
    program(d, dp.fwd, Pass::Forward);
    program(d, dp.bwd, Pass::Backward);
  }
}

void Checker::program(int d, const Program& p, Pass pass) {
  const std::string where = "device " + std::to_string(d) + " " + to_string(pass);
  const DeviceProgram& dp = plan_.devices[static_cast<size_t>(d)];
  const size_t owned = dp.owned_blocks.size();
  if (p.pass != pass) fail(where + ": program of the wrong pass");
  const int32_t stages = plan_.header.options.schedule.num_comm_stages + 1;
  if (p.num_stages != stages)
    fail(where + ": " + std::to_string(p.num_stages) + " stages, the header says " + std::to_string(stages));
  // Every slot is occupied by at least one residency, so residencies bound the slot counts (and
  // with them every allocation an executor derives from them).
  std::array<int64_t, kNumDataKinds> uses{};
  for (const SlotUse& u : p.slot_uses) ++uses[static_cast<size_t>(u.kind)];
  for (int k = 0; k < kNumDataKinds; ++k)
    if (p.num_slots[static_cast<size_t>(k)] < 0 || p.num_slots[static_cast<size_t>(k)] > uses[static_cast<size_t>(k)])
      fail(where + ": " + std::to_string(p.num_slots[static_cast<size_t>(k)]) + " " +
           to_string(static_cast<DataKind>(k)) + " slots for " + std::to_string(uses[static_cast<size_t>(k)]) +
           " residencies");
  for (size_t pc = 0; pc < p.code.size(); ++pc) {
    const std::string w = at(d, pass, pc);
    if (const auto* a = std::get_if<Attend>(&p.code[pc])) {
      if (a->stage < 0 || a->stage >= p.num_stages) fail(w + ": Attend in stage " + std::to_string(a->stage));
      for (const TileOp& op : a->tiles) {
        if (op.tile < 0 || static_cast<size_t>(op.tile) >= t_.tiles.size())
          fail(w + ": tile " + std::to_string(op.tile) + " out of range (" + std::to_string(t_.tiles.size()) + " tiles)");
        for (const BufRef* r : {&op.q, &op.kv, &op.d_o, &op.lse_in, &op.delta, &op.out, &op.out_lse, &op.out_kv})
          ref(*r, p, owned, w);
      }
    } else if (const auto* m = std::get_if<Merge>(&p.code[pc])) {
      if (m->kind != DataKind::O && m->kind != DataKind::dQ && m->kind != DataKind::dKV)
        fail(w + ": Merge of kind " + to_string(m->kind));
      block(m->token_block, w);
      group(m->kind, m->group, w);
      for (int32_t s : m->src_slots) ref(BufRef{Space::Slot, m->kind, s}, p, owned, w);
      for (int32_t s : m->src_lse_slots) ref(BufRef{Space::Slot, DataKind::LSE, s}, p, owned, w);
      ref(m->dst, p, owned, w);
      ref(m->dst_lse, p, owned, w);
    } else if (const auto* c = std::get_if<Copy>(&p.code[pc])) {
      block(c->token_block, w);
      group(c->kind, c->group, w);
      ref(c->src, p, owned, w);
      ref(c->dst, p, owned, w);
    } else if (const auto* cs = std::get_if<CommStart>(&p.code[pc])) {
      if (cs->id < 1 || cs->id > stages + 1) fail(w + ": CommStart of round " + std::to_string(cs->id));
      for (const Transfer& x : cs->ops) {
        if (x.peer < 0 || x.peer >= plan_.header.world_size || x.peer == d)
          fail(w + ": transfer with peer " + std::to_string(x.peer));
        block(x.token_block, w);
        group(x.kind, x.group, w);
        ref(x.buf, p, owned, w);
        const int64_t want = plan_block_bytes(t_, x.kind, t_.token_blocks[static_cast<size_t>(x.token_block)].length);
        if (x.bytes != want)
          fail(w + ": transfer of " + std::to_string(x.bytes) + " bytes, its block holds " + std::to_string(want));
      }
    } else {
      const int32_t id = std::get<CommWait>(p.code[pc]).id;
      if (id < 1 || id > stages + 1) fail(w + ": CommWait of round " + std::to_string(id));
    }
  }
  for (const SlotUse& u : p.slot_uses) {
    if (u.slot < 0 || u.slot >= p.num_slots[static_cast<size_t>(u.kind)] || u.first < 0 || u.first > u.last)
      fail(where + ": slot residency (" + to_string(u.kind) + " slot " + std::to_string(u.slot) + ", instructions " +
           std::to_string(u.first) + ".." + std::to_string(u.last) + ") out of range");
    block(u.token_block, where);
    group(u.kind, u.group, where);
  }
}

}  // namespace

void check_plan_structure(const Plan& plan, const std::string& source) { Checker(plan, source).run(); }

}  // namespace dcp
