// dcp/attention.h — exact attention of a plan on the caller's tensors: what a training framework
// calls once per layer, forward and backward.
//
// Tensors are this rank's tokens in the plan's dispatch order (dispatch.h: owned token blocks in
// ascending id, each block's tokens in order), all heads, any row and head stride:
//   q, o, d_o, dq  [tokens, q_heads, head_dim]      k, v, dk, dv  [tokens, kv_heads, head_dim]
//   lse            [tokens, q_heads] fp32 (head_dim 1), natural log; -inf on rows with no key
// Element types: on a GPU backend bf16 (fp32 is converted); on the CPU backend fp32 or bf16.
// Inside, partials, merges and gradient sums are fp32.
//
// One Attention serves every layer of a step in any order (forward 1..L then backward L..1, and
// activation checkpointing's recomputation in between): each call reads its inputs, writes its
// outputs and keeps nothing between calls but scratch (one block of slot arrays, from the
// backend's allocator, sized by plan_memory). Calls run on the backend's compute stream (the
// caller's, for a CUDA backend bound to it) and return once queued; transfers run on the comm's
// own stream, ordered by events. Every rank calls forward (backward) the same number of times in
// the same order, as the comms pair rounds by order.
#pragma once

#include <cstdint>
#include <memory>

#include "dcp/executor.h"

namespace dcp {

struct AttentionForwardArgs {
  TensorView q, k, v;  // inputs
  TensorView o, lse;   // outputs
};

struct AttentionBackwardArgs {
  TensorView q, k, v, o, lse, d_o;  // inputs (o and lse: the forward's outputs)
  TensorView dq, dk, dv;            // outputs (overwritten)
  // Optional (data null: none): the gradient of lse, [tokens, q_heads] fp32, for a loss that
  // reads lse itself (learned sink logits, outputs merged by the caller). Since d lse_i / d S_ij
  // = P_ij, it enters as dS = P (dP - (Delta - d_lse)): one subtraction from Delta (the CUDA
  // one-pass deterministic backward widens its dQ units by |d_lse|, dcp/detail/dq_units.h).
  TensorView d_lse{};
};

class Attention {
 public:
  // Checks the plan against the comm and backend (Executor's checks), allocates the scratch and
  // prepares every instruction (Executor::prepare). `plan` must outlive this object.
  Attention(const Plan& plan, Backend& backend, Comm& comm, ExecOptions options = {});
  ~Attention();
  Attention(const Attention&) = delete;
  Attention& operator=(const Attention&) = delete;

  // Throws InvalidInput naming the tensor when a shape, stride or type does not fit the plan
  // (rows = num_tokens(), heads and head_dim of the plan's shape), before anything is queued.
  ExecStats forward(const AttentionForwardArgs& args);
  ExecStats backward(const AttentionBackwardArgs& args);

  int64_t num_tokens() const;     // this rank's tokens
  int64_t scratch_bytes() const;  // the one block allocated
  const Plan& plan() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dcp
