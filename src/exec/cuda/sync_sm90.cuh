// sync_sm90.cuh — Hopper (sm_90) synchronisation pieces: shared-memory mbarriers (in the
// warp-specialised backward, attention_backward_sm90_ws.cu, a producer publishes a ring slot and
// consumers release it; likewise in the warp-specialised forward, attention_forward_sm90_ws.cu, where TMA loads complete on them), TMA tile loads, and
// named barriers of a subset of the CTA.
//
// Hand-off protocol: the producer's own cp.async bytes land (wait_group),
// fence.proxy.async makes them visible to wgmma (async proxy), then it arrives on the slot's
// "full" barrier (release, CTA scope); consumers wait on that phase (acquire), so plain st.shared
// stores of the producer before its arrival are visible too. Consumers arrive on "empty" once
// they no longer read the slot; the producer waits on it before overwriting.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dcp::cuda::detail {

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Release at CTA scope (the default semantics of mbarrier.arrive).
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Acquire at CTA scope: returns once phase `parity` of the barrier has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nWS_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WS_WAIT;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// Orders the mbarrier initialisations of this thread before their use by other threads and by
// the tensor memory accelerator (after the CTA barrier that follows).
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

// Arrives once and adds `bytes` to the transaction count of the current phase: the phase then
// completes when the TMA loads signalling this barrier have delivered that many bytes.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

// Adds `bytes` to the transaction count of the current phase without arriving: a thread may issue
// the TMA loads of a phase before it arrives (once the rest of what the phase hands over is written).
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

// TMA load of one box of a 2-D tensor map (a __grid_constant__ kernel parameter) at element
// coordinates (col, row) into shared memory at `dst` (1024-byte aligned for the 128-byte
// swizzle), completing `bytes` on mbarrier `bar`.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void* map, int col, int row, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(bar)
      : "memory");
}

// Named barrier kId (1..15; 0 is __syncthreads) of kThreads threads (a multiple of 32).
template <int kId, int kThreads>
__device__ __forceinline__ void bar_sync_n() {
  static_assert(kId >= 1 && kId < 16 && kThreads % 32 == 0, "barrier 0 belongs to __syncthreads");
  asm volatile("bar.sync %0, %1;\n" ::"n"(kId), "n"(kThreads) : "memory");
}

// Named barrier `id`, a register, of kThreads threads: one instruction for warps that pick
// different barriers, where a branch would sit under a tensor-core product in flight (ptxas then
// serialises the kernel's products).
template <int kThreads>
__device__ __forceinline__ void bar_sync_id(int id) {
  static_assert(kThreads % 32 == 0, "whole warps");
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(kThreads) : "memory");
}

// Arrives on named barrier kId (of kThreads threads) without waiting: the other side of a
// bar_sync_n by other threads (a producer / consumer hand-off between warpgroups).
template <int kId, int kThreads>
__device__ __forceinline__ void bar_arrive_n() {
  static_assert(kId >= 1 && kId < 16 && kThreads % 32 == 0, "barrier 0 belongs to __syncthreads");
  asm volatile("bar.arrive %0, %1;\n" ::"n"(kId), "n"(kThreads) : "memory");
}

// OR of `v` over the kThreads threads meeting at named barrier kId (all of them must call it).
template <int kId, int kThreads>
__device__ __forceinline__ bool bar_any_n(bool v) {
  static_assert(kId >= 1 && kId < 16 && kThreads % 32 == 0, "barrier 0 belongs to __syncthreads");
  uint32_t r;
  asm volatile(
      "{\n.reg .pred q, p;\nsetp.ne.u32 q, %1, 0;\n"
      "bar.red.or.pred p, %2, %3, q;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(r)
      : "r"(static_cast<uint32_t>(v)), "n"(kId), "n"(kThreads)
      : "memory");
  return r != 0;
}

}  // namespace dcp::cuda::detail
