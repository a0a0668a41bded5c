// launch_setup.h — host-side state the kernel launchers make on first use, per device: the
// dynamic shared-memory opt-in of a kernel, the SM count, and a side stream for a kernel that runs
// beside another of the same call. First use may fall inside a CUDA graph capture; none of these
// puts work into a stream, so each relaxes the capture's mode around what it makes.
#pragma once

#include <cuda_runtime_api.h>

namespace dcp::cuda::detail {

// Opts a kernel into `smem_bytes` of dynamic shared memory on the current device. The attribute
// is per device, so it is set once per (kernel, device): a process driving several GPUs gets it
// on each.
void allow_shared_memory_on_device(const char* name, const void* kernel, int smem_bytes);
// Streaming multiprocessors of the current device (persistent launches size their grid by it).
int multiprocessor_count();

// A second stream of the calling thread and the current device, with the events that fork it from
// a caller's stream and join it back. Per thread, so that no other thread records the events
// between one launch's fork and join; destroyed with the thread.
struct SideStream {
  cudaStream_t stream = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
};
SideStream& side_stream(const char* name);
// Work put on side.stream between the two runs beside what the caller puts on `stream`, as one
// step of `stream`, eagerly and in a captured graph alike: fork_side makes the side stream wait
// for `stream`, join_side makes `stream` wait for the side stream. Errors name `name`.
void fork_side(const char* name, cudaStream_t stream, const SideStream& side);
void join_side(const char* name, cudaStream_t stream, const SideStream& side);

}  // namespace dcp::cuda::detail
