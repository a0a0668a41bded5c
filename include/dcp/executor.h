// dcp/executor.h — runs one device's Program of a Plan against a Backend and a Comm.
//
// The executor owns the plan's buffers (slot arrays sized from the plan, allocated once through
// the backend) and interprets the instructions in order: Attend (tile lists, forward or
// backward), Merge (LSE merge / sums into slots or the final local tensors), Copy, CommStart and
// CommWait (through the Comm). It knows neither which backend computes nor which comm moves data.
//
// Local tensors (LocalTensors): the device's owned rows in dispatch order (dispatch.h), all
// heads, fp32: Q/O/dO/dQ [rows][q_heads][head_dim], K/V/dK/dV [rows][kv_heads][head_dim],
// LSE/Delta [rows][q_heads]. A head group g uses q heads [g*qpg, (g+1)*qpg) and KV set s uses kv
// heads [s*kvpg, (s+1)*kvpg) (qpg, kvpg from the plan's HeadGroups).
//
// Data in slots and in messages is fp32 whatever the batch dtype (inputs may be bf16-rounded):
// for FP32 batches the slot and message sizes equal plan_block_bytes; for bf16 batches the
// Q/KV/dO slots and messages of this executor are twice the plan's figure.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dcp/attention_cpu.h"
#include "dcp/comm.h"
#include "dcp/plan.h"

namespace dcp {

// The compute side of a device. Pointers are backend memory (host memory for the CPU backend).
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // `num_floats` zeroed fp32 values, valid until the backend is destroyed.
  virtual float* allocate(int64_t num_floats) = 0;
  virtual void attend_forward(const cpu::HeadLayout& heads, std::span<const cpu::ForwardTile> tiles) = 0;
  virtual void attend_backward(const cpu::HeadLayout& heads, std::span<const cpu::BackwardTile> tiles) = 0;
  // Dense rows: see cpu::merge_partials / cpu::sum_into.
  virtual void merge_partials(std::span<const cpu::PartialView> parts, float* o, float* lse, int64_t num_rows,
                              int head_dim) = 0;
  virtual void sum_into(float* dst, const float* src, int64_t n) = 0;
  // dst[r * dst_ld + x] = src[r * src_ld + x] for r < rows, x < row_floats.
  virtual void copy_rows(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows,
                         int64_t row_floats) = 0;
  virtual void fill(float* dst, int64_t n, float value) = 0;
  virtual void compute_delta(const float* d_o, const float* o, int64_t num_rows, int q_heads, int head_dim,
                             float* delta) = 0;
};

// The CPU backend: host memory and the kernels of attention_cpu.h.
std::unique_ptr<Backend> make_cpu_backend();

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
};

struct ExecStats {
  double attend_s = 0.0;
  double merge_s = 0.0;
  double comm_wait_s = 0.0;
  double total_s = 0.0;
};

class Executor {
 public:
  // Checks (before any communication) that the plan fits the comm's world size and rank
  // (InvalidPlan) and allocates the slot arrays of both passes.
  Executor(const Plan& plan, Backend& backend, Comm& comm, ExecOptions options = {});
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Reads t.q, t.k, t.v; writes t.o, t.lse. Pre: t sized by LocalTensors::allocate for this
  // device's owned_tokens (InvalidInput otherwise).
  ExecStats forward(LocalTensors& t);
  // Reads t.q, t.k, t.v, t.o, t.lse, t.d_o; writes t.delta, t.dq, t.dk, t.dv.
  ExecStats backward(LocalTensors& t);
  // Bytes of the slot arrays allocated for `pass`. For FP32 batches this equals
  // plan_memory(plan, rank).{fwd,bwd}.slots_total_bytes (the one sizing formula).
  int64_t slot_bytes_allocated(Pass pass) const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace dcp
