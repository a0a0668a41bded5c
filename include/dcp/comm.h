// dcp/comm.h — how ranks move data blocks: grouped nonblocking point-to-point rounds.
//
// A round (the plan's CommStart(id) / CommWait(id)) is a group of sends and receives posted
// together and completed together. Matching: the k-th send from rank a to rank b in round id
// pairs with the k-th receive on b from a in round id (same bytes; a mismatch is an error).
// Rounds may be reused across passes and layers: matching stays FIFO per (pair, id).
// Every blocking call takes a timeout and throws dcp::Error(Timeout) instead of hanging; a rank
// that calls abort() (or dies, for the in-process comm) makes the others' waits fail too.
//
// Implementations: LocalComm (one thread per rank inside one process, for tests; see
// LocalWorld), the self comm of a single rank, MpiComm (nonblocking MPI_Isend/MPI_Irecv, polled with a deadline); NCCL's is in
// dcp/nccl_comm.h. A Comm is used by one thread at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "dcp/cluster.h"

namespace dcp {

struct CommOp {
  int32_t peer = 0;
  bool send = false;     // true: `data` is read and sent to peer; false: received into `data`
  void* data = nullptr;  // must stay valid (and untouched) until wait() of its round returns
  int64_t bytes = 0;
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string name() const = 0;  // "local", "mpi", "nccl"
  // True when ops carry host pointers (local, mpi); false for device memory (nccl).
  virtual bool host_memory() const { return true; }
  // Device comms order their transfers after the work already queued on this stream (a
  // cudaStream_t) and make it wait for completed rounds; host comms ignore it.
  virtual void bind_stream(void* stream) { (void)stream; }

  // Posts the ops of round `round` (>= 0). Pre: no round with this id is pending on this rank;
  // 0 <= peer < world_size, peer != rank; bytes >= 0. Throws InvalidInput on a bad op.
  virtual void start(int32_t round, std::span<const CommOp> ops) = 0;
  // Finer ordering for device comms (host comms run compute synchronously and ignore it):
  // note_point(p) records the bound stream's current position under id p; start_after(round,
  // ops, p) posts the round ordered after that position only, instead of after everything
  // queued so far. Lets a round that sends inputs run beside an unrelated long stage. Pre: p
  // was noted on this comm before (ids are the caller's; a later note replaces an earlier one).
  virtual void note_point(int32_t point) { (void)point; }
  virtual void start_after(int32_t round, std::span<const CommOp> ops, int32_t point) {
    (void)point;
    start(round, ops);
  }
  // Completes every op of `round`. Throws Timeout after timeout_s seconds, System if a peer
  // aborted, InvalidPlan if a received message has a different size than its receive. After a
  // Timeout the round stays pending: a later wait() may still complete it.
  virtual void wait(int32_t round, double timeout_s) = 0;
  // All ranks reach the barrier, or Timeout.
  virtual void barrier(double timeout_s) = 0;
  // Tells every rank to stop: their pending and later waits fail. Never throws. (MpiComm calls
  // MPI_Abort: only a tool's top level should call it, after reporting the error.)
  virtual void abort(const std::string& reason) noexcept = 0;
};

// ---- in-process comm --------------------------------------------------------------------------

// The shared state of `world_size` in-process ranks (mailboxes, barrier, abort flag). Sends are
// eager: the payload is copied when the round starts, so a send completes at once.
class LocalWorld {
 public:
  explicit LocalWorld(int world_size);
  ~LocalWorld();
  LocalWorld(const LocalWorld&) = delete;
  LocalWorld& operator=(const LocalWorld&) = delete;
  int world_size() const;
  // The comm of `rank`; owned by the world. Pre: 0 <= rank < world_size.
  Comm& comm(int rank);
  struct State;

 private:
  std::unique_ptr<State> state_;
};

// The comm of a world of one rank (no peers: rounds are empty). `host_memory` says which backend
// it pairs with (true: CPU, false: a GPU), since it moves nothing either way.
std::unique_ptr<Comm> make_self_comm(bool host_memory);

// Runs fn(comm) on world_size threads, one per rank. If a rank throws, the world is aborted (the
// others' waits fail instead of hanging) and the first error is rethrown after every thread
// has joined. No rank starts before all threads exist; if one cannot be made, none runs fn and
// an Error of kind System says which.
void run_local_ranks(int world_size, const std::function<void(Comm&)>& fn);

// ---- MPI ----------------------------------------------------------------------------------------

bool mpi_available();  // built with MPI

// Initialises MPI (MPI_Init_thread, FUNNELED) unless already initialised, and finalises what it
// initialised. Throws Unsupported when built without MPI.
class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

 private:
  [[maybe_unused]] bool owns_ = false;  // unused in a build without MPI
};

// A comm over a duplicate of MPI_COMM_WORLD. Pre: MPI initialised. Throws Unsupported when built
// without MPI.
std::unique_ptr<Comm> make_mpi_comm_world();

// This process's rank among the processes of MPI_COMM_WORLD on its node (MPI_Comm_split_type
// with MPI_COMM_TYPE_SHARED), e.g. to pick a GPU. Pre: MPI initialised.
int mpi_local_rank();

// Nodes and ranks per node of MPI_COMM_WORLD (the machines from MPI_Comm_split_type with
// MPI_COMM_TYPE_SHARED), checked by node_layout_of: the devices_per_node of the Cluster a plan
// for these ranks needs. Collective over MPI_COMM_WORLD. Pre: MPI initialised.
NodeLayout mpi_node_layout();

// MPI_Abort of the whole job with `exit_code` (the launcher exits with it), for a tool's top
// level after it reported an error. Does nothing when MPI is absent or not initialised.
void mpi_abort_world(int exit_code) noexcept;

}  // namespace dcp
