// dcp/cuda_backend.h — the executor's CUDA backend and NCCL comm (built only with CUDA; NCCL
// when found). Both are plain factories so callers need no CUDA headers.
//
// CUDA backend: arrays in device memory (cudaMalloc, once per executor; Q/K/V/dO bf16, the rest
// fp32), one compute stream; Attend runs the tile-list kernels of attention_cuda.h in one launch
// per instruction (forward: tiles sharing an output run in one CTA with online softmax, so
// accumulating tiles need no extra partials; backward: outputs zeroed once, then fp32 atomics),
// Merge one launch of the batched LSE-merge / sum kernel (merge_batch: one launch for the whole
// batch), Copy cudaMemcpyAsync. Everything derived from a call (tile
// and work lists, merge segments) is built on its first use and cached on the device by the
// call's key, so from the second step on nothing is allocated (num_allocations() stays put).
//
// NCCL comm: bootstrapped over MPI_COMM_WORLD (ncclGetUniqueId on rank 0, MPI_Bcast,
// ncclCommInitRank). A round is one ncclGroupStart/ncclSend/ncclRecv/ncclGroupEnd on its own
// stream, ordered after the work queued so far on the bound compute stream (an event), followed
// by a completion event; wait() polls that event and ncclCommGetAsyncError until the deadline,
// then aborts the communicator and throws Timeout; on success the compute stream waits on the
// event. NCCL_NVLS_ENABLE is set to 0 unless the environment sets it.
#pragma once

#include <memory>

#include "dcp/comm.h"
#include "dcp/executor.h"

namespace dcp {

bool cuda_backend_available();  // built with CUDA and a device is visible
int cuda_device_count();        // 0 without CUDA or devices
// Pre: 0 <= device < cuda_device_count(). Throws Unsupported when built without CUDA.
std::unique_ptr<Backend> make_cuda_backend(int device);

bool nccl_available();  // built with NCCL (and MPI)
// Pre: MPI initialised; each rank passes its own device. Throws Unsupported without NCCL.
std::unique_ptr<Comm> make_nccl_comm_world(int device);

}  // namespace dcp
