// Dry run of a plan (dcp/detail/exec_dry_run.h): the Executor over a backend without memory and a comm
// without messages.
#include "dcp/detail/exec_dry_run.h"

#include <map>
#include <memory>
#include <string>

#include "comm/check_ops.h"
#include "dcp/error.h"
#include "dcp/executor.h"
#include "dcp/limits.h"

namespace dcp {
namespace {

// Array bases are distinct fake addresses that are never dereferenced: the executor only forms
// row pointers from them (for comm ops), and this backend's kernels touch nothing.
class NullBackend final : public Backend {
 public:
  NullBackend(int64_t limit, int device) : limit_(limit), device_(device) {}
  std::string name() const override { return "dry-run"; }
  ElemType storage_type() const override { return ElemType::F32; }
  bool host_memory() const override { return true; }
  void* allocate(int64_t bytes) override {
    bytes_ = checked_add(bytes_, bytes, "dry run: device memory");
    if (bytes_ > limit_)
      raise(ErrorKind::InvalidInput, "dry run: device " + std::to_string(device_) + " needs more than " +
                                         std::to_string(limit_) + " bytes for its arrays");
    ++allocations_;
    return reinterpret_cast<void*>(kFakeBase * static_cast<uintptr_t>(allocations_));
  }
  int64_t num_allocations() const override { return allocations_; }
  int64_t bytes() const { return bytes_; }

  void attend(const ArraySet&, const AttendCall& call) override {
    // The executor derived these ranges from the masks; they must lie inside their tiles.
    for (const AttendTile& t : call.tiles) {
      if (t.kind != TileKind::Partial) continue;
      const auto first = static_cast<size_t>(t.mask);
      for (int64_t r = 0; r < t.num_q; ++r)
        for (int64_t i = call.row_offsets[first + static_cast<size_t>(r)];
             i < call.row_offsets[first + static_cast<size_t>(r) + 1]; ++i) {
          const Range& g = call.ranges[static_cast<size_t>(t.ranges_begin + i)];
          if (g.begin < 0 || g.end > t.num_kv || g.begin >= g.end)
            raise(ErrorKind::Internal, "dry run: tile " + std::to_string(t.tile) + " row " + std::to_string(r) +
                                           " has key range [" + std::to_string(g.begin) + ", " + std::to_string(g.end) +
                                           ") outside its " + std::to_string(t.num_kv) + " keys");
        }
    }
  }
  void merge(const ArraySet&, const MergeCall&) override {}
  void copy_rows(const ArraySet&, Array, int64_t, int64_t, int64_t) override {}
  void zero_rows(const ArraySet&, Array, int64_t, int64_t) override {}
  void compute_delta(const ArraySet&, int64_t, int64_t, int64_t, int64_t) override {}
  void exchange(const ArraySet&, std::span<const LocalExchange>) override {}
  void delta_from(const ArraySet&, int64_t, int64_t, int, const TensorView&, const TensorView&,
                  const TensorView*) override {}
  void upload(const ArraySet&, Array, int64_t, const float*, int64_t, int64_t) override {}
  void download(const ArraySet&, Array, int64_t, float*, int64_t, int64_t) override {}
  void fill_random(const ArraySet&, Array, int64_t, int64_t, uint64_t, float) override {}

 private:
  static constexpr uintptr_t kFakeBase = uintptr_t{1} << 40;
  int64_t limit_;
  int device_;
  int64_t bytes_ = 0;
  int64_t allocations_ = 0;
};

// Checks every round like a real comm would (peers, sizes, start/wait pairing) and moves nothing.
class NullComm final : public Comm {
 public:
  NullComm(int rank, int world) : rank_(rank), world_(world) {}
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string name() const override { return "dry-run"; }
  void start(int32_t round, std::span<const CommOp> ops) override {
    comm_detail::check_ops(*this, round, ops, pending_.count(round) != 0);
    pending_[round] = true;
    ++rounds_;
  }
  void wait(int32_t round, double) override {
    if (pending_.erase(round) == 0)
      raise(ErrorKind::InvalidPlan, "dry run: device " + std::to_string(rank_) + " waits for round " +
                                        std::to_string(round) + " that was not started");
  }
  void barrier(double) override {}
  void abort(const std::string&) noexcept override {}
  int64_t rounds() const { return rounds_; }
  bool idle() const { return pending_.empty(); }

 private:
  int rank_, world_;
  std::map<int32_t, bool> pending_;
  int64_t rounds_ = 0;
};

}  // namespace

DryRunReport dry_run_plan(const Plan& plan, const DryRunOptions& options) {
  DryRunReport report;
  const int P = plan.header.world_size;
  for (int d = 0; d < P; ++d) {
    NullBackend backend(options.max_device_bytes, d);
    NullComm comm(d, P);
    {
      Executor exec(plan, backend, comm, ExecOptions{});
      exec.forward_layer(0);
      exec.backward_layer(0);
    }
    if (!comm.idle())
      raise(ErrorKind::InvalidPlan, "dry run: device " + std::to_string(d) + " ends with a round never waited for");
    const DeviceProgram& dp = plan.devices[static_cast<size_t>(d)];
    report.instructions += static_cast<int64_t>(dp.fwd.code.size() + dp.bwd.code.size());
    report.comm_rounds += comm.rounds();
    report.max_device_bytes = std::max(report.max_device_bytes, backend.bytes());
  }
  return report;
}

}  // namespace dcp
