// NCCL comm (see dcp/cuda_backend.h): rounds are NCCL groups on a communication stream, ordered
// against the bound compute stream with events; waits poll with a deadline so a dead peer ends
// in Timeout (after ncclCommAbort) instead of a hang.
#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>

#include "comm/check_ops.h"
#include "dcp/cuda_backend.h"
#include "dcp/error.h"

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

class NcclComm final : public Comm {
 public:
  explicit NcclComm(int device) : device_(device) {
    // NVLink multicast stays off on shared machines whatever the caller's environment forgot.
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    if (MPI_Comm_dup(MPI_COMM_WORLD, &mpi_) != MPI_SUCCESS) raise(ErrorKind::Mpi, "nccl comm: MPI_Comm_dup failed");
    MPI_Comm_rank(mpi_, &rank_);
    MPI_Comm_size(mpi_, &size_);
    ck_cuda(cudaSetDevice(device_), "cudaSetDevice");
    ncclUniqueId id{};
    if (rank_ == 0) ck_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    if (MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, mpi_) != MPI_SUCCESS) raise(ErrorKind::Mpi, "nccl comm: MPI_Bcast failed");
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
  }
  ~NcclComm() override {
    if (!aborted_) {
      cudaStreamSynchronize(stream_);
      ncclCommDestroy(comm_);
    }
    for (auto& [id, ev] : done_) cudaEventDestroy(ev);
    for (auto& [id, ev] : points_) cudaEventDestroy(ev);
    cudaEventDestroy(ready_);
    cudaStreamDestroy(stream_);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&mpi_);
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
    poll(ev, timeout_s, "round " + std::to_string(round));
    // Host saw completion; the compute stream is ordered after it too (cheap, and right even
    // if a caller ever stops blocking here).
    ck_cuda(cudaStreamWaitEvent(compute_, ev, 0), "cudaStreamWaitEvent");
    pending_.erase(it);
  }

  void barrier(double timeout_s) override {
    MPI_Request req = MPI_REQUEST_NULL;
    MPI_Ibarrier(mpi_, &req);
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
    int done = 0;
    while (!done) {
      MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      if (!done && Clock::now() > deadline)
        raise(ErrorKind::Timeout, "nccl comm rank " + std::to_string(rank_) + ": barrier timed out");
      if (!done) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  void abort(const std::string& reason) noexcept override {
    (void)reason;
    if (!aborted_) {
      aborted_ = true;
      ncclCommAbort(comm_);
    }
    MPI_Abort(MPI_COMM_WORLD, 1);
  }

 private:
  void poll(cudaEvent_t ev, double timeout_s, const std::string& what) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
    for (int spins = 0;; ++spins) {
      const cudaError_t q = cudaEventQuery(ev);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) ck_cuda(q, "cudaEventQuery");
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        abort_comm();
        raise(ErrorKind::Nccl, "nccl comm rank " + std::to_string(rank_) + ": " + what + ": " + ncclGetErrorString(async));
      }
      if (Clock::now() > deadline) {
        abort_comm();
        raise(ErrorKind::Timeout, "nccl comm rank " + std::to_string(rank_) + ": " + what + " not complete after " +
                                      std::to_string(timeout_s) + " s (communicator aborted)");
      }
      if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  void abort_comm() {
    if (aborted_) return;
    aborted_ = true;
    ncclCommAbort(comm_);
  }

  int device_ = 0;
  int rank_ = 0, size_ = 1;
  MPI_Comm mpi_ = MPI_COMM_NULL;
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
std::unique_ptr<Comm> make_nccl_comm_world(int device) { return std::make_unique<NcclComm>(device); }

}  // namespace dcp
