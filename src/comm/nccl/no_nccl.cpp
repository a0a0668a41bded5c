// Built without NCCL (or MPI): the NCCL comm is unavailable.
#include "dcp/cuda_backend.h"
#include "dcp/error.h"

namespace dcp {
bool nccl_available() { return false; }
std::unique_ptr<Comm> make_nccl_comm_world(int) {
  raise(ErrorKind::Unsupported, "nccl comm: this build has no NCCL (configure with NCCL and MPI found)");
}
}  // namespace dcp
