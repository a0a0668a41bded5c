// dcp/plan.h — what every device executes: one forward and one backward Program per device,
// plus everything an executor needs to run them (block table, token-block homes, shapes).
//
// Buffers. A device holds two kinds of storage:
//   * Local tensors: the tokens it owns, in dispatch order (owned_blocks, ascending global
//     token block id), all heads: Q, KV (K and V), dO in the batch dtype; O, dQ, dKV, LSE and
//     Delta in fp32 (the outputs accumulate there: see Attend and Merge), each laid out
//     [owned tokens, heads, ...]. A Local BufRef names an owned
//     token block by its position p in owned_blocks; its token offset is owned_token_offset[p];
//     the head group (or KV set) comes from the instruction (tile or Merge).
//   * Slot arrays, one per DataKind: num_slots[kind] slots of slot_bytes(table, kind) each.
//     A slot holds one data block (one token block x one head group, or one KV set for KV-side
//     kinds). Slot size = max block tokens x per-head-group bytes of the kind, so any block fits
//     (a short last block uses a prefix). Slots of O, dQ and dKV hold fp32 partials; LSE slots
//     hold fp32 partial LSE (forward) or a copy of the final LSE (backward); Q, KV, dO are in
//     the batch dtype, Delta in fp32. Slots are reused once their content is dead (liveness),
//     and slot_uses records every residency so executors and the validator can check contents.
//
// Semantics of the instructions (executed in order on the device's compute stream; CommStart
// and CommWait drive its communication):
//   Attend  : for each TileOp, attention of one tile. Forward: reads q, kv; writes out (O
//             partial, fp32) and out_lse: a slot, or with outputs_in_place the local tensors
//             of an owned q block (its partials accumulate there). If accumulate_q, out/out_lse already hold partials of
//             the same (q block, head group) and the tile is merged into them (online softmax);
//             otherwise they are overwritten. Backward: reads q, kv, d_o, lse_in, delta; adds
//             into (or, without accumulate, overwrites) out (dQ partial) and out_kv (dKV
//             partial, accumulate_kv). Rows without allowed keys contribute O = 0, LSE = -inf.
//   Merge   : combines fp32 partials of one output block. Forward (kind O): LSE-merge of the
//             (O, LSE) slot pairs src_slots[i] / src_lse_slots[i]; backward (dQ, dKV): sum.
//             dst Local or Slot: an fp32 accumulator; if accumulate, its content is one of the
//             inputs, else it is overwritten; an empty source list writes O = 0, LSE = -inf (or
//             zero gradients). Without outputs_in_place every owned output ends with one
//             non-accumulating Merge into its local tensor.
//   Copy    : dst := src, one data block of `kind` (same size; Local <-> Slot or Slot -> Slot).
//   CommStart: posts the grouped nonblocking sends and receives of one round (id). Sends read
//             their buffer, receives write it; neither may be touched until CommWait(id).
//   CommWait: waits until every transfer of CommStart(id) has completed.
// Every device posts its rounds in increasing id order and every transfer of round id on one
// device is matched by a transfer of the same round id on its peer (same kind, block, group,
// bytes, and the same order within each ordered device pair), which is what makes the rounds
// deadlock-free under NCCL's in-order group semantics.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "dcp/blocks.h"
#include "dcp/cluster.h"
#include "dcp/placement.h"
#include "dcp/schedule.h"

namespace dcp {

inline constexpr uint32_t kPlanFormatVersion = 1;
inline constexpr int kNumDataKinds = 8;  // DataKind::Q .. DataKind::Delta

enum class Space : uint8_t { None, Local, Slot };

// An operand: nothing, an owned block of a local tensor, or a slot.
struct BufRef {
  Space space = Space::None;
  DataKind kind = DataKind::Q;
  int32_t index = -1;  // Local: position in owned_blocks; Slot: slot number in kind's array
  friend bool operator==(const BufRef&, const BufRef&) = default;
};

struct TileOp {
  int32_t tile = 0;   // index into table.tiles
  BufRef q;           // Q of the tile's q block
  BufRef kv;          // KV of the tile's kv block (its KV set)
  BufRef d_o;         // backward: dO of the q block
  BufRef lse_in;      // backward: final LSE of the q block
  BufRef delta;       // backward: Delta = rowsum(dO * O) of the q block
  BufRef out;         // forward: O partial; backward: dQ partial (Slot, or Local: in place)
  BufRef out_lse;     // forward: LSE partial, paired with out (backward: None)
  BufRef out_kv;      // backward: dKV partial (forward: None)
  bool accumulate_q = false;   // out (and out_lse) already hold partials to merge into
  bool accumulate_kv = false;  // out_kv already holds partials to add to
};

struct Attend {
  int32_t stage = 0;
  std::vector<TileOp> tiles;
};

struct Merge {
  DataKind kind = DataKind::O;   // O (forward O+LSE), dQ or dKV
  int32_t token_block = 0;       // global id of the output's token block
  int32_t group = 0;             // head group (O, dQ) or KV set (dKV)
  std::vector<int32_t> src_slots;      // slots of `kind`
  std::vector<int32_t> src_lse_slots;  // forward: LSE slot paired with each src slot
  BufRef dst;                    // Local or Slot (fp32 accumulator) of `kind`
  BufRef dst_lse;                // forward: Local LSE or LSE slot
  bool accumulate = false;       // dst is also an input
};

struct Copy {
  DataKind kind = DataKind::Q;
  int32_t token_block = 0;
  int32_t group = 0;
  BufRef src;
  BufRef dst;
};

struct Transfer {
  int32_t peer = 0;
  bool send = false;        // true: this device sends buf to peer; false: receives into buf
  DataKind kind = DataKind::Q;
  int32_t token_block = 0;  // global token block id of the data block
  int32_t group = 0;        // head group or KV set
  BufRef buf;               // Local or Slot of `kind`
  int64_t bytes = 0;        // plan_block_bytes(table, kind, block tokens)
};

struct CommStart {
  int32_t id = 0;     // round: 1..num_stages+1 (see schedule.h)
  std::vector<Transfer> ops;  // sorted by (peer, send, ...), same order on both ends per pair
};

struct CommWait {
  int32_t id = 0;
};

using Instruction = std::variant<Attend, Merge, Copy, CommStart, CommWait>;

// One residency: slot `slot` of `kind` holds (token_block, group) from instruction `first`
// (the one that writes it first) to instruction `last` (the last one reading it), inclusive.
struct SlotUse {
  DataKind kind = DataKind::Q;
  int32_t slot = 0;
  int32_t token_block = 0;
  int32_t group = 0;
  int32_t first = 0;
  int32_t last = 0;
};

struct Program {
  Pass pass = Pass::Forward;
  int32_t num_stages = 1;
  std::vector<Instruction> code;
  std::array<int32_t, kNumDataKinds> num_slots{};  // indexed by DataKind
  std::vector<SlotUse> slot_uses;                  // ordered by (first, kind, slot)
};

struct DeviceProgram {
  int32_t device = 0;
  std::vector<int32_t> owned_blocks;         // global token block ids, dispatch order
  std::vector<int64_t> owned_token_offset;   // per owned block: first row in local tensors
  int64_t owned_tokens = 0;
  Program fwd;
  Program bwd;
};

struct PlanOptions {
  ScheduleOptions schedule;
  bool reuse_slots = true;  // false: one slot per residency (debugging, memory upper bound)
  // The outputs of an owned block accumulate in place in its local tensors (no fp32 slot and no
  // final merge per output block; fewer slots, a few percent less memory per device). Measured on
  // one H200 (bench/results/cuda_attention_h200.md, ldc 65536, B 2048): forward
  // 7-20 % and backward 1-9 % faster on every mask. The executors and the validator run both
  // forms.
  bool outputs_in_place = true;
  void validate() const;    // throws InvalidInput naming the option
};

struct PlanHeader {
  uint32_t format_version = kPlanFormatVersion;
  int32_t world_size = 0;
  AttentionShape shape;
  int64_t block_size = 0;        // B (0 for custom cuts)
  int64_t max_block_tokens = 0;  // longest token block: slot sizing
  HeadGroups groups;
  Cluster cluster;               // the cluster the plan was scheduled for
  PlanOptions options;
  std::string method;            // placement method ("dcp", "ring", ...)
};

struct Plan {
  PlanHeader header;
  BlockTable table;        // tiles, token blocks, masks: tile geometry via tile_row_ranges
  Placement placement;     // block_home and tile_device
  std::vector<DeviceProgram> devices;  // size world_size, devices[d].device == d
};

// Bytes of one data block of `kind` for `tokens` tokens and one head group (KV-side kinds:
// one KV set). Q, KV (K and V), dO in the dtype; O, dQ, dKV as fp32 partials; LSE and Delta
// fp32 per row and query head (= BlockTable::partial_bytes). Used for slot sizes and transfer
// sizes alike.
int64_t plan_block_bytes(const BlockTable& table, DataKind kind, int64_t tokens);
// Slot size of `kind`: plan_block_bytes(kind, max block tokens).
int64_t slot_bytes(const BlockTable& table, DataKind kind);

struct PassMemory {
  std::array<int64_t, kNumDataKinds> slot_bytes{};  // per kind: num_slots x slot size
  int64_t slots_total_bytes = 0;
};

struct DeviceMemory {
  int64_t local_bytes = 0;  // owned tensors of forward and backward (all kinds, all heads)
  PassMemory fwd;
  PassMemory bwd;
  int64_t peak_bytes = 0;   // local + max(fwd slots, bwd slots)
};

// THE sizing formula: what device `device` allocates to run `plan` (the executor calls it to
// allocate, the planner reports it). Pre: 0 <= device < world_size.
DeviceMemory plan_memory(const Plan& plan, int device);

// Build the plan: schedule then programs. Pre: placement.validate(table); cluster has
// placement.num_devices devices. Deterministic.
Plan build_plan(const BlockTable& table, const Placement& placement, const Cluster& cluster,
                const PlanOptions& opts);
// Same with a schedule made elsewhere (must be valid for table and placement).
Plan build_plan(const BlockTable& table, const Placement& placement, const Cluster& cluster,
                const Schedule& schedule, const PlanOptions& opts);

// Binary plan file: magic "DCPPLAN\0", format version, payload size, payload, FNV-1a 64
// checksum of the payload. Load errors are InvalidPlan naming the source and the problem
// ("plan.bin: checksum mismatch", "plan.bin: format version 7, this build reads 1"). Loading
// also checks the contents (check_plan_structure, plan_check.h), so a loaded plan is safe to
// validate, simulate or execute; an unreadable path is InvalidInput.
std::vector<uint8_t> serialize_plan(const Plan& plan);
Plan deserialize_plan(const std::vector<uint8_t>& bytes, const std::string& source);
void save_plan(const Plan& plan, const std::string& path);
Plan load_plan(const std::string& path);

// Identity of a plan: FNV-1a 64 of serialize_plan(plan). Ranks compare it before running one.
uint64_t plan_hash(const Plan& plan);

// Throws InvalidPlan "<where>: plan for world size W, communicator has N" on mismatch.
void check_plan_world_size(const Plan& plan, int world_size, const std::string& where);

// Human-readable JSON (header, memory, programs); for `dcp plan --dump`.
std::string plan_to_json(const Plan& plan, bool pretty = true);

}  // namespace dcp
