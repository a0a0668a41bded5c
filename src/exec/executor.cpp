// Executor: interprets one device's Program (see dcp/executor.h and dcp/plan.h) over the arrays
// it allocated through the backend. Every operand resolves to rows of one array, so backends
// see row numbers, never plan structures.
#include "dcp/executor.h"

#include <atomic>
#include <cmath>
#include <chrono>
#include <limits>
#include <map>
#include <string>
#include <variant>

#include "dcp/detail/comm_order.h"
#include "dcp/error.h"
#include "dcp/limits.h"
#include "exec/merge_batches.h"

namespace dcp {
namespace {

using Clock = std::chrono::steady_clock;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

bool kv_side(DataKind k) { return k == DataKind::KV || k == DataKind::dKV; }

// The array holding `kind` (KV-side kinds: the first part; the second is the next array).
Array array_of(DataKind kind) {
  switch (kind) {
    case DataKind::Q: return Array::Q;
    case DataKind::KV: return Array::K;
    case DataKind::O: return Array::O;
    case DataKind::LSE: return Array::LSE;
    case DataKind::dO: return Array::dO;
    case DataKind::dQ: return Array::dQ;
    case DataKind::dKV: return Array::dK;
    case DataKind::Delta: return Array::Delta;
  }
  return Array::Q;
}
Array second_array(DataKind kind) { return kind == DataKind::KV ? Array::V : Array::dV; }

DataKind kind_of(Array a) {
  switch (a) {
    case Array::Q: return DataKind::Q;
    case Array::K: case Array::V: return DataKind::KV;
    case Array::O: return DataKind::O;
    case Array::LSE: return DataKind::LSE;
    case Array::dO: return DataKind::dO;
    case Array::Delta: return DataKind::Delta;
    case Array::dQ: return DataKind::dQ;
    case Array::dK: case Array::dV: return DataKind::dKV;
  }
  return DataKind::Q;
}

// Keys: executor serial (bits 44..63), layer (33..43), pass (32), instruction (0..31).
constexpr uint64_t kExecutorKeyMask = ~((uint64_t{1} << 44) - 1);
uint64_t next_executor_serial() {
  static std::atomic<uint64_t> serial{1};
  return serial.fetch_add(1) << 44;
}
uint64_t call_key(uint64_t executor, int layer, Pass pass, size_t instruction) {
  return executor | (static_cast<uint64_t>(layer) << 33) | (static_cast<uint64_t>(pass == Pass::Backward) << 32) |
         static_cast<uint64_t>(instruction);
}

}  // namespace

const char* to_string(ElemType t) { return t == ElemType::F32 ? "fp32" : "bf16"; }

TensorView TensorView::resolved() const {
  TensorView v = *this;
  if (v.head_stride == 0) v.head_stride = head_dim;
  if (v.row_stride == 0) v.row_stride = heads * v.head_stride;
  return v;
}

void ExecOptions::validate() const {
  if (!(comm_timeout_s > 0) || !std::isfinite(comm_timeout_s))
    raise(ErrorKind::InvalidInput, "exec options: comm_timeout_s must be a positive number of seconds (got " +
                                       std::to_string(comm_timeout_s) + ")");
  if (num_layers < 1 || num_layers > 2000)
    raise(ErrorKind::InvalidInput, "exec options: num_layers must be in [1, 2000] (got " + std::to_string(num_layers) + ")");
}

const char* to_string(Array a) {
  static const char* names[] = {"Q", "K", "V", "O", "LSE", "dO", "Delta", "dQ", "dK", "dV"};
  return names[static_cast<size_t>(a)];
}

template <typename T>
const char* instruction_name() {
  if constexpr (std::is_same_v<T, Attend>) return "Attend";
  else if constexpr (std::is_same_v<T, Merge>) return "Merge";
  else if constexpr (std::is_same_v<T, Copy>) return "Copy";
  else if constexpr (std::is_same_v<T, CommStart>) return "CommStart";
  else return "CommWait";
}

// Synchronous backends: a marker is the host clock when the instruction boundary is reached.
void Backend::mark(int index) {
  if (index < 0) return;
  if (static_cast<size_t>(index) >= host_marks_.size()) host_marks_.resize(static_cast<size_t>(index) + 1);
  host_marks_[static_cast<size_t>(index)] = std::chrono::steady_clock::now();
}

void Backend::merge_batch(const ArraySet& arrays, const MergeBatchCall& batch) {
  for (const MergeCall& call : batch.calls) merge(arrays, call);
}

std::vector<double> Backend::marker_seconds(int count) {
  std::vector<double> out(static_cast<size_t>(std::max(0, count)), 0.0);
  for (int i = 0; i < count && static_cast<size_t>(i) < host_marks_.size(); ++i)
    out[static_cast<size_t>(i)] = std::chrono::duration<double>(host_marks_[static_cast<size_t>(i)] - host_marks_[0]).count();
  return out;
}

struct Executor::Impl {
  const Plan& plan;
  Backend& backend;
  Comm& comm;
  ExecOptions options;
  const DeviceProgram& dev;
  int qpg = 0, kvpg = 0, dim = 0;
  int num_groups = 0, num_sets = 0;
  int64_t max_tokens = 0, local_rows = 0;
  ArraySet arrays;
  void* block = nullptr;  // every array, one allocation
  int64_t block_bytes = 0;
  // Per array: first row of the forward and backward slot regions.
  std::array<int64_t, kNumArrays> slot_row_fwd{}, slot_row_bwd{};
  // Resolved Attend instructions, per key: tiles and Partial masks.
  struct Resolved {
    std::vector<AttendTile> tiles;
    std::vector<int64_t> row_offsets;
    std::vector<Range> ranges;
  };
  std::map<uint64_t, Resolved> attends;
  // Resolved Merge instructions, per key of a run's first instruction: a batch of consecutive
  // independent merges (or one merge without ExecOptions::batch_merges).
  struct MergeRun {
    std::vector<MergeCall> calls;
    std::vector<int64_t> rows;  // the calls' src and src_lse rows (their spans point here)
  };
  std::map<uint64_t, MergeRun> merge_runs;
  std::map<int32_t, std::vector<CommOp>> round_ops;  // reused vectors: no steady-state growth
  // Per pass (fwd, bwd), analysed once: what each CommStart waits for (comm_order.h).
  std::array<CommOrder, 2> comm_orders{comm_order(dev.fwd), comm_order(dev.bwd)};
  bool bwd_dq_in_place = dq_in_place(dev.bwd);  // BackwardRows::dq_in_place
  ExecStats stats;
  // Per pass: what the timeline markers 2e, 2e + 1 of entry e measured.
  struct TimelineEntry {
    int index = 0;
    int num_instructions = 1;
    const char* kind = "";
  };
  std::array<std::vector<TimelineEntry>, 2> timeline_entries;
  int layer = 0;
  Pass pass = Pass::Forward;
  int rounds_in_flight = 0;  // started and not yet waited for (AttendCall::comm_in_flight)
  uint64_t serial = next_executor_serial();

  ~Impl() {
    try {
      // Nothing in flight may touch the arrays once they are returned, unless the memory comes
      // back in stream order anyway.
      if (!backend.stream_ordered_memory()) backend.synchronize();
      backend.forget(serial, kExecutorKeyMask);
      backend.deallocate(block);
    } catch (...) {  // a failed device keeps its memory; destructors never throw
    }
  }

  Impl(const Plan& p, Backend& b, Comm& c, ExecOptions o)
      : plan(p), backend(b), comm(c), options(o), dev(checked_device(p, c)) {
    options.validate();
    if (b.host_memory() != c.host_memory())
      raise(ErrorKind::InvalidInput, "executor: backend " + b.name() + " keeps " +
                                         (b.host_memory() ? "host" : "device") + " memory but comm " + c.name() +
                                         " moves " + (c.host_memory() ? "host" : "device") + " buffers");
    const HeadGroups& g = plan.table.groups;
    qpg = g.q_heads_per_group;
    kvpg = g.kv_heads_per_group;
    num_groups = g.num_groups;
    num_sets = g.num_kv_sets();
    dim = plan.header.shape.head_dim;
    max_tokens = plan.header.max_block_tokens;
    local_rows = dev.owned_tokens;
    if (qpg < 1 || kvpg < 1 || dim < 1 || qpg % kvpg != 0)
      raise(ErrorKind::InvalidPlan, "executor: head groups of " + std::to_string(qpg) + " q and " + std::to_string(kvpg) +
                                        " kv heads of dim " + std::to_string(dim) + " do not form a GQA layout");
    arrays.q_heads = qpg;
    arrays.kv_heads = kvpg;
    arrays.head_dim = dim;
    comm.bind_stream(backend.compute_stream());
    const ElemType in_type = backend.storage_type();
    for (int i = 0; i < kNumArrays; ++i) {
      const auto a = static_cast<Array>(i);
      const DataKind kind = kind_of(a);
      const auto k = static_cast<size_t>(kind);
      const auto ai = static_cast<size_t>(i);
      arrays.type[ai] = (kind == DataKind::Q || kind == DataKind::KV || kind == DataKind::dO) ? in_type : ElemType::F32;
      arrays.row_elems[ai] = per_row(kind);
      const int64_t parts = kv_side(kind) ? num_sets : num_groups;
      // Plans from files bound these counts (plan_check.h), not their products: check each step.
      const char* what = "executor: array size";
      slot_row_fwd[ai] = checked_mul(checked_mul(options.num_layers, parts, what), local_rows, what);
      slot_row_bwd[ai] = checked_add(slot_row_fwd[ai], checked_mul(dev.fwd.num_slots[k], max_tokens, what), what);
      arrays.rows[ai] = checked_add(slot_row_bwd[ai], checked_mul(dev.bwd.num_slots[k], max_tokens, what), what);
    }
    // One block: each array at a 256-byte boundary (vector loads, TMA and cp.async need 16).
    std::array<int64_t, kNumArrays> offset{};
    for (size_t ai = 0; ai < kNumArrays; ++ai) {
      offset[ai] = block_bytes;
      const int64_t bytes = arrays.rows[ai] * arrays.row_elems[ai] * elem_bytes(arrays.type[ai]);
      block_bytes += (std::max<int64_t>(16, bytes) + 255) / 256 * 256;
    }
    block = backend.allocate(block_bytes);
    for (size_t ai = 0; ai < kNumArrays; ++ai) arrays.base[ai] = static_cast<char*>(block) + offset[ai];
    // Our slots are the plan's whenever our element type is the batch's (the planner's memory
    // figure is ours).
    const bool same_type = (plan.header.shape.dtype == DType::FP32) == (in_type == ElemType::F32);
    for (int k = 0; same_type && k < kNumDataKinds; ++k) {
      const auto kind = static_cast<DataKind>(k);
      const int64_t mine = slot_block_bytes(kind);
      if (mine != slot_bytes(plan.table, kind))
        raise(ErrorKind::InvalidPlan, std::string("executor: slot of ") + to_string(kind) + " is " +
                                          std::to_string(slot_bytes(plan.table, kind)) + " bytes in the plan, " +
                                          std::to_string(mine) + " here");
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
  int64_t slot_block_bytes(DataKind kind) const {
    const auto a = static_cast<size_t>(array_of(kind));
    return max_tokens * arrays.row_elems[a] * elem_bytes(arrays.type[a]) * (kv_side(kind) ? 2 : 1);
  }

  int64_t block_tokens(int32_t token_block) const {
    return plan.table.token_blocks[static_cast<size_t>(token_block)].length;
  }

  // First row (in the kind's array) of operand `ref` holding (token_block, group).
  int64_t row_of(const BufRef& ref, DataKind kind, int32_t token_block, int32_t group) const {
    if (ref.space == Space::None || ref.kind != kind)
      raise(ErrorKind::InvalidPlan, std::string("executor: operand of kind ") + to_string(kind) + " is missing or mistyped");
    const auto a = static_cast<size_t>(array_of(kind));
    if (ref.space == Space::Slot)
      return (pass == Pass::Forward ? slot_row_fwd[a] : slot_row_bwd[a]) + int64_t{ref.index} * max_tokens;
    const auto pos = static_cast<size_t>(ref.index);
    if (dev.owned_blocks.at(pos) != token_block)
      raise(ErrorKind::InvalidPlan, "executor: local operand names owned block " + std::to_string(ref.index) +
                                        ", which is not token block " + std::to_string(token_block));
    return local_row(kind, group) + dev.owned_token_offset[pos];
  }
  // Every operand the executor hands out lies inside its array (backends trust the rows).
  void check_rows(DataKind kind, int64_t row, int64_t rows, const char* what) const {
    const auto a = static_cast<size_t>(array_of(kind));
    if (row < 0 || rows < 0 || row + rows > arrays.rows[a])
      raise(ErrorKind::InvalidPlan, std::string("executor: ") + what + " rows [" + std::to_string(row) + ", " +
                                        std::to_string(row + rows) + ") outside array " + to_string(array_of(kind)) +
                                        " of " + std::to_string(arrays.rows[a]) + " rows");
  }
  int64_t local_row(DataKind kind, int32_t group) const {
    const int64_t parts = kv_side(kind) ? num_sets : num_groups;
    return (int64_t{layer} * parts + group) * local_rows;
  }

  void check_layer(int at_layer) const {
    if (at_layer < 0 || at_layer >= options.num_layers)
      raise(ErrorKind::InvalidInput, "executor: layer " + std::to_string(at_layer) + " outside [0, " +
                                         std::to_string(options.num_layers) + ")");
  }

  // The layer's own K, V, dO, Delta and dQ rows (all of them on one device).
  BackwardRows backward_rows() const {
    BackwardRows rows;
    rows.kv_row = local_row(DataKind::KV, 0);
    rows.kv_rows = int64_t{num_sets} * local_rows;
    rows.dout_row = local_row(DataKind::dO, 0);
    rows.delta_row = local_row(DataKind::Delta, 0);
    rows.dq_row = local_row(DataKind::dQ, 0);
    rows.rows = int64_t{num_groups} * local_rows;
    rows.one_device = plan.devices.size() == 1;
    rows.dq_in_place = bwd_dq_in_place;
    return rows;
  }
  // Every dQ contribution of the program lands in its q block's own dQ rows (BackwardRows).
  static bool dq_in_place(const Program& program) {
    for (const Instruction& ins : program.code) {
      if (const auto* a = std::get_if<Attend>(&ins)) {
        for (const TileOp& op : a->tiles)
          if (op.out.space != Space::Local || op.d_o.space != Space::Local || op.out.index != op.d_o.index) return false;
      } else if (const auto* m = std::get_if<Merge>(&ins)) {
        // The empty merge of an owned block that nothing contributed to writes zeros, which are
        // zeros as counts too.
        if (m->kind == DataKind::dQ && (m->accumulate || !m->src_slots.empty())) return false;
      } else if (const auto* c = std::get_if<Copy>(&ins)) {
        if (c->kind == DataKind::dQ) return false;
      }
    }
    return true;
  }
  void begin_backward(int at_layer) {
    check_layer(at_layer);
    layer = at_layer;
    backend.begin_backward(arrays, backward_rows());
  }
  void end_backward() { backend.end_backward(arrays, backward_rows()); }

  const Resolved& resolve(const Attend& a, uint64_t key) {
    auto it = attends.find(key);
    if (it != attends.end()) return it->second;
    Resolved r;
    std::vector<Range> row;
    // A Partial tile's mask rows depend on its blocks only: head groups share one copy, made
    // where the blocks first appear. The rows are sized once (a row has a range or two in the
    // named masks): growing them by doubling touched about twice their memory, page by page, in
    // the step's first attention call.
    std::map<std::pair<int32_t, int32_t>, std::pair<int64_t, int64_t>> masks;  // -> (mask, ranges_begin); -1: not made yet
    int64_t mask_rows = 0;
    for (const TileOp& op : a.tiles) {
      const Tile& tile = plan.table.tiles[static_cast<size_t>(op.tile)];
      if (tile.kind == TileKind::Partial && masks.try_emplace({tile.q_block, tile.kv_block}, -1, -1).second)
        mask_rows += block_tokens(tile.q_block) + 1;
    }
    r.row_offsets.reserve(static_cast<size_t>(mask_rows));
    r.ranges.reserve(static_cast<size_t>(2 * mask_rows));
    r.tiles.reserve(a.tiles.size());
    for (const TileOp& op : a.tiles) {
      const Tile& tile = plan.table.tiles[static_cast<size_t>(op.tile)];
      const int32_t set = plan.table.groups.kv_set(tile.head_group);
      AttendTile t;
      t.tile = op.tile;
      t.kind = tile.kind;
      t.num_q = block_tokens(tile.q_block);
      t.num_kv = block_tokens(tile.kv_block);
      t.q = row_of(op.q, DataKind::Q, tile.q_block, tile.head_group);
      t.kv = row_of(op.kv, DataKind::KV, tile.kv_block, set);
      t.accumulate_q = op.accumulate_q;
      t.accumulate_kv = op.accumulate_kv;
      if (pass == Pass::Forward) {
        t.o = row_of(op.out, DataKind::O, tile.q_block, tile.head_group);
        t.lse = row_of(op.out_lse, DataKind::LSE, tile.q_block, tile.head_group);
      } else {
        t.d_o = row_of(op.d_o, DataKind::dO, tile.q_block, tile.head_group);
        t.lse_in = row_of(op.lse_in, DataKind::LSE, tile.q_block, tile.head_group);
        t.delta = row_of(op.delta, DataKind::Delta, tile.q_block, tile.head_group);
        t.dq = row_of(op.out, DataKind::dQ, tile.q_block, tile.head_group);
        t.dkv = row_of(op.out_kv, DataKind::dKV, tile.kv_block, set);
      }
      check_rows(DataKind::Q, t.q, t.num_q, "Attend q");
      check_rows(DataKind::KV, t.kv, t.num_kv, "Attend kv");
      if (pass == Pass::Forward) {
        check_rows(DataKind::O, t.o, t.num_q, "Attend out");
        check_rows(DataKind::LSE, t.lse, t.num_q, "Attend out_lse");
      } else {
        check_rows(DataKind::dO, t.d_o, t.num_q, "Attend dO");
        check_rows(DataKind::LSE, t.lse_in, t.num_q, "Attend lse");
        check_rows(DataKind::Delta, t.delta, t.num_q, "Attend delta");
        check_rows(DataKind::dQ, t.dq, t.num_q, "Attend dq");
        check_rows(DataKind::dKV, t.dkv, t.num_kv, "Attend dkv");
      }
      if (tile.kind == TileKind::Partial) {
        auto& [mask, ranges_begin] = masks.at({tile.q_block, tile.kv_block});
        if (mask < 0) {
          const TokenBlock& qb = plan.table.token_blocks[static_cast<size_t>(tile.q_block)];
          const TokenBlock& kb = plan.table.token_blocks[static_cast<size_t>(tile.kv_block)];
          mask = static_cast<int64_t>(r.row_offsets.size());
          ranges_begin = static_cast<int64_t>(r.ranges.size());
          r.row_offsets.push_back(0);
          for (int64_t i = 0; i < qb.length; ++i) {
            plan.table.tile_row_ranges(tile, qb.begin + i, row);  // sequence coordinates
            for (const Range& g : row) r.ranges.push_back({g.begin - kb.begin, g.end - kb.begin});
            r.row_offsets.push_back(static_cast<int64_t>(r.ranges.size()) - ranges_begin);
          }
        }
        t.mask = mask;
        t.ranges_begin = ranges_begin;
      }
      r.tiles.push_back(t);
    }
    return attends.emplace(key, std::move(r)).first->second;
  }

  void attend(const Attend& a, uint64_t key) {
    const auto t0 = Clock::now();
    const Resolved& r = resolve(a, key);
    AttendCall call{pass, key, r.tiles, r.row_offsets, r.ranges};
    call.comm_in_flight = rounds_in_flight > 0;
    backend.attend(arrays, call);
    stats.attend_s += seconds_since(t0);
  }

  // One Merge as rows: the call with its source rows appended to src / src_lse (spans unset).
  MergeCall resolve_merge(const Merge& m, uint64_t key, std::vector<int64_t>& src, std::vector<int64_t>& src_lse) const {
    if (m.kind == DataKind::O && m.src_lse_slots.size() != m.src_slots.size())
      raise(ErrorKind::InvalidPlan, "executor: merge of O with " + std::to_string(m.src_slots.size()) +
                                        " partials but " + std::to_string(m.src_lse_slots.size()) + " LSE slots");
    MergeCall call;
    call.key = key;
    call.kind = m.kind;
    call.num_rows = block_tokens(m.token_block);
    call.accumulate = m.accumulate;
    call.dst = row_of(m.dst, m.kind, m.token_block, m.group);
    check_rows(m.kind, call.dst, call.num_rows, "merge destination");
    if (m.kind == DataKind::O) {
      call.dst_lse = row_of(m.dst_lse, DataKind::LSE, m.token_block, m.group);
      check_rows(DataKind::LSE, call.dst_lse, call.num_rows, "merge LSE destination");
    }
    for (size_t i = 0; i < m.src_slots.size(); ++i) {
      src.push_back(row_of(BufRef{Space::Slot, m.kind, m.src_slots[i]}, m.kind, m.token_block, m.group));
      check_rows(m.kind, src.back(), call.num_rows, "merge source");
      if (m.kind != DataKind::O) continue;
      src_lse.push_back(
          row_of(BufRef{Space::Slot, DataKind::LSE, m.src_lse_slots[i]}, DataKind::LSE, m.token_block, m.group));
      check_rows(DataKind::LSE, src_lse.back(), call.num_rows, "merge LSE source");
    }
    return call;
  }

  // The run of Merge instructions starting at `first`: as many consecutive independent ones as
  // the batcher admits (one without batch_merges). Built on first use, then reused.
  const MergeRun& merge_run(const Program& program, size_t first) {
    const uint64_t run_key = call_key(serial, layer, pass, first);
    if (auto it = merge_runs.find(run_key); it != merge_runs.end()) return it->second;
    MergeRun run;
    std::vector<std::array<size_t, 3>> at;  // per call: offsets of src and src_lse in rows, count
    exec_detail::MergeBatcher batcher;
    std::vector<int64_t> src, src_lse;
    for (size_t i = first; i < program.code.size(); ++i) {
      const auto* m = std::get_if<Merge>(&program.code[i]);
      if (m == nullptr || (!options.batch_merges && !run.calls.empty())) break;
      src.clear();
      src_lse.clear();
      MergeCall call = resolve_merge(*m, call_key(serial, layer, pass, i), src, src_lse);
      call.src = src;
      call.src_lse = src_lse;
      if (!batcher.try_add(call)) break;
      at.push_back({run.rows.size(), run.rows.size() + src.size(), src.size()});
      run.rows.insert(run.rows.end(), src.begin(), src.end());
      run.rows.insert(run.rows.end(), src_lse.begin(), src_lse.end());
      run.calls.push_back(call);
    }
    for (size_t c = 0; c < run.calls.size(); ++c) {
      const auto [s0, l0, n] = at[c];
      MergeCall& call = run.calls[c];
      call.src = std::span<const int64_t>(run.rows.data() + s0, n);
      call.src_lse = std::span<const int64_t>(run.rows.data() + l0, call.kind == DataKind::O ? n : 0);
    }
    return merge_runs.emplace(run_key, std::move(run)).first->second;
  }

  // Returns the number of instructions run (those of the run starting at `first`).
  size_t merge(const Program& program, size_t first) {
    const auto t0 = Clock::now();
    const MergeRun& run = merge_run(program, first);
    if (options.batch_merges) backend.merge_batch(arrays, MergeBatchCall{run.calls.front().key, run.calls});
    else backend.merge(arrays, run.calls.front());
    stats.num_merges += static_cast<int>(run.calls.size());
    ++stats.num_merge_calls;
    stats.merge_s += seconds_since(t0);
    return run.calls.size();
  }

  void copy(const Copy& c) {
    const int64_t src = row_of(c.src, c.kind, c.token_block, c.group);
    const int64_t dst = row_of(c.dst, c.kind, c.token_block, c.group);
    const int64_t rows = block_tokens(c.token_block);
    check_rows(c.kind, src, rows, "copy source");
    check_rows(c.kind, dst, rows, "copy destination");
    backend.copy_rows(arrays, array_of(c.kind), dst, src, rows);
    if (kv_side(c.kind)) backend.copy_rows(arrays, second_array(c.kind), dst, src, rows);
  }

  // A transfer of a KV-side kind is two messages (K then V, or dK then dV) on both ends.
  void comm_start(const CommStart& s, int32_t after) {
    std::vector<CommOp>& ops = round_ops[s.id];
    ops.clear();
    for (const Transfer& t : s.ops) {
      const int64_t row = row_of(t.buf, t.kind, t.token_block, t.group);
      const int64_t rows = block_tokens(t.token_block);
      const Array a = array_of(t.kind);
      const auto ai = static_cast<size_t>(a);
      const int64_t bytes = rows * arrays.row_elems[ai] * elem_bytes(arrays.type[ai]);
      check_rows(t.kind, row, rows, "transfer");
      ops.push_back(CommOp{t.peer, t.send, arrays.at(a, row), bytes});
      if (kv_side(t.kind)) ops.push_back(CommOp{t.peer, t.send, arrays.at(second_array(t.kind), row), bytes});
    }
    comm.start_after(s.id, ops, after);
    ++rounds_in_flight;
  }

  void comm_wait(const CommWait& w) {
    const auto t0 = Clock::now();
    comm.wait(w.id, options.comm_timeout_s);
    --rounds_in_flight;
    stats.comm_wait_s += seconds_since(t0);
  }

  void run(const Program& program, int at_layer) {
    check_layer(at_layer);
    layer = at_layer;
    pass = program.pass;
    const auto t0 = Clock::now();
    const CommOrder& order = comm_orders[program.pass == Pass::Forward ? 0 : 1];
    comm.bind_stream(backend.compute_stream());  // the caller may have moved compute to another stream
    rounds_in_flight = 0;
    comm.note_point(kPassStartPoint);
    // Timeline markers: 2e at the start of timeline entry e, 2e + 1 at its end.
    auto& entries = timeline_entries[pass == Pass::Forward ? 0 : 1];
    entries.clear();
    for (size_t i = 0; i < program.code.size();) {
      const uint64_t key = call_key(serial, layer, pass, i);
      if (options.timeline) backend.mark(static_cast<int>(2 * entries.size()));
      size_t count = 1;
      const char* kind = std::visit(
          [&](const auto& x) {
            using T = std::decay_t<decltype(x)>;
            if constexpr (std::is_same_v<T, Attend>) attend(x, key);
            else if constexpr (std::is_same_v<T, Merge>) count = merge(program, i);
            else if constexpr (std::is_same_v<T, Copy>) copy(x);
            else if constexpr (std::is_same_v<T, CommStart>) comm_start(x, order.after[i]);
            else comm_wait(x);
            return instruction_name<T>();
          },
          program.code[i]);
      // A batch of merges ends where its last instruction does: note every point it covers.
      for (size_t k = i; k < i + count; ++k)
        if (order.mark_after[k] != 0) comm.note_point(static_cast<int32_t>(k));
      if (options.timeline) {
        backend.mark(static_cast<int>(2 * entries.size() + 1));
        entries.push_back({static_cast<int>(i), static_cast<int>(count), kind});
      }
      i += count;
    }
    stats.total_s += seconds_since(t0);
  }

  // Host tensor of all heads <-> group-major rows of one layer.
  void transfer(int at_layer, Array a, std::vector<float>& host, bool up) {
    const DataKind kind = kind_of(a);
    const int64_t parts = kv_side(kind) ? num_sets : num_groups;
    const int64_t width = arrays.row_elems[static_cast<size_t>(a)];
    const int64_t ld = width * parts;
    layer = at_layer;
    for (int32_t g = 0; g < parts; ++g) {
      const int64_t row = local_row(kind, g);
      if (up) backend.upload(arrays, a, row, host.data() + g * width, ld, local_rows);
      else backend.download(arrays, a, row, host.data() + g * width, ld, local_rows);
    }
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
    if (s.q_heads != num_groups * qpg || s.kv_heads != num_sets * kvpg)
      raise(ErrorKind::InvalidPlan, "executor: head groups do not tile the heads");
  }
};

LocalTensors LocalTensors::allocate(const AttentionShape& shape, int64_t rows) {
  LocalTensors t;
  t.rows = rows;
  const char* what = "local tensors";
  if (rows < 0) raise(ErrorKind::InvalidInput, std::string(what) + ": " + std::to_string(rows) + " rows");
  const auto q_size = static_cast<size_t>(checked_mul(checked_mul(rows, shape.q_heads, what), shape.head_dim, what));
  const auto kv_size = static_cast<size_t>(checked_mul(checked_mul(rows, shape.kv_heads, what), shape.head_dim, what));
  const auto l_size = static_cast<size_t>(checked_mul(rows, shape.q_heads, what));
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

void Executor::upload(int layer, const LocalTensors& t, Pass what) {
  impl_->check_sizes(t);
  auto& mt = const_cast<LocalTensors&>(t);  // transfer() only reads when uploading
  for (Array a : {Array::Q, Array::K, Array::V}) {
    std::vector<float>& v = a == Array::Q ? mt.q : a == Array::K ? mt.k : mt.v;
    impl_->transfer(layer, a, v, true);
  }
  if (what == Pass::Backward) {
    impl_->transfer(layer, Array::O, mt.o, true);
    impl_->transfer(layer, Array::LSE, mt.lse, true);
    impl_->transfer(layer, Array::dO, mt.d_o, true);
  }
}

void Executor::download(int layer, LocalTensors& t, Pass what) {
  impl_->check_sizes(t);
  impl_->backend.synchronize();
  if (what == Pass::Forward) {
    impl_->transfer(layer, Array::O, t.o, false);
    impl_->transfer(layer, Array::LSE, t.lse, false);
    return;
  }
  impl_->transfer(layer, Array::Delta, t.delta, false);
  impl_->transfer(layer, Array::dQ, t.dq, false);
  impl_->transfer(layer, Array::dK, t.dk, false);
  impl_->transfer(layer, Array::dV, t.dv, false);
}

void Executor::fill_random_inputs(int layer, uint64_t seed) {
  Impl& m = *impl_;
  m.layer = layer;
  const std::pair<Array, float> inputs[] = {{Array::Q, 2.0f}, {Array::K, 2.0f}, {Array::V, 1.0f}, {Array::dO, 1.0f}};
  for (const auto& [a, amplitude] : inputs) {
    const DataKind kind = kind_of(a);
    const int64_t parts = kv_side(kind) ? m.num_sets : m.num_groups;
    m.backend.fill_random(m.arrays, a, m.local_row(kind, 0), parts * m.local_rows,
                          seed * 16 + static_cast<uint64_t>(a) + static_cast<uint64_t>(layer) * 1024, amplitude);
  }
}

ExecStats Executor::forward_layer(int layer) {
  impl_->stats = ExecStats{};
  impl_->run(impl_->dev.fwd, layer);
  return impl_->stats;
}

ExecStats Executor::backward_layer(int layer) {
  impl_->stats = ExecStats{};
  Impl& m = *impl_;
  if (layer < 0 || layer >= m.options.num_layers)
    raise(ErrorKind::InvalidInput, "executor: layer " + std::to_string(layer) + " outside [0, " +
                                       std::to_string(m.options.num_layers) + ")");
  m.layer = layer;
  m.backend.compute_delta(m.arrays, m.local_row(DataKind::dO, 0), m.local_row(DataKind::O, 0),
                          m.local_row(DataKind::Delta, 0), int64_t{m.num_groups} * m.local_rows);
  m.begin_backward(layer);
  m.run(m.dev.bwd, layer);
  m.end_backward();
  return m.stats;
}

ExecStats Executor::backward_layer_with_delta(int layer) {
  impl_->stats = ExecStats{};
  impl_->begin_backward(layer);
  impl_->run(impl_->dev.bwd, layer);
  impl_->end_backward();
  return impl_->stats;
}

void Executor::prepare() {
  Impl& m = *impl_;
  std::vector<AttendCall> attends;
  std::vector<MergeBatchCall> merges;
  m.layer = 0;
  for (const Program* program : {&m.dev.fwd, &m.dev.bwd}) {
    m.pass = program->pass;
    for (size_t i = 0; i < program->code.size();) {
      const uint64_t key = call_key(m.serial, 0, m.pass, i);
      if (const auto* a = std::get_if<Attend>(&program->code[i])) {
        const Impl::Resolved& r = m.resolve(*a, key);
        attends.push_back(AttendCall{m.pass, key, r.tiles, r.row_offsets, r.ranges});
      } else if (std::holds_alternative<Merge>(program->code[i])) {
        const Impl::MergeRun& run = m.merge_run(*program, i);
        if (m.options.batch_merges) merges.push_back(MergeBatchCall{run.calls.front().key, run.calls});
        else merges.push_back(MergeBatchCall{run.calls.front().key, std::span<const MergeCall>(run.calls.data(), 1)});
        i += run.calls.size();
        continue;
      }
      ++i;
    }
  }
  m.backend.prepare(m.arrays, attends, merges);
}

void Executor::exchange(int layer, std::span<const std::pair<Array, TensorView>> imports,
                        std::span<const std::pair<Array, TensorView>> exports) {
  Impl& m = *impl_;
  if (layer < 0 || layer >= m.options.num_layers)
    raise(ErrorKind::InvalidInput, "executor: layer " + std::to_string(layer) + " outside [0, " +
                                       std::to_string(m.options.num_layers) + ")");
  m.layer = layer;
  std::vector<LocalExchange> moves;
  for (const bool import : {true, false}) {
    for (const auto& [array, view] : import ? imports : exports) {
      const DataKind kind = kind_of(array);
      const int64_t per_group = array == Array::LSE || array == Array::Delta ? m.qpg
                                : kv_side(kind)                             ? m.kvpg
                                                                            : m.qpg;
      const int groups = kv_side(kind) ? m.num_sets : m.num_groups;
      const int64_t want_dim = array == Array::LSE || array == Array::Delta ? 1 : m.dim;
      if (view.data == nullptr || view.rows != m.local_rows || view.heads != per_group * groups ||
          view.head_dim != want_dim)
        raise(ErrorKind::InvalidInput, std::string("executor: tensor for ") + to_string(array) + " is [" +
                                           std::to_string(view.rows) + ", " + std::to_string(view.heads) + ", " +
                                           std::to_string(view.head_dim) + "], expected [" +
                                           std::to_string(m.local_rows) + ", " + std::to_string(per_group * groups) +
                                           ", " + std::to_string(want_dim) + "]" +
                                           (view.data == nullptr ? " (null data)" : ""));
      moves.push_back(LocalExchange{array, import, m.local_row(kind, 0), m.local_rows, groups, view.resolved()});
    }
  }
  m.backend.exchange(m.arrays, moves);
}

void Executor::delta_from(int layer, const TensorView& d_o, const TensorView& o, const TensorView* d_lse) {
  Impl& m = *impl_;
  if (layer < 0 || layer >= m.options.num_layers)
    raise(ErrorKind::InvalidInput, "executor: layer " + std::to_string(layer) + " outside [0, " +
                                       std::to_string(m.options.num_layers) + ")");
  m.layer = layer;
  for (const TensorView* v : {&d_o, &o})
    if (v->data == nullptr || v->rows != m.local_rows || v->heads != int64_t{m.qpg} * m.num_groups || v->head_dim != m.dim)
      raise(ErrorKind::InvalidInput, std::string("executor: ") + (v == &d_o ? "dO" : "O") + " for Delta is [" +
                                         std::to_string(v->rows) + ", " + std::to_string(v->heads) + ", " +
                                         std::to_string(v->head_dim) + "], expected [" + std::to_string(m.local_rows) +
                                         ", " + std::to_string(m.qpg * m.num_groups) + ", " + std::to_string(m.dim) + "]");
  if (d_lse != nullptr && (d_lse->data == nullptr || d_lse->rows != m.local_rows ||
                          d_lse->heads != int64_t{m.qpg} * m.num_groups || d_lse->head_dim != 1 ||
                          d_lse->type != ElemType::F32))
    raise(ErrorKind::InvalidInput, "executor: d_lse for Delta is [" + std::to_string(d_lse->rows) + ", " +
                                       std::to_string(d_lse->heads) + ", " + std::to_string(d_lse->head_dim) + "] " +
                                       to_string(d_lse->type) + ", expected [" + std::to_string(m.local_rows) + ", " +
                                       std::to_string(m.qpg * m.num_groups) + ", 1] f32");
  const TensorView d_lse_resolved = d_lse != nullptr ? d_lse->resolved() : TensorView{};
  m.backend.delta_from(m.arrays, m.local_row(DataKind::Delta, 0), m.local_rows, m.num_groups, d_o.resolved(),
                       o.resolved(), d_lse != nullptr ? &d_lse_resolved : nullptr);
}

int64_t Executor::local_rows() const { return impl_->local_rows; }
int64_t Executor::bytes_allocated() const { return impl_->block_bytes; }

const ArraySet& Executor::arrays() const { return impl_->arrays; }

std::vector<MeasuredInstruction> Executor::timeline(Pass pass) const {
  std::vector<MeasuredInstruction> out;
  if (!impl_->options.timeline) return out;
  // Markers are per backend, reused by each pass: only the pass run last can be read back.
  if (pass != impl_->pass) return out;
  const auto& entries = impl_->timeline_entries[pass == Pass::Forward ? 0 : 1];
  const std::vector<double> t = impl_->backend.marker_seconds(static_cast<int>(2 * entries.size()));
  for (size_t e = 0; e < entries.size(); ++e)
    out.push_back({pass, entries[e].index, entries[e].kind, t[2 * e], t[2 * e + 1], entries[e].num_instructions});
  return out;
}

ExecStats Executor::forward(LocalTensors& t) {
  upload(0, t, Pass::Forward);
  ExecStats s = forward_layer(0);
  download(0, t, Pass::Forward);
  return s;
}

ExecStats Executor::backward(LocalTensors& t) {
  upload(0, t, Pass::Backward);
  ExecStats s = backward_layer(0);
  download(0, t, Pass::Backward);
  return s;
}

int64_t Executor::slot_bytes_allocated(Pass pass) const {
  const Program& program = pass == Pass::Forward ? impl_->dev.fwd : impl_->dev.bwd;
  int64_t bytes = 0;
  for (int k = 0; k < kNumDataKinds; ++k)
    bytes += program.num_slots[static_cast<size_t>(k)] * impl_->slot_block_bytes(static_cast<DataKind>(k));
  return bytes;
}

}  // namespace dcp
