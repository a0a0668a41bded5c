// PlanQueue: steps planned on worker threads ahead of the training loop. Workers take submitted
// steps in submission order; results wait in a map until get() takes them. Batches seen recently
// are keyed by their canonical JSON (every length, mask and shape, and the layer counts), so an
// equal batch takes the plans already made, or joins the step planning them.
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dcp/error.h"
#include "dcp/io.h"
#include "dcp/planner.h"

namespace dcp {

using Clock = std::chrono::steady_clock;

struct PlanQueue::State {
  Cluster cluster;
  StepPlanOptions options;
  mutable std::mutex mutex;
  std::condition_variable work_ready;  // workers: a step was submitted, or stop
  std::condition_variable plan_ready;  // get(): a step finished
  struct Step {
    std::vector<Batch> kinds;  // one batch, or the layer kinds of submit_kinds
    std::vector<double> layers;  // submit_kinds: layers per kind
    bool layered = false;      // submitted by submit_kinds
    Clock::time_point submitted;
    bool started = false;
    bool done = false;
    std::vector<std::shared_ptr<const Plan>> plans;
    std::exception_ptr error;
    StepStats stats;
  };
  std::map<int64_t, Step> steps;  // submitted, not yet taken
  std::deque<int64_t> todo;       // submission order
  std::map<int64_t, StepStats> history;
  bool stop = false;
  std::vector<std::thread> workers;

  // Plans by batch key: done ones (most recently used last in `recent`), and those being planned
  // with the steps waiting for them.
  int reuse_batches = 0;
  struct Known {
    bool done = false;
    std::vector<std::shared_ptr<const Plan>> plans;
    std::vector<int64_t> waiting;  // steps with an equal batch, fulfilled when it is done
  };
  std::map<std::string, Known> known;
  std::deque<std::string> recent;  // done keys, least recently used first

  static std::string key_of(const std::vector<Batch>& kinds, const std::vector<double>& layers, bool layered) {
    std::string key = layered ? "kinds" : "batch";
    for (const double l : layers) {  // shortest text that reads back as the same double
      char text[32];
      key.append(1, ' ').append(text, std::to_chars(text, text + sizeof text, l).ptr);
    }
    for (const Batch& b : kinds) key.append(1, '\n').append(batch_to_json(b, false));
    return key;
  }
  void touch(const std::string& key) {
    for (auto it = recent.begin(); it != recent.end(); ++it)
      if (*it == key) {
        recent.erase(it);
        break;
      }
    recent.push_back(key);
    while (static_cast<int>(recent.size()) > reuse_batches) {
      known.erase(recent.front());
      recent.pop_front();
    }
  }
  void finish(Step& s, std::vector<std::shared_ptr<const Plan>> plans, std::exception_ptr error, double ms) {
    s.plans = std::move(plans);
    s.error = error;
    s.stats.planning_ms = ms;
    s.done = true;
  }

  void work() {
    std::unique_lock lock(mutex);
    for (;;) {
      work_ready.wait(lock, [&] { return stop || !todo.empty(); });
      if (stop) return;
      const int64_t id = todo.front();
      todo.pop_front();
      auto it = steps.find(id);
      if (it == steps.end()) continue;
      Step& step = it->second;
      step.started = true;
      const auto t0 = Clock::now();
      step.stats.queued_ms = std::chrono::duration<double, std::milli>(t0 - step.submitted).count();
      const std::vector<Batch> kinds = std::move(step.kinds);
      const bool layered = step.layered;
      const std::vector<double> layers = std::move(step.layers);
      std::string key;
      if (reuse_batches > 0) {
        lock.unlock();
        key = key_of(kinds, layers, layered);
        lock.lock();
        auto k = known.find(key);
        if (k != known.end()) {
          Step& same = steps.at(id);
          same.stats.reused = true;
          if (k->second.done) {
            finish(same, k->second.plans, nullptr, std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
            touch(key);
            plan_ready.notify_all();
          } else {
            k->second.waiting.push_back(id);
          }
          continue;
        }
        known[key];  // being planned: equal batches wait for it
      }
      lock.unlock();
      std::vector<std::shared_ptr<const Plan>> plans;
      std::exception_ptr error;
      try {
        if (layered) {
          for (Plan& p : plan_step_kinds(kinds, cluster, options, layers)) plans.push_back(std::make_shared<const Plan>(std::move(p)));
        } else {
          plans.push_back(std::make_shared<const Plan>(plan_step(kinds.front(), cluster, options)));
        }
      } catch (...) {
        error = std::current_exception();
      }
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      lock.lock();
      // The step is still there: get() waits for done and the destructor joins first; so are
      // the steps waiting for its batch.
      if (!key.empty()) {
        Known& k = known.at(key);
        for (const int64_t other : k.waiting) finish(steps.at(other), plans, error, 0.0);
        k.waiting.clear();
        if (error) {
          known.erase(key);  // a failure is not kept: the next equal batch tries again
        } else {
          k.done = true;
          k.plans = plans;
          touch(key);
        }
      }
      finish(steps.at(id), std::move(plans), error, ms);
      plan_ready.notify_all();
    }
  }
};

PlanQueue::PlanQueue(Cluster cluster, StepPlanOptions options, int threads, int reuse_batches)
    : state_(std::make_unique<State>()) {
  if (threads < 1 || threads > 256)
    raise(ErrorKind::InvalidInput, "plan queue: threads must be in [1, 256] (got " + std::to_string(threads) + ")");
  if (reuse_batches < 0 || reuse_batches > 4096)
    raise(ErrorKind::InvalidInput,
          "plan queue: reuse_batches must be in [0, 4096] (got " + std::to_string(reuse_batches) + ")");
  state_->reuse_batches = reuse_batches;
  cluster.validate("plan queue: cluster");
  options.validate();
  state_->cluster = std::move(cluster);
  state_->options = std::move(options);
  try {
    for (int i = 0; i < threads; ++i) state_->workers.emplace_back([s = state_.get()] { s->work(); });
  } catch (...) {  // a thread could not start: stop and join those that did
    {
      std::lock_guard lock(state_->mutex);
      state_->stop = true;
    }
    state_->work_ready.notify_all();
    for (std::thread& t : state_->workers) t.join();
    throw;
  }
}

PlanQueue::~PlanQueue() {
  {
    std::lock_guard lock(state_->mutex);
    state_->stop = true;
  }
  state_->work_ready.notify_all();
  for (std::thread& t : state_->workers) t.join();
}

void PlanQueue::submit(int64_t step, Batch batch) {
  std::vector<Batch> kinds;
  kinds.push_back(std::move(batch));
  enqueue(step, std::move(kinds), {}, false);
}

void PlanQueue::submit_kinds(int64_t step, std::vector<Batch> kinds, std::vector<double> layers) {
  if (kinds.empty())
    raise(ErrorKind::InvalidInput, "plan queue: step " + std::to_string(step) + " was submitted with no layer kinds");
  enqueue(step, std::move(kinds), std::move(layers), true);
}

void PlanQueue::enqueue(int64_t step, std::vector<Batch> kinds, std::vector<double> layers, bool layered) {
  std::lock_guard lock(state_->mutex);
  if (state_->steps.count(step) != 0)
    raise(ErrorKind::InvalidInput, "plan queue: step " + std::to_string(step) + " was already submitted");
  State::Step& s = state_->steps[step];
  s.kinds = std::move(kinds);
  s.layers = std::move(layers);
  s.layered = layered;
  s.submitted = Clock::now();
  state_->todo.push_back(step);
  state_->work_ready.notify_one();
}

std::shared_ptr<const Plan> PlanQueue::get(int64_t step, double timeout_s) {
  return take(step, timeout_s, false).front();
}

std::vector<std::shared_ptr<const Plan>> PlanQueue::get_kinds(int64_t step, double timeout_s) {
  return take(step, timeout_s, true);
}

std::vector<std::shared_ptr<const Plan>> PlanQueue::take(int64_t step, double timeout_s, bool layered) {
  const auto t0 = Clock::now();
  std::unique_lock lock(state_->mutex);
  auto it = state_->steps.find(step);
  if (it == state_->steps.end())
    raise(ErrorKind::InvalidInput, "plan queue: step " + std::to_string(step) + " was never submitted (or already taken)");
  if (it->second.layered && !layered)
    raise(ErrorKind::InvalidInput, "plan queue: step " + std::to_string(step) +
                                       " was submitted with layer kinds (submit_kinds): take it with get_kinds");
  const auto deadline = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  if (!state_->plan_ready.wait_until(lock, deadline, [&] { return state_->steps.at(step).done; }))
    raise(ErrorKind::Timeout, "plan queue: step " + std::to_string(step) + " not planned after " +
                                  std::to_string(timeout_s) + " s");
  it = state_->steps.find(step);
  State::Step s = std::move(it->second);
  state_->steps.erase(it);
  s.stats.waited_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  state_->history[step] = s.stats;
  while (state_->history.size() > 1024) state_->history.erase(state_->history.begin());
  lock.unlock();
  if (s.error) {
    try {
      std::rethrow_exception(s.error);
    } catch (const Error& e) {
      raise(e.kind(), "step " + std::to_string(step) + ": " + e.what());
    } catch (const std::exception& e) {
      raise(ErrorKind::System, "step " + std::to_string(step) + ": " + e.what());
    }
  }
  return s.plans;
}

PlanQueue::StepStats PlanQueue::stats(int64_t step) const {
  std::lock_guard lock(state_->mutex);
  auto it = state_->history.find(step);
  if (it == state_->history.end())
    raise(ErrorKind::InvalidInput, "plan queue: no figures for step " + std::to_string(step) + " (not taken yet)");
  return it->second;
}

int64_t PlanQueue::in_flight() const {
  std::lock_guard lock(state_->mutex);
  return static_cast<int64_t>(state_->steps.size());
}

const Cluster& PlanQueue::cluster() const { return state_->cluster; }

}  // namespace dcp
