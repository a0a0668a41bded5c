// Executor: interprets one device's Program (see dcp/executor.h and dcp/plan.h).
#include "dcp/executor.h"

#include <chrono>
#include <limits>
#include <map>
#include <string>
#include <variant>

#include "dcp/error.h"

namespace dcp {
namespace {

using Clock = std::chrono::steady_clock;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// One data block of one (token block, head group or KV set): rows of `row_floats` floats,
// `ld` floats apart; KV-side kinds have a second part (V or dV) with the same geometry.
struct View {
  float* p = nullptr;
  float* p2 = nullptr;
  int64_t ld = 0;
  int64_t rows = 0;
  int64_t row_floats = 0;
  int64_t floats() const { return rows * row_floats * (p2 ? 2 : 1); }
};

bool kv_side(DataKind k) { return k == DataKind::KV || k == DataKind::dKV; }

}  // namespace

struct Executor::Impl {
  const Plan& plan;
  Backend& backend;
  Comm& comm;
  ExecOptions options;
  const DeviceProgram& dev;
  int qpg = 0, kvpg = 0, dim = 0;
  int64_t max_tokens = 0;
  cpu::HeadLayout heads;
  // Slot arrays per pass and kind.
  std::array<float*, kNumDataKinds> slots_fwd{}, slots_bwd{};
  std::array<int64_t, kNumDataKinds> slot_floats{};
  std::array<float*, kNumDataKinds>* slots = nullptr;
  LocalTensors* local = nullptr;
  // Per tile (index into table.tiles): CSR ranges in tile-local key coordinates (Partial only).
  std::map<int32_t, std::pair<std::vector<int64_t>, std::vector<Range>>> tile_rows;
  // Staging of the current rounds: per round, receives to unpack after the wait.
  struct Pending {
    std::vector<std::vector<float>> buffers;
    std::vector<std::pair<View, size_t>> unpack;  // destination view, buffer index
  };
  std::map<int32_t, Pending> rounds;
  ExecStats stats;

  Impl(const Plan& p, Backend& b, Comm& c, ExecOptions o)
      : plan(p), backend(b), comm(c), options(o), dev(checked_device(p, c)) {
    const HeadGroups& g = plan.table.groups;
    qpg = g.q_heads_per_group;
    kvpg = g.kv_heads_per_group;
    dim = plan.header.shape.head_dim;
    max_tokens = plan.header.max_block_tokens;
    heads = cpu::HeadLayout{qpg, kvpg, dim};
    heads.validate();
    for (int k = 0; k < kNumDataKinds; ++k) {
      const auto kind = static_cast<DataKind>(k);
      slot_floats[static_cast<size_t>(k)] = slot_size(kind);
      // fp32 batches: our slots are exactly the plan's (the planner's memory figure is ours).
      if (plan.header.shape.dtype == DType::FP32 && slot_size(kind) * 4 != slot_bytes(plan.table, kind))
        raise(ErrorKind::InvalidPlan, std::string("executor: slot of ") + to_string(kind) + " is " +
                                          std::to_string(slot_bytes(plan.table, kind)) + " bytes in the plan, " +
                                          std::to_string(slot_size(kind) * 4) + " here");
    }
    for (int k = 0; k < kNumDataKinds; ++k) {
      const auto kind = static_cast<size_t>(k);
      slots_fwd[kind] = backend.allocate(std::max<int64_t>(1, dev.fwd.num_slots[kind] * slot_floats[kind]));
      slots_bwd[kind] = backend.allocate(std::max<int64_t>(1, dev.bwd.num_slots[kind] * slot_floats[kind]));
    }
  }

  static const DeviceProgram& checked_device(const Plan& p, const Comm& c) {
    check_plan_world_size(p, c.world_size(), "executor");
    if (static_cast<int>(p.devices.size()) != c.world_size() || p.devices[static_cast<size_t>(c.rank())].device != c.rank())
      raise(ErrorKind::InvalidPlan, "executor: plan has no program for rank " + std::to_string(c.rank()));
    return p.devices[static_cast<size_t>(c.rank())];
  }

  int64_t per_row(DataKind kind) const {
    switch (kind) {
      case DataKind::Q: case DataKind::O: case DataKind::dO: case DataKind::dQ: return int64_t{qpg} * dim;
      case DataKind::KV: case DataKind::dKV: return int64_t{kvpg} * dim;
      case DataKind::LSE: case DataKind::Delta: return qpg;
    }
    return 0;
  }
  int64_t slot_size(DataKind kind) const { return max_tokens * per_row(kind) * (kv_side(kind) ? 2 : 1); }

  int64_t block_tokens(int32_t token_block) const {
    return plan.table.token_blocks[static_cast<size_t>(token_block)].length;
  }

  View view(const BufRef& ref, DataKind kind, int32_t token_block, int32_t group) const {
    if (ref.space == Space::None || ref.kind != kind)
      raise(ErrorKind::InvalidPlan, std::string("executor: operand of kind ") + to_string(kind) + " is missing or mistyped");
    View v;
    v.rows = block_tokens(token_block);
    v.row_floats = per_row(kind);
    if (ref.space == Space::Slot) {
      const auto k = static_cast<size_t>(kind);
      float* base = (*slots)[k] + ref.index * slot_floats[k];
      v.p = base;
      v.ld = v.row_floats;
      if (kv_side(kind)) v.p2 = base + max_tokens * v.row_floats;
      return v;
    }
    const auto pos = static_cast<size_t>(ref.index);
    if (dev.owned_blocks.at(pos) != token_block)
      raise(ErrorKind::InvalidPlan, "executor: local operand names owned block " + std::to_string(ref.index) +
                                        ", which is not token block " + std::to_string(token_block));
    const int64_t row0 = dev.owned_token_offset[pos];
    const AttentionShape& s = plan.header.shape;
    const int64_t q_ld = int64_t{s.q_heads} * dim;
    const int64_t kv_ld = int64_t{s.kv_heads} * dim;
    LocalTensors& t = *local;
    switch (kind) {
      case DataKind::Q: v.p = t.q.data() + row0 * q_ld + int64_t{group} * qpg * dim; v.ld = q_ld; break;
      case DataKind::O: v.p = t.o.data() + row0 * q_ld + int64_t{group} * qpg * dim; v.ld = q_ld; break;
      case DataKind::dO: v.p = t.d_o.data() + row0 * q_ld + int64_t{group} * qpg * dim; v.ld = q_ld; break;
      case DataKind::dQ: v.p = t.dq.data() + row0 * q_ld + int64_t{group} * qpg * dim; v.ld = q_ld; break;
      case DataKind::LSE: v.p = t.lse.data() + row0 * s.q_heads + int64_t{group} * qpg; v.ld = s.q_heads; break;
      case DataKind::Delta: v.p = t.delta.data() + row0 * s.q_heads + int64_t{group} * qpg; v.ld = s.q_heads; break;
      case DataKind::KV:
        v.p = t.k.data() + row0 * kv_ld + int64_t{group} * kvpg * dim;
        v.p2 = t.v.data() + row0 * kv_ld + int64_t{group} * kvpg * dim;
        v.ld = kv_ld;
        break;
      case DataKind::dKV:
        v.p = t.dk.data() + row0 * kv_ld + int64_t{group} * kvpg * dim;
        v.p2 = t.dv.data() + row0 * kv_ld + int64_t{group} * kvpg * dim;
        v.ld = kv_ld;
        break;
    }
    return v;
  }

  // Dense copies of a view (pack) and back (unpack), in the message layout [part][rows][row].
  void pack(const View& v, float* dst) {
    backend.copy_rows(dst, v.row_floats, v.p, v.ld, v.rows, v.row_floats);
    if (v.p2) backend.copy_rows(dst + v.rows * v.row_floats, v.row_floats, v.p2, v.ld, v.rows, v.row_floats);
  }
  void unpack(const float* src, const View& v) {
    backend.copy_rows(v.p, v.ld, src, v.row_floats, v.rows, v.row_floats);
    if (v.p2) backend.copy_rows(v.p2, v.ld, src + v.rows * v.row_floats, v.row_floats, v.rows, v.row_floats);
  }

  const cpu::TileMaskView tile_mask(int32_t tile_index) {
    const Tile& tile = plan.table.tiles[static_cast<size_t>(tile_index)];
    cpu::TileMaskView m;
    m.kind = tile.kind;
    if (tile.kind != TileKind::Partial) return m;
    auto it = tile_rows.find(tile_index);
    if (it == tile_rows.end()) {
      const TokenBlock& qb = plan.table.token_blocks[static_cast<size_t>(tile.q_block)];
      const TokenBlock& kb = plan.table.token_blocks[static_cast<size_t>(tile.kv_block)];
      std::vector<int64_t> offsets{0};
      std::vector<Range> ranges, row;
      for (int64_t r = 0; r < qb.length; ++r) {
        plan.table.tile_row_ranges(tile, qb.begin + r, row);  // sequence coordinates
        for (const Range& g : row) ranges.push_back({g.begin - kb.begin, g.end - kb.begin});
        offsets.push_back(static_cast<int64_t>(ranges.size()));
      }
      it = tile_rows.emplace(tile_index, std::make_pair(std::move(offsets), std::move(ranges))).first;
    }
    m.row_offsets = it->second.first;
    m.ranges = it->second.second;
    return m;
  }

  void attend(const Attend& a, Pass pass) {
    const auto t0 = Clock::now();
    for (const TileOp& op : a.tiles) {
      const Tile& tile = plan.table.tiles[static_cast<size_t>(op.tile)];
      const int32_t set = plan.table.groups.kv_set(tile.head_group);
      const View q = view(op.q, DataKind::Q, tile.q_block, tile.head_group);
      const View kv = view(op.kv, DataKind::KV, tile.kv_block, set);
      if (pass == Pass::Forward) {
        const View o = view(op.out, DataKind::O, tile.q_block, tile.head_group);
        const View lse = view(op.out_lse, DataKind::LSE, tile.q_block, tile.head_group);
        cpu::ForwardTile f;
        f.num_q = q.rows;
        f.num_kv = kv.rows;
        f.mask = tile_mask(op.tile);
        f.q = q.p;
        f.k = kv.p;
        f.v = kv.p2;
        f.o = o.p;
        f.lse = lse.p;
        f.ld = cpu::RowStrides{.q = q.ld, .kv = kv.ld, .o = o.ld, .lse = lse.ld};
        f.accumulate = op.accumulate_q;
        backend.attend_forward(heads, {&f, 1});
        continue;
      }
      const View d_o = view(op.d_o, DataKind::dO, tile.q_block, tile.head_group);
      const View lse = view(op.lse_in, DataKind::LSE, tile.q_block, tile.head_group);
      const View delta = view(op.delta, DataKind::Delta, tile.q_block, tile.head_group);
      const View dq = view(op.out, DataKind::dQ, tile.q_block, tile.head_group);
      const View dkv = view(op.out_kv, DataKind::dKV, tile.kv_block, set);
      if (!op.accumulate_q) zero(dq);
      if (!op.accumulate_kv) zero(dkv);
      cpu::BackwardTile b;
      b.num_q = q.rows;
      b.num_kv = kv.rows;
      b.mask = tile_mask(op.tile);
      b.q = q.p;
      b.k = kv.p;
      b.v = kv.p2;
      b.d_o = d_o.p;
      b.lse = lse.p;
      b.delta = delta.p;
      b.dq = dq.p;
      b.dk = dkv.p;
      b.dv = dkv.p2;
      b.ld = cpu::RowStrides{.q = q.ld, .kv = kv.ld, .o = 0, .lse = lse.ld, .d_o = d_o.ld, .delta = delta.ld,
                             .dq = dq.ld, .dkv = dkv.ld};
      backend.attend_backward(heads, {&b, 1});
    }
    stats.attend_s += seconds_since(t0);
  }

  void zero(const View& v) {
    for (float* p : {v.p, v.p2}) {
      if (!p) continue;
      if (v.ld == v.row_floats) {
        backend.fill(p, v.rows * v.row_floats, 0.0f);
      } else {
        for (int64_t r = 0; r < v.rows; ++r) backend.fill(p + r * v.ld, v.row_floats, 0.0f);
      }
    }
  }

  void merge(const Merge& m) {
    const auto t0 = Clock::now();
    const auto slot_ref = [&](DataKind kind, int32_t slot) { return BufRef{Space::Slot, kind, slot}; };
    const View dst = view(m.dst, m.kind, m.token_block, m.group);
    const int64_t n = dst.rows * dst.row_floats;  // per part
    if (m.kind == DataKind::O) {
      const View dst_lse = view(m.dst_lse, DataKind::LSE, m.token_block, m.group);
      if (m.src_lse_slots.size() != m.src_slots.size())
        raise(ErrorKind::InvalidPlan, "executor: merge of O with " + std::to_string(m.src_slots.size()) +
                                          " partials but " + std::to_string(m.src_lse_slots.size()) + " LSE slots");
      std::vector<float> o_acc(static_cast<size_t>(n)), lse_acc(static_cast<size_t>(dst_lse.rows * qpg));
      std::vector<float> dst_o, dst_l;
      std::vector<cpu::PartialView> parts;
      if (m.accumulate) {
        dst_o.resize(o_acc.size());
        dst_l.resize(lse_acc.size());
        backend.copy_rows(dst_o.data(), dst.row_floats, dst.p, dst.ld, dst.rows, dst.row_floats);
        backend.copy_rows(dst_l.data(), qpg, dst_lse.p, dst_lse.ld, dst_lse.rows, qpg);
        parts.push_back({dst_o.data(), dst_l.data()});
      }
      for (size_t i = 0; i < m.src_slots.size(); ++i) {
        const View o = view(slot_ref(DataKind::O, m.src_slots[i]), DataKind::O, m.token_block, m.group);
        const View l = view(slot_ref(DataKind::LSE, m.src_lse_slots[i]), DataKind::LSE, m.token_block, m.group);
        parts.push_back({o.p, l.p});  // slots are dense: rows x qpg rows of head_dim
      }
      backend.merge_partials(parts, o_acc.data(), lse_acc.data(), dst.rows * qpg, dim);
      backend.copy_rows(dst.p, dst.ld, o_acc.data(), dst.row_floats, dst.rows, dst.row_floats);
      backend.copy_rows(dst_lse.p, dst_lse.ld, lse_acc.data(), qpg, dst_lse.rows, qpg);
    } else {
      std::vector<float> acc(static_cast<size_t>(dst.floats()), 0.0f);
      if (m.accumulate) pack(dst, acc.data());
      std::vector<float> tmp(acc.size());
      for (int32_t s : m.src_slots) {
        const View src = view(slot_ref(m.kind, s), m.kind, m.token_block, m.group);
        pack(src, tmp.data());
        backend.sum_into(acc.data(), tmp.data(), static_cast<int64_t>(acc.size()));
      }
      unpack(acc.data(), dst);
    }
    stats.merge_s += seconds_since(t0);
  }

  void copy(const Copy& c) {
    const View src = view(c.src, c.kind, c.token_block, c.group);
    const View dst = view(c.dst, c.kind, c.token_block, c.group);
    std::vector<float> tmp(static_cast<size_t>(src.floats()));
    pack(src, tmp.data());
    unpack(tmp.data(), dst);
  }

  void comm_start(const CommStart& s) {
    Pending& pending = rounds[s.id];
    std::vector<CommOp> ops;
    pending.buffers.reserve(s.ops.size());
    for (const Transfer& t : s.ops) {
      const View v = view(t.buf, t.kind, t.token_block, t.group);
      pending.buffers.emplace_back(static_cast<size_t>(v.floats()));
      std::vector<float>& buf = pending.buffers.back();
      if (t.send) pack(v, buf.data());
      else pending.unpack.emplace_back(v, pending.buffers.size() - 1);
      ops.push_back(CommOp{t.peer, t.send, buf.data(), static_cast<int64_t>(buf.size() * sizeof(float))});
    }
    comm.start(s.id, ops);
  }

  void comm_wait(const CommWait& w) {
    const auto t0 = Clock::now();
    comm.wait(w.id, options.comm_timeout_s);
    stats.comm_wait_s += seconds_since(t0);
    auto it = rounds.find(w.id);
    if (it == rounds.end()) raise(ErrorKind::InvalidPlan, "executor: CommWait(" + std::to_string(w.id) + ") without start");
    for (const auto& [v, index] : it->second.unpack) unpack(it->second.buffers[index].data(), v);
    rounds.erase(it);
  }

  void run(const Program& program, LocalTensors& t) {
    check_sizes(t);
    local = &t;
    slots = program.pass == Pass::Forward ? &slots_fwd : &slots_bwd;
    stats = ExecStats{};
    const auto t0 = Clock::now();
    for (const Instruction& ins : program.code) {
      std::visit(
          [&](const auto& x) {
            using T = std::decay_t<decltype(x)>;
            if constexpr (std::is_same_v<T, Attend>) attend(x, program.pass);
            else if constexpr (std::is_same_v<T, Merge>) merge(x);
            else if constexpr (std::is_same_v<T, Copy>) copy(x);
            else if constexpr (std::is_same_v<T, CommStart>) comm_start(x);
            else comm_wait(x);
          },
          ins);
    }
    stats.total_s = seconds_since(t0);
    local = nullptr;
  }

  void check_sizes(const LocalTensors& t) const {
    const AttentionShape& s = plan.header.shape;
    const int64_t rows = dev.owned_tokens;
    const auto q_size = static_cast<size_t>(rows * s.q_heads * s.head_dim);
    const auto kv_size = static_cast<size_t>(rows * s.kv_heads * s.head_dim);
    const auto l_size = static_cast<size_t>(rows * s.q_heads);
    if (t.rows != rows || t.q.size() != q_size || t.o.size() != q_size || t.d_o.size() != q_size ||
        t.dq.size() != q_size || t.k.size() != kv_size || t.v.size() != kv_size || t.dk.size() != kv_size ||
        t.dv.size() != kv_size || t.lse.size() != l_size || t.delta.size() != l_size)
      raise(ErrorKind::InvalidInput, "executor: local tensors sized for " + std::to_string(t.rows) +
                                         " rows; device " + std::to_string(dev.device) + " owns " +
                                         std::to_string(rows) + " tokens (use LocalTensors::allocate)");
  }
};

LocalTensors LocalTensors::allocate(const AttentionShape& shape, int64_t rows) {
  LocalTensors t;
  t.rows = rows;
  const auto q_size = static_cast<size_t>(rows * shape.q_heads * shape.head_dim);
  const auto kv_size = static_cast<size_t>(rows * shape.kv_heads * shape.head_dim);
  const auto l_size = static_cast<size_t>(rows * shape.q_heads);
  t.q.assign(q_size, 0.0f);
  t.o.assign(q_size, 0.0f);
  t.d_o.assign(q_size, 0.0f);
  t.dq.assign(q_size, 0.0f);
  t.k.assign(kv_size, 0.0f);
  t.v.assign(kv_size, 0.0f);
  t.dk.assign(kv_size, 0.0f);
  t.dv.assign(kv_size, 0.0f);
  t.lse.assign(l_size, kNegInf);
  t.delta.assign(l_size, 0.0f);
  return t;
}

Executor::Executor(const Plan& plan, Backend& backend, Comm& comm, ExecOptions options)
    : impl_(std::make_unique<Impl>(plan, backend, comm, options)) {}

Executor::~Executor() = default;

ExecStats Executor::forward(LocalTensors& t) {
  impl_->run(impl_->dev.fwd, t);
  return impl_->stats;
}

int64_t Executor::slot_bytes_allocated(Pass pass) const {
  const Program& program = pass == Pass::Forward ? impl_->dev.fwd : impl_->dev.bwd;
  int64_t bytes = 0;
  for (int k = 0; k < kNumDataKinds; ++k)
    bytes += program.num_slots[static_cast<size_t>(k)] * impl_->slot_floats[static_cast<size_t>(k)] *
             static_cast<int64_t>(sizeof(float));
  return bytes;
}

ExecStats Executor::backward(LocalTensors& t) {
  impl_->check_sizes(t);
  const AttentionShape& s = impl_->plan.header.shape;
  impl_->backend.compute_delta(t.d_o.data(), t.o.data(), t.rows, s.q_heads, s.head_dim, t.delta.data());
  impl_->run(impl_->dev.bwd, t);
  return impl_->stats;
}

}  // namespace dcp
