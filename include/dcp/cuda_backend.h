// dcp/cuda_backend.h — the executor's CUDA backend (built only with CUDA; else the factories
// throw Unsupported). Plain factories, so callers need no CUDA headers.
//
// Arrays in device memory (Q/K/V/dO bf16, the rest fp32), one executor's arrays in one block from
// the caller's Allocator (stream-ordered, e.g. PyTorch's caching allocator) or cudaMalloc;
// compute in order on one stream: the backend's own, or the caller's (options.stream, or
// set_compute_stream per call, where 0 means the legacy default stream). Attend runs the tile-list kernels of attention_cuda.h in one launch per
// instruction (forward: tiles sharing an output run in one CTA with online softmax, so
// accumulating tiles need no extra partials; backward: outputs zeroed once, then fp32 atomics),
// Merge one launch of the batched LSE-merge / sum kernel (merge_batch: one launch for the whole
// batch), Copy cudaMemcpyAsync, exchange one launch for all its moves. What is derived from a
// call (tile and work lists, merge segments) is built once and kept on the device by the call's
// key: Executor::prepare builds every call of an executor in one host-to-device copy; calls not
// prepared are built on first use. From the second step of the same executor on nothing is
// allocated (num_allocations() stays put) and the host only launches.
#pragma once

#include <memory>
#include <string>

#include "dcp/executor.h"

namespace dcp {

// Which attention kernels run (dcp/attention_cuda.h's routes). Auto: the warp-specialised wgmma
// kernels on Hopper (sm_90) for head_dim 64 or 128, mma.sync elsewhere.
enum class KernelRoute { Auto, Mma, Wgmma, WgmmaBasic };
// How the WgmmaBasic backward adds dQ to memory (the other routes ignore it).
enum class DqReduction { Bulk, Atomic };
const char* to_string(KernelRoute route);    // "auto", "mma", "wgmma", "wgmma-basic"
const char* to_string(DqReduction dq);       // "bulk", "atomic"
// Throws InvalidInput naming `where` (a flag or variable) and the accepted spellings.
KernelRoute parse_kernel_route(const std::string& s, const std::string& where);
DqReduction parse_dq_reduction(const std::string& s, const std::string& where);
// An on/off setting: "", "0", "off", "false" -> false; "1", "on", "true" -> true.
bool parse_switch(const std::string& s, const std::string& where);
// A count of rows >= 0 ("" -> 0), e.g. CudaKernelOptions::deterministic_unit_rows.
int parse_row_count(const std::string& s, const std::string& where);

struct CudaKernelOptions {
  KernelRoute forward = KernelRoute::Auto;
  KernelRoute backward = KernelRoute::Auto;
  DqReduction dq = DqReduction::Bulk;
  // dQ, dK and dV bitwise identical run to run (no order-dependent float reductions; the
  // contract in dcp/detail/attention_cuda.h). Needs the wgmma backward (Hopper): Unsupported on
  // other routes. On one device (below) one pass over the tiles; on several, two passes, the
  // second recomputing S and dP for dQ (0.82-0.90x the default backward's speed on whole plans:
  // bench/results/cuda_attention_h200.md).
  bool deterministic_backward = false;
  // On one device, the deterministic backward in one pass over the tiles grouped by key blocks,
  // each dQ contribution added as an int32 count of a per-row unit below a bound, so that the
  // sums are exact in any order (AttnBackwardParams::dq_units; dQ keeps 29 bits below the bound,
  // 12-17 bits on rows with outlier features, above the bf16 gradient it becomes; 0.918x the
  // default backward's speed in training, the counts' conversion fused into the dQ export). Several
  // devices, or a plan whose dQ partials are merged from slots, always take two passes: the unit
  // needs every K and V row's maxima, and a merge adds floats. false: two passes everywhere.
  bool deterministic_one_pass = true;
  // The one-pass method over the default backward's work instead of the key blocks' units
  // (AttnBackwardParams::ordered): both backward kernels as the default runs them, the wide one's
  // items first, dQ in units as above, each item's dK / dV added in its turn. Bitwise repeatable
  // but no faster than one pass (0.77-0.80x the default backward on one-GPU plans: the two kernels
  // run one after the other, the turns forbidding the default's side-by-side launch, and dQ's
  // conversion to units costs about 5 %), so off.
  bool deterministic_ordered = false;
  // Its dK / dV pass's work units (cuda::make_deterministic_backward_work's unit_rows): 0, whole
  // key blocks; > 0, a key block's tiles cut into units of at most this many q rows.
  int deterministic_unit_rows = 0;
  // Classify the sub-tiles of Partial tiles once on the host (cuda::make_partial_cells) instead
  // of in every kernel step; backward items of Partial tiles with no allowed pair are not
  // launched. Same results either way; off only to measure what it saves.
  bool partial_cells = true;
  // Run the Hopper forward persistent (one CTA per SM taking work items from a counter; the next
  // item's loads under the current item's output stores) whenever no transfer round is in
  // flight. Same results either way; off to measure what it saves.
  bool persistent_forward = true;
  // Run the Hopper backward's items that need no mask (full 128-key chunks of Full tiles of at
  // least 1024 rows, head dim 128) with 80-row q steps (cuda::partition_backward_work), the rest
  // with 64-row steps. Same results up to summation order; 2-4 % faster on the backward's full
  // and causal lists (bench/results/cuda_attention_h200.md); off to measure what it saves.
  bool wide_backward = true;
  // With wide_backward: the wide kernel's items walk runs of the Full tiles that share a key block
  // (kv rows, dK / dV rows, head group) and length, cut at multiples of this many q rows
  // (cuda::make_backward_runs), holding their K / V chunk and dK / dV from the run's first tile to
  // its last; 0: one item per tile. Same results up to summation order.
  int backward_run_rows = 4096;
};

struct CudaBackendOptions {
  int device = 0;
  // Where compute is queued: a stream the backend creates (own_stream), or the caller's
  // cudaStream_t `stream` (0 is the legacy default stream, as PyTorch's default stream is).
  bool own_stream = true;
  void* stream = nullptr;
  Allocator* allocator = nullptr;  // null: cudaMalloc / cudaFree; else must outlive the backend
  CudaKernelOptions kernels;
};

bool cuda_backend_available();  // built with CUDA and a device is visible
int cuda_device_count();        // 0 without CUDA or devices
// "domain:bus:device.function" of a visible device (what NVML and nvidia-smi name it by); empty
// without CUDA or for a device outside [0, cuda_device_count()).
std::string cuda_device_pci_bus_id(int device);
// The device's product name ("NVIDIA H100 80GB HBM3"); empty without CUDA or for a device outside
// [0, cuda_device_count()).
std::string cuda_device_name(int device);
// Pre: 0 <= options.device < cuda_device_count(). Throws Unsupported when built without CUDA.
std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& options);
inline std::unique_ptr<Backend> make_cuda_backend(int device) {
  CudaBackendOptions options;
  options.device = device;
  return make_cuda_backend(options);
}

}  // namespace dcp
