// The fork-join pool (task_pool.h).
#include "core/task_pool.h"

#include <chrono>
#include <string>
#include <system_error>

#include "dcp/error.h"

namespace dcp {

namespace {

// The group of the piece this thread is running (null outside pieces): the parent of the groups
// its run() calls create.
thread_local const void* current_group = nullptr;

}  // namespace

TaskPool::TaskPool(int threads, const char* owner) {
  try {
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { work(); });
  } catch (const std::system_error& e) {  // a thread could not start: stop and join those that did
    {
      std::unique_lock<std::mutex> lock(mu_);
      stop_ = true;
      notify(lock);
    }
    for (std::thread& t : workers_) t.join();
    raise(ErrorKind::System, "could not start thread " + std::to_string(workers_.size() + 1) + " of " +
                                 std::to_string(threads) + " (" + owner + "): " + e.what());
  }
}

TaskPool::~TaskPool() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    stop_ = true;
    notify(lock);
  }
  for (std::thread& t : workers_) t.join();
}

void TaskPool::execute(Piece p, std::unique_lock<std::mutex>& lock) {
  lock.unlock();
  std::exception_ptr error;
  const void* const outer = current_group;
  current_group = p.group;
  try {
    (*p.group->fn)(p.index);
  } catch (...) {
    error = std::current_exception();
  }
  current_group = outer;
  lock.lock();
  if (error) p.group->error[static_cast<size_t>(p.index)] = error;
  if (--p.group->remaining == 0) notify(lock);
}

bool TaskPool::spin(std::unique_lock<std::mutex>& lock, uint64_t seen) {
  lock.unlock();
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinMicros);
  bool changed = false;
  for (int i = 0; !changed; ++i) {
    changed = events_.load(std::memory_order_acquire) != seen;
    if (changed) break;
    std::this_thread::yield();
    if (i % 16 == 15 && std::chrono::steady_clock::now() > until) break;
  }
  lock.lock();
  return changed || events_.load(std::memory_order_relaxed) != seen;
}

void TaskPool::wait_for_event(std::unique_lock<std::mutex>& lock) {
  const uint64_t seen = events_.load(std::memory_order_relaxed);
  if (spin(lock, seen)) return;
  cv_.wait(lock, [&] { return events_.load(std::memory_order_relaxed) != seen; });
}

void TaskPool::work() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (!stop_ && queue_.empty()) {
      wait_for_event(lock);
      continue;
    }
    if (queue_.empty()) return;  // stopping, nothing left
    const Piece p = queue_.front();
    queue_.erase(queue_.begin());
    execute(p, lock);
  }
}

bool TaskPool::take_nested(const Group* g, Piece& p) {
  // g's own pieces first, the newest (lowest index) first; then the oldest piece of a nested
  // group, the closest to g.
  auto take = [&](size_t i) {
    p = queue_[i];
    queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(i));
    return true;
  };
  for (size_t i = queue_.size(); i > 0; --i)
    if (queue_[i - 1].group == g) return take(i - 1);
  for (size_t i = 0; i < queue_.size(); ++i) {
    const Group* q = queue_[i].group;
    while (q != nullptr && q != g) q = q->parent;
    if (q != nullptr) return take(i);
  }
  return false;
}

void TaskPool::run(int n, const std::function<void(int)>& fn) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    for (int i = 0; i < n; ++i) fn(i);
    return;
  }
  Group g;
  g.fn = &fn;
  g.parent = static_cast<const Group*>(current_group);
  g.remaining = n;
  g.error.resize(static_cast<size_t>(n));
  std::unique_lock<std::mutex> lock(mu_);
  // Queued last to first: the caller starts with index 0 (the newest), an idle thread with
  // index n - 1 (the oldest).
  for (int i = n - 1; i >= 0; --i) queue_.push_back({&g, i});
  notify(lock);
  while (g.remaining > 0) {
    Piece p{};
    if (take_nested(&g, p)) execute(p, lock);
    else wait_for_event(lock);
  }
  lock.unlock();
  for (const std::exception_ptr& e : g.error)
    if (e) std::rethrow_exception(e);
}

}  // namespace dcp
