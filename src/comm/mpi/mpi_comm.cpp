// MPI comm: each round is a set of MPI_Isend / MPI_Irecv requests with tag = round id, completed
// by polling MPI_Testall against a deadline (MPI_Waitall could block forever on a dead peer).
// Messages between one pair with one tag are non-overtaking in MPI, which gives the FIFO
// matching that comm.h promises.
#include <mpi.h>

#include <chrono>
#include <climits>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "comm/check_ops.h"
#include "dcp/comm.h"
#include "dcp/error.h"

namespace dcp {
namespace {

void check_mpi(int rc, const char* expr, const char* file, int line) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
  raise(ErrorKind::Mpi, std::string(expr) + " failed at " + file + ":" + std::to_string(line) + ": code " +
                            std::to_string(rc) + " (" + std::string(text, static_cast<size_t>(len)) + ")");
}
#define DCP_MPI_CHECK(expr) check_mpi((expr), #expr, __FILE__, __LINE__)

// MPI counts are int: larger messages go as several chunks (both ends split the same way).
constexpr int64_t kMaxChunkBytes = int64_t{1} << 30;

using Clock = std::chrono::steady_clock;

class MpiComm final : public Comm {
 public:
  MpiComm() {
    DCP_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
    // Errors come back as codes (then thrown as dcp::Error) instead of aborting inside MPI.
    DCP_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    DCP_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    DCP_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  }
  ~MpiComm() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && pending_.empty()) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  std::string name() const override { return "mpi"; }

  void start(int32_t round, std::span<const CommOp> ops) override {
    comm_detail::check_ops(*this, round, ops, pending_.count(round) != 0);
    std::vector<MPI_Request>& reqs = pending_[round];
    for (const CommOp& op : ops) {
      auto* p = static_cast<char*>(op.data);
      int64_t offset = 0;
      do {  // zero-byte ops still post one message, so both ends agree on the count
        const int n = static_cast<int>(std::min(kMaxChunkBytes, op.bytes - offset));
        MPI_Request req = MPI_REQUEST_NULL;
        if (op.send)
          DCP_MPI_CHECK(MPI_Isend(p + offset, n, MPI_BYTE, op.peer, round, comm_, &req));
        else
          DCP_MPI_CHECK(MPI_Irecv(p + offset, n, MPI_BYTE, op.peer, round, comm_, &req));
        reqs.push_back(req);
        sizes_[round].push_back(op.send ? -1 : n);
        offset += n;
      } while (offset < op.bytes);
    }
  }

  void wait(int32_t round, double timeout_s) override {
    auto it = pending_.find(round);
    if (it == pending_.end())
      raise(ErrorKind::InvalidInput, "mpi comm rank " + std::to_string(rank_) + ": wait for round " +
                                         std::to_string(round) + " that was not started");
    std::vector<MPI_Request>& reqs = it->second;
    std::vector<MPI_Status> statuses(reqs.size());
    poll_until_done(reqs, statuses, timeout_s, "round " + std::to_string(round));
    const std::vector<int> sizes = std::move(sizes_[round]);
    pending_.erase(it);
    sizes_.erase(round);
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (sizes[i] < 0) continue;
      int got = 0;
      DCP_MPI_CHECK(MPI_Get_count(&statuses[i], MPI_BYTE, &got));
      if (got != sizes[i])
        raise(ErrorKind::InvalidPlan, "mpi comm rank " + std::to_string(rank_) + ": round " + std::to_string(round) +
                                          ": received " + std::to_string(got) + " bytes, expected " +
                                          std::to_string(sizes[i]));
    }
  }

  void barrier(double timeout_s) override {
    std::vector<MPI_Request> reqs(1, MPI_REQUEST_NULL);
    DCP_MPI_CHECK(MPI_Ibarrier(comm_, reqs.data()));
    std::vector<MPI_Status> statuses(1);
    poll_until_done(reqs, statuses, timeout_s, "barrier");
  }

  void abort(const std::string& reason) noexcept override {
    (void)reason;  // the caller has reported it; MPI_Abort takes only a code
    MPI_Abort(comm_, 1);
  }

 private:
  void poll_until_done(std::vector<MPI_Request>& reqs, std::vector<MPI_Status>& statuses, double timeout_s,
                       const std::string& what) {
    const auto deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
    auto sleep = std::chrono::microseconds(1);
    for (;;) {
      int done = 0;
      DCP_MPI_CHECK(MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, statuses.data()));
      if (done) return;
      if (Clock::now() > deadline)
        raise(ErrorKind::Timeout, "mpi comm rank " + std::to_string(rank_) + ": " + what + " not complete within " +
                                      std::to_string(timeout_s) + " s (a peer rank died or its plan differs)");
      // Back off to at most 1 ms so that waiting ranks leave the cores to computing ones.
      std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep * 2, std::chrono::microseconds(1000));
    }
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::map<int32_t, std::vector<MPI_Request>> pending_;
  std::map<int32_t, std::vector<int>> sizes_;  // per request: expected receive bytes, -1 for sends
};

}  // namespace

bool mpi_available() { return true; }

MpiSession::MpiSession(int* argc, char*** argv) {
  int initialized = 0;
  DCP_MPI_CHECK(MPI_Initialized(&initialized));
  if (initialized) return;
  int provided = 0;
  DCP_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
  owns_ = true;
}

MpiSession::~MpiSession() {
  if (!owns_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

namespace {
void require_mpi(const char* who) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) raise(ErrorKind::InvalidInput, std::string(who) + ": MPI is not initialised (create an MpiSession first)");
}
}  // namespace

int mpi_local_rank() {
  require_mpi("mpi_local_rank");
  MPI_Comm node = MPI_COMM_NULL;
  DCP_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  int rank = 0;
  MPI_Comm_rank(node, &rank);
  MPI_Comm_free(&node);
  return rank;
}

NodeLayout mpi_node_layout() {
  require_mpi("mpi_node_layout");
  MPI_Comm node = MPI_COMM_NULL;
  DCP_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  // A machine is named by the world rank of its first process.
  int world_rank = 0, world = 0, first = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  DCP_MPI_CHECK(MPI_Allreduce(&world_rank, &first, 1, MPI_INT, MPI_MIN, node));
  MPI_Comm_free(&node);
  std::vector<int> node_of_rank(static_cast<size_t>(world));
  DCP_MPI_CHECK(MPI_Allgather(&first, 1, MPI_INT, node_of_rank.data(), 1, MPI_INT, MPI_COMM_WORLD));
  return node_layout_of(node_of_rank);
}

void mpi_abort_world(int exit_code) noexcept {
  int initialized = 0, finalized = 0;
  if (MPI_Initialized(&initialized) != MPI_SUCCESS || !initialized) return;
  if (MPI_Finalized(&finalized) != MPI_SUCCESS || finalized) return;
  MPI_Abort(MPI_COMM_WORLD, exit_code);
}

std::unique_ptr<Comm> make_mpi_comm_world() {
  int initialized = 0;
  DCP_MPI_CHECK(MPI_Initialized(&initialized));
  if (!initialized) raise(ErrorKind::InvalidInput, "make_mpi_comm_world: MPI is not initialised (create an MpiSession first)");
  return std::make_unique<MpiComm>();
}

}  // namespace dcp
