// NCCL comm bootstrapped over MPI_COMM_WORLD: rank 0 makes the unique id, MPI_Bcast hands it to
// every rank.
#include <mpi.h>

#include "comm/nccl/nccl_internal.h"
#include "dcp/error.h"
#include "dcp/nccl_comm.h"

namespace dcp {

std::unique_ptr<Comm> make_nccl_comm_world(int device) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) raise(ErrorKind::InvalidInput, "nccl comm: MPI is not initialised (make an MpiSession first)");
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  NcclUniqueId id;
  if (rank == 0) id = nccl_unique_id();
  if (MPI_Bcast(id.bytes.data(), static_cast<int>(id.bytes.size()), MPI_BYTE, 0, MPI_COMM_WORLD) != MPI_SUCCESS)
    raise(ErrorKind::Mpi, "nccl comm: MPI_Bcast of the unique id failed");
  NcclCommOptions options;
  options.device = device;
  return comm_detail::make_nccl_comm_with_abort(id, rank, size, options, [] { MPI_Abort(MPI_COMM_WORLD, 1); });
}

}  // namespace dcp
