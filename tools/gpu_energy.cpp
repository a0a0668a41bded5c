// NVML through dlopen: the handful of entry points the meter needs, declared by their C ABI.
#include "gpu_energy.h"

#include <dlfcn.h>

#include "dcp/cuda_backend.h"

namespace dcp::cli {

struct GpuEnergyMeter::Api {
  void* lib = nullptr;
  int (*init)() = nullptr;
  int (*shutdown)() = nullptr;
  int (*by_pci_bus_id)(const char*, void**) = nullptr;
  int (*energy)(void*, unsigned long long*) = nullptr;
  int (*clock)(void*, int, unsigned*) = nullptr;
  ~Api() {
    if (shutdown != nullptr) shutdown();
    if (lib != nullptr) dlclose(lib);
  }
};

namespace {
constexpr int kNvmlSuccess = 0;
constexpr int kNvmlClockSm = 1;

template <typename F>
bool load(void* lib, const char* name, F& f) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  return f != nullptr;
}
}  // namespace

std::unique_ptr<GpuEnergyMeter> GpuEnergyMeter::open(int cuda_device, std::string& why) {
  const std::string bus = cuda_device_pci_bus_id(cuda_device);
  if (bus.empty()) {
    why = "no CUDA device " + std::to_string(cuda_device);
    return nullptr;
  }
  auto api = std::make_unique<Api>();
  api->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (api->lib == nullptr) {
    why = "libnvidia-ml.so.1 not found (NVML comes with the NVIDIA driver)";
    return nullptr;
  }
  if (!load(api->lib, "nvmlInit_v2", api->init) || !load(api->lib, "nvmlDeviceGetHandleByPciBusId_v2", api->by_pci_bus_id) ||
      !load(api->lib, "nvmlDeviceGetTotalEnergyConsumption", api->energy) ||
      !load(api->lib, "nvmlDeviceGetClockInfo", api->clock)) {
    why = "libnvidia-ml.so.1 lacks an entry point the meter needs";
    return nullptr;
  }
  if (api->init() != kNvmlSuccess) {
    why = "nvmlInit failed";
    return nullptr;
  }
  load(api->lib, "nvmlShutdown", api->shutdown);  // from here on, the Api's destructor shuts NVML down
  void* device = nullptr;
  if (api->by_pci_bus_id(bus.c_str(), &device) != kNvmlSuccess) {
    why = "NVML does not know the GPU at PCI bus id " + bus;
    return nullptr;
  }
  std::unique_ptr<GpuEnergyMeter> meter(new GpuEnergyMeter(std::move(api), device));
  if (!meter->energy_mj()) {
    why = "the GPU has no energy counter (before Volta)";
    return nullptr;
  }
  return meter;
}

GpuEnergyMeter::GpuEnergyMeter(std::unique_ptr<Api> api, void* device) : api_(std::move(api)), device_(device) {}
GpuEnergyMeter::~GpuEnergyMeter() = default;

std::optional<uint64_t> GpuEnergyMeter::energy_mj() const {
  unsigned long long mj = 0;
  if (api_->energy(device_, &mj) != kNvmlSuccess) return std::nullopt;
  return static_cast<uint64_t>(mj);
}

std::optional<unsigned> GpuEnergyMeter::sm_clock_mhz() const {
  unsigned mhz = 0;
  if (api_->clock(device_, kNvmlClockSm, &mhz) != kNvmlSuccess) return std::nullopt;
  return mhz;
}

}  // namespace dcp::cli
