// dcp/partition.h — the DCP placement: a hierarchical, balanced hypergraph partition of a
// block table onto a cluster (nodes first, then the devices of each node).
//
// The placement hypergraph (one per block table):
//   vertices  [0, num_tiles)            : tiles, in table order; compute weight = fwd + bwd FLOPs,
//                                         memory weight 0.
//             [num_tiles, + num_blocks) : token blocks, in table order; memory weight = every
//                                         tensor the home owns (all head groups, fwd + bwd),
//                                         compute weight 0. All heads of a token block share
//                                         one home, hence one vertex per token block.
//   nets      per token block t, in this order: one Q-side net per head group g, then one
//             KV-side net per KV set s. Pins: the token-block vertex first (the home), then every
//             tile reading or writing that data, in table order. Weight = bytes moved to/from
//             one extra device, forward + backward (the model of metrics.h):
//               Q-side : Q + O partial + LSE (fwd), Q + dO + LSE + Delta + dQ partial (bwd)
//               KV-side: KV (fwd), KV + dKV partial (bwd)
//             Partials (O, dQ, dKV) count in fp32 (BlockTable::partial_bytes), copies in the
//             element type (data_bytes).
// Objective: sum over nets of bytes x (devices touching the net - 1), where a remote device on
// another node than the home costs Cluster::inter_weight() per byte. This equals the
// intra + inter bytes of compute_metrics() for the same placement.
//
// Constraints (both enforced, then checked on the final placement):
//   per device: compute <= (1 + eps_compute) x mean, owned memory <= (1 + eps_memory) x mean,
//   and full memory (owned + received copies + partials) <= (1 + eps_memory) x its mean.
//   per node (first level): the same with eps x node_eps_factor (the node level aims there;
//   it accepts up to eps). Why 1/2 by default: the per-device bound is against the global
//   mean, so a node at (1 + eps) x its share would need a perfect split of its devices; a node
//   held to eps/2 leaves every device eps/2 of slack for tile and token-block granularity,
//   while still letting the node level (where bytes are expensive) trade balance for bytes.
//   Measured on bench_placement's instances (bench/results/placement.md): 1/2 moves 5-15% fewer
//   inter-node bytes than 1/4; 1 is no better on average and worse on longalign. (The paper's
//   "x4 between nodes" loosens the node level instead; with a global per-device bound that
//   cannot hold.) When a node's share still cannot be split (token blocks are coarse: a few
//   per device), a last repair moves blocks across nodes; what remains is reported.
// A placement that still violates a bound after repair is returned with the violations listed
// in the report (PlacementReport::violations); callers must look at them.
#pragma once

#include <array>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "dcp/blocks.h"
#include "dcp/cluster.h"
#include "dcp/placement.h"

namespace dcp {

// ---- the hypergraph ------------------------------------------------------------------------

struct PlacementHypergraph {
  int32_t num_tiles = 0;
  int32_t num_token_blocks = 0;
  int32_t num_head_groups = 0;         // Q-side nets per token block
  int32_t nets_per_block = 0;          // head groups + KV sets
  std::vector<double> compute_flops;   // per vertex
  std::vector<int64_t> memory_bytes;   // per vertex
  std::vector<int64_t> net_begin;      // CSR over nets; size num_nets + 1
  std::vector<int32_t> pins;           // first pin of each net = its token-block vertex
  std::vector<int64_t> net_bytes;      // per net
  // Bytes a device other than the home holds while it touches the net (received copies and
  // fp32 partial buffers, as compute_metrics counts memory), in the forward and the backward
  // working set. The backward set is the larger for every net (it adds dO, Delta and the fp32
  // dQ / dKV partials), so refinement charges held_bwd_bytes per (net, remote device).
  std::vector<int64_t> held_fwd_bytes;  // per net
  std::vector<int64_t> held_bwd_bytes;  // per net

  int32_t num_vertices() const { return num_tiles + num_token_blocks; }
  int32_t num_nets() const { return static_cast<int32_t>(net_bytes.size()); }
  int32_t block_vertex(int32_t token_block) const { return num_tiles + token_block; }
};

// Compute weight of a tile: fwd FLOPs x fwd[kind] + bwd FLOPs x bwd[kind], kind indexing
// TileKind (Full, CausalDiagonal, Partial). All ones (the default) weigh mask-area FLOPs; the
// planner sets full-forward-rate equivalents from its calibration (planner.h), so that the
// balance bounds hold on predicted kernel time: measured on 2 x H200, FLOP-balanced ranks
// differed by 13% in forward Attend time because one held more diagonal tiles.
struct TileCost {
  std::array<double, 3> fwd{1.0, 1.0, 1.0};
  std::array<double, 3> bwd{1.0, 1.0, 1.0};
  double weight(const BlockTable& table, const Tile& t) const;
  bool is_flops() const;  // all ones
};

// Pre: table.validate() passes. Post: every tile is a pin of exactly two nets (its Q-side and
// KV-side group) and every token block of nets_per_block nets; compute_flops[tile] is
// cost.weight() (FLOPs by default).
PlacementHypergraph build_placement_hypergraph(const BlockTable& table, const TileCost& cost = {});

// Vertex -> device from a placement (tiles, then token blocks) and back.
std::vector<int32_t> placement_to_parts(const PlacementHypergraph& h, const Placement& p);
Placement parts_to_placement(const PlacementHypergraph& h, const std::vector<int32_t>& parts,
                             int num_devices, const std::string& method);

// Bytes the placement moves by the hypergraph model: remote devices on the home's node count
// as intra, on other nodes as inter (as compute_metrics counts them).
struct ConnectivityBytes {
  int64_t intra_bytes = 0;
  int64_t inter_bytes = 0;
  double objective = 0;  // intra + inter_weight x inter
};
ConnectivityBytes connectivity_bytes(const PlacementHypergraph& h,
                                     const std::vector<int32_t>& parts, const Cluster& cluster);

// Everything each device holds (compute_metrics' DeviceLoad::memory_bytes): owned bytes plus
// the larger of the forward and backward sums of held bytes over the nets it touches remotely.
std::vector<int64_t> full_memory_bytes(const PlacementHypergraph& h,
                                       const std::vector<int32_t>& parts, int num_devices);

// ---- options, report, entry point -----------------------------------------------------------

enum class PartitionerKind { Builtin, Metis, Zoltan };
const char* to_string(PartitionerKind kind);                  // "builtin", "metis", "zoltan"
PartitionerKind parse_partitioner(const std::string& name);   // throws InvalidInput
// Backends compiled into this build (Zoltan is optional).
std::vector<PartitionerKind> available_partitioners();

// The built-in backend's multilevel scheme (src/placement/coarsen.cpp, multilevel.cpp): every
// start is refined by a V-cycle (coarsened inside its parts, FM on every level back up), and a
// multilevel start (coarsened freely, partitioned on the coarsest level, FM on the way up) joins
// the structured ones. Measurements below (made while tuning, before node_candidate_margin was
// raised): `bench/compare_partitioners export DIR --set ...` on its 24 seed-1 instances,
// objective = geometric mean of the built-in's over the best feasible hierarchical Mt-KaHyPar
// result of a first reference run, time = the built-in's planning time summed over the
// instances (one core). Without the scheme: 1.21 and 0.62 s; with these defaults: 0.85 and
// 1.36 s. Current figures: bench/results/placement_vs_kahypar.md.
struct MultilevelOptions {
  bool enabled = true;
  // Coarsening stops at this many vertices per part: 20 gave 0.87 (1.52 s), 40 0.85 (1.36 s),
  // 160 (Mt-KaHyPar's default) 1.00 (1.26 s): the tiles of a sequence form chains that coarsen
  // into few, well-shaped clusters.
  int vertices_per_part = 40;
  // At a level whose parts are split again (nodes), the multilevel start coarsens on to this
  // many vertices per part (0: no further) and starts a second time there, from the rows flat
  // start; both are refined up to the level above the finest one, where the better (capacities,
  // then objective) goes on (partition_multilevel). When that is the deeper start's and it then
  // loses to the structured start, it is not carried through the device level as a second node
  // candidate (node_candidate_margin). Coarser clusters move whole stretches of a sequence
  // between nodes: on lambda masks the start at vertices_per_part stopped at node cuts 40-70 %
  // above those of partitions within the same node caps. Measured on the 48 comparison instances
  // (seeds 1 and 2; placement seeds 1 / 2 / 3; ours / the recorded best feasible Mt-KaHyPar):
  // none 0.980 / 0.967 / 0.978 with 3 / 2 / 3 instances above 1.3; 20: 0.974 / 0.954 / 0.977
  // with 1 / 0 / 2 (longalign_lambda_4x8_s1 1.43 -> 1.16, longalign_lambda_8x8_s2 1.36 -> 1.26
  // on seed 1), planning time +0.3 % on one thread and +1.9 % on 2 threads (geometric means); 10
  // places as 20. Carrying the deeper start's losing partitions as candidates too: 0.974 / 0.953
  // / 0.974 for 6-7 % more time (the device level twice on ldc_causal_16x8_s1 and 3 more
  // instances); a separate second start with its own coarsening, refined to the finest level:
  // about the same quality for 7-9 % more time; deciding on the coarsest shared level instead left
  // longalign_lambda_4x8_s1 at 1.43; a start at 20 in place of the one at 40 lost (0.997,
  // ldc_causal_2x8_s1 1.05 -> 1.71), as did vertices_per_part 20 at every level (worst 1.475).
  int node_deeper_vertices_per_part = 20;
  // A cluster holds at most this share of the smallest part's compute cap, and of its owned
  // memory cap (one vertex always fits), so that moving it keeps the bounds reachable. Compute
  // 1/24: 0.87 (1.52 s); 1/12: 0.85; 1/8: 0.86 (worst instance 1.22 against 1.13); 0.2: 0.85
  // but worst 1.29. Memory 1/8 to 1/2: within 0.3 %.
  double cluster_compute_share = 1.0 / 12;
  double cluster_memory_share = 0.25;
  // Coarsening stops when a pass removes fewer than this share of the vertices.
  double min_shrink = 0.05;
  // A pass shrinks the vertex count by at most this factor (Mt-KaHyPar uses 2.5, for levels of
  // gradually growing clusters). Here one pass typically shrinks a level 10-30x; bounding it at
  // 2.5 gave 0.87 (1.47 s), at 8 0.86 (one instance over a bound), unbounded 0.85 (1.36 s).
  double max_shrink = 1e9;
  // A net with more pins rates only the pins within half this many positions of the vertex in
  // its pin order (table order: the tile's neighbours in its row or column); rating every pair
  // of a net costs pins^2, and a long causal sequence has nets of hundreds of tiles. Measured:
  // 8: 0.86; 16: 0.85; 32: 0.84 (1.26 s); 64: 0.85 (1.36 s); 128: 0.85 (1.37 s).
  int max_rated_net_pins = 32;
  int max_levels = 24;
};

// k-way FM (fm.cpp), on every level of the built-in backend and in the repairs. A pass moves
// vertices best gain first, negative gains allowed, and keeps the best prefix.
struct RefineOptions {
  int passes = 12;  // at most, per call
  // Refinement stops after a pass that wins less than this share of the objective. Measured (as
  // MultilevelOptions): 0 (stop only when a pass wins nothing) 0.81 for 3.5 s, 0.02 0.85 for
  // 1.75 s (with share 1/8 and max 1000 below).
  double min_pass_gain = 0.02;
  // The same for the global refinement (FM over all devices at once, on the hierarchical cost,
  // PlacementOptions::global_refinement), whose passes cost several times those of a level and
  // win less after the levels. Measured on the 48 comparison instances (seeds 1 and 2) with
  // placement seeds 1, 2 and 3, as PlacementOptions::full_memory_fresh_always (quality mean,
  // instance-runs above 1.3, planning time summed over the instances), applied to every FM over
  // all devices: 0.02 (the levels' value) 0.984, 3, 1.87 s; 0.05 0.987, 4, 1.74 s; 0.1 0.988, 4,
  // 1.67 s (7 % less than 0.02 in alternating runs on the loaded machine); 0.2 0.990; one pass
  // only 0.990. FM after the cross-node full-memory repair keeps min_pass_gain: at 0.1 it left
  // a bound violated on a 1M-token ldc lambda batch (bench_placement --only large); keeping it
  // there moved the objective by -0.5 % on average (the same 144 instance-runs). The light path
  // (PlacementOptions::large_vertices) keeps min_pass_gain everywhere: there FM over all devices
  // is what meets the full-memory bound, and at 0.1 it left a bound violated on longalign causal
  // batches at 1M tokens on 256 devices, so that the full portfolio ran after it (1.2 s against
  // 0.46 s).
  double min_pass_gain_all_devices = 0.1;
  // A pass stops after this many moves without a new best prefix: share x vertices, clamped to
  // [idle_moves_min, idle_moves_max]. Measured: share 1/8 and max 1000 took 12 % more time than
  // 1/16 and 500 for a 0.5 % lower objective.
  double idle_moves_share = 1.0 / 16;
  int idle_moves_min = 50;
  int idle_moves_max = 500;
  // The same share and minimum for the global refinement's FM (over all devices, on the
  // hierarchical cost, after the repairs; its maximum is idle_moves_max). Its passes run on one
  // thread at the end of the placement and win little once the levels are refined: on the 48
  // comparison instances (seeds 1 and 2; placement seeds 1 / 2 / 3; ours / the recorded best
  // feasible Mt-KaHyPar) the levels' 1/16 and 50 gave 0.972 / 0.969 / 0.990, 1/64 and 12 0.976 /
  // 0.973 / 0.992 for 19 % fewer instructions in the global refinement (2.1 % of the placement),
  // 1/128 and 6 0.978 / 0.977 / 0.995 for 27 % (2.9 %); no instance newly above 1.3 either way.
  // The FM after the cross-node full-memory repair and the light path (large_vertices) keep the
  // levels' values: there FM is what meets the full-memory bound.
  double idle_moves_share_all_devices = 1.0 / 64;
  int idle_moves_min_all_devices = 12;
};

struct PlacementOptions {
  PartitionerKind partitioner = PartitionerKind::Builtin;
  double eps_compute = 0.1;       // per-device compute tolerance
  double eps_memory = 0.2;        // per-device memory tolerance (owned and full, see below)
  double node_eps_factor = 0.5;   // node-level target tolerance = eps x factor
  // Node-level compute target = eps_compute x this factor; 0 = auto: 0.75 with at most 2
  // devices per node (the device level then splits a node's tiles by head group, exactly in
  // halves, so it needs less slack; measured at 65536 tokens on 8 x 2: ldc causal 0.613 ->
  // 0.570 of the best static layout's inter-node bytes), else node_eps_factor (8 devices per
  // node need the slack: 0.75 was measured worse on longalign at 131072 tokens on 4 x 8).
  double node_compute_eps_factor = 0;
  uint64_t seed = 1;
  RefineOptions refine;           // FM (built-in backend and the repairs)
  // Built-in: initial placements tried at the device level, each refined, the best kept
  // (1: the structured placement; 2: + zigzag rows; 3: + head-group-major). Each start costs
  // about one more device level.
  // 0 = auto: 1 when the multilevel scheme is on (every start is then V-cycled and the
  // multilevel start joins them; measured as MultilevelOptions: 3 starts gave 0.85 as 1 did, for
  // 1.87 s against 1.36 s); without it, 3 starts up to 16 devices (measured at 65536
  // tokens on 8 x 2: ldc sparse 0.372 -> 0.362 of the best static layout's inter-node bytes for
  // ~1 ms more), 2 above (3 was ~10 % fewer bytes than 2 on long causal sequences but over the
  // 200 ms planning budget at 131072 tokens on 4 x 8).
  int initial_starts = 0;
  TileCost tile_cost;  // what compute balance weighs (default: FLOPs)
  MultilevelOptions multilevel;  // built-in backend
  // Node-level partitions whose node objective is within this factor of the best one are all
  // carried through the device level and the repairs, and the lowest final objective wins (the
  // node objective prices a remote net once per node, the device level once per device reading
  // it). 0 = the best node partition only. Measured on the 48 comparison instances (seeds 1 and
  // 2): 0: 0.967, worst instance 1.77 (a 2-node batch whose best node split by the node objective
  // was not the best in the end); 0.15: 0.956, worst 1.32, for 17 % more time; 0.5: 0.951, worst
  // 1.32, for 50 % more time.
  double node_candidate_margin = 0.15;
  // Among several node candidates, one whose objective after the repairs (device level, bounds)
  // is more than this factor above another's with no more violated bounds drops out before the
  // global refinement (< 0: every candidate is refined). The global refinement never raises the
  // objective of the candidate ahead, and it lowers an objective by 0-19 % (on the 48 comparison
  // instances with placement seeds 1-3, 167 candidates refined). Measured there: with 0, 0.05 or
  // 0.1 the winner was never a dropped candidate (every placement the same as with every candidate
  // refined), and on the 7-9 instances per seed with two candidates the one behind was 8-61 %
  // behind; 2-thread wall on those 0.92-1.02x (ldc_causal_2x8_s1 0.93x), where the one behind
  // finishes its repairs last or its thread then helps the other's. 0.05 leaves room for a
  // global refinement that wins more on the one behind than on the one ahead.
  double candidate_refine_margin = 0.05;
  // After the repairs: FM over all devices at once on the exact objective (intra-node bytes +
  // inter_weight x inter-node bytes) under every bound, full memory included; kept only when it
  // adds no violation. Measured (as MultilevelOptions): 0.85 against 0.87 without, for 12 %
  // more time.
  bool global_refinement = true;
  // Full-memory repair (full_memory.cpp): rounds, and the target each round aims at, as a share
  // of eps_memory above the mean. Aiming under the bound leaves room for the mean to drop as
  // tiles move back to their data; a later round aims lower still. Measured: targets 0.9 / 0.8
  // gave 0.85, 0.95 / 0.9 0.86, 0.8 / 0.7 0.90; one round left one instance over the bound,
  // two and three none (a round costs nothing when no device is over).
  int full_memory_rounds = 3;
  double full_memory_target_first = 0.9;
  double full_memory_target_later = 0.8;
  // Full-memory rounds: a node over the bound is repaired and refined; a fresh partition of the
  // node under the bound runs beside it only where that still misses a bound (false), or always
  // (true; the light path never does). Measured on the 48 comparison instances (seeds 1 and 2)
  // with placement seeds 1, 2 and 3 (mean over the seeds of the geometric mean of ours / best
  // feasible Mt-KaHyPar; instance-runs above 1.3; time = ours / Mt-KaHyPar default's CPU time
  // per thread, geometric mean): true 0.979, 4, 0.299; false 0.984, 3, 0.245. Where the repaired
  // split meets every bound, the fresh partition won on 46 of 140 nodes, by little.
  bool full_memory_fresh_always = false;
  // Instances with more placement-hypergraph vertices than this (tiles + token blocks; 0 =
  // none) take the light path, whose work grows about linearly with the tiles: the node level
  // runs the Best structured start alone, V-cycled; the full-memory rounds repair and V-cycle
  // the current split of a node over the bound (its fresh re-partition only where that still
  // misses a bound); the global refinement is flat FM. Where the placement still violates a
  // bound, the full portfolio's node candidates are placed too and the best kept. On 1M-token
  // batches the light path is both faster and lower in bytes (bench/results/placement.md); the
  // comparison against Mt-KaHyPar and the 64K / 131K settings stay below the default. Why 25000:
  // above it the light path moves about the same bytes in far less time; below it, it moved
  // markedly more bytes on some batches.
  int32_t large_vertices = 25000;
  // Light path: in the first full-memory round, a node whose repaired split still misses the
  // full-memory bound (but meets compute and owned memory) is not re-partitioned fresh: the
  // cross-node repair and FM of that round fix most such nodes for less, and a node still over
  // is re-partitioned in a later round. false = a fresh partition in every round.
  bool large_defer_fresh = true;
  // Threads of the built-in backend (the calling thread included; at most 256). Independent
  // work runs at the same time: the starts of each portfolio (structured and multilevel), the
  // node candidates, the device-level partitions and full-memory repairs of different nodes,
  // the set-up of an FM pass on a large level (src/placement/README.md).
  // The placement is the same bit for bit for every thread count (each piece of work writes
  // its own result; results are combined in a fixed order). Default 1: the planner's queue
  // (PlanQueue, the Python package) already plans several steps at once on its own threads,
  // and threads here on top of those would oversubscribe the cores; set it where one placement
  // at a time is on the critical path. Other backends always run on one thread.
  int threads = 1;
  // Throws InvalidInput naming the option (eps < 0, factor <= 0, compute factor < 0, passes
  // < 0, starts outside [0, 3], threads outside [1, 256], a tile cost that is not positive and
  // finite).
  void validate() const;
};

struct PlacementReport {
  std::string partitioner;
  int64_t intra_bytes = 0;   // by the hypergraph model (equals compute_metrics)
  int64_t inter_bytes = 0;
  double objective = 0;      // intra + inter_weight x inter
  double compute_imbalance = 0;  // max / mean over devices (fwd + bwd FLOPs, or tile_cost's weight)
  double memory_imbalance = 0;   // max / mean over devices (owned bytes)
  // max / mean over devices of everything a device holds: owned data, received copies and
  // fp32 partials (full_memory_bytes; equals compute_metrics' memory_imbalance).
  double full_memory_imbalance = 0;
  double node_compute_imbalance = 0;
  double node_memory_imbalance = 0;
  std::vector<std::string> violations;  // empty when every bound holds
  double build_s = 0;        // hypergraph construction
  double node_level_s = 0;   // first level (nodes)
  double device_level_s = 0; // second level (devices of each node)
  double total_s = 0;
  bool balanced() const { return violations.empty(); }
};

struct DcpPlacement {
  Placement placement;  // method "dcp"; note names the partitioner and any violation
  PlacementReport report;
};

// Pre: table.validate() passes, cluster.validate() passes, opts.validate() passes.
// Post: placement.validate(table) passes; every tile and token block has one device; the report
// lists every violated bound. Deterministic for equal inputs and seed.
DcpPlacement place_dcp(const BlockTable& table, const Cluster& cluster,
                       const PlacementOptions& opts = {});

// The driver's repairs applied to a placement made elsewhere (an imported partition, a static
// layout): vertices move only out of devices over a bound (compute and owned memory, then full
// memory), cheapest objective increase first; nothing is refined. Report as place_dcp's, with
// `partitioner` = start.method. Pre: start.validate(table) passes and has the cluster's
// device count.
DcpPlacement repair_placement(const BlockTable& table, const Cluster& cluster,
                              const PlacementOptions& opts, const Placement& start);

// The tiles of `table` placed on token homes fixed beforehand (start.block_home, kept as they
// are; start.tile_device is where the refinement starts): what a model whose layers attend with
// different masks needs, since every layer kind must hold the same tokens on every device (the
// layers between attentions see whole tokens) while each kind's tiles may go anywhere. Tiles
// move, cheapest objective increase first, out of devices over the compute or full-memory bound
// (compute <= (1 + eps_compute) x mean, full memory <= (1 + eps_memory) x its mean), then k-way
// FM (a V-cycle when opts.multilevel is on) lowers the objective under those bounds; the owned
// memory is the homes' and does not change. Deterministic; report as place_dcp's, partitioner
// "homes fixed", method "dcp". Pre: start.validate(table) passes and has the cluster's device
// count.
DcpPlacement place_tiles_on_homes(const BlockTable& table, const Cluster& cluster,
                                  const PlacementOptions& opts, const Placement& start);

// Token homes refined for several tables at once: the layer kinds of one step, whose tables share
// their token blocks (same cuts) and whose tiles are all placed on the same homes. `starts[k]` is
// table k's placement (every one with the same block_home); `layers[k]` weighs it. FM over all
// devices moves token blocks and tiles of every table to lower the sum of the tables' objectives
// (each times its layers) under owned memory, full memory (every table's copies) and the summed
// compute (each tile times its table's layers); a kind's own compute balance is the caller's to
// restore (place_tiles_on_homes on the returned homes). Returns the placements (homes shared).
// Deterministic. Pre: every start validates against its table, tables have equal token blocks.
std::vector<Placement> refine_homes_for_kinds(const std::vector<const BlockTable*>& tables,
                                              const std::vector<double>& layers, const Cluster& cluster,
                                              const PlacementOptions& opts, const std::vector<Placement>& starts);

// Checks the bounds of `opts` on a finished placement (device and node level); returns the
// violations as text (empty when all hold) and fills the imbalance fields of `report`.
std::vector<std::string> check_balance(const PlacementHypergraph& h,
                                       const std::vector<int32_t>& parts, const Cluster& cluster,
                                       const PlacementOptions& opts, PlacementReport& report);

// ---- hMETIS exchange ------------------------------------------------------------------------
// .hgr: header "num_nets num_vertices 11" (net and vertex weights); then one line per net in
// our net order: "weight pin pin ..." with 1-based vertex ids in our vertex order (tiles, then
// token blocks) and weight = net bytes (x inter_weight is NOT applied: hMETIS has one level);
// then one line per vertex with its weight: compute FLOPs / flops_unit for `HgrWeight::Compute`
// or memory bytes / bytes_unit for `HgrWeight::Memory` (rounded, at least 1). hMETIS takes one
// vertex weight: the other constraint travels beside it, in the vertex-weight file
// (write_vertex_weights: both weights, exact) and, for partitioners that take fixed vertices,
// the fixed-vertex file (write_fixed_homes: token blocks fixed to memory-balanced homes). `dcp
// plan --export-hgr PATH` writes PATH and PATH.weights. Net weights are in units of `bytes_unit`
// bytes (rounded, at least 1).
// Partition file: one line per vertex, its part id (device), 0-based.
enum class HgrWeight { Compute, Memory };
struct HgrOptions {
  HgrWeight vertex_weight = HgrWeight::Compute;
  double flops_unit = 1e6;
  double bytes_unit = 1024;
};
void write_hgr(const PlacementHypergraph& h, const HgrOptions& opts, std::ostream& out);
// Both constraints for an outside partitioner, beside the .hgr (which carries one vertex weight):
// one line per vertex in .hgr order, "compute_flops memory_bytes" (exact: FLOPs rounded to an
// integer, owned bytes). Tiles carry compute only and token blocks memory only, so a reader that
// takes one weight per vertex can still express the memory bound by fixing the token blocks
// (write_fixed_homes) or by a second balance run on the token blocks.
void write_vertex_weights(const PlacementHypergraph& h, std::ostream& out);
// hMETIS fixed-vertex file (as KaHyPar and Mt-KaHyPar read it): one line per vertex, the part a
// token block is fixed to (its device in `parts`) and -1 for every tile. With the homes fixed,
// owned memory per device is that of `parts` whatever the partitioner does with the tiles.
void write_fixed_homes(const PlacementHypergraph& h, const std::vector<int32_t>& parts,
                       std::ostream& out);
void write_partition(const std::vector<int32_t>& parts, std::ostream& out);
// Reads a partition file; `source` names it in errors ("file:line: ..."). Throws InvalidInput
// for a wrong number of lines, a non-integer or a part id outside [0, num_devices).
std::vector<int32_t> read_partition(std::istream& in, const std::string& source,
                                    int32_t num_vertices, int num_devices);
// The partition file at `path` as a placement of `table` (method "imported").
Placement import_partition(const BlockTable& table, const std::string& path, int num_devices);

}  // namespace dcp
