// launch_setup.cpp — the launchers' per-device first-use state (launch_setup.h).
#include "launch_setup.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "dcp/error.h"

namespace dcp::cuda::detail {
namespace {

void check(cudaError_t e, const char* name, const char* what) {
  if (e != cudaSuccess) raise(ErrorKind::Cuda, std::string(name) + ": " + what + ": " + cudaGetErrorString(e));
}

int current_device(const char* name) {
  int device = 0;
  check(cudaGetDevice(&device), name, "cudaGetDevice");
  return device;
}

// Runs make() with this thread's stream-capture mode relaxed: setting an attribute or making a
// stream inside a strict capture would invalidate it, though neither puts work into a stream.
template <typename Make>
void relaxed_capture(const char* name, Make&& make) {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  check(cudaThreadExchangeStreamCaptureMode(&mode), name, "cudaThreadExchangeStreamCaptureMode");
  make();
  check(cudaThreadExchangeStreamCaptureMode(&mode), name, "cudaThreadExchangeStreamCaptureMode");
}

}  // namespace

void allow_shared_memory_on_device(const char* name, const void* kernel, int smem_bytes) {
  static std::mutex mutex;
  static std::set<std::pair<const void*, int>> done;  // (kernel, device) pairs already opted in
  const int device = current_device(name);
  const std::lock_guard<std::mutex> lock(mutex);
  if (done.count({kernel, device}) != 0) return;
  cudaError_t attr = cudaSuccess;
  relaxed_capture(name, [&] { attr = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes); });
  check(attr, name, "cudaFuncSetAttribute");
  done.insert({kernel, device});
}

int multiprocessor_count() {
  static std::mutex mutex;
  static std::map<int, int> counts;  // per device: asked once, every persistent launch reads it
  const int device = current_device("multiprocessor_count");
  const std::lock_guard<std::mutex> lock(mutex);
  if (const auto it = counts.find(device); it != counts.end()) return it->second;
  int count = 0;
  check(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device), "multiprocessor_count",
        "cudaDeviceGetAttribute(multiprocessors)");
  return counts[device] = std::max(count, 1);
}

SideStream& side_stream(const char* name) {
  struct Streams {
    std::map<int, SideStream> of;  // by device
    Streams() = default;
    Streams(const Streams&) = delete;
    Streams& operator=(const Streams&) = delete;
    ~Streams() {  // errors ignored: at process exit the context may be gone first
      for (auto& [device, s] : of) {
        (void)cudaEventDestroy(s.fork);
        (void)cudaEventDestroy(s.join);
        (void)cudaStreamDestroy(s.stream);
      }
    }
  };
  thread_local Streams streams;
  const int device = current_device(name);
  if (const auto it = streams.of.find(device); it != streams.of.end()) return it->second;
  SideStream s;
  cudaError_t made[3] = {};
  relaxed_capture(name, [&] {
    made[0] = cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking);
    made[1] = cudaEventCreateWithFlags(&s.fork, cudaEventDisableTiming);
    made[2] = cudaEventCreateWithFlags(&s.join, cudaEventDisableTiming);
  });
  for (const cudaError_t e : made) check(e, name, "making the side stream and its events");
  return streams.of[device] = s;
}

void fork_side(const char* name, cudaStream_t stream, const SideStream& side) {
  check(cudaEventRecord(side.fork, stream), name, "fork");
  check(cudaStreamWaitEvent(side.stream, side.fork, 0), name, "fork");
}

void join_side(const char* name, cudaStream_t stream, const SideStream& side) {
  check(cudaEventRecord(side.join, side.stream), name, "join");
  check(cudaStreamWaitEvent(stream, side.join, 0), name, "join");
}

}  // namespace dcp::cuda::detail
