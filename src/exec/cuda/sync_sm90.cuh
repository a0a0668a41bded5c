// sync_sm90.cuh — Hopper (sm_90) synchronisation pieces of the warp-specialised backward
// (attention_backward_sm90_ws.cu): shared-memory mbarriers (a
// producer publishes a ring slot, consumers release it) and named barriers of a subset of the CTA.
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

// Named barrier kId (1..15; 0 is __syncthreads) of kThreads threads (a multiple of 32).
template <int kId, int kThreads>
__device__ __forceinline__ void bar_sync_n() {
  static_assert(kId >= 1 && kId < 16 && kThreads % 32 == 0, "barrier 0 belongs to __syncthreads");
  asm volatile("bar.sync %0, %1;\n" ::"n"(kId), "n"(kThreads) : "memory");
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
