// Built without CUDA: the CUDA backend is unavailable.
#include "dcp/cuda_backend.h"
#include "dcp/error.h"

namespace dcp {
int cuda_device_count() { return 0; }
bool cuda_backend_available() { return false; }
std::string cuda_device_pci_bus_id(int) { return ""; }
std::string cuda_device_name(int) { return ""; }
std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions&) {
  raise(ErrorKind::Unsupported, "cuda backend: this build has no CUDA (configure with nvcc found)");
}
}  // namespace dcp
