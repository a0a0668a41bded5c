// Balance repair: moves vertices out of parts over a capacity, cheapest objective increase
// first; parts over their full-memory bound also shed whole remote groups.
#include <algorithm>
#include <tuple>

#include "placement/kway.h"

namespace dcp::placement {

namespace {

// Pin counts per (net, part) and loads per part, updated move by move.
struct State {
  const SubHypergraph& s;
  int k;
  std::vector<int32_t> count;  // net * k + part
  const std::vector<int32_t>& part;
  std::vector<double> load_c, load_m, load_f;  // compute, owned memory, full memory
  std::vector<double> gain_scratch;

  State(const SubHypergraph& sub, int num_parts, const std::vector<int32_t>& p)
      : s(sub), k(num_parts), part(p) {
    load_c.assign(k, 0.0);
    load_m.assign(k, 0.0);
    for (int32_t v = 0; v < s.num_vertices(); ++v) {
      load_c[part[v]] += s.compute[v];
      load_m[part[v]] += s.memory[v];
    }
    // Full memory (full_loads) with the pin counts: owned memory first, then each net's held
    // bytes on every part it touches but its home's, added when the part's first pin is counted
    // (net by net, so each part's sum runs in full_loads' order).
    load_f = load_m;
    const bool held = !s.net_held.empty();
    count.assign(static_cast<size_t>(s.num_nets()) * k, 0);
    for (int32_t e = 0; e < s.num_nets(); ++e) {
      int32_t* c = &count[static_cast<size_t>(e) * k];
      const int32_t hp = held && s.net_home[e] >= 0 ? part[s.net_home[e]] : -1;
      for (int64_t i = s.net_begin[e]; i < s.net_begin[e + 1]; ++i) {
        const int32_t q = part[s.pins[i]];
        if (++c[q] == 1 && held && q != hp) load_f[q] += s.net_held[e];
      }
    }
    gain_scratch.assign(k, 0.0);
  }

  // gain_scratch[b] = objective decrease when v moves from `from` to b (0 for b == from).
  void gains(int32_t v, int32_t from) {
    move_gains(s, count.data(), k, part, v, from, gain_scratch, node_scratch);
  }
  std::vector<int32_t> node_scratch;

  void move(int32_t v, int32_t from, int32_t to, std::vector<int32_t>& part_out) {
    double d_from, d_to;
    held_delta(s, count.data(), k, part, v, from, to, d_from, d_to);
    load_f[from] += d_from;
    load_f[to] += d_to;
    for (int64_t i = s.vertex_begin[v]; i < s.vertex_begin[v + 1]; ++i) {
      const size_t e = static_cast<size_t>(s.vertex_nets[i]) * k;
      --count[e + from];
      ++count[e + to];
    }
    load_c[from] -= s.compute[v];
    load_m[from] -= s.memory[v];
    load_c[to] += s.compute[v];
    load_m[to] += s.memory[v];
    part_out[v] = to;
  }

  // `leave` caches v's full-memory change of its own part across the calls of one vertex in an
  // unchanged state: kLeaveUnknown until the first call that needs it sets it.
  bool fits(int32_t v, int b, const PartCaps& caps, double& leave) const {
    // A resource the vertex does not carry cannot block it (a tile may enter a part whose
    // memory is over its bound).
    if (!((s.compute[v] <= 0 || load_c[b] + s.compute[v] <= caps.compute[b]) &&
          (s.memory[v] <= 0 || load_m[b] + s.memory[v] <= caps.memory[b])))
      return false;
    if (!caps.has_full()) return true;
    const int32_t from = part[v];
    double d_from, d_to;
    held_delta_to(s, count.data(), k, part, v, b, leave, d_from, d_to);
    return (d_to <= 0 || load_f[b] + d_to <= caps.full_memory[b]) &&
           (d_from <= 0 || load_f[from] + d_from <= caps.full_memory[from]);
  }
  bool full_over(int p, const PartCaps& caps) const {
    return caps.has_full() && load_f[p] > caps.full_memory[p];
  }
  // True when moving v out of p lowers p's full memory.
  bool relieves_full(int32_t v, int32_t p) const {
    double d_from, d_to;
    held_delta(s, count.data(), k, part, v, p, p == 0 ? 1 : 0, d_from, d_to);
    return d_from < 0;
  }
};

// Parts over their full-memory bound shed remote groups they hold. A single tile rarely frees a
// copy (the rows of a band share it), so all of the part's pins of one remote net move together:
// to the net's home part when they fit there, else to the part touching the net with the most
// room. Nets with the fewest pins in the part go first (cheapest compute to move). Returns true
// when it moved a vertex.
bool shed_remote_groups(const SubHypergraph& s, const PartCaps& caps, State& st,
                        std::vector<int32_t>& part) {
  bool moved = false;
  const int k = caps.k();
  std::vector<std::pair<int32_t, int32_t>> found, nets;  // (pins in p, net)
  std::vector<int32_t> at;                                // counting sort: bucket starts
  std::vector<int32_t> pins;
  for (int round = 0; round < 8; ++round) {
    bool moved_any = false;
    for (int p = 0; p < k; ++p) {
      if (!st.full_over(p, caps)) continue;
      // The remote nets p touches, by pins in p and then by net id: found in net order, so a
      // stable counting sort by pin count gives that order.
      found.clear();
      int32_t max_c = 0;
      for (int32_t e = 0; e < s.num_nets(); ++e) {
        const int32_t c = st.count[static_cast<size_t>(e) * k + p];
        if (c == 0) continue;
        const int32_t hp = s.net_home[e] >= 0 ? part[s.net_home[e]] : -1;
        if (hp == p) continue;
        found.emplace_back(c, e);
        max_c = std::max(max_c, c);
      }
      at.assign(static_cast<size_t>(max_c) + 2, 0);
      for (const auto& f : found) ++at[static_cast<size_t>(f.first) + 1];
      for (int32_t c = 1; c <= max_c; ++c) at[static_cast<size_t>(c) + 1] += at[c];
      nets.resize(found.size());
      for (const auto& f : found) nets[static_cast<size_t>(at[f.first]++)] = f;
      for (const auto& [c, e] : nets) {
        if (!st.full_over(p, caps)) break;
        const int32_t hp = s.net_home[e] >= 0 ? part[s.net_home[e]] : -1;
        int32_t target = hp;
        if (target < 0 || target == p) {
          target = -1;
          for (int b = 0; b < k; ++b) {
            if (b == p || st.count[static_cast<size_t>(e) * k + b] == 0) continue;
            if (target < 0 || caps.full_memory[b] - st.load_f[b] >
                                  caps.full_memory[target] - st.load_f[target])
              target = b;
          }
        }
        if (target < 0) continue;
        // The net's pins in p other than its home, in pin order (the scan stops at the last).
        int32_t left = st.count[static_cast<size_t>(e) * k + p] - (hp == p ? 1 : 0);
        pins.clear();
        for (int64_t i = s.net_begin[e]; i < s.net_begin[e + 1] && left > 0; ++i)
          if (part[s.pins[i]] == p && s.pins[i] != s.net_home[e]) {
            pins.push_back(s.pins[i]);
            --left;
          }
        for (int32_t u : pins) {
          if (double leave = kLeaveUnknown; !st.fits(u, target, caps, leave)) continue;
          st.move(u, p, target, part);
          moved_any = true;
        }
      }
    }
    if (!moved_any) break;
    moved = true;
  }
  return moved;
}

// repair_balance stops after this many rounds in a row that lower no excess over the caps.
constexpr int kMaxStalledRounds = 2;

}  // namespace

bool repair_balance(const SubHypergraph& s, const PartCaps& caps, std::vector<int32_t>& part) {
  const int k = caps.k();
  if (!caps.has_full()) {
    // Without a full-memory bound the loads alone say whether anything is over (most calls:
    // refined partitions and starts that already fit); the pin counts are built only then.
    std::vector<double> c(static_cast<size_t>(k), 0.0), m(static_cast<size_t>(k), 0.0);
    for (int32_t v = 0; v < s.num_vertices(); ++v) {
      c[part[v]] += s.compute[v];
      m[part[v]] += s.memory[v];
    }
    bool any = false;
    for (int p = 0; p < k; ++p) any = any || c[p] > caps.compute[p] || m[p] > caps.memory[p];
    if (!any) return true;
  }
  State st(s, k, part);
  auto over = [&](int p) {
    return st.load_c[p] > caps.compute[p] || st.load_m[p] > caps.memory[p] ||
           st.full_over(p, caps);
  };
  // How far the parts are over their caps (as cap_excess), from the loads.
  auto excess = [&] {
    auto share = [](double load, double cap) { return cap > 0 ? std::max(0.0, load - cap) / cap : 0.0; };
    CapExcess x;
    for (int p = 0; p < k; ++p) {
      x.hard += share(st.load_c[p], caps.compute[p]) + share(st.load_m[p], caps.memory[p]);
      if (caps.has_full()) x.full += share(st.load_f[p], caps.full_memory[p]);
    }
    return x;
  };
  CapExcess best_excess = excess();
  int stalled = 0;
  for (int round = 0; round < 16; ++round) {
    bool any_over = false;
    for (int p = 0; p < k; ++p) any_over = any_over || over(p);
    if (!any_over) return true;
    // (gain, vertex, target), best gain first; ties by vertex id for determinism.
    std::vector<std::tuple<double, int32_t, int32_t>> cand;
    auto needs_move = [&](int32_t v, int32_t p) {
      return (st.load_c[p] > caps.compute[p] && s.compute[v] > 0) ||
             (st.load_m[p] > caps.memory[p] && s.memory[v] > 0) ||
             (st.full_over(p, caps) && st.relieves_full(v, p));
    };
    for (int32_t v = 0; v < s.num_vertices(); ++v) {
      const int32_t p = part[v];
      if (!needs_move(v, p)) continue;
      st.gains(v, p);
      int32_t best = -1;
      double leave = kLeaveUnknown;
      for (int b = 0; b < k; ++b) {
        if (b == p || (best >= 0 && !(st.gain_scratch[b] > st.gain_scratch[best])) ||
            !st.fits(v, b, caps, leave))
          continue;
        best = b;
      }
      if (best >= 0) cand.emplace_back(st.gain_scratch[best], v, best);
    }
    std::sort(cand.begin(), cand.end(), [](const auto& a, const auto& b) {
      if (std::get<0>(a) != std::get<0>(b)) return std::get<0>(a) > std::get<0>(b);
      return std::get<1>(a) < std::get<1>(b);
    });
    int moved = 0;
    for (const auto& [g, v, b] : cand) {
      const int32_t p = part[v];
      if (double leave = kLeaveUnknown; !needs_move(v, p) || !st.fits(v, b, caps, leave)) continue;
      st.move(v, p, b, part);
      ++moved;
    }
    // A round that moves nothing leaves the state as it found it, so every later round would
    // repeat it: stop.
    if (caps.has_full()) {
      bool full_left = false;
      for (int p = 0; p < k; ++p) full_left = full_left || st.full_over(p, caps);
      if (full_left && shed_remote_groups(s, caps, st, part)) ++moved;
    }
    if (moved == 0) break;
    // Rounds that keep moving vertices without lowering the excess go round in circles (groups
    // shed by one part overload another): stop after kMaxStalledRounds of them.
    const CapExcess x = excess();
    if (x.less(best_excess)) {
      best_excess = x;
      stalled = 0;
    } else if (++stalled >= kMaxStalledRounds) {
      break;
    }
  }
  for (int p = 0; p < k; ++p)
    if (over(p)) return false;
  return true;
}

}  // namespace dcp::placement
