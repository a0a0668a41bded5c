// Shared pieces of every level: incidence, full memory, move gains and the objective (flat and
// hierarchical), and the backend registry.
#include "placement/kway.h"

#include <algorithm>

#include "dcp/error.h"

namespace dcp::placement {

void SubHypergraph::finish_incidence() {
  const int32_t n = num_vertices();
  vertex_begin.assign(static_cast<size_t>(n) + 1, 0);
  for (int32_t v : pins) ++vertex_begin[static_cast<size_t>(v) + 1];
  for (int32_t v = 0; v < n; ++v) vertex_begin[v + 1] += vertex_begin[v];
  vertex_nets.resize(pins.size());
  vertex_pin.resize(pins.size());
  std::vector<int64_t> fill(vertex_begin.begin(), vertex_begin.end() - 1);
  for (int32_t e = 0; e < num_nets(); ++e)
    for (int64_t i = net_begin[e]; i < net_begin[e + 1]; ++i) {
      vertex_pin[fill[pins[i]]] = i;
      vertex_nets[fill[pins[i]]++] = e;
    }
}

std::vector<double> full_loads(const SubHypergraph& s, const std::vector<int32_t>& count, int k,
                               const std::vector<int32_t>& part) {
  std::vector<double> f(static_cast<size_t>(k), 0.0);
  for (int32_t v = 0; v < s.num_vertices(); ++v) f[part[v]] += s.memory[v];
  if (s.net_held.empty()) return f;
  for (int32_t e = 0; e < s.num_nets(); ++e) {
    const int32_t hp = s.net_home[e] >= 0 ? part[s.net_home[e]] : -1;
    const int32_t* c = &count[static_cast<size_t>(e) * k];
    for (int p = 0; p < k; ++p)
      if (c[p] > 0 && p != hp) f[p] += s.net_held[e];
  }
  return f;
}

void move_gains(const SubHypergraph& s, const int32_t* count, int k,
                const std::vector<int32_t>& part, int32_t v, int32_t from,
                std::vector<double>& gain, std::vector<int32_t>& node_scratch) {
  gain.assign(static_cast<size_t>(k), 0.0);
  if (!s.hierarchical()) {
    // Connectivity: leaving a part where v is the net's last pin saves the net's weight,
    // entering a part the net does not touch costs it.
    double leave = 0;
    for (int64_t i = s.vertex_begin[v]; i < s.vertex_begin[v + 1]; ++i) {
      const int32_t e = s.vertex_nets[i];
      const double w = s.net_weight[e];
      const int32_t* c = count + static_cast<size_t>(e) * k;
      if (c[from] == 1) leave += w;
      // Without a branch per part (x - 0.0 == x: the same gains).
      double* g = gain.data();
      for (int b = 0; b < k; ++b) g[b] -= c[b] == 0 ? w : 0.0;
    }
    for (int b = 0; b < k; ++b) gain[b] = b == from ? 0.0 : gain[b] + leave;
    return;
  }
  // Hierarchical: a part p touching net e costs w x f(p, H), f = 1 on the node of the home part
  // H and node_factor elsewhere. A pin other than the home changes only its own parts' terms;
  // moving the home changes every term, so its cost after the move is counted per node of the
  // parts the net still touches.
  const double x = s.node_factor;
  int32_t num_nodes = 0;
  for (int32_t n : s.part_node) num_nodes = std::max(num_nodes, n + 1);
  node_scratch.assign(static_cast<size_t>(num_nodes), 0);
  auto f = [&](int p, int h) { return h < 0 || s.part_node[p] == s.part_node[h] ? 1.0 : x; };
  for (int64_t i = s.vertex_begin[v]; i < s.vertex_begin[v + 1]; ++i) {
    const int32_t e = s.vertex_nets[i];
    const double w = s.net_weight[e];
    const int32_t* c = count + static_cast<size_t>(e) * k;
    const int32_t hv = s.net_home[e];
    if (hv != v) {
      const int32_t h = hv >= 0 ? part[hv] : -1;
      const double leave = c[from] == 1 && from != h ? w * f(from, h) : 0.0;
      for (int b = 0; b < k; ++b)
        if (b != from) gain[b] += leave - (c[b] == 0 && b != h ? w * f(b, h) : 0.0);
      continue;
    }
    double before = 0;
    int32_t touched = 0;  // parts touching the net once v has left `from`
    for (int p = 0; p < k; ++p) {
      if (c[p] == 0) continue;
      if (p != from) before += w * f(p, from);
      if (c[p] - (p == from ? 1 : 0) > 0) {
        ++touched;
        ++node_scratch[static_cast<size_t>(s.part_node[p])];
      }
    }
    for (int b = 0; b < k; ++b) {
      if (b == from) continue;
      const bool in = c[b] - (b == from ? 1 : 0) > 0;
      const int32_t same = node_scratch[static_cast<size_t>(s.part_node[b])] - (in ? 1 : 0);
      const int32_t other = touched - node_scratch[static_cast<size_t>(s.part_node[b])];
      gain[b] += before - w * (same + x * other);
    }
    for (int p = 0; p < k; ++p)
      if (c[p] - (p == from ? 1 : 0) > 0) node_scratch[static_cast<size_t>(s.part_node[p])] = 0;
  }
}

double move_gain(const SubHypergraph& s, const int32_t* count, int k,
                 const std::vector<int32_t>& part, int32_t v, int32_t from, int32_t to) {
  const bool hier = s.hierarchical();
  const double x = s.node_factor;
  auto f = [&](int p, int h) {
    return !hier || h < 0 || s.part_node[p] == s.part_node[h] ? 1.0 : x;
  };
  double g = 0;
  for (int64_t i = s.vertex_begin[v]; i < s.vertex_begin[v + 1]; ++i) {
    const int32_t e = s.vertex_nets[i];
    const double w = s.net_weight[e];
    const int32_t* c = count + static_cast<size_t>(e) * k;
    const int32_t hv = s.net_home.empty() ? -1 : s.net_home[e];
    if (!hier || hv != v) {
      // Under the flat cost every part counts alike, the home's included (connectivity - 1).
      const int32_t h = hier && hv >= 0 ? part[hv] : -1;
      if (c[from] == 1 && from != h) g += w * f(from, h);
      if (c[to] == 0 && to != h) g -= w * f(to, h);
      continue;
    }
    for (int p = 0; p < k; ++p) {
      const int32_t after = c[p] - (p == from ? 1 : 0) + (p == to ? 1 : 0);
      if (c[p] > 0 && p != from) g += w * f(p, from);
      if (after > 0 && p != to) g -= w * f(p, to);
    }
  }
  return g;
}

CapExcess cap_excess(const SubHypergraph& s, const PartCaps& caps, const std::vector<int32_t>& part) {
  const int k = caps.k();
  std::vector<double> c(static_cast<size_t>(k), 0.0), m(static_cast<size_t>(k), 0.0);
  for (int32_t v = 0; v < s.num_vertices(); ++v) {
    c[part[v]] += s.compute[v];
    m[part[v]] += s.memory[v];
  }
  auto over = [](double load, double cap) { return cap > 0 ? std::max(0.0, load - cap) / cap : 0.0; };
  CapExcess x;
  for (int p = 0; p < k; ++p) x.hard += over(c[p], caps.compute[p]) + over(m[p], caps.memory[p]);
  if (caps.has_full()) {
    // full_loads: owned memory, then each net's held bytes on every part it touches but its
    // home's, net by net (a part is seen once per net: the stamp of the last net that touched it).
    std::vector<double> f = m;
    if (!s.net_held.empty()) {
      std::vector<int32_t> seen(static_cast<size_t>(k), -1);
      for (int32_t e = 0; e < s.num_nets(); ++e) {
        const int32_t hp = s.net_home[e] >= 0 ? part[s.net_home[e]] : -1;
        for (int64_t i = s.net_begin[e]; i < s.net_begin[e + 1]; ++i) {
          const int32_t p = part[s.pins[i]];
          if (seen[p] == e) continue;
          seen[p] = e;
          if (p != hp) f[p] += s.net_held[e];
        }
      }
    }
    for (int p = 0; p < k; ++p) x.full += over(f[p], caps.full_memory[p]);
  }
  return x;
}

double sub_objective(const SubHypergraph& s, const std::vector<int32_t>& part, int k) {
  std::vector<int32_t> seen(static_cast<size_t>(k), -1);
  double total = 0;
  if (s.hierarchical()) {
    for (int32_t e = 0; e < s.num_nets(); ++e) {
      const int32_t h = s.net_home[e] >= 0 ? part[s.net_home[e]] : -1;
      if (h >= 0) seen[h] = e;
      for (int64_t i = s.net_begin[e]; i < s.net_begin[e + 1]; ++i) {
        const int32_t p = part[s.pins[i]];
        if (seen[p] == e) continue;
        seen[p] = e;
        total += s.net_weight[e] * (h < 0 || s.part_node[p] == s.part_node[h] ? 1.0 : s.node_factor);
      }
    }
    return total;
  }
  for (int32_t e = 0; e < s.num_nets(); ++e) {
    int32_t parts = s.net_external[e] ? 1 : 0;
    for (int64_t i = s.net_begin[e]; i < s.net_begin[e + 1]; ++i) {
      const int32_t p = part[s.pins[i]];
      if (seen[p] != e) {
        seen[p] = e;
        ++parts;
      }
    }
    if (parts > 1) total += s.net_weight[e] * (parts - 1);
  }
  return total;
}

std::unique_ptr<Partitioner> make_partitioner(PartitionerKind kind, int builtin_starts,
                                              const MultilevelOptions& ml, bool builtin_light,
                                              TaskPool* builtin_pool) {
  switch (kind) {
    case PartitionerKind::Builtin:
      return make_builtin_partitioner(builtin_starts, ml, builtin_light, builtin_pool);
    case PartitionerKind::Metis: return make_metis_partitioner();
    case PartitionerKind::Zoltan: return make_zoltan_partitioner();
  }
  raise(ErrorKind::InvalidInput, "partitioner: unknown kind");
}

}  // namespace dcp::placement
