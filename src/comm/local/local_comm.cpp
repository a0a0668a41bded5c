// In-process comm: one thread per rank, mailboxes keyed by (source, destination, round).
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <future>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "comm/check_ops.h"
#include "dcp/comm.h"
#include "dcp/error.h"

namespace dcp {

using Clock = std::chrono::steady_clock;

struct LocalWorld::State {
  int world_size = 0;
  std::mutex mutex;
  std::condition_variable changed;
  std::map<std::tuple<int, int, int32_t>, std::deque<std::vector<uint8_t>>> mailboxes;
  bool aborted = false;
  std::string abort_reason;
  int barrier_arrived = 0;
  int64_t barrier_generation = 0;
  std::vector<std::unique_ptr<Comm>> comms;

  [[noreturn]] void raise_aborted(int rank) const {
    raise(ErrorKind::System, "local comm rank " + std::to_string(rank) + ": aborted (" + abort_reason + ")");
  }
};

namespace {

Clock::time_point deadline_after(double timeout_s) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
}

class LocalComm final : public Comm {
 public:
  LocalComm(LocalWorld::State& state, int rank) : state_(state), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return state_.world_size; }
  std::string name() const override { return "local"; }

  void start(int32_t round, std::span<const CommOp> ops) override {
    comm_detail::check_ops(*this, round, ops, pending_.count(round) != 0);
    std::vector<CommOp> recvs;
    std::lock_guard lock(state_.mutex);
    if (state_.aborted) state_.raise_aborted(rank_);
    for (const CommOp& op : ops) {
      if (!op.send) {
        recvs.push_back(op);
        continue;
      }
      const auto* p = static_cast<const uint8_t*>(op.data);
      state_.mailboxes[{rank_, op.peer, round}].emplace_back(p, p + op.bytes);
    }
    pending_.emplace(round, std::move(recvs));
    state_.changed.notify_all();
  }

  void wait(int32_t round, double timeout_s) override {
    auto it = pending_.find(round);
    if (it == pending_.end())
      raise(ErrorKind::InvalidInput, "local comm rank " + std::to_string(rank_) + ": wait for round " +
                                         std::to_string(round) + " that was not started");
    std::vector<CommOp>& recvs = it->second;
    const auto deadline = deadline_after(timeout_s);
    std::unique_lock lock(state_.mutex);
    // Completed receives leave the list as they finish, so a timed-out round stays pending with
    // what is left and a later wait() can complete it.
    while (!recvs.empty()) {
      const CommOp op = recvs.front();
      auto& box = state_.mailboxes[{op.peer, rank_, round}];
      while (box.empty()) {
        if (state_.aborted) state_.raise_aborted(rank_);
        if (state_.changed.wait_until(lock, deadline) == std::cv_status::timeout && box.empty() && !state_.aborted)
          raise(ErrorKind::Timeout, "local comm rank " + std::to_string(rank_) + ": round " + std::to_string(round) +
                                        ": no message from rank " + std::to_string(op.peer) + " within " +
                                        std::to_string(timeout_s) + " s");
      }
      std::vector<uint8_t> msg = std::move(box.front());
      box.pop_front();
      recvs.erase(recvs.begin());
      if (static_cast<int64_t>(msg.size()) != op.bytes)
        raise(ErrorKind::InvalidPlan, "local comm rank " + std::to_string(rank_) + ": round " + std::to_string(round) +
                                          ": message from rank " + std::to_string(op.peer) + " has " +
                                          std::to_string(msg.size()) + " bytes, the receive expects " +
                                          std::to_string(op.bytes));
      if (op.bytes > 0) std::memcpy(op.data, msg.data(), msg.size());
    }
    pending_.erase(it);
  }

  void barrier(double timeout_s) override {
    const auto deadline = deadline_after(timeout_s);
    std::unique_lock lock(state_.mutex);
    if (state_.aborted) state_.raise_aborted(rank_);
    const int64_t generation = state_.barrier_generation;
    if (++state_.barrier_arrived == state_.world_size) {
      state_.barrier_arrived = 0;
      ++state_.barrier_generation;
      state_.changed.notify_all();
      return;
    }
    while (state_.barrier_generation == generation) {
      if (state_.aborted) state_.raise_aborted(rank_);
      if (state_.changed.wait_until(lock, deadline) == std::cv_status::timeout &&
          state_.barrier_generation == generation) {
        --state_.barrier_arrived;
        raise(ErrorKind::Timeout, "local comm rank " + std::to_string(rank_) + ": barrier not reached by all " +
                                      std::to_string(state_.world_size) + " ranks within " +
                                      std::to_string(timeout_s) + " s");
      }
    }
  }

  void abort(const std::string& reason) noexcept override {
    try {
      std::lock_guard lock(state_.mutex);
      if (!state_.aborted) {
        state_.aborted = true;
        state_.abort_reason = "rank " + std::to_string(rank_) + ": " + reason;
      }
    } catch (...) {
      // A failed lock leaves the flag unset; the peers then stop on their timeouts.
    }
    state_.changed.notify_all();
  }

 private:
  LocalWorld::State& state_;
  int rank_;
  std::map<int32_t, std::vector<CommOp>> pending_;  // receives of started rounds
};

}  // namespace

LocalWorld::LocalWorld(int world_size) : state_(std::make_unique<State>()) {
  if (world_size < 1)
    raise(ErrorKind::InvalidInput, "LocalWorld: world size must be >= 1 (got " + std::to_string(world_size) + ")");
  state_->world_size = world_size;
  for (int r = 0; r < world_size; ++r) state_->comms.push_back(std::make_unique<LocalComm>(*state_, r));
}

LocalWorld::~LocalWorld() = default;

int LocalWorld::world_size() const { return state_->world_size; }

Comm& LocalWorld::comm(int rank) {
  if (rank < 0 || rank >= state_->world_size)
    raise(ErrorKind::InvalidInput, "LocalWorld::comm: rank " + std::to_string(rank) + " outside [0, " +
                                       std::to_string(state_->world_size) + ")");
  return *state_->comms[static_cast<size_t>(rank)];
}

void run_local_ranks(int world_size, const std::function<void(Comm&)>& fn) {
  LocalWorld world(world_size);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world_size));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(world_size));
  // No rank starts its work before every rank thread exists: a world that cannot be made whole
  // (thread creation failing under a memory or thread limit) then runs nothing at all, instead of
  // ranks that wait for peers that never start while their own work (OpenMP regions among it)
  // competes for the memory whose lack stopped the creation.
  std::promise<bool> gate;  // true: every thread exists, run; false: one could not be made
  const std::shared_future<bool> start = gate.get_future().share();
  try {
    for (int r = 0; r < world_size; ++r)
      threads.emplace_back([&, r, start] {  // a copy each: shared_future is safe to share by copy
        if (!start.get()) return;
        Comm& comm = world.comm(r);
        try {
          fn(comm);
        } catch (const std::exception& e) {
          errors[static_cast<size_t>(r)] = std::current_exception();
          comm.abort(e.what());
        } catch (...) {
          errors[static_cast<size_t>(r)] = std::current_exception();
          comm.abort("unknown exception");
        }
      });
  } catch (const std::exception& e) {
    // The threads already made wait at the gate: cancel it, join them, and report why the world
    // could not be made.
    const std::string why = "cannot start in-process rank " + std::to_string(threads.size()) + " of " +
                            std::to_string(world_size) + " (" + e.what() + ")";
    gate.set_value(false);
    for (std::thread& t : threads) t.join();
    raise(ErrorKind::System, why);
  }
  gate.set_value(true);
  for (std::thread& t : threads) t.join();
  // The root cause is the error that is not a consequence of another rank's abort.
  std::exception_ptr first;
  for (const std::exception_ptr& e : errors) {
    if (!e) continue;
    if (!first) first = e;
    try {
      std::rethrow_exception(e);
    } catch (const Error& err) {
      if (err.kind() != ErrorKind::System || std::string(err.what()).find("aborted") == std::string::npos) {
        first = e;
        break;
      }
    } catch (...) {
      first = e;
      break;
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace dcp
