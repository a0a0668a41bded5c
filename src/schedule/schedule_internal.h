// Helpers shared by the schedule and plan builders (not part of the public interface).
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <utility>
#include <vector>

#include "dcp/blocks.h"
#include "dcp/cluster.h"
#include "dcp/error.h"
#include "dcp/schedule.h"

namespace dcp::sched {

// Point-to-point bandwidth (B/s) and latency between two devices; inter-node links share the
// node's NICs evenly between its devices.
double link_bw(const Cluster& c, int src, int dst);
double link_latency(const Cluster& c, int src, int dst);

// Reroute inter-node inputs needed by several devices of one node through one relay there;
// with relay_first_round, also blocks shared in the first round (the others' copies and the tiles
// reading them move one round later; needs at least 3 stages).
void apply_two_phase(const BlockTable& table, const Placement& placement, const Cluster& cluster,
                     bool relay_first_round, PassSchedule& ps);
// Proxies (proxies.cpp): crossings of inputs (round >= 2) and of partial outputs (before the
// final round) moved off each node's busiest inter-node ports to its idlest ones, receiving ports
// first, then sending ports, each through a proxy one round apart.
void proxy_inputs(const BlockTable& table, const Cluster& cluster, double slack, PassSchedule& ps);
void proxy_outputs(const BlockTable& table, const Cluster& cluster, double slack, PassSchedule& ps);
// Reduce inter-node partial outputs of several devices of one node at one relay there (among
// the sources ready last, the one whose port has sent the fewest bytes across nodes so far).
void reduce_outputs_per_node(const BlockTable& table, const Cluster& cluster, PassSchedule& ps);

// Bytes of one scheduled transfer as it crosses its link (BlockTable::partial_bytes).
inline int64_t transfer_bytes(const BlockTable& table, const ScheduledTransfer& t) {
  return table.partial_bytes(t.kind, table.token_blocks[static_cast<size_t>(t.token_block)].length);
}

// The largest DataKind value, a KeyPacker field's bound.
inline constexpr int64_t kMaxDataKind = static_cast<int64_t>(DataKind::Delta);

// Lexicographic keys of non-negative fields packed into one integer, most significant field
// first: key order is the fields' tuple order and equal keys are equal tuples, as long as every
// field stays within its width. Widths come from the fields' largest values; `fits` is false when
// they need more than 64 bits together.
class KeyPacker {
 public:
  KeyPacker(std::initializer_list<int64_t> max_values) {
    int total = 0;
    for (int64_t m : max_values) {
      const int w = m <= 0 ? 0 : static_cast<int>(std::bit_width(static_cast<uint64_t>(m)));
      widths_.push_back(w);
      total += w;
    }
    fits_ = total <= 64;
  }
  bool fits() const { return fits_; }
  uint64_t pack(std::initializer_list<int64_t> fields) const {
    uint64_t key = 0;
    size_t i = 0;
    for (int64_t f : fields) {
      const int w = widths_[i++];
      DCP_ASSERT(f >= 0 && (w == 64 || static_cast<uint64_t>(f) < (uint64_t{1} << w)));
      key = (w == 64 ? 0 : key << w) | static_cast<uint64_t>(f);
    }
    return key;
  }

 private:
  std::vector<int> widths_;
  bool fits_ = false;
};

// Sorts `v` as std::sort with the comparator `less` does, comparing `key(x)` (a packed KeyPacker
// key that orders as `less`) instead when `keyed`: std::sort's moves follow only the outcomes of
// its comparisons, and those are the same, so the order is the same, equal elements included.
template <class T, class Key, class Less>
void sort_keyed(std::vector<T>& v, bool keyed, Key key, Less less) {
  if (!keyed) {
    std::sort(v.begin(), v.end(), less);
    return;
  }
  std::vector<std::pair<uint64_t, T>> kv;
  kv.reserve(v.size());
  for (const T& x : v) kv.emplace_back(key(x), x);
  std::sort(kv.begin(), kv.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 0; i < v.size(); ++i) v[i] = kv[i].second;
}

}  // namespace dcp::sched
