// dcp/executor.h — runs one device's Program of a Plan against a Backend and a Comm.
//
// The executor owns the device's storage and interprets the instructions in order: Attend (tile
// lists, forward or backward), Merge (LSE merge / sums into slots or the final local tensors),
// Copy, CommStart and CommWait (through the Comm). It knows neither which backend computes nor
// which comm moves data; there is one instruction walker for every backend. Consecutive Merge
// instructions that do not depend on each other (rows checked, see MergeBatchCall) reach the
// backend as one batch; the grouping is made once per (layer, pass, instruction) and reused.
//
// Storage: ten arrays of rows (dcp/backend.h, which a backend implements), in one block.
//
// Host tensors (LocalTensors, the CPU-friendly interface): the device's owned rows in dispatch
// order (dispatch.h), all heads, fp32: Q/O/dO/dQ [rows][q_heads][head_dim], K/V/dK/dV
// [rows][kv_heads][head_dim], LSE/Delta [rows][q_heads]. forward()/backward() upload the inputs
// into layer 0, run, and download the outputs. Device-resident use (any backend, the CUDA one in
// particular): upload() once, then forward_layer()/backward_layer() for each layer, without
// host copies; download() when the outputs are wanted. Caller-owned tensors of any stride:
// dcp/attention.h, built on exchange() below.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dcp/backend.h"
#include "dcp/comm.h"
#include "dcp/plan.h"

namespace dcp {

struct LocalTensors {
  int64_t rows = 0;
  std::vector<float> q, k, v;              // forward inputs
  std::vector<float> o, lse;               // forward outputs (backward inputs)
  std::vector<float> d_o;                  // backward input
  std::vector<float> delta, dq, dk, dv;    // backward outputs
  // Every tensor sized for `rows` rows of `shape`; O = 0, LSE = -inf, the rest 0.
  static LocalTensors allocate(const AttentionShape& shape, int64_t rows);
};

struct ExecOptions {
  double comm_timeout_s = 120.0;  // every CommWait; a Timeout error names the round
  int num_layers = 1;             // local tensors kept per layer (device-resident use)
  bool timeline = false;          // measure every instruction (Executor::timeline)
  // Hand each maximal run of consecutive, mutually independent Merge instructions to the
  // backend as one Backend::merge_batch (false: one Backend::merge per instruction).
  bool batch_merges = true;
  // Throws InvalidInput naming the option.
  void validate() const;
};

// One measured instruction: when the compute stream started and finished it, relative to the
// start of its pass. CommWait spans are the stream's stall waiting for the round's data;
// CommStart spans are the cost of posting it. A batch of merges (ExecOptions::batch_merges) is
// one entry covering its instructions [index, index + num_instructions).
struct MeasuredInstruction {
  Pass pass = Pass::Forward;
  int index = 0;          // position in the device's program of that pass
  std::string kind;       // "Attend", "Merge", "Copy", "CommStart", "CommWait"
  double start_s = 0;
  double end_s = 0;
  int num_instructions = 1;
};

struct ExecStats {
  double attend_s = 0.0;   // host time issuing (synchronous backends: running) Attend
  double merge_s = 0.0;
  int num_merges = 0;       // Merge instructions run
  int num_merge_calls = 0;  // backend calls that ran them (merge or merge_batch; GPU: launches)
  double comm_wait_s = 0.0;
  double total_s = 0.0;
};

class Executor {
 public:
  // Checks (before any communication) that the plan fits the comm's world size and rank
  // (InvalidPlan) and that comm and backend agree on memory (InvalidInput), and allocates every
  // array once, in one block. The plan must outlive the executor.
  Executor(const Plan& plan, Backend& backend, Comm& comm, ExecOptions options = {});
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Reads t.q, t.k, t.v; writes t.o, t.lse (layer 0). Pre: t sized by LocalTensors::allocate
  // for this device's owned_tokens (InvalidInput otherwise).
  ExecStats forward(LocalTensors& t);
  // Reads t.q, t.k, t.v, t.o, t.lse, t.d_o; writes t.delta, t.dq, t.dk, t.dv.
  ExecStats backward(LocalTensors& t);

  // Device-resident use. upload: the inputs of `what` (Forward: Q, K, V; Backward: also O, LSE,
  // dO) into `layer`; download: the outputs of `what` (Forward: O, LSE; Backward: Delta, dQ, dK,
  // dV). forward_layer/backward_layer do not synchronise the backend.
  void upload(int layer, const LocalTensors& t, Pass what);
  void download(int layer, LocalTensors& t, Pass what);
  // Random Q, K, V, dO of `layer` (values in [-2, 2], [-2, 2], [-1, 1], [-1, 1]), on the backend.
  void fill_random_inputs(int layer, uint64_t seed);
  ExecStats forward_layer(int layer);
  ExecStats backward_layer(int layer);  // computes Delta first
  const ArraySet& arrays() const;
  // Resolves every instruction of both passes of layer 0 now and lets the backend build what it
  // derives from them (Backend::prepare), so the first forward_layer(0) / backward_layer(0) only
  // launches.
  void prepare();
  // Moves between layer `layer`'s local rows and the caller's tensors (LocalExchange with
  // first_row, num_rows and num_groups filled in here), and Delta straight from the caller's
  // dO and O. Queued on the backend like compute.
  void exchange(int layer, std::span<const std::pair<Array, TensorView>> imports,
                std::span<const std::pair<Array, TensorView>> exports);
  void delta_from(int layer, const TensorView& d_o, const TensorView& o, const TensorView* d_lse = nullptr);
  // backward_layer without computing Delta (delta_from already did).
  ExecStats backward_layer_with_delta(int layer);
  // Tokens this device owns (rows of its local tensors).
  int64_t local_rows() const;
  // Bytes of the one block holding every array.
  int64_t bytes_allocated() const;
  // With ExecOptions::timeline: the instructions of the last forward_layer / backward_layer (or
  // forward / backward) as measured, in program order, together covering the whole program;
  // waits for the backend. Empty without the option.
  std::vector<MeasuredInstruction> timeline(Pass pass) const;

  // Bytes of the slot arrays allocated for `pass`. For FP32 batches on an fp32 backend this
  // equals plan_memory(plan, rank).{fwd,bwd}.slots_total_bytes (the one sizing formula); for
  // bf16 batches on a bf16 backend likewise.
  int64_t slot_bytes_allocated(Pass pass) const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace dcp
