// placement/kway.h — one level of the hierarchical placement: a k-way partition of a
// sub-hypergraph under two per-part capacities, and the backends that compute it.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "dcp/partition.h"

namespace dcp {
class TaskPool;  // core/task_pool.h
}

namespace dcp::placement {

// The vertices and nets one level sees. At the node level that is everything; at the device
// level, the vertices of one node, with nets cut down to their pins inside the node.
struct SubHypergraph {
  std::vector<int32_t> global;     // sub vertex -> hypergraph vertex
  std::vector<double> compute;     // per sub vertex
  std::vector<double> memory;      // per sub vertex
  // Preferred companion for the initial placement: the Q-side (else KV-side) token block
  // of a tile, as a sub vertex; -1 for token blocks and tiles whose blocks live elsewhere.
  std::vector<int32_t> anchor;
  // Geometry (what the built-in backend exploits; other backends ignore it). Per sub vertex:
  // the sequence, the head group (-1 for a token block), the query block and the key block
  // (both = the block itself for a token block), as global token block ids.
  std::vector<int32_t> seq, group, row, col;
  // Devices each part of this level is split into later (the node level of a cluster with
  // several devices per node). Cutting by head group across such parts is then avoided: the
  // next level wants whole rows to cut by group without fetching remote data twice.
  int sub_parts = 1;
  std::vector<int64_t> net_begin;  // CSR over sub nets
  std::vector<int32_t> pins;       // sub vertex ids
  std::vector<double> net_weight;  // objective weight per extra part
  // 1 when the net also touches a fixed part outside this level (its home lies elsewhere):
  // the cost is then weight x parts touched, not weight x (parts - 1).
  std::vector<uint8_t> net_external;
  // Full-memory accounting (empty = not tracked): per net, the bytes a part other than the
  // home's holds while it touches the net (received copies and fp32 partials), and the sub
  // vertex of the net's home (-1 when the home lies outside this level: every part touching
  // the net then holds a copy).
  std::vector<double> net_held;
  std::vector<int32_t> net_home;
  std::vector<int64_t> vertex_begin;  // CSR vertex -> sub nets
  std::vector<int32_t> vertex_nets;
  std::vector<int64_t> vertex_pin;    // parallel to vertex_nets: the pin's index in `pins`
  // Hierarchical cost (empty = flat): the node of every part of this level. A part touching a
  // net costs net_weight when it shares the node of the part holding the net's home, and
  // net_weight x node_factor when not (the objective across all devices at once: intra-node
  // bytes + inter_weight x inter-node bytes). Needs net_home.
  std::vector<int32_t> part_node;
  double node_factor = 1;

  int32_t num_vertices() const { return static_cast<int32_t>(global.size()); }
  int32_t num_nets() const { return static_cast<int32_t>(net_weight.size()); }
  bool hierarchical() const { return !part_node.empty(); }
  void finish_incidence();  // fills vertex_begin / vertex_nets from the pins
};

struct PartCaps {
  std::vector<double> compute;  // per part: upper bound
  std::vector<double> memory;
  // Per part: bound on everything it holds (owned memory + held copies); empty = unbounded.
  // Only meaningful when the sub-hypergraph tracks net_held.
  std::vector<double> full_memory;
  int k() const { return static_cast<int>(compute.size()); }
  bool has_full() const { return !full_memory.empty(); }
};

// Full memory per part (owned + held copies) for pin counts `count` (net * k + part).
std::vector<double> full_loads(const SubHypergraph& s, const std::vector<int32_t>& count, int k,
                               const std::vector<int32_t>& part);

// Change of the full memory of `from` and `to` when v moves between them (counts before the
// move): a tile entering a part that does not hold its Q/KV group adds the held bytes; a home
// leaving a part where its tiles stay leaves a copy behind there.
inline void held_delta(const SubHypergraph& s, const int32_t* count, int k,
                       const std::vector<int32_t>& part, int32_t v, int32_t from, int32_t to,
                       double& d_from, double& d_to) {
  d_from = -s.memory[v];
  d_to = s.memory[v];
  if (s.net_held.empty()) return;
  for (int64_t i = s.vertex_begin[v]; i < s.vertex_begin[v + 1]; ++i) {
    const int32_t e = s.vertex_nets[i];
    const double held = s.net_held[e];
    const int32_t* c = count + static_cast<size_t>(e) * k;
    const int32_t home = s.net_home[e];
    if (home == v) {
      if (c[to] > 0) d_to -= held;
      if (c[from] > 1) d_from += held;
    } else {
      const int32_t hp = home >= 0 ? part[home] : -1;
      if (c[from] == 1 && from != hp) d_from -= held;
      if (c[to] == 0 && to != hp) d_to += held;
    }
  }
}

// held_delta's d_to alone (the same terms in the same order, so the same value): where one
// vertex is checked against several targets, its d_from is the same for all of them.
inline double held_enter(const SubHypergraph& s, const int32_t* count, int k,
                         const std::vector<int32_t>& part, int32_t v, int32_t to) {
  double d_to = s.memory[v];
  if (s.net_held.empty()) return d_to;
  for (int64_t i = s.vertex_begin[v]; i < s.vertex_begin[v + 1]; ++i) {
    const int32_t e = s.vertex_nets[i];
    const int32_t* c = count + static_cast<size_t>(e) * k;
    const int32_t home = s.net_home[e];
    if (home == v) {
      if (c[to] > 0) d_to -= s.net_held[e];
    } else if (c[to] == 0 && to != (home >= 0 ? part[home] : -1)) {
      d_to += s.net_held[e];
    }
  }
  return d_to;
}

// held_delta for one of several targets of v in an unchanged state: `leave` carries d_from from
// the first call (kLeaveUnknown before it), so the later targets walk only d_to's terms.
inline constexpr double kLeaveUnknown = std::numeric_limits<double>::quiet_NaN();
inline void held_delta_to(const SubHypergraph& s, const int32_t* count, int k, const std::vector<int32_t>& part,
                          int32_t v, int32_t to, double& leave, double& d_from, double& d_to) {
  if (std::isnan(leave)) {
    held_delta(s, count, k, part, v, part[v], to, d_from, d_to);
    leave = d_from;
  } else {
    d_from = leave;
    d_to = held_enter(s, count, k, part, v, to);
  }
}

double sub_objective(const SubHypergraph& s, const std::vector<int32_t>& part, int k);

// How far `part` is over the capacities: the sum over parts of the excess as a share of the
// bound, for compute and owned memory (`hard`) and for full memory (`full`); 0 when they hold.
// Ranks partitions that cannot meet every bound: compute and owned memory come first.
struct CapExcess {
  double hard = 0, full = 0;
  // Less excess: the hard bounds first, then full memory (differences under 1e-9 are ties).
  bool less(const CapExcess& o) const {
    if (std::abs(hard - o.hard) > 1e-9) return hard < o.hard;
    return full < o.full - 1e-9;
  }
  bool same(const CapExcess& o) const { return !less(o) && !o.less(*this); }
};
CapExcess cap_excess(const SubHypergraph& s, const PartCaps& caps, const std::vector<int32_t>& part);

// gain[b] = objective decrease when v moves from `from` to part b (gain[from] = 0), exact for
// the flat and the hierarchical cost, with pin counts `count` (net * k + part) before the move.
// `node_scratch` is resized as needed.
void move_gains(const SubHypergraph& s, const int32_t* count, int k,
                const std::vector<int32_t>& part, int32_t v, int32_t from,
                std::vector<double>& gain, std::vector<int32_t>& node_scratch);
// The same gain for one target part `to` (either cost).
double move_gain(const SubHypergraph& s, const int32_t* count, int k,
                 const std::vector<int32_t>& part, int32_t v, int32_t from, int32_t to);

// Moves vertices out of parts over a capacity, cheapest objective increase first, in rounds;
// no move puts a part over a cap, so the excess over the caps (cap_excess) never grows. Stops
// when every capacity holds, or after a round that moves nothing or two in a row that lower no
// excess. Returns true when every capacity holds afterwards.
bool repair_balance(const SubHypergraph& s, const PartCaps& caps, std::vector<int32_t>& part);

// Structured initial placement ("pack, then split only what must be split"): sequences by
// decreasing size, each placed whole on the part with the most room where it fits both caps;
// a sequence that fits nowhere is cut over the parts with the most room, trying row bands and
// head-group-major cuts and keeping the cheapest by the exact objective. Needs the geometry
// fields. Parts may end over a cap when the total does not fit; callers repair.
// Best: per cut sequence, the cheapest of every candidate cut. GroupFirst: head-group-major cuts
// wherever a sequence has several groups (also at a level whose parts are split again).
// Zigzag: zigzag row runs wherever a sequence has more than two rows. The built-in backend runs
// all three through repair and FM and keeps the best (a portfolio: FM ends in different local
// optima from different starts). SharedBands: Best plus bands shared by 2 or 3 parts (cut by key
// block) at the bottom of a sequence cut over kSharedBandsMinParts or more parts (so the same
// as Best on fewer parts than that).
// GroupSplit: every tile on the part of its head group (group g on part g * k / G; only where
// the G head groups divide evenly over the k parts), homes placed afterwards where their nets
// are: see BuiltinPartitioner for when it runs.
enum class InitialStrategy { Best, GroupFirst, Zigzag, SharedBands, GroupSplit };
constexpr int kSharedBandsMinParts = 5;
// `shared_bands_apply` (may be null) is set to whether a sequence was cut over
// kSharedBandsMinParts or more parts in more than two rows, where SharedBands tries its shared
// bands: from a Best run that saw none, SharedBands would make the same placement.
std::vector<int32_t> structured_initial(const SubHypergraph& s, const PartCaps& caps,
                                        InitialStrategy strategy = InitialStrategy::Best,
                                        bool* shared_bands_apply = nullptr);
// The Best and the SharedBands starts at once (returns Best's, SharedBands's into `shared`, and
// each one's shared_bands_apply where not null), the same as two structured_initial calls:
// they share every cut up to the first sequence where a shared band wins.
std::vector<int32_t> structured_best_and_shared(const SubHypergraph& s, const PartCaps& caps,
                                                std::vector<int32_t>& shared, bool* best_apply = nullptr,
                                                bool* shared_apply = nullptr);

// k-way FM passes (best exact gain first, negative gains allowed inside a pass, rollback to
// the best prefix) that keep both capacities; never increases the objective. `pool` (may be
// null) evaluates a large level's pass set-up on several threads; the result is the same.
void refine_fm(const SubHypergraph& s, const PartCaps& caps, const RefineOptions& opts, uint64_t seed,
               std::vector<int32_t>& part, TaskPool* pool = nullptr);
// The same FM, each pass set up only from the vertices near `around` (each one and the pins of
// its nets), a region that every pass widens by the vertices it moved; a move inside a pass still
// renews (and may queue) any neighbour. After a local change (a repair that moved a few vertices)
// it refines where the change is at a cost that does not grow with the whole level; a pass's idle
// limit (RefineOptions::idle_moves_share) counts the vertices first set up, not the level's.
// Same guarantees as refine_fm.
void refine_fm_around(const SubHypergraph& s, const PartCaps& caps, const RefineOptions& opts,
                      uint64_t seed, std::vector<int32_t>& part, const std::vector<int32_t>& around,
                      TaskPool* pool = nullptr);

class Partitioner {
 public:
  virtual ~Partitioner() = default;
  // Post: part has one id in [0, caps.k()) per sub vertex. Capacities are targets; the driver
  // repairs and checks what comes back.
  virtual std::vector<int32_t> partition(const SubHypergraph& s, const PartCaps& caps,
                                         uint64_t seed, const RefineOptions& refine) const = 0;
  // Several partitions of the level, the best first (by the level's objective, those that meet
  // the capacities first); the driver may carry more than one through the next level. Default:
  // the one of partition().
  virtual std::vector<std::vector<int32_t>> candidates(const SubHypergraph& s, const PartCaps& caps,
                                                       uint64_t seed, const RefineOptions& refine) const {
    return {partition(s, caps, seed, refine)};
  }
};

// `starts`: structured starts tried at a device level (1: Best; 2: + Zigzag; 3: + GroupFirst;
// GroupSplit is added where the head groups divide evenly over the parts); `ml`: the multilevel
// scheme (V-cycles and the multilevel start) when enabled; `light`: at a level whose parts are
// split again, the Best structured start alone (PlacementOptions::large_vertices); `pool`
// (may be null): runs the portfolio's starts at the same time (the result is the same with any
// thread count, task_pool.h); it must outlive the partitioner.
std::unique_ptr<Partitioner> make_builtin_partitioner(int starts, const MultilevelOptions& ml,
                                                      bool light = false, TaskPool* pool = nullptr);
std::unique_ptr<Partitioner> make_metis_partitioner();
std::unique_ptr<Partitioner> make_zoltan_partitioner();  // throws Unsupported when not built
std::unique_ptr<Partitioner> make_partitioner(PartitionerKind kind, int builtin_starts,
                                              const MultilevelOptions& ml, bool builtin_light = false,
                                              TaskPool* builtin_pool = nullptr);

// splitmix64: the project's portable PRNG step.
inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace dcp::placement
