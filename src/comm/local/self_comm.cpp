// The comm of a world of one rank: there are no peers, so every round is empty and completes at
// once. Lets one device (a CPU or a GPU) run plans through the same executor as many.
#include <set>

#include "comm/check_ops.h"
#include "dcp/comm.h"
#include "dcp/error.h"

namespace dcp {
namespace {

class SelfComm final : public Comm {
 public:
  explicit SelfComm(bool host_memory) : host_memory_(host_memory) {}
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string name() const override { return "self"; }
  bool host_memory() const override { return host_memory_; }
  void start(int32_t round, std::span<const CommOp> ops) override {
    comm_detail::check_ops(*this, round, ops, pending_.count(round) != 0);  // any op names a bad peer
    pending_.insert(round);
  }
  void wait(int32_t round, double) override {
    if (pending_.erase(round) == 0)
      raise(ErrorKind::InvalidInput, "self comm: wait for round " + std::to_string(round) + " that was not started");
  }
  void barrier(double) override {}
  void abort(const std::string&) noexcept override {}

 private:
  bool host_memory_ = true;
  std::set<int32_t> pending_;
};

}  // namespace

std::unique_ptr<Comm> make_self_comm(bool host_memory) { return std::make_unique<SelfComm>(host_memory); }

}  // namespace dcp
