// Human-readable JSON of a plan (`dcp plan --dump`): header, memory, and every program.
#include <nlohmann/json.hpp>

#include "dcp/plan.h"

namespace dcp {
namespace {

using nlohmann::json;

json ref_json(const BufRef& b) {
  if (b.space == Space::None) return nullptr;
  return json{{"space", b.space == Space::Local ? "local" : "slot"}, {"kind", to_string(b.kind)}, {"index", b.index}};
}

json program_json(const Program& p) {
  json code = json::array();
  for (const Instruction& ins : p.code) {
    if (const auto* a = std::get_if<Attend>(&ins)) {
      json tiles = json::array();
      for (const TileOp& op : a->tiles) {
        json t{{"tile", op.tile}, {"q", ref_json(op.q)}, {"kv", ref_json(op.kv)}, {"out", ref_json(op.out)}};
        if (op.out_lse.space != Space::None) t["out_lse"] = ref_json(op.out_lse);
        if (op.d_o.space != Space::None) {
          t["dO"] = ref_json(op.d_o);
          t["lse_in"] = ref_json(op.lse_in);
          t["delta"] = ref_json(op.delta);
          t["out_kv"] = ref_json(op.out_kv);
          t["accumulate_kv"] = op.accumulate_kv;
        }
        t["accumulate_q"] = op.accumulate_q;
        tiles.push_back(std::move(t));
      }
      code.push_back({{"op", "attend"}, {"stage", a->stage}, {"tiles", std::move(tiles)}});
    } else if (const auto* m = std::get_if<Merge>(&ins)) {
      json j{{"op", "merge"}, {"kind", to_string(m->kind)}, {"token_block", m->token_block}, {"group", m->group},
             {"src_slots", m->src_slots}, {"dst", ref_json(m->dst)}, {"accumulate", m->accumulate}};
      if (m->dst_lse.space != Space::None) {
        j["src_lse_slots"] = m->src_lse_slots;
        j["dst_lse"] = ref_json(m->dst_lse);
      }
      code.push_back(std::move(j));
    } else if (const auto* c = std::get_if<Copy>(&ins)) {
      code.push_back({{"op", "copy"}, {"kind", to_string(c->kind)}, {"token_block", c->token_block},
                      {"group", c->group}, {"src", ref_json(c->src)}, {"dst", ref_json(c->dst)}});
    } else if (const auto* cs = std::get_if<CommStart>(&ins)) {
      json ops = json::array();
      for (const Transfer& x : cs->ops)
        ops.push_back({{x.send ? "send_to" : "recv_from", x.peer}, {"kind", to_string(x.kind)},
                       {"token_block", x.token_block}, {"group", x.group}, {"buf", ref_json(x.buf)},
                       {"bytes", x.bytes}});
      code.push_back({{"op", "comm_start"}, {"id", cs->id}, {"transfers", std::move(ops)}});
    } else {
      code.push_back({{"op", "comm_wait"}, {"id", std::get<CommWait>(ins).id}});
    }
  }
  json slots = json::object();
  for (int k = 0; k < kNumDataKinds; ++k)
    if (p.num_slots[k] > 0) slots[to_string(static_cast<DataKind>(k))] = p.num_slots[k];
  return json{{"pass", to_string(p.pass)}, {"num_stages", p.num_stages}, {"num_slots", slots}, {"code", code}};
}

}  // namespace

std::string plan_to_json(const Plan& plan, bool pretty) {
  const PlanHeader& h = plan.header;
  json header{{"format_version", h.format_version},
              {"world_size", h.world_size},
              {"method", h.method},
              {"shape", {{"q_heads", h.shape.q_heads}, {"kv_heads", h.shape.kv_heads},
                         {"head_dim", h.shape.head_dim}, {"dtype", to_string(h.shape.dtype)}}},
              {"block_size", h.block_size},
              {"max_block_tokens", h.max_block_tokens},
              {"head_groups", h.groups.num_groups},
              {"cluster", {{"name", h.cluster.name}, {"nodes", h.cluster.nodes},
                           {"devices_per_node", h.cluster.devices_per_node}}},
              {"options", {{"num_comm_stages", h.options.schedule.num_comm_stages},
                           {"balance_by_time", h.options.schedule.balance_by_time},
                           {"two_phase", h.options.schedule.two_phase},
                           {"reuse_slots", h.options.reuse_slots}}},
              {"num_token_blocks", plan.table.num_token_blocks()},
              {"num_tiles", plan.table.tiles.size()}};
  json devices = json::array();
  for (const DeviceProgram& dp : plan.devices) {
    DeviceMemory m = plan_memory(plan, dp.device);
    devices.push_back({{"device", dp.device},
                       {"owned_blocks", dp.owned_blocks},
                       {"owned_tokens", dp.owned_tokens},
                       {"memory", {{"local_bytes", m.local_bytes}, {"fwd_slot_bytes", m.fwd.slots_total_bytes},
                                   {"bwd_slot_bytes", m.bwd.slots_total_bytes}, {"peak_bytes", m.peak_bytes}}},
                       {"fwd", program_json(dp.fwd)},
                       {"bwd", program_json(dp.bwd)}});
  }
  json j{{"header", header}, {"devices", devices}};
  return pretty ? j.dump(2) : j.dump();
}

}  // namespace dcp
