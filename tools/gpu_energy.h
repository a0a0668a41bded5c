// gpu_energy.h — a GPU's energy counter and SM clock, from NVML loaded at run time (the driver's
// libnvidia-ml.so.1): nothing to link or install, and a reason instead of a meter where it is
// missing. What `dcp bench --energy-iters` reads: at the power limit a GPU lowers its clock for
// every kernel, so a kernel's energy per FLOP counts beside its time (docs/training.md, "The
// power limit").
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace dcp::cli {

class GpuEnergyMeter {
 public:
  // The meter of CUDA device `cuda_device` (found by its PCI bus id), or null with `why` set.
  static std::unique_ptr<GpuEnergyMeter> open(int cuda_device, std::string& why);
  ~GpuEnergyMeter();
  GpuEnergyMeter(const GpuEnergyMeter&) = delete;
  GpuEnergyMeter& operator=(const GpuEnergyMeter&) = delete;

  std::optional<uint64_t> energy_mj() const;     // since the driver loaded
  std::optional<unsigned> sm_clock_mhz() const;  // now

  struct Api;

 private:
  GpuEnergyMeter(std::unique_ptr<Api> api, void* device);
  std::unique_ptr<Api> api_;
  void* device_ = nullptr;  // nvmlDevice_t
};

}  // namespace dcp::cli
