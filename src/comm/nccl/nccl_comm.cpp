// NCCL comm (see dcp/nccl_comm.h): rounds are NCCL groups on a communication stream, ordered
// against the bound compute stream with events; blocking waits poll with a deadline so a dead
// peer ends in Timeout (after ncclCommAbort) instead of a hang.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <thread>

#include "comm/check_ops.h"
#include "comm/nccl/nccl_internal.h"
#include "dcp/error.h"
#include "dcp/nccl_comm.h"

namespace dcp {
namespace {

using Clock = std::chrono::steady_clock;

void ck_cuda(cudaError_t e, const char* where) {
  if (e != cudaSuccess) raise(ErrorKind::Cuda, std::string("nccl comm: ") + where + ": " + cudaGetErrorString(e));
}
void ck_nccl(ncclResult_t r, const char* where) {
  if (r != ncclSuccess && r != ncclInProgress)
    raise(ErrorKind::Nccl, std::string("nccl comm: ") + where + ": " + ncclGetErrorString(r));
}

static_assert(sizeof(ncclUniqueId) <= sizeof(NcclUniqueId::bytes), "ncclUniqueId grew");

class NcclComm final : public Comm {
 public:
  NcclComm(const NcclUniqueId& uid, int rank, int world_size, const NcclCommOptions& options,
           std::function<void()> on_abort)
      : device_(options.device), rank_(rank), size_(world_size), blocking_(options.blocking_wait),
        on_abort_(std::move(on_abort)) {
    if (world_size < 1 || rank < 0 || rank >= world_size)
      raise(ErrorKind::InvalidInput, "nccl comm: rank " + std::to_string(rank) + " outside world of " +
                                         std::to_string(world_size));
    ck_cuda(cudaSetDevice(device_), "cudaSetDevice");
    ncclUniqueId id{};
    std::memcpy(&id, uid.bytes.data(), sizeof(id));
    ck_nccl(ncclCommInitRank(&comm_, size_, id, rank_), "ncclCommInitRank");
    // Highest priority: an Attend launch queues thousands of CTAs on the compute stream, and at
    // equal priority the block scheduler hands out all of them before the NCCL kernel gets an SM,
    // so a transfer posted before a long stage only moved once that stage had finished (measured
    // on 2 x H200: 54 ms of a 141 ms forward pass spent waiting). At higher priority the NCCL
    // kernel takes the next free SM and the transfer overlaps the stage, as the schedule assumes.
    int least_priority = 0, greatest_priority = 0;
    ck_cuda(cudaDeviceGetStreamPriorityRange(&least_priority, &greatest_priority), "cudaDeviceGetStreamPriorityRange");
    ck_cuda(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest_priority), "cudaStreamCreateWithPriority");
    ck_cuda(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate");
    ck_cuda(cudaMalloc(&barrier_word_, sizeof(int32_t)), "cudaMalloc");
  }
  ~NcclComm() override {
    if (!aborted_) {
      cudaStreamSynchronize(stream_);
      ncclCommDestroy(comm_);
    }
    for (auto& [id, ev] : done_) cudaEventDestroy(ev);
    for (auto& [id, ev] : points_) cudaEventDestroy(ev);
    cudaEventDestroy(ready_);
    cudaFree(barrier_word_);
    cudaStreamDestroy(stream_);
  }
  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  std::string name() const override { return "nccl"; }
  bool host_memory() const override { return false; }
  void bind_stream(void* stream) override { compute_ = static_cast<cudaStream_t>(stream); }

  void start(int32_t round, std::span<const CommOp> ops) override {
    // Sends read what the compute stream has produced so far.
    ck_cuda(cudaEventRecord(ready_, compute_), "cudaEventRecord");
    post(round, ops, ready_);
  }

  void note_point(int32_t point) override {
    cudaEvent_t& ev = points_[point];
    if (ev == nullptr) ck_cuda(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
    ck_cuda(cudaEventRecord(ev, compute_), "cudaEventRecord");
  }

  void start_after(int32_t round, std::span<const CommOp> ops, int32_t point) override {
    const auto it = points_.find(point);
    if (it == points_.end())
      raise(ErrorKind::InvalidInput, "nccl comm rank " + std::to_string(rank_) + ": round " + std::to_string(round) +
                                         " ordered after point " + std::to_string(point) + ", which was never noted");
    post(round, ops, it->second);
  }

 private:
  void post(int32_t round, std::span<const CommOp> ops, cudaEvent_t ready) {
    if (aborted_) raise(ErrorKind::System, "nccl comm: communicator was aborted");
    comm_detail::check_ops(*this, round, ops, pending_.count(round) != 0);
    ck_cuda(cudaStreamWaitEvent(stream_, ready, 0), "cudaStreamWaitEvent");
    ck_nccl(ncclGroupStart(), "ncclGroupStart");
    for (const CommOp& op : ops) {
      if (op.bytes == 0) continue;  // both ends skip it alike (sizes match)
      const auto n = static_cast<size_t>(op.bytes);
      if (op.send) ck_nccl(ncclSend(op.data, n, ncclInt8, op.peer, comm_, stream_), "ncclSend");
      else ck_nccl(ncclRecv(op.data, n, ncclInt8, op.peer, comm_, stream_), "ncclRecv");
    }
    ck_nccl(ncclGroupEnd(), "ncclGroupEnd");
    cudaEvent_t& ev = done_[round];
    if (ev == nullptr) ck_cuda(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
    ck_cuda(cudaEventRecord(ev, stream_), "cudaEventRecord");
    pending_[round] = true;
  }

 public:
  void wait(int32_t round, double timeout_s) override {
    auto it = pending_.find(round);
    if (it == pending_.end())
      raise(ErrorKind::InvalidInput, "nccl comm rank " + std::to_string(rank_) + ": wait for round " +
                                         std::to_string(round) + " that was not started");
    cudaEvent_t ev = done_[round];
    // While the compute stream is being captured into a CUDA graph, the round's event is a node
    // of that graph, not work the host could wait for (querying it is an error there): the
    // stream-side wait below is the whole ordering, and a dead peer shows when the graph runs.
    if (blocking_ && !capturing()) poll(ev, timeout_s, "round " + std::to_string(round));
    else check_async("round " + std::to_string(round));
    // The compute stream reads what the round received only after it has landed.
    ck_cuda(cudaStreamWaitEvent(compute_, ev, 0), "cudaStreamWaitEvent");
    pending_.erase(it);
  }

  // A one-word all-reduce on the communication stream, waited for with the deadline.
  void barrier(double timeout_s) override {
    if (aborted_) raise(ErrorKind::System, "nccl comm: communicator was aborted");
    ck_nccl(ncclAllReduce(barrier_word_, barrier_word_, 1, ncclInt32, ncclSum, comm_, stream_), "ncclAllReduce");
    cudaEvent_t& ev = done_[kBarrierRound];
    if (ev == nullptr) ck_cuda(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
    ck_cuda(cudaEventRecord(ev, stream_), "cudaEventRecord");
    poll(ev, timeout_s, "barrier");
  }

  void abort(const std::string& reason) noexcept override {
    (void)reason;
    abort_comm();
    if (on_abort_) on_abort_();
  }

 private:
  void poll(cudaEvent_t ev, double timeout_s, const std::string& what) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
    for (int spins = 0;; ++spins) {
      const cudaError_t q = cudaEventQuery(ev);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) ck_cuda(q, "cudaEventQuery");
      check_async(what);
      if (Clock::now() > deadline) {
        abort_comm();
        raise(ErrorKind::Timeout, "nccl comm rank " + std::to_string(rank_) + ": " + what + " not complete after " +
                                      std::to_string(timeout_s) + " s (communicator aborted)");
      }
      if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  bool capturing() const {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    ck_cuda(cudaStreamIsCapturing(compute_, &status), "cudaStreamIsCapturing");
    return status != cudaStreamCaptureStatusNone;
  }
  void check_async(const std::string& what) {
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm_, &async);
    if (async != ncclSuccess && async != ncclInProgress) {
      abort_comm();
      raise(ErrorKind::Nccl, "nccl comm rank " + std::to_string(rank_) + ": " + what + ": " + ncclGetErrorString(async));
    }
  }
  void abort_comm() noexcept {
    if (aborted_) return;
    aborted_ = true;
    ncclCommAbort(comm_);
  }

  static constexpr int32_t kBarrierRound = -1;  // rounds of plans are >= 0
  int device_ = 0;
  int rank_ = 0, size_ = 1;
  bool blocking_ = true;
  std::function<void()> on_abort_;
  int32_t* barrier_word_ = nullptr;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaStream_t compute_ = nullptr;  // legacy default stream until bound
  cudaEvent_t ready_ = nullptr;
  std::map<int32_t, cudaEvent_t> done_;
  std::map<int32_t, cudaEvent_t> points_;  // note_point(): compute-stream positions by id
  std::map<int32_t, bool> pending_;
  bool aborted_ = false;
};

}  // namespace

bool nccl_available() { return true; }

NcclUniqueId nccl_unique_id() {
  ncclUniqueId id{};
  ck_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  NcclUniqueId out;
  std::memcpy(out.bytes.data(), &id, sizeof(id));
  return out;
}

std::unique_ptr<Comm> make_nccl_comm(const NcclUniqueId& id, int rank, int world_size, const NcclCommOptions& options) {
  return std::make_unique<NcclComm>(id, rank, world_size, options, nullptr);
}

namespace comm_detail {
std::unique_ptr<Comm> make_nccl_comm_with_abort(const NcclUniqueId& id, int rank, int world_size,
                                                const NcclCommOptions& options, std::function<void()> on_abort) {
  return std::make_unique<NcclComm>(id, rank, world_size, options, std::move(on_abort));
}
}  // namespace comm_detail

}  // namespace dcp
