// Plan file: "DCPPLAN\0", u32 format version, u64 payload size, payload, u64 FNV-1a of the
// payload. Integers are little-endian; the payload is the header, block table, placement and
// programs in declaration order (docs/formats.md). Every read is bounds- and range-checked.
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <type_traits>

#include "dcp/error.h"
#include "dcp/detail/hash.h"
#include "dcp/plan.h"
#include "dcp/detail/plan_check.h"

namespace dcp {
namespace {

// The checksum of format version 1 is FNV-1a 64 started from this basis (not FNV's usual one):
// files written since the format began carry it, so it stays.
constexpr uint64_t kChecksumBasis = 1469598103934665603ull;

constexpr char kMagic[8] = {'D', 'C', 'P', 'P', 'L', 'A', 'N', '\0'};


class Writer {
 public:
  std::vector<uint8_t> out;
  template <class T>
  void pod(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    uint8_t b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    out.insert(out.end(), b, b + sizeof(T));
  }
  void i64(int64_t v) { pod(v); }
  void i32(int32_t v) { pod(v); }
  void u8(uint8_t v) { pod(v); }
  void f64(double v) { pod(v); }
  void str(const std::string& s) {
    i64(static_cast<int64_t>(s.size()));
    out.insert(out.end(), s.begin(), s.end());
  }
  template <class T, class F>
  void vec(const std::vector<T>& v, F each) {
    i64(static_cast<int64_t>(v.size()));
    for (const T& x : v) each(x);
  }
  void ivec(const std::vector<int32_t>& v) { vec(v, [&](int32_t x) { i32(x); }); }
  void lvec(const std::vector<int64_t>& v) { vec(v, [&](int64_t x) { i64(x); }); }
};

class Reader {
 public:
  Reader(const uint8_t* p, size_t n, const std::string& src) : p_(p), n_(n), src_(src) {}
  [[noreturn]] void fail(const std::string& what) const {
    raise(ErrorKind::InvalidPlan, src_ + ": " + what + " (at payload byte " + std::to_string(at_) + ")");
  }
  template <class T>
  T pod() {
    if (n_ - at_ < sizeof(T)) fail("truncated payload");
    T v;
    std::memcpy(&v, p_ + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  int64_t i64() { return pod<int64_t>(); }
  int32_t i32() { return pod<int32_t>(); }
  uint8_t u8() { return pod<uint8_t>(); }
  double f64() { return pod<double>(); }
  bool flag() {
    uint8_t v = u8();
    if (v > 1) fail("bad boolean " + std::to_string(v));
    return v == 1;
  }
  template <class E>
  E enm(int count, const char* what) {
    uint8_t v = u8();
    if (v >= count) fail(std::string("bad ") + what + " " + std::to_string(v));
    return static_cast<E>(v);
  }
  int64_t count(size_t min_elem_bytes) {
    int64_t c = i64();
    if (c < 0 || static_cast<uint64_t>(c) > (n_ - at_) / std::max<size_t>(min_elem_bytes, 1))
      fail("bad element count " + std::to_string(c));
    return c;
  }
  std::string str() {
    int64_t c = count(1);
    std::string s(reinterpret_cast<const char*>(p_ + at_), static_cast<size_t>(c));
    at_ += static_cast<size_t>(c);
    return s;
  }
  template <class T, class F>
  std::vector<T> vec(size_t min_bytes, F each) {
    int64_t c = count(min_bytes);
    std::vector<T> v;
    v.reserve(static_cast<size_t>(c));
    for (int64_t i = 0; i < c; ++i) v.push_back(each());
    return v;
  }
  std::vector<int32_t> ivec() { return vec<int32_t>(4, [&] { return i32(); }); }
  std::vector<int64_t> lvec() { return vec<int64_t>(8, [&] { return i64(); }); }
  bool done() const { return at_ == n_; }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t at_ = 0;
  std::string src_;
};

void put_shape(Writer& w, const AttentionShape& s) {
  w.i32(s.q_heads);
  w.i32(s.kv_heads);
  w.i32(s.head_dim);
  w.u8(static_cast<uint8_t>(s.dtype));
}
AttentionShape get_shape(Reader& r) {
  AttentionShape s;
  s.q_heads = r.i32();
  s.kv_heads = r.i32();
  s.head_dim = r.i32();
  s.dtype = r.enm<DType>(3, "dtype");
  return s;
}
void put_groups(Writer& w, const HeadGroups& g) {
  w.i32(g.num_groups);
  w.i32(g.q_heads_per_group);
  w.i32(g.kv_heads_per_group);
  w.i32(g.groups_per_kv_set);
}
HeadGroups get_groups(Reader& r) {
  HeadGroups g;
  g.num_groups = r.i32();
  g.q_heads_per_group = r.i32();
  g.kv_heads_per_group = r.i32();
  g.groups_per_kv_set = r.i32();
  if (g.num_groups < 1 || g.groups_per_kv_set < 1 || g.num_groups % g.groups_per_kv_set != 0)
    r.fail("bad head groups");
  return g;
}

void put_mask(Writer& w, const Mask& m) {
  w.u8(static_cast<uint8_t>(m.kind));
  w.i64(m.sink);
  w.i64(m.window);
  w.i64(m.block);
  w.i64(m.local_blocks);
  w.i64(m.sink_blocks);
  w.i64(m.question);
  w.lvec(m.answers);
  w.u8(m.rows ? 1 : 0);
  if (m.rows)
    w.vec(*m.rows, [&](const std::vector<Range>& row) {
      w.vec(row, [&](const Range& x) {
        w.i64(x.begin);
        w.i64(x.end);
      });
    });
}
Mask get_mask(Reader& r) {
  Mask m;
  m.kind = r.enm<MaskKind>(7, "mask kind");
  m.sink = r.i64();
  m.window = r.i64();
  m.block = r.i64();
  m.local_blocks = r.i64();
  m.sink_blocks = r.i64();
  m.question = r.i64();
  m.answers = r.lvec();
  if (r.flag()) {
    auto rows = r.vec<std::vector<Range>>(8, [&] {
      return r.vec<Range>(16, [&] {
        Range x;
        x.begin = r.i64();
        x.end = r.i64();
        return x;
      });
    });
    m.rows = std::make_shared<const std::vector<std::vector<Range>>>(std::move(rows));
  }
  return m;
}

void put_ref(Writer& w, const BufRef& b) {
  w.u8(static_cast<uint8_t>(b.space));
  w.u8(static_cast<uint8_t>(b.kind));
  w.i32(b.index);
}
BufRef get_ref(Reader& r) {
  BufRef b;
  b.space = r.enm<Space>(3, "buffer space");
  b.kind = r.enm<DataKind>(kNumDataKinds, "data kind");
  b.index = r.i32();
  return b;
}

void put_program(Writer& w, const Program& p) {
  w.u8(static_cast<uint8_t>(p.pass));
  w.i32(p.num_stages);
  for (int32_t n : p.num_slots) w.i32(n);
  w.vec(p.code, [&](const Instruction& ins) {
    w.u8(static_cast<uint8_t>(ins.index()));
    if (const auto* a = std::get_if<Attend>(&ins)) {
      w.i32(a->stage);
      w.vec(a->tiles, [&](const TileOp& op) {
        w.i32(op.tile);
        for (const BufRef* b : {&op.q, &op.kv, &op.d_o, &op.lse_in, &op.delta, &op.out, &op.out_lse, &op.out_kv})
          put_ref(w, *b);
        w.u8(op.accumulate_q);
        w.u8(op.accumulate_kv);
      });
    } else if (const auto* m = std::get_if<Merge>(&ins)) {
      w.u8(static_cast<uint8_t>(m->kind));
      w.i32(m->token_block);
      w.i32(m->group);
      w.ivec(m->src_slots);
      w.ivec(m->src_lse_slots);
      put_ref(w, m->dst);
      put_ref(w, m->dst_lse);
      w.u8(m->accumulate);
    } else if (const auto* c = std::get_if<Copy>(&ins)) {
      w.u8(static_cast<uint8_t>(c->kind));
      w.i32(c->token_block);
      w.i32(c->group);
      put_ref(w, c->src);
      put_ref(w, c->dst);
    } else if (const auto* cs = std::get_if<CommStart>(&ins)) {
      w.i32(cs->id);
      w.vec(cs->ops, [&](const Transfer& x) {
        w.i32(x.peer);
        w.u8(x.send);
        w.u8(static_cast<uint8_t>(x.kind));
        w.i32(x.token_block);
        w.i32(x.group);
        put_ref(w, x.buf);
        w.i64(x.bytes);
      });
    } else {
      w.i32(std::get<CommWait>(ins).id);
    }
  });
  w.vec(p.slot_uses, [&](const SlotUse& u) {
    w.u8(static_cast<uint8_t>(u.kind));
    w.i32(u.slot);
    w.i32(u.token_block);
    w.i32(u.group);
    w.i32(u.first);
    w.i32(u.last);
  });
}

Program get_program(Reader& r) {
  Program p;
  p.pass = r.enm<Pass>(2, "pass");
  p.num_stages = r.i32();
  for (int32_t& n : p.num_slots) n = r.i32();
  p.code = r.vec<Instruction>(5, [&]() -> Instruction {
    switch (r.enm<int>(5, "instruction")) {
      case 0: {
        Attend a;
        a.stage = r.i32();
        a.tiles = r.vec<TileOp>(6, [&] {
          TileOp op;
          op.tile = r.i32();
          for (BufRef* b : {&op.q, &op.kv, &op.d_o, &op.lse_in, &op.delta, &op.out, &op.out_lse, &op.out_kv})
            *b = get_ref(r);
          op.accumulate_q = r.flag();
          op.accumulate_kv = r.flag();
          return op;
        });
        return a;
      }
      case 1: {
        Merge m;
        m.kind = r.enm<DataKind>(kNumDataKinds, "data kind");
        m.token_block = r.i32();
        m.group = r.i32();
        m.src_slots = r.ivec();
        m.src_lse_slots = r.ivec();
        m.dst = get_ref(r);
        m.dst_lse = get_ref(r);
        m.accumulate = r.flag();
        return m;
      }
      case 2: {
        Copy c;
        c.kind = r.enm<DataKind>(kNumDataKinds, "data kind");
        c.token_block = r.i32();
        c.group = r.i32();
        c.src = get_ref(r);
        c.dst = get_ref(r);
        return c;
      }
      case 3: {
        CommStart cs;
        cs.id = r.i32();
        cs.ops = r.vec<Transfer>(8, [&] {
          Transfer x;
          x.peer = r.i32();
          x.send = r.flag();
          x.kind = r.enm<DataKind>(kNumDataKinds, "data kind");
          x.token_block = r.i32();
          x.group = r.i32();
          x.buf = get_ref(r);
          x.bytes = r.i64();
          return x;
        });
        return cs;
      }
      default: return CommWait{r.i32()};
    }
  });
  p.slot_uses = r.vec<SlotUse>(21, [&] {
    SlotUse u;
    u.kind = r.enm<DataKind>(kNumDataKinds, "data kind");
    u.slot = r.i32();
    u.token_block = r.i32();
    u.group = r.i32();
    u.first = r.i32();
    u.last = r.i32();
    return u;
  });
  return p;
}

void put_cluster(Writer& w, const Cluster& c) {
  w.str(c.name);
  w.i32(c.nodes);
  w.i32(c.devices_per_node);
  for (double v : {c.intra_bw, c.inter_bw_device, c.nic_bw_node, c.intra_latency_s, c.inter_latency_s,
                   c.attn_fwd_flops, c.attn_bwd_flops, c.device_memory_bytes})
    w.f64(v);
}
Cluster get_cluster(Reader& r) {
  Cluster c;
  c.name = r.str();
  c.nodes = r.i32();
  c.devices_per_node = r.i32();
  for (double* v : {&c.intra_bw, &c.inter_bw_device, &c.nic_bw_node, &c.intra_latency_s, &c.inter_latency_s,
                    &c.attn_fwd_flops, &c.attn_bwd_flops, &c.device_memory_bytes})
    *v = r.f64();
  return c;
}

}  // namespace

uint64_t plan_hash(const Plan& plan) {
  const std::vector<uint8_t> bytes = serialize_plan(plan);
  return fnv1a(bytes.data(), bytes.size());
}

std::vector<uint8_t> serialize_plan(const Plan& plan) {
  Writer w;
  const PlanHeader& h = plan.header;
  w.i32(h.world_size);
  put_shape(w, h.shape);
  w.i64(h.block_size);
  w.i64(h.max_block_tokens);
  put_groups(w, h.groups);
  put_cluster(w, h.cluster);
  w.i32(h.options.schedule.num_comm_stages);
  w.u8(h.options.schedule.balance_by_time);
  w.u8(h.options.schedule.two_phase);
  w.u8(h.options.reuse_slots);
  w.str(h.method);
  const BlockTable& t = plan.table;
  put_shape(w, t.shape);
  w.i64(t.block_size);
  put_groups(w, t.groups);
  w.ivec(t.seq_first_block);
  w.lvec(t.seq_length);
  w.vec(t.seq_mask, [&](const Mask& m) { put_mask(w, m); });
  w.vec(t.token_blocks, [&](const TokenBlock& b) {
    w.i32(b.seq);
    w.i32(b.index);
    w.i64(b.begin);
    w.i64(b.length);
    w.i64(b.global_begin);
  });
  w.vec(t.tiles, [&](const Tile& x) {
    w.i32(x.seq);
    w.i32(x.head_group);
    w.i32(x.q_block);
    w.i32(x.kv_block);
    w.u8(static_cast<uint8_t>(x.kind));
    w.i64(x.area);
  });
  w.str(plan.placement.method);
  w.i32(plan.placement.num_devices);
  w.ivec(plan.placement.block_home);
  w.ivec(plan.placement.tile_device);
  w.str(plan.placement.note);
  w.vec(plan.devices, [&](const DeviceProgram& dp) {
    w.i32(dp.device);
    w.ivec(dp.owned_blocks);
    w.lvec(dp.owned_token_offset);
    w.i64(dp.owned_tokens);
    put_program(w, dp.fwd);
    put_program(w, dp.bwd);
  });
  Writer file;
  for (char c : kMagic) file.u8(static_cast<uint8_t>(c));
  file.pod<uint32_t>(kPlanFormatVersion);
  file.pod<uint64_t>(w.out.size());
  file.out.insert(file.out.end(), w.out.begin(), w.out.end());
  file.pod<uint64_t>(fnv1a(w.out.data(), w.out.size(), kChecksumBasis));
  return std::move(file.out);
}

Plan deserialize_plan_unchecked(const std::vector<uint8_t>& bytes, const std::string& source) {
  auto bad = [&](const std::string& what) { raise(ErrorKind::InvalidPlan, source + ": " + what); };
  if (bytes.size() < 8 + 4 + 8 + 8) bad("too short for a plan file (" + std::to_string(bytes.size()) + " bytes)");
  if (std::memcmp(bytes.data(), kMagic, 8) != 0) bad("not a dcp plan file (bad magic)");
  uint32_t version;
  std::memcpy(&version, bytes.data() + 8, 4);
  if (version != kPlanFormatVersion)
    bad("format version " + std::to_string(version) + ", this build reads " + std::to_string(kPlanFormatVersion));
  uint64_t size;
  std::memcpy(&size, bytes.data() + 12, 8);
  if (size != bytes.size() - 28)
    bad("payload size " + std::to_string(size) + " but file holds " + std::to_string(bytes.size() - 28) + " (truncated?)");
  uint64_t sum;
  std::memcpy(&sum, bytes.data() + 20 + size, 8);
  if (sum != fnv1a(bytes.data() + 20, size, kChecksumBasis)) bad("checksum mismatch");
  Reader r(bytes.data() + 20, size, source);
  Plan plan;
  PlanHeader& h = plan.header;
  h.format_version = version;
  h.world_size = r.i32();
  if (h.world_size < 1) r.fail("bad world size " + std::to_string(h.world_size));
  h.shape = get_shape(r);
  h.block_size = r.i64();
  h.max_block_tokens = r.i64();
  h.groups = get_groups(r);
  h.cluster = get_cluster(r);
  h.options.schedule.num_comm_stages = r.i32();
  h.options.schedule.balance_by_time = r.flag();
  h.options.schedule.two_phase = r.flag();
  h.options.reuse_slots = r.flag();
  h.method = r.str();
  BlockTable& t = plan.table;
  t.shape = get_shape(r);
  t.block_size = r.i64();
  t.groups = get_groups(r);
  t.seq_first_block = r.ivec();
  t.seq_length = r.lvec();
  t.seq_mask = r.vec<Mask>(50, [&] { return get_mask(r); });
  t.token_blocks = r.vec<TokenBlock>(32, [&] {
    TokenBlock b;
    b.seq = r.i32();
    b.index = r.i32();
    b.begin = r.i64();
    b.length = r.i64();
    b.global_begin = r.i64();
    return b;
  });
  t.tiles = r.vec<Tile>(25, [&] {
    Tile x;
    x.seq = r.i32();
    x.head_group = r.i32();
    x.q_block = r.i32();
    x.kv_block = r.i32();
    x.kind = r.enm<TileKind>(3, "tile kind");
    x.area = r.i64();
    return x;
  });
  plan.placement.method = r.str();
  plan.placement.num_devices = r.i32();
  plan.placement.block_home = r.ivec();
  plan.placement.tile_device = r.ivec();
  plan.placement.note = r.str();
  plan.devices = r.vec<DeviceProgram>(8, [&] {
    DeviceProgram dp;
    dp.device = r.i32();
    dp.owned_blocks = r.ivec();
    dp.owned_token_offset = r.lvec();
    dp.owned_tokens = r.i64();
    dp.fwd = get_program(r);
    dp.bwd = get_program(r);
    return dp;
  });
  if (!r.done()) r.fail("trailing bytes after the programs");
  if (static_cast<int>(plan.devices.size()) != h.world_size || plan.placement.num_devices != h.world_size)
    bad("header says world size " + std::to_string(h.world_size) + " but the plan has " +
        std::to_string(plan.devices.size()) + " programs");
  return plan;
}

void save_plan(const Plan& plan, const std::string& path) {
  std::vector<uint8_t> bytes = serialize_plan(plan);
  std::ofstream f(path, std::ios::binary);
  if (!f) raise(ErrorKind::System, path + ": cannot open for writing");
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!f) raise(ErrorKind::System, path + ": write failed");
}

Plan deserialize_plan(const std::vector<uint8_t>& bytes, const std::string& source) {
  Plan plan = deserialize_plan_unchecked(bytes, source);
  check_plan_structure(plan, source);
  return plan;
}

Plan load_plan_unchecked(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    raise(ErrorKind::InvalidInput, path + ": cannot read plan file (it is a directory)");
  std::ifstream f(path, std::ios::binary);
  if (!f) raise(ErrorKind::InvalidInput, path + ": cannot open plan file (" + std::strerror(errno) + ")");
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) raise(ErrorKind::InvalidInput, path + ": error while reading plan file");
  return deserialize_plan_unchecked(bytes, path);
}

Plan load_plan(const std::string& path) {
  Plan plan = load_plan_unchecked(path);
  check_plan_structure(plan, path);
  return plan;
}

void check_plan_world_size(const Plan& plan, int world_size, const std::string& where) {
  if (plan.header.world_size != world_size)
    raise(ErrorKind::InvalidPlan, where + ": plan for world size " + std::to_string(plan.header.world_size) +
                                      ", communicator has " + std::to_string(world_size));
}

}  // namespace dcp
