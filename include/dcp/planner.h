// dcp/planner.h — the whole planning pipeline for one batch, with a cost-model search.
//
// Batch -> BlockTable -> DCP Placement -> Plan for each candidate (block size B with or
// without a split sink, compute tolerance eps_c, and schedule options); every candidate plan is
// simulated (sim.h) and the fastest predicted one (forward + backward) is kept, optionally after
// placing the best one's table again with further seeds (reseed_best). The static layouts
// (baselines.h) are candidates too (static_layouts), so the chosen plan is never predicted
// slower than theirs: they are placements like DCP's, the same executor runs them, and on a batch
// where one of them is the fastest, that is the plan to run. The search is what a data loader would
// run ahead of training: each candidate costs a few milliseconds, so a 3 x 3 grid of
// placements (x 8 schedules each) stays within a few seconds.
// Deterministic: candidates are tried in a fixed order and ties keep the earlier one.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dcp/baselines.h"
#include "dcp/partition.h"
#include "dcp/plan.h"
#include "dcp/sim.h"

namespace dcp {

struct PlannerOptions {
  std::vector<int64_t> block_sizes{1024};  // candidates for B (multiples of 16)
  std::vector<double> eps_compute{0.1};    // candidates for the per-device compute tolerance
  int q_heads_per_group = 0;               // BlockOptions::q_heads_per_group
  PlacementOptions placement;              // eps_compute is overridden by the candidates
  PlanOptions plan;
  // The simulator's rates for ranking candidates; empty: the cluster's own
  // (calibration_from_cluster: the measured kernels on h200-nvl).
  std::optional<Calibration> calibration;
  // Balance predicted kernel time instead of FLOPs: when placement.tile_cost is the default,
  // the candidates' placements weigh tiles by tile_cost_from(calibration).
  bool balance_time = true;
  // Schedules tried on each candidate's placement (plan and simulation only, the placement is
  // shared): every ScheduleOptions::far_outputs_first x last_round_share of these lists, the
  // rest of plan.schedule as given. Measured on the paper micro-benchmark at scale 4
  // (bench/results/plan_sim.md): both orders and shares {1, 0.5} took shared question from
  // 13.40 to 12.61 ms and lambda from 3.31 to 2.63 ms.
  std::vector<bool> far_outputs_first{false, true};
  // Planning time grows with the tile count (placement above all): a block size whose table
  // holds more than this many tiles per device is skipped, unless it is the largest candidate
  // (0 = no limit). Measured on the paper micro-benchmark (bench/results/plan_sim.md): adding
  // B = 512 took lambda at scale 4 from 2.63 to 2.53 ms and causal_blockwise from 3.56 to 1.77;
  // without a limit B = 512 also ran on the causal cells (66048 tiles for one 131072-token
  // sequence), 3.1 s of search per batch at scale 4 for no gain; 768 keeps B = 1024 there
  // (16512 tiles on 32 devices) and skips B = 512.
  int64_t max_tiles_per_device = 768;
  // ... but the budget in all is never below this many tiles: on few devices placement is cheap
  // (on one there is nothing to place: B = 1024 plans a 65536-token lambda batch of 1536 tiles
  // in under a millisecond) and fine blocks are what sparse masks need there: measured on one
  // H200 (bench/results/cuda_attention_h200.md, ldc 65536, outputs in place), B =
  // 1024 ran lambda 6.02 / 18.39 ms against 6.41 / 19.30 at B = 2048, and shared question
  // 10.24 / 33.21 against 10.88 / 34.42.
  int64_t min_tile_budget = 8192;
  std::vector<double> last_round_share{1.0, 0.5};
  // ScheduleOptions::level_stage_compute candidates, crossed with the two lists above. Measured
  // on the paper micro-benchmark (bench/results/plan_sim.md): with leveling tried too, causal
  // at scale 4 fell from 24.98 to 22.85 ms and lambda from 2.53 to 2.31; twice the schedules
  // per placement took the search from 169–1498 to 264–1992 ms per batch (placement dominates).
  std::vector<bool> level_stage_compute{false, true};
  // ScheduleOptions::rounds_per_link_class candidates, crossed with the lists above (where
  // far_outputs_first is a list of both, with its true alone: without it the tiles whose inputs
  // stay in the node lead the rounds anyway; on one node true is not tried: one class).
  // Measured on the paper micro-benchmark (bench/results/plan_sim.md): shared question at scale
  // 2 from 4.78 to 4.66 ms, causal at scale 2 from 9.30 to 9.02, no cell slower; the search
  // 30-40 % longer.
  std::vector<bool> rounds_per_link_class{false, true};
  // Per placement and stage count, the backward's choices (ScheduleOptions::backward) may come
  // from another of the schedules tried than the forward's: where the schedule fastest in one
  // pass is not the one fastest in the other, that mix is planned and simulated too (the passes
  // are scheduled and simulated apart, so it is predicted at their sum).
  bool mix_passes = true;
  // Across nodes, the chosen placement (DCP's or a static layout's) is planned again with every
  // schedule and the other ScheduleOptions::proxies setting; the fastest plan is kept: proxies
  // make most plans faster but not all. Both settings on every placement would double the search
  // (bench/results/plan_sim.md).
  bool retry_proxies = true;
  // BlockOptions::split_sink candidates, crossed with block_sizes (a split that cuts no
  // sequence, as on masks without a sink, is not planned twice). Measured on the paper
  // micro-benchmark (bench/results/plan_sim.md): lambda's 131072-token sequence at scale 4
  // moved 100-210 MB inter-node per candidate, mostly KV of the sink's block to every device and
  // its dKV partials back; with the sink in a 64-token block of its own 57-83 MB.
  std::vector<bool> split_sink{false, true};
  // ScheduleOptions::num_comm_stages candidates, crossed with the schedule lists above; empty:
  // plan.schedule's alone. Each costs a plan and a simulation per schedule and placement, no
  // placement. Measured on the paper micro-benchmark (bench/results/plan_sim.md): lambda's
  // sequence at scale 4 (split sink) 2.02 ms at 4 stages, 1.93 at 3.
  std::vector<int> num_comm_stages{};
  // Once every candidate is tried, the best one's block table and eps are placed again with
  // this many further seeds (placement.seed + 1, + 2, ...), each with every schedule: the
  // partitioner's result depends on its seed as much as on eps, and where it counts most is
  // around the best candidate. Each costs one placement and its schedules. Measured on the paper
  // micro-benchmark (bench/results/plan_sim.md): 1 took shared question at scale 2 from 5.04 to
  // 4.93 ms; no cell got slower.
  int reseed_best = 0;
  // Once the seeds are tried, the placements of this many of the best candidates (each judged by
  // its fastest schedule; reseeded ones included) are tightened to every tolerance of
  // tighten_eps below their own eps, each with every schedule: the token homes stay, tiles
  // move cheapest first out of devices over the tighter compute bound and k-way FM refines them
  // under it (place_tiles_on_homes). A fresh placement at a tight eps pays for its balance with
  // a larger cut (on the paper's shared question at scale 2, 46 % more inter-node bytes at eps
  // 0.02 than at 0.1); walking down from the loose placement keeps most of its cut and trims
  // the busiest devices. Each costs one tile refinement (far less than a placement) and its
  // schedules. Measured on the paper micro-benchmark (bench/results/plan_sim.md) with 2 and
  // {0.07, 0.05, 0.03}: shared question at scale 2 4.92 -> 4.79 ms, causal at scales 1-4 0.5-1.4 %
  // faster; no cell slower; the search about 10-40 % longer. 0: off (and on one device).
  int tighten_best = 0;
  std::vector<double> tighten_eps{0.07, 0.05, 0.03};
  // Static layouts planned and simulated beside DCP's candidates (baselines.h names; on more
  // than one device), each with plan.schedule at every stage count (num_comm_stages), packing at
  // every block size. The fastest plan wins whichever placement made it; a static one counts as
  // balanced when its full memory (compute_metrics' memory_imbalance) is within 1 +
  // placement.eps_memory. A layout whose table holds more tiles than the block sizes' budget
  // (max_tiles_per_device; the chunk-cutting layouts by an upper bound, before any is built) is
  // skipped. Measured with `dcp simulate --search` on 2 H200s (h200-nvl,
  // 1 x 2; bench/results/plan_sim.md): DCP's own best was 0.99x of zigzag or Ulysses on 3 of 32
  // causal and shared-question batches and at most 1.01x ahead on most others of those masks, so
  // on few devices the static layouts are real contenders; empty: DCP's placements only.
  std::vector<std::string> static_layouts = default_static_layouts();
  // Threads of the search: the block tables, the placements of one phase (the fresh ones, the
  // reseeded ones, the tightened ones, the static layouts) and the plan and simulation of every
  // (placement, schedule) run at the same time on a pool of this many threads (the caller's and
  // threads - 1 more). The choice and every candidate's prediction are the same on any count:
  // each piece writes its own result and the results are taken in the order one thread tries
  // them. 1 (the default) because PlanQueue already plans several steps at once on its own
  // threads; set it where one search is waited for (the command line, a first step). Each
  // placement also has placement.threads of its own. In [1, 256].
  int threads = 1;
  // Throws InvalidInput naming the option (empty candidate lists, bad B or eps, an unknown or
  // repeated static layout).
  void validate() const;
  static std::vector<std::string> default_static_layouts();  // every baseline, baselines.h order
};

struct PlanCandidate {
  std::string method = "dcp";  // "dcp", or the static layout (placement_methods()) that made the plan
  int64_t block_size = 0;
  bool split_sink = false;  // BlockOptions::split_sink (and it cut a sequence)
  double eps_compute = 0;
  // The schedule's options tried (ScheduleOptions::choices): the forward's, and the backward's
  // too unless it has its own (mix_passes).
  ScheduleOptions::PassChoices choices;
  std::optional<ScheduleOptions::PassChoices> backward;
  bool proxies = false;
  int num_comm_stages = 0;
  uint64_t placement_seed = 0;  // PlacementOptions::seed of its placement
  double tightened_from = 0;    // the eps of the placement it was tightened from (0: placed afresh)
  double predicted_s = 0;   // simulated forward + backward
  bool balanced = true;     // the placement met every bound
  double planning_s = 0;    // block table + placement + plan (simulation excluded)
};

// One line for people: "B 1024 (split sink) eps 0.05 far-first on last-round share 1 leveling off
// stages 2" for DCP's candidates, "static layout zigzag stages 2" (packing: with its B) otherwise.
std::string describe(const PlanCandidate& c);

struct PlannedBatch {
  BlockTable table;
  DcpPlacement placement;  // a static layout's placement when one won (chosen.method; report empty)
  Plan plan;
  SimResult predicted;
  PlanCandidate chosen;
  std::vector<PlanCandidate> candidates;  // in the order tried
  std::vector<int64_t> skipped_block_sizes;  // over PlannerOptions::max_tiles_per_device
  std::vector<std::string> skipped_static_layouts;  // the same budget
  double search_s = 0;                    // whole search, simulations included
};

// Tile weights in full-forward-rate equivalents: a tile's weight over the calibration's forward
// rate is its predicted Attend time (fwd + bwd) under the simulator's model (sim.h).
TileCost tile_cost_from(const Calibration& calibration);

// Pre: batch.validate() and cluster.validate() pass. Candidates whose placement violates a
// balance bound are kept only if no candidate is balanced.
PlannedBatch plan_batch(const Batch& batch, const Cluster& cluster, const PlannerOptions& opts);

// ---- placement by name ---------------------------------------------------------------------

// "dcp" first, then every static baseline (baselines.h order).
std::vector<std::string> placement_methods();
// Throws InvalidInput naming `where` and listing the methods if `name` is not one of them.
void check_placement_method(const std::string& name, const std::string& where);

struct PlacedMethod {
  std::string method;
  PlacedBatch placed;
  std::vector<std::string> violations;  // DCP balance bounds not met (empty for baselines)
  double placement_ms = 0;              // block table (DCP) + placement
};
// Places `batch` with `method` ("dcp" uses `placement`; baselines cut their own tables).
PlacedMethod place_by_method(const std::string& method, const Batch& batch, const BlockOptions& blocks,
                             const Cluster& cluster, const PlacementOptions& placement);

// ---- one step's plan, and planning ahead -----------------------------------------------------

// How every step of a training run is planned: one placement method, fixed options (or DCP's
// search over `search.block_sizes` x `search.eps_compute` when `search_candidates`).
struct StepPlanOptions {
  std::string method = "dcp";
  BlockOptions blocks;
  PlacementOptions placement;
  PlanOptions plan;
  bool search_candidates = false;  // dcp only: plan_batch over the candidates of `search`
  PlannerOptions search;
  // Layer kinds (plan_step_kinds) on several devices: besides each lead's homes, the homes refined
  // for every kind at once (refine_homes_for_kinds) are a candidate. Measured with `dcp simulate
  // --layer-masks "lambda*3+causal" --search` (bench/results/plan_sim.md): the predicted step
  // 19.39 -> 17.70 ms on a100-p4d 4 x 8 (131072 tokens), 13.91 -> 13.47 on 2 x 8 (65536).
  bool kinds_joint_homes = true;
  // Layer kinds: every kind but the lead is also planned on the lead's token blocks cut into 2
  // pieces (same homes, so the same tokens in the same order on every device), and each kind keeps
  // the cut the simulator predicts fastest. Measured with `dcp simulate --layer-masks
  // "lambda*3+causal" --search` (bench/results/plan_sim.md): a100-p4d 2 x 8 (65536 tokens) 13.47 ->
  // 12.38 ms, 4 x 8 (131072) 17.70 -> 16.89, planning 15-18 % longer; 4 pieces as well changed
  // nothing more for twice the planning.
  bool kinds_finer_blocks = true;
  void validate() const;  // throws InvalidInput naming the option
};

// Batch -> Plan for `cluster` (one program per device). Deterministic: every rank that calls it
// with the same arguments gets the same plan, bit for bit (plan_hash).
Plan plan_step(const Batch& batch, const Cluster& cluster, const StepPlanOptions& options);

// ---- layer kinds: one token placement, a plan per mask -------------------------------------

// A model whose layers attend with different masks (sliding-window layers between global ones, as
// recent models interleave them) runs one plan per layer kind, and every kind's plan must hold
// the same tokens on every device in the same order: the layers between attentions see whole
// tokens. A lead kind is planned as plan_step plans it; every other kind is cut into the same token
// blocks and its tiles placed on the lead's token homes (place_tiles_on_homes, starting from the
// lead's device of the same tile where the lead has it, else the home of its query block), then
// scheduled with the lead's plan options; a static lead places every kind by its own rule where
// that keeps the lead's token blocks and homes (place_by_method). On one device the lead is the
// kind with the most attention work (mask area x its layers; the first on a tie). On several,
// every kind leads in turn, and with each lead the homes refined for every kind at once
// (refine_homes_for_kinds, then each kind's tiles balanced again; StepPlanOptions::
// kinds_joint_homes) are a candidate too; with the candidate search, every block size is tried
// this way. Each kind but the lead may also take its token blocks cut into 2 pieces on the same
// devices (StepPlanOptions::kinds_finer_blocks), where the simulator predicts it faster. The plans
// predicted fastest over all layers (each kind's forward + backward x its layers) are kept;
// earlier candidates win ties. `layers`: the layers of each kind (empty: one each). Returns one
// plan per kind, in the order given; every plan holds the same tokens in the same order on every
// device (local_tokens(...).global_row), though a kind's blocks may be finer than the lead's.
// Throws InvalidInput naming the kind when the kinds differ in shape or sequence lengths, a batch
// is invalid, or a layer count is not positive.
std::vector<Plan> plan_step_kinds(const std::vector<Batch>& kinds, const Cluster& cluster,
                                  const StepPlanOptions& options, const std::vector<double>& layers = {});

// Plans steps ahead of training on a pool of threads. submit() returns at once; get() blocks only
// until that step's plan is ready and hands it over. A step whose planning failed rethrows its
// error from get(), its message prefixed with "step N: ". Thread-safe.
//
// Reuse: planning is deterministic, so a step whose batch (and layer kinds) equals an earlier
// step's gets that step's plans without planning again. The queue keeps the plans of the last
// `reuse_batches` distinct batches (shared, immutable; few, since a plan of a large batch holds
// tens of megabytes); a batch equal to one still being planned waits for it instead of planning
// twice. Fixed-length data (every step the same documents'
// lengths and masks) then plans once. Failures are not kept.
class PlanQueue {
 public:
  struct StepStats {
    double planning_ms = 0;  // on a worker: batch validation to plan (a reused plan: the lookup)
    double queued_ms = 0;    // submitted until a worker started it
    double waited_ms = 0;    // get() blocked
    bool reused = false;     // the plans of an earlier step with an equal batch
  };

  // threads >= 1, reuse_batches >= 0 (0: every step planned). Throws InvalidInput on bad
  // options or cluster.
  PlanQueue(Cluster cluster, StepPlanOptions options, int threads, int reuse_batches = 2);
  ~PlanQueue();  // finishes the steps being planned, drops the rest
  PlanQueue(const PlanQueue&) = delete;
  PlanQueue& operator=(const PlanQueue&) = delete;

  // Throws InvalidInput if `step` was already submitted and not yet taken by get().
  void submit(int64_t step, Batch batch);
  // The step's layer kinds (plan_step_kinds, with `layers` per kind), planned on one token
  // placement: get_kinds returns one plan per kind, in the order given. Throws InvalidInput if
  // `kinds` is empty.
  void submit_kinds(int64_t step, std::vector<Batch> kinds, std::vector<double> layers = {});
  // Throws InvalidInput if `step` was never submitted (or was submitted with submit_kinds);
  // Timeout after timeout_s seconds.
  std::shared_ptr<const Plan> get(int64_t step, double timeout_s = 600.0);
  // Any submitted step: its plans, one per layer kind (one for a step of submit()).
  std::vector<std::shared_ptr<const Plan>> get_kinds(int64_t step, double timeout_s = 600.0);
  // Figures of a step taken by get() (the last 1024 steps are kept).
  StepStats stats(int64_t step) const;
  int64_t in_flight() const;  // submitted, not yet taken
  const Cluster& cluster() const;

 private:
  void enqueue(int64_t step, std::vector<Batch> kinds, std::vector<double> layers, bool layered);
  std::vector<std::shared_ptr<const Plan>> take(int64_t step, double timeout_s, bool layered);
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace dcp
