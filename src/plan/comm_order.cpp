// Per-buffer last-writer / last-toucher analysis for CommStart ordering (see comm_order.h).
#include "dcp/detail/comm_order.h"

#include <algorithm>
#include <type_traits>
#include <variant>

namespace dcp {
namespace {

// Per buffer (space, kind, index): the last compute instruction writing it and the last one
// reading or writing it. Indices are dense (owned-block positions, slot numbers), so each
// (space, kind) keeps a vector grown on demand; untouched entries hold kPassStartPoint.
struct LastUse {
  static constexpr int kSpaces = 3;  // Space::None, Local, Slot
  std::vector<int32_t> writer[kSpaces * kNumDataKinds];
  std::vector<int32_t> toucher[kSpaces * kNumDataKinds];

  static int table_of(const BufRef& b) {
    return static_cast<int>(b.space) * kNumDataKinds + static_cast<int>(b.kind);
  }
  static void set(std::vector<int32_t>& v, int32_t index, int32_t i) {
    if (index < 0) return;  // only in plans that fail validation; never a real buffer
    const auto at = static_cast<size_t>(index);
    if (at >= v.size()) v.resize(std::max(at + 1, 2 * v.size()), kPassStartPoint);
    v[at] = i;
  }
  void read(const BufRef& b, int32_t i) {
    if (b.space != Space::None) set(toucher[table_of(b)], b.index, i);
  }
  void write(const BufRef& b, int32_t i) {
    if (b.space == Space::None) return;
    set(writer[table_of(b)], b.index, i);
    set(toucher[table_of(b)], b.index, i);
  }
  static int32_t find(const std::vector<int32_t>& v, const BufRef& b) {
    const auto at = static_cast<size_t>(b.index);
    return b.index >= 0 && at < v.size() ? v[at] : kPassStartPoint;
  }
  int32_t last_writer(const BufRef& b) const { return find(writer[table_of(b)], b); }
  int32_t last_toucher(const BufRef& b) const { return find(toucher[table_of(b)], b); }
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
              dep = std::max(dep, t.send ? last.last_writer(t.buf) : last.last_toucher(t.buf));
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
