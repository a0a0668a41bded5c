// Built without CUDA: the CUDA backend and the NCCL comm are unavailable.
#include "dcp/cuda_backend.h"
#include "dcp/error.h"

namespace dcp {
int cuda_device_count() { return 0; }
bool cuda_backend_available() { return false; }
std::unique_ptr<Backend> make_cuda_backend(int) {
  raise(ErrorKind::Unsupported, "cuda backend: this build has no CUDA (configure with nvcc found)");
}
bool nccl_available() { return false; }
std::unique_ptr<Comm> make_nccl_comm_world(int) {
  raise(ErrorKind::Unsupported, "nccl comm: this build has no CUDA/NCCL");
}
}  // namespace dcp
