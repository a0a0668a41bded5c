// dcp/nccl_comm.h — a Comm over NCCL, for device memory (built with NCCL; else the factories
// throw Unsupported). No CUDA or NCCL headers are needed to use it.
//
// Bootstrap: one rank makes a unique id (nccl_unique_id), every rank receives it by whatever
// channel the program already has (a torch process group, MPI, a file), then each rank calls
// make_nccl_comm with the same id, its rank, the world size and its device. The communicator
// is the comm's own, separate from any other the program uses (DDP's, FSDP's).
//
// Rounds are NCCL groups on a communication stream of the highest priority, ordered after the
// bound compute stream with events (Comm::note_point / start_after); wait() makes the compute
// stream wait for the round's completion event. With blocking waits (the default), wait() also
// polls that event and ncclCommGetAsyncError until the deadline, so a dead peer ends in a
// Timeout after ncclCommAbort instead of a hang. With non-blocking waits the host returns at
// once and only the stream waits: the host can run ahead of the GPU; failures surface at the
// next blocking call (barrier, check, or a later blocking wait).
//
// The library never sets NCCL's environment: NVLink multicast (NCCL_NVLS_ENABLE) and the like
// are the program's to choose before the first communicator is made.
#pragma once

#include <array>
#include <memory>

#include "dcp/comm.h"

namespace dcp {

bool nccl_available();  // built with NCCL

struct NcclUniqueId {
  std::array<char, 128> bytes{};  // ncclUniqueId, opaque
};
// Throws Unsupported without NCCL, Nccl on failure.
NcclUniqueId nccl_unique_id();

struct NcclCommOptions {
  int device = 0;             // CUDA device of this rank
  bool blocking_wait = true;  // see above
};

// Pre: every rank of [0, world_size) calls it with the same id. Blocks until all have joined.
std::unique_ptr<Comm> make_nccl_comm(const NcclUniqueId& id, int rank, int world_size, const NcclCommOptions& options);

// MPI bootstrap over MPI_COMM_WORLD (rank 0 makes the id, MPI_Bcast). Pre: MPI initialised.
// abort() also calls MPI_Abort (a tool's top level, after reporting the error). Throws
// Unsupported without NCCL or MPI.
std::unique_ptr<Comm> make_nccl_comm_world(int device);

}  // namespace dcp
