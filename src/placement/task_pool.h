// placement/task_pool.h — fork-join parallelism for one placement (PlacementOptions::threads).
//
// The placement has independent pieces of work: the starts of a portfolio, the node candidates,
// the device-level partitions of different nodes. A TaskPool runs such a set of pieces on
// `threads` threads (the caller and threads - 1 workers that live as long as the pool). The
// result never depends on the thread count: every piece writes only its own slot, and callers
// combine the slots in index order afterwards, exactly as a sequential loop would.
//
// Nesting is allowed (a piece may call run() again): a thread waiting for its pieces runs
// queued pieces meanwhile, its own or anyone's, so waiting never blocks a thread that work
// depends on. Newest pieces are taken first (depth first), which keeps nested work moving.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dcp::placement {

class TaskPool {
 public:
  // threads <= 1: no worker; run() is then a plain loop on the calling thread.
  explicit TaskPool(int threads);
  ~TaskPool();
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(i) for every i in [0, n), on any threads and in any order; returns when all are
  // done. When pieces throw, the exception of the lowest throwing index is rethrown once all
  // are done, so which error surfaces does not depend on the thread count.
  void run(int n, const std::function<void(int)>& fn);

 private:
  struct Group {
    const std::function<void(int)>* fn = nullptr;
    int remaining = 0;                      // guarded by mu_
    std::vector<std::exception_ptr> error;  // per index
  };
  struct Piece {
    Group* group;
    int index;
  };

  // Runs one piece outside the lock; `lock` is held on entry and on return.
  void execute(Piece p, std::unique_lock<std::mutex>& lock);
  void work();

  std::mutex mu_;
  std::condition_variable cv_;  // a piece was queued, a group finished, or the pool stops
  std::vector<Piece> queue_;    // a stack: newest first
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

// Runs a, then b, possibly at the same time (two pieces of `pool`, or a plain sequence when
// pool is null).
inline void run_both(TaskPool* pool, const std::function<void()>& a, const std::function<void()>& b) {
  if (pool == nullptr || pool->threads() <= 1) {
    a();
    b();
    return;
  }
  pool->run(2, [&](int i) { i == 0 ? a() : b(); });
}

// fn(i) for i in [0, n) on `pool` (a plain loop when pool is null).
inline void run_each(TaskPool* pool, int n, const std::function<void(int)>& fn) {
  if (pool == nullptr) {
    for (int i = 0; i < n; ++i) fn(i);
    return;
  }
  pool->run(n, fn);
}

}  // namespace dcp::placement
