// make_plan_corpus OUT_DIR — writes the plan corpus of the plan fuzz target (run by hand when the
// plan format changes; the output is committed under tests/fuzz/corpus/plan):
//   seed/<case>.payload   the payload of a small valid plan (the target frames it), one per case
//   good/<case>.plan      the same plan as a whole file: must be accepted
//   bad/<case>-<what>.plan  the plan with one field made wrong and the checksum made right again,
//                         or the file cut or its framing damaged: must be refused
// Cases cover every placement method, every mask kind, 1 to 4 devices on 1 or 2 nodes, 1 to 3
// stages, fp32 and bf16, and finer or coarser head groups. Small plans get every mutation, larger
// ones every eighth; a mutation that does not apply to a case (one device, no Merge, ...) is
// skipped for it. The program checks itself: it
// fails if a good plan is refused or a bad one accepted by the loader + validator.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "dcp/baselines.h"
#include "dcp/blocks.h"
#include "dcp/error.h"
#include "dcp/partition.h"
#include "dcp/plan.h"
#include "dcp/detail/plan_check.h"
#include "dcp/validate.h"

using namespace dcp;
namespace fs = std::filesystem;

namespace {

struct Case {
  std::string name;
  Plan plan;
};

Batch batch_of(const std::vector<std::pair<int64_t, Mask>>& seqs, int q, int kv, int dim, DType dtype) {
  Batch b;
  b.shape = AttentionShape{q, kv, dim, dtype};
  for (const auto& [len, mask] : seqs) b.sequences.push_back(Sequence{len, mask, ""});
  return b;
}

Mask diagonal_ranges(int64_t n) {
  std::vector<std::vector<Range>> rows(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    rows[static_cast<size_t>(i)].push_back({i, i + 1});
    if (i >= 40) rows[static_cast<size_t>(i)].insert(rows[static_cast<size_t>(i)].begin(), Range{0, 8});
  }
  return Mask::ranges(std::move(rows));
}

Plan make(const Batch& batch, const std::string& method, int nodes, int per_node, int stages, int64_t block,
          int q_per_group) {
  Cluster cluster = cluster_preset("a100-p4d", nodes);
  cluster.devices_per_node = per_node;
  const BlockOptions bo{block, q_per_group};
  PlacedBatch placed;
  if (method == "dcp") {
    placed.table = build_block_table(batch, bo);
    placed.placement = place_dcp(placed.table, cluster, PlacementOptions{}).placement;
  } else {
    for (BaselineKind k : all_baselines())
      if (method == to_string(k)) placed = make_baseline(k, batch, bo, cluster);
  }
  PlanOptions po;
  po.schedule.num_comm_stages = stages;
  return build_plan(placed.table, placed.placement, cluster, po);
}

std::vector<Case> cases() {
  std::vector<Case> out;
  const Batch mixed = batch_of({{70, Mask::causal()},
                                {33, Mask::full()},
                                {90, Mask::lambda(4, 20)},
                                {65, Mask::causal_blockwise(16, 1, 1)},
                                {40, Mask::shared_question_for(40)}},
                               4, 2, 16, DType::FP32);
  const Batch ranges = batch_of({{64, diagonal_ranges(64)}, {1, Mask::causal()}}, 2, 1, 16, DType::BF16);
  const Batch one = batch_of({{200, Mask::causal()}}, 8, 2, 16, DType::BF16);
  // Cutting baselines pair every chunk of a sequence: a smaller batch keeps their plans small.
  const Batch small = batch_of({{24, Mask::causal()}, {20, Mask::shared_question_for(20)}, {30, Mask::lambda(2, 6)}}, 4,
                               2, 16, DType::FP32);
  out.push_back({"mixed-dcp-2x2", make(mixed, "dcp", 2, 2, 2, 32, 0)});
  out.push_back({"mixed-packing-2x2", make(mixed, "packing", 2, 2, 2, 32, 0)});
  for (const std::string m : {"ring", "zigzag", "ulysses", "a2a_p2p"})
    out.push_back({"small-" + m + "-2x2", make(small, m, 2, 2, 2, 32, 0)});
  out.push_back({"small-zigzag-1x3", make(small, "zigzag", 1, 3, 1, 32, 0)});
  out.push_back({"mixed-dcp-1x3", make(mixed, "dcp", 1, 3, 3, 32, 0)});
  out.push_back({"mixed-dcp-1x1", make(mixed, "dcp", 1, 1, 1, 64, 0)});
  out.push_back({"ranges-dcp-1x2", make(ranges, "dcp", 1, 2, 1, 32, 0)});
  out.push_back({"ranges-zigzag-1x2", make(ranges, "zigzag", 1, 2, 2, 32, 0)});
  out.push_back({"one-dcp-finer-1x4", make(one, "dcp", 1, 4, 2, 64, 2)});
  out.push_back({"one-ring-coarser-2x1", make(one, "ring", 2, 1, 1, 64, 8)});
  return out;
}

using Mutation = std::function<bool(Plan&)>;  // false: does not apply to this plan

template <class T>
T* first_of(Program& p) {
  for (Instruction& ins : p.code)
    if (auto* x = std::get_if<T>(&ins)) return x;
  return nullptr;
}

TileOp* first_tile(Plan& p) {
  for (DeviceProgram& d : p.devices)
    if (Attend* a = first_of<Attend>(d.fwd); a && !a->tiles.empty()) return &a->tiles.front();
  return nullptr;
}

Transfer* first_transfer(Plan& p) {
  for (DeviceProgram& d : p.devices)
    for (Instruction& ins : d.fwd.code)
      if (auto* c = std::get_if<CommStart>(&ins); c && !c->ops.empty()) return &c->ops.front();
  return nullptr;
}

Merge* first_merge(Plan& p) {
  for (DeviceProgram& d : p.devices)
    if (Merge* m = first_of<Merge>(d.fwd)) return m;
  return nullptr;
}

std::vector<std::pair<std::string, Mutation>> mutations() {
  std::vector<std::pair<std::string, Mutation>> all;
  auto add = [&](std::string name, Mutation f) { all.emplace_back(std::move(name), std::move(f)); };
  add("head-dim-0", [](Plan& p) { return p.header.shape.head_dim = 0, true; });
  add("head-dim-both-0", [](Plan& p) { return p.header.shape.head_dim = p.table.shape.head_dim = 0, true; });
  add("head-dim-huge", [](Plan& p) { return p.header.shape.head_dim = p.table.shape.head_dim = 1 << 20, true; });
  add("q-heads-disagree", [](Plan& p) { return p.header.shape.q_heads *= 2, true; });
  add("q-heads-both-doubled", [](Plan& p) { return p.header.shape.q_heads = p.table.shape.q_heads *= 2, true; });
  add("kv-heads-zero", [](Plan& p) { return p.header.shape.kv_heads = p.table.shape.kv_heads = 0, true; });
  add("dtype-disagree", [](Plan& p) {
    p.header.shape.dtype = p.header.shape.dtype == DType::FP32 ? DType::BF16 : DType::FP32;
    return true;
  });
  add("groups-disagree", [](Plan& p) { return p.header.groups.num_groups += 1, true; });
  add("groups-both-wrong", [](Plan& p) { return p.header.groups.num_groups = p.table.groups.num_groups *= 2, true; });
  add("world-size-plus-1", [](Plan& p) { return p.header.world_size += 1, true; });
  add("world-size-0", [](Plan& p) { return p.header.world_size = 0, true; });
  add("block-size-disagree", [](Plan& p) { return p.header.block_size += 16, true; });
  add("max-block-tokens", [](Plan& p) { return p.header.max_block_tokens += 1, true; });
  add("max-block-tokens-huge", [](Plan& p) { return p.header.max_block_tokens = int64_t{1} << 40, true; });
  add("stages-0", [](Plan& p) { return p.header.options.schedule.num_comm_stages = 0, true; });
  add("stages-disagree", [](Plan& p) { return p.header.options.schedule.num_comm_stages += 1, true; });
  add("cluster-nodes-0", [](Plan& p) { return p.header.cluster.nodes = 0, true; });
  add("cluster-size-disagree", [](Plan& p) { return p.header.cluster.devices_per_node += 1, true; });
  add("cluster-bandwidth-negative", [](Plan& p) { return p.header.cluster.intra_bw = -1, true; });
  add("tile-q-block-out-of-range", [](Plan& p) { return p.table.tiles.front().q_block = 1 << 30, true; });
  add("tile-kv-block-negative", [](Plan& p) { return p.table.tiles.front().kv_block = -1, true; });
  add("tile-area-plus-1", [](Plan& p) { return p.table.tiles.front().area += 1, true; });
  add("tile-area-0", [](Plan& p) { return p.table.tiles.front().area = 0, true; });
  add("tile-kind-changed", [](Plan& p) {
    Tile& t = p.table.tiles.front();
    t.kind = t.kind == TileKind::Partial ? TileKind::Full : TileKind::Partial;
    return true;
  });
  add("tile-group-out-of-range", [](Plan& p) { return p.table.tiles.back().head_group = 1 << 20, true; });
  add("tile-missing", [](Plan& p) {
    p.table.tiles.pop_back();
    p.placement.tile_device.pop_back();
    return true;
  });
  add("tile-duplicated", [](Plan& p) {
    p.table.tiles.push_back(p.table.tiles.back());
    p.placement.tile_device.push_back(p.placement.tile_device.back());
    return true;
  });
  add("tile-seq-out-of-range", [](Plan& p) { return p.table.tiles.back().seq = 1 << 20, true; });
  add("block-length-plus-1", [](Plan& p) { return p.table.token_blocks.front().length += 1, true; });
  add("block-begin-moved", [](Plan& p) { return p.table.token_blocks.back().begin += 1, true; });
  add("seq-length-plus-1", [](Plan& p) { return p.table.seq_length.front() += 1, true; });
  add("seq-length-0", [](Plan& p) { return p.table.seq_length.back() = 0, true; });
  add("seq-first-block-past-end", [](Plan& p) {
    if (p.table.seq_first_block.size() < 3) return false;
    p.table.seq_first_block[1] = 1 << 30;
    return true;
  });
  add("seq-first-block-backwards", [](Plan& p) {
    if (p.table.seq_first_block.size() < 3) return false;
    p.table.seq_first_block[1] = -5;
    return true;
  });
  add("mask-lambda-window-0", [](Plan& p) {
    p.table.seq_mask.front() = Mask::lambda(4, 0);
    return true;
  });
  add("mask-changed-to-full", [](Plan& p) {
    for (Mask& m : p.table.seq_mask)
      if (m.kind != MaskKind::Full) return m = Mask::full(), true;
    return false;
  });
  add("mask-missing", [](Plan& p) { return p.table.seq_mask.pop_back(), true; });
  add("home-out-of-range", [](Plan& p) { return p.placement.block_home.front() = p.header.world_size, true; });
  add("tile-device-negative", [](Plan& p) { return p.placement.tile_device.front() = -1, true; });
  add("tile-on-other-device", [](Plan& p) {
    if (p.header.world_size < 2) return false;
    int32_t& d = p.placement.tile_device.front();
    d = (d + 1) % p.header.world_size;
    return true;
  });
  add("owned-block-extra", [](Plan& p) { return p.devices.front().owned_blocks.push_back(0), true; });
  add("owned-offset-shifted", [](Plan& p) {
    if (p.devices.front().owned_token_offset.empty()) return false;
    p.devices.front().owned_token_offset.back() += 1;
    return true;
  });
  add("owned-tokens-plus-1", [](Plan& p) { return p.devices.front().owned_tokens += 1, true; });
  add("device-id-wrong", [](Plan& p) { return p.devices.back().device += 1, true; });
  add("program-missing", [](Plan& p) { return p.devices.pop_back(), true; });
  add("slots-huge", [](Plan& p) { return p.devices.front().fwd.num_slots[0] = 1 << 30, true; });
  add("slots-negative", [](Plan& p) { return p.devices.front().bwd.num_slots[2] = -1, true; });
  add("slots-too-few", [](Plan& p) {
    for (DeviceProgram& d : p.devices)
      for (int32_t& n : d.fwd.num_slots)
        if (n > 0) return n -= 1, true;
    return false;
  });
  add("pass-swapped", [](Plan& p) { return p.devices.front().bwd.pass = Pass::Forward, true; });
  add("program-stages-wrong", [](Plan& p) { return p.devices.front().fwd.num_stages = 99, true; });
  add("attend-tile-out-of-range", [](Plan& p) {
    TileOp* op = first_tile(p);
    return op ? (op->tile = 1 << 30, true) : false;
  });
  add("attend-tile-negative", [](Plan& p) {
    TileOp* op = first_tile(p);
    return op ? (op->tile = -3, true) : false;
  });
  add("attend-q-slot-out-of-range", [](Plan& p) {
    TileOp* op = first_tile(p);
    return op ? (op->q = BufRef{Space::Slot, DataKind::Q, 1 << 20}, true) : false;
  });
  add("attend-kv-local-out-of-range", [](Plan& p) {
    TileOp* op = first_tile(p);
    return op ? (op->kv = BufRef{Space::Local, DataKind::KV, 999}, true) : false;
  });
  add("attend-out-missing", [](Plan& p) {
    TileOp* op = first_tile(p);
    return op ? (op->out = BufRef{}, true) : false;
  });
  add("attend-out-wrong-kind", [](Plan& p) {
    TileOp* op = first_tile(p);
    return op ? (op->out.kind = DataKind::Q, true) : false;
  });
  add("attend-duplicated", [](Plan& p) {
    for (DeviceProgram& d : p.devices)
      for (size_t i = 0; i < d.fwd.code.size(); ++i)
        if (std::holds_alternative<Attend>(d.fwd.code[i])) {
          d.fwd.code.insert(d.fwd.code.begin() + static_cast<std::ptrdiff_t>(i), d.fwd.code[i]);
          return true;
        }
    return false;
  });
  add("attend-stage-out-of-range", [](Plan& p) {
    for (DeviceProgram& d : p.devices)
      if (Attend* a = first_of<Attend>(d.bwd)) return a->stage = 1000, true;
    return false;
  });
  add("transfer-peer-out-of-range", [](Plan& p) {
    Transfer* t = first_transfer(p);
    return t ? (t->peer = p.header.world_size, true) : false;
  });
  add("transfer-bytes-plus-2", [](Plan& p) {
    Transfer* t = first_transfer(p);
    return t ? (t->bytes += 2, true) : false;
  });
  add("transfer-block-negative", [](Plan& p) {
    Transfer* t = first_transfer(p);
    return t ? (t->token_block = -1, true) : false;
  });
  add("transfer-group-out-of-range", [](Plan& p) {
    Transfer* t = first_transfer(p);
    return t ? (t->group = 1 << 20, true) : false;
  });
  add("transfer-buffer-slot-out-of-range", [](Plan& p) {
    Transfer* t = first_transfer(p);
    return t ? (t->buf = BufRef{Space::Slot, t->kind, 1 << 24}, true) : false;
  });
  add("transfer-direction-flipped", [](Plan& p) {
    Transfer* t = first_transfer(p);
    return t ? (t->send = !t->send, true) : false;
  });
  add("round-id-huge", [](Plan& p) {
    for (DeviceProgram& d : p.devices)
      if (CommStart* c = first_of<CommStart>(d.fwd)) return c->id = 1 << 30, true;
    return false;
  });
  add("wait-removed", [](Plan& p) {
    for (DeviceProgram& d : p.devices)
      for (size_t i = 0; i < d.fwd.code.size(); ++i)
        if (std::holds_alternative<CommWait>(d.fwd.code[i]))
          return d.fwd.code.erase(d.fwd.code.begin() + static_cast<std::ptrdiff_t>(i)), true;
    return false;
  });
  add("wait-id-unknown", [](Plan& p) {
    for (DeviceProgram& d : p.devices)
      if (CommWait* w = first_of<CommWait>(d.bwd)) return w->id = 77, true;
    return false;
  });
  add("merge-removed", [](Plan& p) {
    for (DeviceProgram& d : p.devices)
      for (size_t i = d.fwd.code.size(); i-- > 0;)
        if (std::holds_alternative<Merge>(d.fwd.code[i]))
          return d.fwd.code.erase(d.fwd.code.begin() + static_cast<std::ptrdiff_t>(i)), true;
    return false;
  });
  add("merge-source-out-of-range", [](Plan& p) {
    Merge* m = first_merge(p);
    if (!m) return false;
    m->src_slots.push_back(1 << 24);
    m->src_lse_slots.push_back(1 << 24);
    return true;
  });
  add("merge-block-out-of-range", [](Plan& p) {
    Merge* m = first_merge(p);
    return m ? (m->token_block = 1 << 30, true) : false;
  });
  add("merge-group-out-of-range", [](Plan& p) {
    Merge* m = first_merge(p);
    return m ? (m->group = 1 << 20, true) : false;
  });
  add("merge-kind-q", [](Plan& p) {
    Merge* m = first_merge(p);
    return m ? (m->kind = DataKind::Q, true) : false;
  });
  add("merge-lse-unpaired", [](Plan& p) {
    Merge* m = first_merge(p);
    return m && !m->src_lse_slots.empty() ? (m->src_lse_slots.pop_back(), true) : false;
  });
  add("slot-use-out-of-range", [](Plan& p) {
    for (DeviceProgram& d : p.devices)
      if (!d.fwd.slot_uses.empty()) return d.fwd.slot_uses.front().slot = 1 << 24, true;
    return false;
  });
  return all;
}

void write(const fs::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                              static_cast<std::streamsize>(bytes.size()));
}

// Accepted = loads (format and structure) and validates.
bool accepted(const std::vector<uint8_t>& bytes) {
  try {
    return validate_plan(deserialize_plan(bytes, "corpus"), 1).empty();
  } catch (const Error&) {
    return false;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_plan_corpus OUT_DIR\n");
    return 2;
  }
  const fs::path out = argv[1];
  for (const char* d : {"seed", "good", "bad"}) fs::create_directories(out / d);
  int num_good = 0, num_bad = 0, wrong = 0;
  for (const Case& c : cases()) {
    const std::vector<uint8_t> file = serialize_plan(c.plan);
    if (!accepted(file)) {
      std::fprintf(stderr, "case %s: the valid plan is refused\n", c.name.c_str());
      ++wrong;
    }
    write(out / "good" / (c.name + ".plan"), file);
    write(out / "seed" / (c.name + ".payload"), std::vector<uint8_t>(file.begin() + 20, file.end() - 8));
    ++num_good;
    auto bad = [&](const std::string& what, const std::vector<uint8_t>& bytes) {
      if (accepted(bytes)) {
        std::fprintf(stderr, "case %s: mutation %s is accepted\n", c.name.c_str(), what.c_str());
        ++wrong;
      }
      write(out / "bad" / (c.name + "-" + what + ".plan"), bytes);
      ++num_bad;
    };
    // Every mutation on small plans; on larger ones every eighth (the corpus stays a few MB).
    const auto all = mutations();
    const size_t step = file.size() <= 16384 ? 1 : 8;
    for (size_t i = 0; i < all.size(); i += step) {
      Plan p = c.plan;
      if (all[i].second(p)) bad(all[i].first, serialize_plan(p));
    }
    // The framing: cut files, a damaged magic, version, size or checksum, trailing bytes.
    for (size_t cut : {size_t{0}, size_t{7}, size_t{19}, size_t{27}, file.size() / 2, file.size() - 1})
      bad("cut-at-" + std::to_string(cut), std::vector<uint8_t>(file.begin(), file.begin() + static_cast<std::ptrdiff_t>(cut)));
    for (size_t at : {size_t{0}, size_t{8}, size_t{12}, size_t{20}, file.size() / 3, file.size() - 1}) {
      std::vector<uint8_t> flipped = file;
      flipped[at] ^= 0x10;
      bad("bit-flip-at-" + std::to_string(at), flipped);
    }
    std::vector<uint8_t> longer = file;
    longer.push_back(0);
    bad("trailing-byte", longer);
  }
  std::printf("plan corpus: %d good, %d bad, %d misclassified\n", num_good, num_bad, wrong);
  return wrong == 0 ? 0 : 1;
}
