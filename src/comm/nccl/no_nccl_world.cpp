// Built with NCCL but without MPI: only the MPI bootstrap is unavailable.
#include "dcp/error.h"
#include "dcp/nccl_comm.h"

namespace dcp {
std::unique_ptr<Comm> make_nccl_comm_world(int) {
  raise(ErrorKind::Unsupported, "nccl comm: this build has no MPI to bootstrap NCCL over (use make_nccl_comm)");
}
}  // namespace dcp
