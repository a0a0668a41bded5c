// Per-buffer last-writer / last-toucher analysis for CommStart ordering (see comm_order.h).
#include "dcp/detail/comm_order.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <type_traits>
#include <variant>

namespace dcp {
namespace {

using Key = std::tuple<uint8_t, uint8_t, int32_t>;  // (space, kind, index)

Key key_of(const BufRef& b) {
  return {static_cast<uint8_t>(b.space), static_cast<uint8_t>(b.kind), b.index};
}

struct LastUse {
  std::map<Key, int32_t> writer;  // last compute instruction writing the buffer
  std::map<Key, int32_t> toucher; // last compute instruction reading or writing it

  void read(const BufRef& b, int32_t i) {
    if (b.space != Space::None) toucher[key_of(b)] = i;
  }
  void write(const BufRef& b, int32_t i) {
    if (b.space == Space::None) return;
    writer[key_of(b)] = i;
    toucher[key_of(b)] = i;
  }
  static int32_t find(const std::map<Key, int32_t>& m, const BufRef& b) {
    const auto it = m.find(key_of(b));
    return it == m.end() ? kPassStartPoint : it->second;
  }
};

}  // namespace

CommOrder comm_order(const Program& program) {
  const auto n = program.code.size();
  CommOrder order;
  order.after.assign(n, kPassStartPoint);
  order.mark_after.assign(n, 0);
  LastUse last;
  for (size_t pos = 0; pos < n; ++pos) {
    const auto i = static_cast<int32_t>(pos);
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, Attend>) {
            for (const TileOp& t : x.tiles) {
              for (const BufRef* b : {&t.q, &t.kv, &t.d_o, &t.lse_in, &t.delta}) last.read(*b, i);
              // Accumulating outputs are read too; write() records both.
              for (const BufRef* b : {&t.out, &t.out_lse, &t.out_kv}) last.write(*b, i);
            }
          } else if constexpr (std::is_same_v<T, Merge>) {
            for (int32_t s : x.src_slots) last.read(BufRef{Space::Slot, x.kind, s}, i);
            for (int32_t s : x.src_lse_slots) last.read(BufRef{Space::Slot, DataKind::LSE, s}, i);
            last.write(x.dst, i);
            last.write(x.dst_lse, i);
          } else if constexpr (std::is_same_v<T, Copy>) {
            last.read(x.src, i);
            last.write(x.dst, i);
          } else if constexpr (std::is_same_v<T, CommStart>) {
            int32_t dep = kPassStartPoint;
            for (const Transfer& t : x.ops)
              dep = std::max(dep, LastUse::find(t.send ? last.writer : last.toucher, t.buf));
            order.after[pos] = dep;
            if (dep != kPassStartPoint) order.mark_after[static_cast<size_t>(dep)] = 1;
          }
          // CommWait: the compute stream waits for the round; nothing to record.
        },
        program.code[pos]);
  }
  return order;
}

}  // namespace dcp
