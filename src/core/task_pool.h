// core/task_pool.h — fork-join parallelism inside one call (PlacementOptions::threads,
// PlannerOptions::threads).
//
// A placement has independent pieces of work (the starts of a portfolio, the node candidates,
// the device-level partitions of different nodes), and so has a planner's search (the
// candidate placements, the plan and simulation of each schedule). A TaskPool runs such a set of
// pieces on `threads` threads (the caller and threads - 1 workers that live as long as the pool). The
// result never depends on the thread count: every piece writes only its own slot, and callers
// combine the slots in index order afterwards, exactly as a sequential loop would.
//
// Nesting is allowed (a piece may call run() again). Which thread takes which queued piece
// decides how long the whole takes, never what it computes:
// - a thread waiting for its pieces runs queued pieces meanwhile: its own group's first, then
//   the oldest (outermost) of groups nested inside its pieces, never others: a piece from
//   elsewhere can be long (a whole node's partition), and the thread's own group would then wait
//   for it after its last piece is done, holding up everything after the join;
// - an idle thread takes the oldest queued piece: the outermost, largest pieces (another node
//   candidate, another node) go to the thread that has nothing to do, and the thread that queued
//   them goes on with its own, each thread on a large share of the work with few hand-overs.
// Every queued piece can always be run by the thread waiting for its group, so waiting never
// blocks a thread that work depends on.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dcp {

class TaskPool {
 public:
  // threads <= 1: no worker; run() is then a plain loop on the calling thread. `owner` names
  // the option that asked for the threads, for the error when one cannot start.
  explicit TaskPool(int threads, const char* owner = "PlacementOptions::threads");
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
    const Group* parent = nullptr;          // the group of the piece that called run(), if any
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
  // Takes a queued piece of g (the newest) or else of a group nested in g's pieces (the oldest)
  // off the queue; false when there is none. Called with mu_ held.
  bool take_nested(const Group* g, Piece& p);
  // Something waiters look for happened (a piece queued, a group done, the pool stopping).
  // Called with mu_ held.
  void notify(std::unique_lock<std::mutex>&) {
    events_.fetch_add(1, std::memory_order_release);
    cv_.notify_all();
  }
  // Returns, with mu_ held again, after the next notify() or a spurious wake-up. It spins
  // (yielding the core) for up to kSpinMicros before it sleeps: waking a sleeping thread took
  // 50-200 us on the 2-core virtual machine measured, as long as many of the pieces a placement
  // hands over (2-node instances of bench/compare_partitioners: 2-thread wall -3 % with the
  // spin, on top of the order above).
  void wait_for_event(std::unique_lock<std::mutex>& lock);
  // Spins with mu_ released until events_ moves past `seen` or kSpinMicros pass; whether it moved.
  bool spin(std::unique_lock<std::mutex>& lock, uint64_t seen);
  static constexpr int kSpinMicros = 100;

  std::mutex mu_;
  std::condition_variable cv_;  // a piece was queued, a group finished, or the pool stops
  std::atomic<uint64_t> events_{0};  // notify() calls, changed under mu_
  std::vector<Piece> queue_;    // in the order queued: oldest first
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

}  // namespace dcp
