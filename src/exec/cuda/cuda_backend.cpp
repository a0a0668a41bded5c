// cuda_backend.cpp — the executor's CUDA backend (see dcp/cuda_backend.h).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "cuda_backend_kernels.h"
#include "dcp/detail/attention_cuda.h"
#include "dcp/detail/bf16.h"
#include "dcp/cuda_backend.h"
#include "dcp/error.h"

namespace dcp {
namespace {

void ck(cudaError_t e, const char* where) {
  if (e != cudaSuccess) raise(ErrorKind::Cuda, std::string("cuda backend: ") + where + ": " + cudaGetErrorString(e));
}

int32_t i32(int64_t v, const char* what) {
  if (v < 0 || v > INT32_MAX) raise(ErrorKind::Unsupported, std::string("cuda backend: ") + what + " exceeds int32");
  return static_cast<int32_t>(v);
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaBackendOptions& options)
      : device_(options.device), allocator_(options.allocator), kernels_(options.kernels) {
    ck(cudaSetDevice(device_), "cudaSetDevice");
    if (!cuda::build_runs_on_current_device()) {
      int major = 0, minor = 0;
      ck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_), "cudaDeviceGetAttribute");
      ck(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_), "cudaDeviceGetAttribute");
      raise(ErrorKind::Unsupported, "cuda backend: device " + std::to_string(device_) + " is sm_" + std::to_string(major) +
                                        std::to_string(minor) + ", and this build has GPU code for " +
                                        DCP_CUDA_ARCHITECTURES +
                                        " only (the kernels need sm_80 or later; rebuild with "
                                        "-DCMAKE_CUDA_ARCHITECTURES naming it)");
    }
    ck(cudaStreamCreateWithFlags(&own_stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    stream_ = options.own_stream ? own_stream_ : static_cast<cudaStream_t>(options.stream);
    ck(cudaEventCreateWithFlags(&staging_done_, cudaEventDisableTiming), "cudaEventCreate");
  }
  ~CudaBackend() override {
    cudaStreamSynchronize(stream_);
    cudaStreamSynchronize(own_stream_);
    for (auto& [key, block] : meta_blocks_) release(block);
    for (void* p : buffers_) release(p);
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    cudaEventDestroy(staging_done_);
    if (staging_ != nullptr) cudaFreeHost(staging_);
    cudaStreamDestroy(own_stream_);
  }
  std::string name() const override { return "cuda"; }
  ElemType storage_type() const override { return ElemType::BF16; }
  bool host_memory() const override { return false; }
  bool stream_ordered_memory() const override { return allocator_ != nullptr; }
  void* allocate(int64_t bytes) override {
    void* p = nullptr;
    if (allocator_ != nullptr) p = allocator_->allocate(bytes);
    else ck(cudaMalloc(&p, static_cast<size_t>(bytes)), "cudaMalloc");
    buffers_.push_back(p);
    ++num_allocations_;
    ck(cudaMemsetAsync(p, 0, static_cast<size_t>(bytes), stream_), "cudaMemset");
    return p;
  }
  int64_t num_allocations() const override { return num_allocations_; }
  void deallocate(void* p) override {
    settle();
    auto it = std::find(buffers_.begin(), buffers_.end(), p);
    if (it == buffers_.end()) return;
    buffers_.erase(it);
    release(p);
  }
  void forget(uint64_t base, uint64_t mask) override {
    if (!pending_.empty()) {  // an executor's arrays are about to go
      settle();
      if (!stream_ordered_memory()) synchronize();
    }
    const auto stale = [&](const auto& kv) { return (kv.first & mask) == base; };
    std::erase_if(attends_, stale);
    std::erase_if(merges_, stale);
    std::erase_if(merge_batches_, stale);
    for (auto it = meta_blocks_.begin(); it != meta_blocks_.end();) {
      if ((it->first & mask) == base) {
        release(it->second);
        it = meta_blocks_.erase(it);
      } else {
        ++it;
      }
    }
  }
  void* compute_stream() override { return stream_; }
  void set_compute_stream(void* stream) override {
    settle();
    stream_ = static_cast<cudaStream_t>(stream);
  }
  // Timeline markers: one reusable event per marker index (created on first use only).
  void mark(int index) override {
    if (index < 0) return;
    while (static_cast<int>(events_.size()) <= index) {
      cudaEvent_t e = nullptr;
      ck(cudaEventCreate(&e), "cudaEventCreate");
      events_.push_back(e);
    }
    ck(cudaEventRecord(events_[static_cast<size_t>(index)], stream_), "cudaEventRecord");
  }
  std::vector<double> marker_seconds(int count) override {
    std::vector<double> out(static_cast<size_t>(std::max(0, count)), 0.0);
    if (count <= 0 || events_.empty()) return out;
    ck(cudaEventSynchronize(events_[static_cast<size_t>(std::min<int>(count, static_cast<int>(events_.size())) - 1)]),
       "cudaEventSynchronize");
    for (int i = 1; i < count && i < static_cast<int>(events_.size()); ++i) {
      float ms = 0;
      ck(cudaEventElapsedTime(&ms, events_[0], events_[static_cast<size_t>(i)]), "cudaEventElapsedTime");
      out[static_cast<size_t>(i)] = ms * 1e-3;
    }
    return out;
  }
  void synchronize() override { ck(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

  // Everything derived from the calls, built on the host and uploaded in one copy into one block
  // that lives until the executor's keys are forgotten.
  void prepare(const ArraySet& a, std::span<const AttendCall> attends, std::span<const MergeBatchCall> merges) override {
    MetaBuilder meta;
    std::vector<std::pair<uint64_t, HostAttend>> host_attends;
    std::vector<std::pair<uint64_t, HostMerge>> host_merges;
    for (const AttendCall& call : attends)
      if (attends_.count(call.key) == 0) host_attends.emplace_back(call.key, build_attend(a, call, meta));
    for (const MergeBatchCall& batch : merges)
      if (merge_batches_.count(batch.key) == 0) host_merges.emplace_back(batch.key, build_merge(a, batch.calls, meta));
    if (meta.bytes.empty()) return;
    const uint64_t owner = attends.empty() ? merges.front().key : attends.front().key;
    char* device = upload_meta(meta, owner);
    for (auto& [key, h] : host_attends) attends_.emplace(key, h.at(device));
    for (auto& [key, h] : host_merges) merge_batches_.emplace(key, h.at(device));
  }

  bool one_pass() const { return kernels_.deterministic_backward && kernels_.deterministic_one_pass; }

  // Where the Delta kernels write |dO|_2^2 of Delta rows [delta_row, + num_rows) for the one-pass
  // deterministic backward (null when it is off): the units then need no pass over dO.
  float* dout_norms_at(const ArraySet& a, int64_t delta_row, int64_t num_rows) {
    norms_begin_ = norms_end_ = 0;
    dlse_begin_ = dlse_end_ = 0;  // a Delta without d_lse (delta_from sets them after this where given)
    if (!one_pass()) return nullptr;
    return rows_of(dout_norms_, dout_norms_capacity_, a, delta_row, num_rows, norms_begin_, norms_end_);
  }
  // The same for |d_lse| (delta_from with a gradient of lse), which widens the units' bound.
  float* dlse_abs_at(const ArraySet& a, int64_t delta_row, int64_t num_rows) {
    return rows_of(dlse_abs_, dlse_abs_capacity_, a, delta_row, num_rows, dlse_begin_, dlse_end_);
  }
  // Rows [delta_row, + num_rows) of a per-(Delta row, q head) float buffer, grown to the arrays'
  // Delta rows; [begin, end) records which rows the next backward may read.
  float* rows_of(float*& buffer, int64_t& capacity, const ArraySet& a, int64_t delta_row, int64_t num_rows,
                 int64_t& begin, int64_t& end) {
    const int64_t n = a.rows[idx(Array::Delta)] * a.q_heads;
    if (capacity < n) {
      if (buffer != nullptr) deallocate(buffer);
      buffer = static_cast<float*>(allocate(n * static_cast<int64_t>(sizeof(float))));
      capacity = n;
    }
    begin = delta_row;
    end = delta_row + num_rows;
    return buffer + delta_row * a.q_heads;
  }

  // The one-pass deterministic backward's units, from the layer's K and V and |dO|_2^2 (written
  // beside Delta when the layer's Delta was computed here, else from dO). One device only (on
  // several, the K and V maxima would have to be every device's), with every dQ contribution
  // added in place (the dQ rows hold integer counts until end_backward; a Merge would read them
  // as floats).
  void begin_backward(const ArraySet& a, const BackwardRows& r) override {
    // This layer's counts that nobody read are dead once this backward rewrites every one of
    // their rows; anything else this backward could read, or whose units it could overwrite
    // (another executor's: units are indexed by array row), is converted first. Other layers of
    // the same arrays keep their counts: this layer's calls touch none of their rows or units.
    const auto mine = std::find_if(pending_.begin(), pending_.end(),
                                   [&](const PendingCounts& c) { return c.dq == a.at(Array::dQ, r.dq_row); });
    const bool foreign = std::any_of(pending_.begin(), pending_.end(),
                                     [&](const PendingCounts& c) { return c.arrays != a.base[idx(Array::dQ)]; });
    if (foreign || (mine != pending_.end() && !(r.dq_in_place && mine->rows == r.rows))) settle();
    else if (mine != pending_.end()) pending_.erase(mine);
    dq_units_ready_ = false;
    const bool have_norms = norms_begin_ <= r.delta_row && r.delta_row + r.rows <= norms_end_;
    const bool dlse_given = dlse_end_ > dlse_begin_;
    const bool have_dlse = dlse_given && dlse_begin_ <= r.delta_row && r.delta_row + r.rows <= dlse_end_;
    norms_begin_ = norms_end_ = 0;  // the norms serve the backward of the layer whose Delta made them
    dlse_begin_ = dlse_end_ = 0;
    if (!one_pass() || !r.one_device || !r.dq_in_place) return;
    // Units made without the |d_lse| of these rows would not bound their contributions.
    if (dlse_given && !(have_norms && have_dlse))
      raise(ErrorKind::Unsupported, "cuda backend: one-pass deterministic backward: a gradient of lse for Delta "
                                    "rows that are not this backward's; set deterministic_one_pass off");
    const int64_t units = a.rows[idx(Array::dO)] * a.q_heads;
    if (dq_units_ == nullptr || dq_units_capacity_ < units || dq_bound_heads_ < a.kv_heads) {
      settle();  // pending counts read their units from the old buffer
      if (dq_units_ != nullptr) deallocate(dq_units_);
      if (dq_bound_ != nullptr) deallocate(dq_bound_);
      dq_units_ = static_cast<int32_t*>(allocate(units * static_cast<int64_t>(sizeof(int32_t))));
      dq_bound_ = static_cast<float*>(allocate(int64_t{2} * a.kv_heads * static_cast<int64_t>(sizeof(float))));
      dq_units_capacity_ = units;
      dq_bound_heads_ = a.kv_heads;
    }
    cuda::AttnShape shape{a.q_heads, a.kv_heads, a.head_dim, 1.0F / std::sqrt(static_cast<float>(a.head_dim))};
    int32_t* units_at = dq_units_ + r.dout_row * a.q_heads;
    if (have_norms) {
      cuda::deterministic_dq_units_from_norms(a.at(Array::K, r.kv_row), a.at(Array::V, r.kv_row), r.kv_rows,
                                              dout_norms_ + r.delta_row * a.q_heads, r.rows, shape, dq_bound_,
                                              units_at, stream_, have_dlse ? dlse_abs_ + r.delta_row * a.q_heads : nullptr);
    } else {
      cuda::deterministic_dq_units(a.at(Array::K, r.kv_row), a.at(Array::V, r.kv_row), r.kv_rows,
                                   a.at(Array::dO, r.dout_row), r.rows, shape, dq_bound_, units_at, stream_);
    }
    dq_units_ready_ = true;
  }
  // The one-pass method's dQ rows stay integer counts until their export converts them on the
  // way out (exchange) or, before anything else could read or write them, settle() does.
  void end_backward(const ArraySet& a, const BackwardRows& r) override {
    if (!dq_units_ready_) return;
    dq_units_ready_ = false;
    pending_.push_back(PendingCounts{a.base[idx(Array::dQ)], static_cast<float*>(a.at(Array::dQ, r.dq_row)),
                                     dq_units_ + r.dout_row * a.q_heads, r.rows,
                                     cuda::AttnShape{a.q_heads, a.kv_heads, a.head_dim, 1.0F}});
  }
  void settle() {
    for (const PendingCounts& p : pending_) cuda::deterministic_dq_from_units(p.dq, p.units, p.rows, p.shape, stream_);
    pending_.clear();
  }

  void attend(const ArraySet& a, const AttendCall& call) override {
    auto it = attends_.find(call.key);
    if (it == attends_.end()) {
      MetaBuilder meta;
      HostAttend h = build_attend(a, call, meta);
      it = attends_.emplace(call.key, h.at(upload_meta(meta, call.key))).first;
    }
    const DeviceAttend& d = it->second;
    cuda::AttnShape shape{a.q_heads, a.kv_heads, a.head_dim, 0.0F};
    shape.softmax_scale = 1.0F / std::sqrt(static_cast<float>(a.head_dim));
    cuda::AttnTileList list{d.tiles, d.work, d.num_work, d.row_offsets, d.ranges};
    list.cells = d.cells;
    list.num_wide = d.num_wide;
    if (call.pass == Pass::Forward) {
      cuda::AttnForwardParams p;
      p.shape = shape;
      p.list = list;
      p.q = a.base[idx(Array::Q)];
      p.k = a.base[idx(Array::K)];
      p.v = a.base[idx(Array::V)];
      p.o = static_cast<float*>(a.base[idx(Array::O)]);
      p.lse = static_cast<float*>(a.base[idx(Array::LSE)]);
      p.kv_rows = std::min(a.rows[idx(Array::K)], a.rows[idx(Array::V)]);
      p.q_rows = a.rows[idx(Array::Q)];
      p.route = route(kernels_.forward);
      // Persistent unless transfers run meanwhile: a persistent launch holds every SM until its
      // last item, so NCCL's kernels would wait for the whole call instead of taking SMs as CTAs
      // retire. Calls on one stream run one after another and share its counter; calls on
      // different streams (set_compute_stream) may overlap, so each stream has its own. Work
      // captured into a CUDA graph runs whenever the graph is replayed, next to anything queued
      // on any stream: each capture has a counter of its own.
      if (kernels_.persistent_forward && !call.comm_in_flight) {
        cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
        unsigned long long capture_id = 0;
        ck(cudaStreamGetCaptureInfo(stream_, &capture, &capture_id), "cudaStreamGetCaptureInfo");
        int32_t*& counter = capture == cudaStreamCaptureStatusActive
                                ? capture_counters_[capture_id]
                                : work_counters_[stream_];
        if (counter == nullptr) counter = static_cast<int32_t*>(allocate(2 * sizeof(int32_t)));
        p.work_counter = counter;
      }
      cuda::attention_forward(p, stream_);
      return;
    }
    cuda::zero_ranges(d.zero, d.num_zero, stream_);
    cuda::AttnBackwardParams p;
    p.shape = shape;
    p.list = list;
    p.q = a.base[idx(Array::Q)];
    p.k = a.base[idx(Array::K)];
    p.v = a.base[idx(Array::V)];
    p.dout = a.base[idx(Array::dO)];
    p.q_rows = a.rows[idx(Array::Q)];
    p.dout_rows = a.rows[idx(Array::dO)];
    p.lse = static_cast<const float*>(a.base[idx(Array::LSE)]);
    p.delta = static_cast<const float*>(a.base[idx(Array::Delta)]);
    p.dq = static_cast<float*>(a.base[idx(Array::dQ)]);
    p.dq_rows = a.rows[idx(Array::dQ)];
    p.dk = static_cast<float*>(a.base[idx(Array::dK)]);
    p.dv = static_cast<float*>(a.base[idx(Array::dV)]);
    p.dkv_rows = std::min(a.rows[idx(Array::dK)], a.rows[idx(Array::dV)]);
    p.route = route(kernels_.backward);
    p.dq_mode = kernels_.dq == DqReduction::Atomic ? cuda::AttnDqMode::Atomic : cuda::AttnDqMode::Bulk;
    p.kv_rows = std::min(a.rows[idx(Array::K)], a.rows[idx(Array::V)]);
    if (kernels_.deterministic_backward) {
      p.deterministic = true;
      p.semaphores = semaphores_;
      p.num_semaphores = d.num_semaphores;
      p.dq_units = dq_units_ready_ ? dq_units_ : nullptr;
      p.dq_list = list;
      p.dq_list.tiles = d.dq_tiles;
      p.dq_list.work = d.dq_work;
      p.dq_list.num_work = d.num_dq_work;
      if (p.dq_units != nullptr && d.ordered_work != nullptr) {
        p.ordered = true;
        p.list.tiles = d.ordered_tiles;
        p.list.work = d.ordered_work;
        p.list.num_work = d.num_ordered_work;
        p.list.num_wide = d.num_ordered_wide;
        p.num_semaphores = d.num_ordered_semaphores;
      }
    }
    cuda::attention_backward(p, stream_);
  }

  // One launch per call (merge) or per batch (merge_batch), of the same kernel.
  void merge(const ArraySet& a, const MergeCall& m) override {
    settle();
    run_merges(merges_, m.key, a, std::span<const MergeCall>(&m, 1));
  }
  void merge_batch(const ArraySet& a, const MergeBatchCall& b) override {
    settle();
    run_merges(merge_batches_, b.key, a, b.calls);
  }

  void copy_rows(const ArraySet& a, Array arr, int64_t dst, int64_t src, int64_t num_rows) override {
    settle();
    const auto bytes = static_cast<size_t>(num_rows * a.row_elems[idx(arr)] * elem_bytes(a.type[idx(arr)]));
    ck(cudaMemcpyAsync(a.at(arr, dst), a.at(arr, src), bytes, cudaMemcpyDeviceToDevice, stream_), "copy");
  }
  void zero_rows(const ArraySet& a, Array arr, int64_t row, int64_t num_rows) override {
    settle();
    const auto bytes = static_cast<size_t>(num_rows * a.row_elems[idx(arr)] * elem_bytes(a.type[idx(arr)]));
    ck(cudaMemsetAsync(a.at(arr, row), 0, bytes, stream_), "zero");
  }
  void compute_delta(const ArraySet& a, int64_t d_o, int64_t o, int64_t delta, int64_t num_rows) override {
    cuda::delta_bf16_f32(a.at(Array::dO, d_o), static_cast<const float*>(a.at(Array::O, o)),
                         static_cast<float*>(a.at(Array::Delta, delta)), dout_norms_at(a, delta, num_rows),
                         num_rows * a.q_heads, a.head_dim, stream_);
  }
  void exchange(const ArraySet& a, std::span<const LocalExchange> moves) override {
    // An export of exactly the pending dQ rows converts them as it copies; anything else that
    // moves dQ rows finds them converted first.
    const int32_t* fused_units = nullptr;
    size_t fused = moves.size();
    if (!pending_.empty()) {
      bool other = false;  // another move of dQ rows
      auto match = pending_.end();
      for (size_t i = 0; i < moves.size(); ++i) {
        const LocalExchange& x = moves[i];
        if (x.array != Array::dQ) continue;
        const auto it = std::find_if(pending_.begin(), pending_.end(), [&](const PendingCounts& c) {
          return !x.import && a.at(Array::dQ, x.first_row) == c.dq && x.num_rows * x.num_groups == c.rows;
        });
        if (it != pending_.end() && fused == moves.size()) {
          fused = i;
          match = it;
        } else {
          other = true;
        }
      }
      if (other) {
        fused = moves.size();
        settle();
      } else if (fused < moves.size()) {
        fused_units = match->units;
        pending_.erase(match);
      }
    }
    for (size_t first = 0; first < moves.size(); first += cuda::kMaxExchangeMoves) {
      cuda::ExchangeBatch batch;
      for (size_t i = first; i < std::min(moves.size(), first + cuda::kMaxExchangeMoves); ++i) {
        const LocalExchange& x = moves[i];
        const TensorView& t = x.tensor;
        const auto ai = idx(x.array);
        cuda::ExchangeMove& m = batch.moves[batch.num_moves++];
        m.tensor = t.data;
        m.array = a.at(x.array, x.first_row);
        m.row_stride = t.row_stride;
        m.head_stride = t.head_stride;
        m.num_rows = x.num_rows;
        m.heads_per_group = static_cast<int32_t>(t.heads / x.num_groups);
        m.head_dim = static_cast<int32_t>(t.head_dim);
        m.num_groups = x.num_groups;
        m.tensor_bf16 = t.type == ElemType::BF16 ? 1 : 0;
        m.array_bf16 = a.type[ai] == ElemType::BF16 ? 1 : 0;
        m.import = x.import ? 1 : 0;
        m.units = i == fused ? fused_units : nullptr;
        // 8 elements at a time where both sides are 16-byte aligned (fp32: 32 bytes apart).
        const auto addr = reinterpret_cast<uintptr_t>(t.data);
        m.vector = t.head_dim % 8 == 0 && addr % 16 == 0 && t.row_stride % 8 == 0 && t.head_stride % 8 == 0 ? 1 : 0;
      }
      cuda::exchange_rows(batch, stream_);
    }
  }
  void delta_from(const ArraySet& a, int64_t delta_row, int64_t num_rows, int num_groups, const TensorView& d_o,
                  const TensorView& o, const TensorView* d_lse) override {
    cuda::DeltaFromParams p;
    p.d_o = d_o.data;
    p.o = o.data;
    p.delta = static_cast<float*>(a.at(Array::Delta, delta_row));
    p.norm2 = dout_norms_at(a, delta_row, num_rows * num_groups);
    p.do_row_stride = d_o.row_stride;
    p.do_head_stride = d_o.head_stride;
    p.o_row_stride = o.row_stride;
    p.o_head_stride = o.head_stride;
    p.num_rows = num_rows;
    p.heads_per_group = a.q_heads;
    p.num_groups = num_groups;
    p.head_dim = a.head_dim;
    p.do_bf16 = d_o.type == ElemType::BF16 ? 1 : 0;
    p.o_bf16 = o.type == ElemType::BF16 ? 1 : 0;
    if (d_lse != nullptr) {
      p.d_lse = static_cast<const float*>(d_lse->data);
      p.dlse_row_stride = d_lse->row_stride;
      p.dlse_head_stride = d_lse->head_stride;
      // The one-pass deterministic backward's units widen by |d_lse| (dq_units.h).
      if (one_pass()) p.dlse_abs = dlse_abs_at(a, delta_row, num_rows * num_groups);
    }
    cuda::delta_from_tensors(p, stream_);
  }
  // Host copies run on the compute stream and finish before returning. A plain cudaMemcpy from
  // pageable memory may return before its DMA has landed (only the staging copy is done), and it
  // runs on the legacy stream, which our non-blocking stream does not wait for: a kernel launched
  // right after an upload (compute_delta after the last dO rows) could read the old contents.
  void upload(const ArraySet& a, Array arr, int64_t row, const float* host, int64_t host_ld,
              int64_t num_rows) override {
    settle();
    const int64_t w = a.row_elems[idx(arr)];
    if (a.type[idx(arr)] == ElemType::BF16) {
      std::vector<uint16_t> tmp(static_cast<size_t>(num_rows * w));
      for (int64_t r = 0; r < num_rows; ++r)
        for (int64_t x = 0; x < w; ++x) tmp[static_cast<size_t>(r * w + x)] = to_bf16_bits(host[r * host_ld + x]);
      ck(cudaMemcpyAsync(a.at(arr, row), tmp.data(), tmp.size() * 2, cudaMemcpyHostToDevice, stream_), "upload");
      synchronize();  // tmp dies here
      return;
    }
    ck(cudaMemcpy2DAsync(a.at(arr, row), static_cast<size_t>(w) * 4, host, static_cast<size_t>(host_ld) * 4,
                         static_cast<size_t>(w) * 4, static_cast<size_t>(num_rows), cudaMemcpyHostToDevice, stream_),
       "upload");
    synchronize();
  }
  void download(const ArraySet& a, Array arr, int64_t row, float* host, int64_t host_ld,
                int64_t num_rows) override {
    settle();
    const int64_t w = a.row_elems[idx(arr)];
    if (a.type[idx(arr)] == ElemType::BF16) {
      std::vector<uint16_t> tmp(static_cast<size_t>(num_rows * w));
      ck(cudaMemcpyAsync(tmp.data(), a.at(arr, row), tmp.size() * 2, cudaMemcpyDeviceToHost, stream_), "download");
      synchronize();
      for (int64_t r = 0; r < num_rows; ++r)
        for (int64_t x = 0; x < w; ++x) host[r * host_ld + x] = from_bf16_bits(tmp[static_cast<size_t>(r * w + x)]);
      return;
    }
    ck(cudaMemcpy2DAsync(host, static_cast<size_t>(host_ld) * 4, a.at(arr, row), static_cast<size_t>(w) * 4,
                         static_cast<size_t>(w) * 4, static_cast<size_t>(num_rows), cudaMemcpyDeviceToHost, stream_),
       "download");
    synchronize();
  }
  void fill_random(const ArraySet& a, Array arr, int64_t row, int64_t num_rows, uint64_t seed,
                   float amplitude) override {
    settle();
    cuda::fill_random(a.at(arr, row), a.type[idx(arr)] == ElemType::BF16, num_rows * a.row_elems[idx(arr)], seed,
                      amplitude, stream_);
  }

 private:
  struct DeviceAttend {
    const cuda::AttnTile* tiles = nullptr;
    const cuda::AttnWorkItem* work = nullptr;
    int32_t num_work = 0;
    const int32_t* row_offsets = nullptr;
    const int32_t* ranges = nullptr;
    const cuda::ZeroRange* zero = nullptr;
    int num_zero = 0;
    int32_t num_semaphores = 0;  // deterministic backward
    const uint8_t* cells = nullptr;  // Partial tiles' cell classes
    const cuda::AttnTile* dq_tiles = nullptr;  // deterministic backward: the dQ pass
    const cuda::AttnWorkItem* dq_work = nullptr;
    int32_t num_dq_work = 0;
    int32_t num_wide = 0;  // backward: items [0, num_wide) for the wide kernel (partition_backward_work)
    // The ordered deterministic backward's list (the default work with turns), taken where the
    // one-pass units are ready.
    const cuda::AttnTile* ordered_tiles = nullptr;
    const cuda::AttnWorkItem* ordered_work = nullptr;
    int32_t num_ordered_work = 0;
    int32_t num_ordered_wide = 0;
    int32_t num_ordered_semaphores = 0;
  };
  struct DeviceMerge {
    const cuda::MergeSegment* segments = nullptr;
    int32_t num_segments = 0;
    int32_t num_blocks = 0;
    const cuda::MergePart* parts = nullptr;
  };

  // Host image of what a set of calls needs on the device: vectors appended at 256-byte offsets
  // of one buffer, so one copy uploads them all.
  struct MetaBuilder {
    std::vector<char> bytes;
    static constexpr size_t kNone = SIZE_MAX;
    template <class T>
    size_t add(const std::vector<T>& v) {
      if (v.empty()) return kNone;
      const size_t at = bytes.size();
      bytes.resize(at + ((v.size() * sizeof(T) + 255) & ~size_t{255}));
      std::memcpy(bytes.data() + at, v.data(), v.size() * sizeof(T));
      return at;
    }
  };
  template <class T>
  static const T* at_offset(char* device, size_t offset) {
    return offset == MetaBuilder::kNone ? nullptr : reinterpret_cast<const T*>(device + offset);
  }
  struct HostAttend {
    size_t tiles = 0, work = 0, row_offsets = 0, ranges = 0, zero = 0,
           cells = MetaBuilder::kNone, dq_tiles = MetaBuilder::kNone, dq_work = MetaBuilder::kNone,
           ordered_tiles = MetaBuilder::kNone, ordered_work = MetaBuilder::kNone;
    int32_t num_work = 0;
    int num_zero = 0;
    int32_t num_semaphores = 0;
    int32_t num_dq_work = 0;
    int32_t num_wide = 0;
    int32_t num_ordered_work = 0, num_ordered_wide = 0, num_ordered_semaphores = 0;
    DeviceAttend at(char* device) const {
      return DeviceAttend{at_offset<cuda::AttnTile>(device, tiles),
                          at_offset<cuda::AttnWorkItem>(device, work),
                          num_work,
                          at_offset<int32_t>(device, row_offsets),
                          at_offset<int32_t>(device, ranges),
                          at_offset<cuda::ZeroRange>(device, zero),
                          num_zero,
                          num_semaphores,
                          at_offset<uint8_t>(device, cells),
                          at_offset<cuda::AttnTile>(device, dq_tiles),
                          at_offset<cuda::AttnWorkItem>(device, dq_work),
                          num_dq_work,
                          num_wide,
                          at_offset<cuda::AttnTile>(device, ordered_tiles),
                          at_offset<cuda::AttnWorkItem>(device, ordered_work),
                          num_ordered_work,
                          num_ordered_wide,
                          num_ordered_semaphores};
    }
  };
  struct HostMerge {
    size_t segments = 0, parts = 0;
    int32_t num_segments = 0, num_blocks = 0;
    DeviceMerge at(char* device) const {
      return DeviceMerge{at_offset<cuda::MergeSegment>(device, segments), num_segments, num_blocks,
                         at_offset<cuda::MergePart>(device, parts)};
    }
  };

  static size_t idx(Array a) { return static_cast<size_t>(a); }

  // Whether attention_backward runs the Wgmma route for this shape on the current device.
  bool backward_route_is_wgmma(const cuda::AttnShape& shape) const {
    cuda::AttnBackwardParams p;
    p.shape = shape;
    p.route = route(kernels_.backward);
    return cuda::attention_backward_route(p) == cuda::AttnKernelRoute::Wgmma;
  }

  static cuda::AttnKernelRoute route(KernelRoute r) {
    switch (r) {
      case KernelRoute::Mma: return cuda::AttnKernelRoute::Mma;
      case KernelRoute::Wgmma: return cuda::AttnKernelRoute::Wgmma;
      case KernelRoute::WgmmaBasic: return cuda::AttnKernelRoute::WgmmaBasic;
      case KernelRoute::Auto: break;
    }
    return cuda::AttnKernelRoute::Auto;
  }

  // The deterministic backward's dK / dV turns: one semaphore buffer for every call (calls run in order on
  // the compute stream; each launch zeroes what it uses), grown while calls are prepared.
  void reserve_semaphores(int32_t count) {
    if (count <= semaphore_capacity_) return;
    if (semaphores_ != nullptr) deallocate(semaphores_);
    semaphores_ = static_cast<int32_t*>(allocate(int64_t{count} * static_cast<int64_t>(sizeof(int32_t))));
    semaphore_capacity_ = count;
  }

  void release(void* p) noexcept {
    if (allocator_ != nullptr) {
      allocator_->deallocate(p);  // stream-ordered: may be reused only by work queued after ours
      return;
    }
    cudaStreamSynchronize(stream_);
    cudaFree(p);
  }

  // Copies the image to a new device block (through the pinned staging buffer, asynchronously,
  // on the compute stream) owned by `key`'s executor; returns the block.
  char* upload_meta(const MetaBuilder& meta, uint64_t key) {
    const size_t bytes = meta.bytes.size();
    // The staging buffer is reused: the previous copy out of it must have finished.
    ck(cudaEventSynchronize(staging_done_), "cudaEventSynchronize");
    if (bytes > staging_size_) {
      if (staging_ != nullptr) ck(cudaFreeHost(staging_), "cudaFreeHost");
      staging_ = nullptr;
      staging_size_ = std::max(bytes, staging_size_ * 2);
      ck(cudaMallocHost(&staging_, staging_size_), "cudaMallocHost");
    }
    std::memcpy(staging_, meta.bytes.data(), bytes);
    void* block = allocator_ != nullptr ? allocator_->allocate(static_cast<int64_t>(bytes)) : nullptr;
    if (block == nullptr) ck(cudaMalloc(&block, bytes), "cudaMalloc");
    ++num_allocations_;
    meta_blocks_.emplace(key, block);
    ck(cudaMemcpyAsync(block, staging_, bytes, cudaMemcpyHostToDevice, stream_), "metadata");
    ck(cudaEventRecord(staging_done_, stream_), "cudaEventRecord");
    return static_cast<char*>(block);
  }

  HostAttend build_attend(const ArraySet& a, const AttendCall& call, MetaBuilder& meta) {
    const bool fwd = call.pass == Pass::Forward;
    // Forward: tiles sharing an output (same O rows) form one run, in call order; the run's first
    // tile decides whether the output's old content is an input.
    std::vector<std::vector<size_t>> runs;
    std::map<int64_t, size_t> run_of;
    std::vector<cuda::ZeroRange> zero;
    std::map<int64_t, bool> dq_seen, dkv_seen;
    for (size_t i = 0; i < call.tiles.size(); ++i) {
      const AttendTile& t = call.tiles[i];
      if (fwd) {
        auto [it, fresh] = run_of.emplace(t.o, runs.size());
        if (fresh) runs.emplace_back();
        else if (!t.accumulate_q)
          raise(ErrorKind::Unsupported, "cuda backend: a forward tile overwrites an output written earlier in its Attend");
        runs[it->second].push_back(i);
        continue;
      }
      runs.push_back({i});
      auto note = [&](std::map<int64_t, bool>& seen, int64_t row, bool accumulate, int64_t n, std::vector<Array> arrs) {
        const bool fresh = seen.emplace(row, true).second;
        if (!fresh && !accumulate)
          raise(ErrorKind::Unsupported, "cuda backend: a backward tile overwrites a gradient written earlier in its Attend");
        if (fresh && !accumulate)
          for (Array arr : arrs) zero.push_back({static_cast<float*>(a.at(arr, row)), n * a.row_elems[idx(arr)]});
      };
      note(dq_seen, t.dq, t.accumulate_q, t.num_q, {Array::dQ});
      note(dkv_seen, t.dkv, t.accumulate_kv, t.num_kv, {Array::dK, Array::dV});
    }
    std::vector<cuda::AttnTile> tiles;
    std::vector<int32_t> offsets;
    std::map<std::tuple<int64_t, int64_t, int64_t>, size_t> mask_rows;  // (mask, ranges_begin, rows) -> first offset
    std::vector<int32_t> ranges;
    for (const Range& r : call.ranges) {
      ranges.push_back(i32(r.begin, "range"));
      ranges.push_back(i32(r.end, "range"));
    }
    std::vector<cuda::AttnWorkItem> work;
    std::vector<cuda::AttnRun> run_tiles;  // runs[r] as tiles of `tiles`
    for (size_t r = 0; r < runs.size(); ++r) {
      run_tiles.push_back(cuda::AttnRun{static_cast<int32_t>(tiles.size()), static_cast<int32_t>(runs[r].size()),
                                        call.tiles[runs[r][0]].accumulate_q});
      for (size_t i : runs[r]) {
        const AttendTile& t = call.tiles[i];
        if (t.num_q != call.tiles[runs[r][0]].num_q || t.q != call.tiles[runs[r][0]].q)
          raise(ErrorKind::Unsupported, "cuda backend: tiles sharing an output read different q rows");
        cuda::AttnTile c;
        c.q_begin = i32(t.q, "row");
        c.q_len = i32(t.num_q, "rows");
        c.kv_begin = i32(t.kv, "row");
        c.kv_len = i32(t.num_kv, "rows");
        c.kind = t.kind == TileKind::Full ? cuda::TileKind::Full
                 : t.kind == TileKind::CausalDiagonal ? cuda::TileKind::CausalDiagonal : cuda::TileKind::Partial;
        c.kv_head_begin = 0;
        c.kv_head_end = a.kv_heads;
        if (fwd) {
          c.out_begin = i32(t.o, "row");
          c.lse_begin = i32(t.lse, "row");
        } else {
          c.dout_begin = i32(t.d_o, "row");
          c.lse_begin = i32(t.lse_in, "row");
          c.delta_begin = i32(t.delta, "row");
          c.dq_begin = i32(t.dq, "row");
          c.dkv_begin = i32(t.dkv, "row");
        }
        if (t.kind == TileKind::Partial) {
          // Head groups repeat a tile's mask rows: one copy of them (and so one set of cells).
          const auto [it, fresh] = mask_rows.try_emplace({t.mask, t.ranges_begin, t.num_q}, offsets.size());
          c.range_row_begin = i32(static_cast<int64_t>(it->second), "mask");
          if (fresh)
            for (int64_t k = 0; k <= t.num_q; ++k)
              offsets.push_back(i32(t.ranges_begin + call.row_offsets[static_cast<size_t>(t.mask + k)], "mask"));
        }
        tiles.push_back(c);
      }
    }
    std::vector<uint8_t> cells;
    if (kernels_.partial_cells) cells = cuda::make_partial_cells(tiles, offsets, ranges);
    const cuda::AttnShape shape{a.q_heads, a.kv_heads, a.head_dim, 0.0F};
    if (fwd) work = cuda::make_forward_run_work(tiles, run_tiles, shape);
    HostAttend h;
    if (!fwd) {
      if (kernels_.deterministic_backward) {
        if (kernels_.deterministic_one_pass && kernels_.deterministic_ordered) {
          std::vector<cuda::AttnWorkItem> ordered = cuda::make_backward_work(tiles, shape, cells);
          if (kernels_.wide_backward) h.num_ordered_wide = cuda::partition_backward_work(ordered, tiles, shape);
          h.num_ordered_semaphores = cuda::order_backward_turns(ordered, tiles, shape);
          reserve_semaphores(h.num_ordered_semaphores);
          h.ordered_tiles = meta.add(tiles);
          h.ordered_work = meta.add(ordered);
          h.num_ordered_work = i32(static_cast<int64_t>(ordered.size()), "work items");
        }
        cuda::DeterministicBackwardWork det = cuda::make_deterministic_backward_work(tiles, shape, kernels_.deterministic_unit_rows, cells);
        tiles = std::move(det.dkv_tiles);
        work = std::move(det.dkv_work);
        h.dq_tiles = meta.add(det.dq_tiles);
        h.dq_work = meta.add(det.dq_work);
        h.num_dq_work = i32(static_cast<int64_t>(det.dq_work.size()), "work items");
        h.num_semaphores = det.num_semaphores;
        reserve_semaphores(det.num_semaphores);
      } else {
        work = cuda::make_backward_work(tiles, shape, cells);
        if (kernels_.wide_backward) {
          h.num_wide = cuda::partition_backward_work(work, tiles, shape);
          // Runs are walked by the Wgmma route's wide kernel alone; the other routes take a
          // work item as one tile.
          if (kernels_.backward_run_rows > 0 && backward_route_is_wgmma(shape))
            h.num_wide = cuda::make_backward_runs(tiles, work, h.num_wide, shape, kernels_.backward_run_rows);
        }
      }
    }
    h.tiles = meta.add(tiles);
    h.work = meta.add(work);
    h.num_work = i32(static_cast<int64_t>(work.size()), "work items");
    h.row_offsets = meta.add(offsets);
    h.ranges = meta.add(ranges);
    h.cells = meta.add(cells);
    h.zero = meta.add(zero);
    h.num_zero = static_cast<int>(zero.size());
    return h;
  }

  void run_merges(std::map<uint64_t, DeviceMerge>& cache, uint64_t key, const ArraySet& a,
                  std::span<const MergeCall> calls) {
    auto it = cache.find(key);
    if (it == cache.end()) {
      MetaBuilder meta;
      HostMerge h = build_merge(a, calls, meta);
      it = cache.emplace(key, h.at(upload_meta(meta, key))).first;
    }
    const DeviceMerge& d = it->second;
    cuda::merge_batch(cuda::MergeBatchParams{d.segments, d.num_segments, d.num_blocks, d.parts}, stream_);
  }

  // One segment per output block (dKV: one for dK, one for dV); an accumulating call's
  // destination is its first partial (merged in place).
  HostMerge build_merge(const ArraySet& a, std::span<const MergeCall> calls, MetaBuilder& meta) {
    std::vector<cuda::MergeSegment> segments;
    std::vector<cuda::MergePart> parts;
    for (const MergeCall& m : calls) {
      const std::vector<Array> arrs = m.kind == DataKind::O    ? std::vector<Array>{Array::O}
                                      : m.kind == DataKind::dQ ? std::vector<Array>{Array::dQ}
                                                               : std::vector<Array>{Array::dK, Array::dV};
      const bool lse = m.kind == DataKind::O;
      for (Array arr : arrs) {
        if (a.type[idx(arr)] != ElemType::F32) raise(ErrorKind::Unsupported, "cuda backend: merge into a bf16 array");
        cuda::MergeSegment g;
        g.out_f32 = f32(a, arr, m.dst);
        g.lse_out = lse ? f32(a, Array::LSE, m.dst_lse) : nullptr;
        g.num_rows = i32(m.num_rows, "merge rows");
        g.row_elems = i32(a.row_elems[idx(arr)], "row");
        g.head_dim = lse ? a.head_dim : 0;
        g.part_begin = i32(static_cast<int64_t>(parts.size()), "merge partials");
        if (m.accumulate) parts.push_back({f32(a, arr, m.dst), lse ? f32(a, Array::LSE, m.dst_lse) : nullptr});
        for (size_t i = 0; i < m.src.size(); ++i)
          parts.push_back({f32(a, arr, m.src[i]), lse ? f32(a, Array::LSE, m.src_lse[i]) : nullptr});
        g.part_end = i32(static_cast<int64_t>(parts.size()), "merge partials");
        segments.push_back(g);
      }
    }
    HostMerge h;
    h.num_blocks = cuda::prepare_merge_batch(segments);
    h.num_segments = i32(static_cast<int64_t>(segments.size()), "merge segments");
    h.segments = meta.add(segments);
    h.parts = meta.add(parts);
    return h;
  }

  static float* f32(const ArraySet& a, Array arr, int64_t row) { return static_cast<float*>(a.at(arr, row)); }

  int device_ = 0;
  Allocator* allocator_ = nullptr;
  CudaKernelOptions kernels_;
  cudaStream_t own_stream_ = nullptr;
  cudaStream_t stream_ = nullptr;  // where compute is queued: own_stream_ or the caller's (0: legacy default)
  std::vector<cudaEvent_t> events_;  // timeline markers
  std::vector<void*> buffers_;
  int64_t num_allocations_ = 0;
  void* staging_ = nullptr;  // pinned host image of the metadata being uploaded
  size_t staging_size_ = 0;
  cudaEvent_t staging_done_ = nullptr;
  std::multimap<uint64_t, void*> meta_blocks_;  // metadata blocks by the key that made them
  std::map<uint64_t, DeviceAttend> attends_;
  std::map<uint64_t, DeviceMerge> merges_;         // per call (merge)
  std::map<uint64_t, DeviceMerge> merge_batches_;  // per batch (merge_batch)
  int32_t* semaphores_ = nullptr;                  // deterministic backward (reserve_semaphores)
  int32_t* dq_units_ = nullptr;                    // one-pass deterministic backward (begin_backward)
  int64_t dq_units_capacity_ = 0;
  float* dout_norms_ = nullptr;  // |dO|_2^2 indexed like Delta, rows [norms_begin_, norms_end_) valid
  int64_t dout_norms_capacity_ = 0;
  int64_t norms_begin_ = 0;
  int64_t norms_end_ = 0;
  float* dlse_abs_ = nullptr;  // |d_lse| indexed like Delta, rows [dlse_begin_, dlse_end_) valid
  int64_t dlse_abs_capacity_ = 0;
  int64_t dlse_begin_ = 0;
  int64_t dlse_end_ = 0;
  float* dq_bound_ = nullptr;
  int dq_bound_heads_ = 0;
  bool dq_units_ready_ = false;
  struct PendingCounts {  // dQ rows holding the one-pass method's counts (end_backward), per layer
    const void* arrays = nullptr;  // the dQ array they are rows of
    float* dq = nullptr;
    const int32_t* units = nullptr;
    int64_t rows = 0;
    cuda::AttnShape shape;
  };
  std::vector<PendingCounts> pending_;
  std::map<cudaStream_t, int32_t*> work_counters_;  // persistent forward launches, per stream (zeroed by allocate)
  std::map<unsigned long long, int32_t*> capture_counters_;  // the same, per CUDA graph capture
  int32_t semaphore_capacity_ = 0;
};

}  // namespace

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}
bool cuda_backend_available() { return cuda_device_count() > 0; }
std::string cuda_device_pci_bus_id(int device) {
  if (device < 0 || device >= cuda_device_count()) return "";
  char bus[32] = {};
  if (cudaDeviceGetPCIBusId(bus, sizeof bus, device) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  return bus;
}
std::string cuda_device_name(int device) {
  if (device < 0 || device >= cuda_device_count()) return "";
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  return prop.name;
}
std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& options) {
  const int n = cuda_device_count();
  if (options.device < 0 || options.device >= n)
    raise(ErrorKind::InvalidInput, "cuda backend: device " + std::to_string(options.device) + " outside the " +
                                       std::to_string(n) + " visible devices");
  return std::make_unique<CudaBackend>(options);
}

}  // namespace dcp
