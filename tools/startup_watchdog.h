// tools/startup_watchdog.h — a bound on MPI start-up, which no library call can time out.
//
// MPI_Init returns only when every process of the job has started and joined it; a peer that
// never starts (a wrong host, a crashed launcher) leaves the others blocked inside it forever,
// beyond the reach of --timeout. The watchdog is armed before MPI_Init and disarmed after it: if
// start-up takes longer than the timeout, it reports the likely cause and ends the process
// with the peer-failure exit code, which makes the launcher take the job down.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include "exit_codes.h"

namespace dcp::cli {

class StartupWatchdog {
 public:
  StartupWatchdog(double timeout_s, std::string what) : what_(std::move(what)) {
    thread_ = std::thread([this, timeout_s] {
      std::unique_lock lock(mutex_);
      const auto limit = std::chrono::duration<double>(timeout_s);
      if (cv_.wait_for(lock, limit, [this] { return disarmed_; })) return;
      std::fprintf(stderr,
                   "%s: timeout: MPI start-up did not complete within %g s (a peer process of the job never "
                   "started or cannot be reached); giving up\n",
                   what_.c_str(), timeout_s);
      std::fflush(stderr);
      std::_Exit(kExitPeerFailure);
    });
  }
  ~StartupWatchdog() { disarm(); }
  StartupWatchdog(const StartupWatchdog&) = delete;
  StartupWatchdog& operator=(const StartupWatchdog&) = delete;

  void disarm() {
    {
      std::lock_guard lock(mutex_);
      disarmed_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::string what_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool disarmed_ = false;
  std::thread thread_;
};

}  // namespace dcp::cli
