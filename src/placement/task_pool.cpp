// The fork-join pool of one placement (task_pool.h).
#include "placement/task_pool.h"

#include <string>
#include <system_error>

#include "dcp/error.h"

namespace dcp::placement {

TaskPool::TaskPool(int threads) {
  try {
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { work(); });
  } catch (const std::system_error& e) {  // a thread could not start: stop and join those that did
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : workers_) t.join();
    raise(ErrorKind::System, "placement: could not start thread " + std::to_string(workers_.size() + 1) +
                                 " of " + std::to_string(threads) + " (PlacementOptions::threads): " + e.what());
  }
}

TaskPool::~TaskPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void TaskPool::execute(Piece p, std::unique_lock<std::mutex>& lock) {
  lock.unlock();
  std::exception_ptr error;
  try {
    (*p.group->fn)(p.index);
  } catch (...) {
    error = std::current_exception();
  }
  lock.lock();
  if (error) p.group->error[static_cast<size_t>(p.index)] = error;
  if (--p.group->remaining == 0) cv_.notify_all();
}

void TaskPool::work() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, nothing left
    const Piece p = queue_.back();
    queue_.pop_back();
    execute(p, lock);
  }
}

void TaskPool::run(int n, const std::function<void(int)>& fn) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    for (int i = 0; i < n; ++i) fn(i);
    return;
  }
  Group g;
  g.fn = &fn;
  g.remaining = n;
  g.error.resize(static_cast<size_t>(n));
  std::unique_lock<std::mutex> lock(mu_);
  // Pushed last to first, so that index 0 is on top: the caller starts with it.
  for (int i = n - 1; i >= 0; --i) queue_.push_back({&g, i});
  cv_.notify_all();
  while (g.remaining > 0) {
    if (!queue_.empty()) {
      const Piece p = queue_.back();
      queue_.pop_back();
      execute(p, lock);
    } else {
      cv_.wait(lock);
    }
  }
  lock.unlock();
  for (const std::exception_ptr& e : g.error)
    if (e) std::rethrow_exception(e);
}

}  // namespace dcp::placement
