// Built without NCCL: the NCCL comm is unavailable.
#include "dcp/error.h"
#include "dcp/nccl_comm.h"

namespace dcp {
bool nccl_available() { return false; }
NcclUniqueId nccl_unique_id() {
  raise(ErrorKind::Unsupported, "nccl comm: this build has no NCCL (configure with CUDA and NCCL found)");
}
std::unique_ptr<Comm> make_nccl_comm(const NcclUniqueId&, int, int, const NcclCommOptions&) {
  raise(ErrorKind::Unsupported, "nccl comm: this build has no NCCL (configure with CUDA and NCCL found)");
}
std::unique_ptr<Comm> make_nccl_comm_world(int) {
  raise(ErrorKind::Unsupported, "nccl comm: this build has no NCCL (configure with CUDA and NCCL found)");
}
}  // namespace dcp
