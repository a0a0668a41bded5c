// A Backend that forwards every call to the CPU backend: tests derive from it and override the
// calls they watch or change.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "dcp/backend.h"

namespace dcp::test {

class ForwardingBackend : public Backend {
 public:
  std::unique_ptr<Backend> cpu = make_cpu_backend();

  std::string name() const override { return "forwarding-cpu"; }
  ElemType storage_type() const override { return cpu->storage_type(); }
  bool host_memory() const override { return true; }
  void* allocate(int64_t bytes) override { return cpu->allocate(bytes); }
  void deallocate(void* p) override { cpu->deallocate(p); }
  int64_t num_allocations() const override { return cpu->num_allocations(); }
  void attend(const ArraySet& a, const AttendCall& c) override { cpu->attend(a, c); }
  void merge(const ArraySet& a, const MergeCall& c) override { cpu->merge(a, c); }
  void merge_batch(const ArraySet& a, const MergeBatchCall& b) override { cpu->merge_batch(a, b); }
  void copy_rows(const ArraySet& a, Array arr, int64_t d, int64_t s, int64_t n) override { cpu->copy_rows(a, arr, d, s, n); }
  void zero_rows(const ArraySet& a, Array arr, int64_t r, int64_t n) override { cpu->zero_rows(a, arr, r, n); }
  void compute_delta(const ArraySet& a, int64_t d_o, int64_t o, int64_t delta, int64_t n) override {
    cpu->compute_delta(a, d_o, o, delta, n);
  }
  void exchange(const ArraySet& a, std::span<const LocalExchange> moves) override { cpu->exchange(a, moves); }
  void delta_from(const ArraySet& a, int64_t row, int64_t n, int g, const TensorView& d_o, const TensorView& o,
                  const TensorView* d_lse) override {
    cpu->delta_from(a, row, n, g, d_o, o, d_lse);
  }
  void upload(const ArraySet& a, Array arr, int64_t r, const float* host, int64_t ld, int64_t n) override {
    cpu->upload(a, arr, r, host, ld, n);
  }
  void download(const ArraySet& a, Array arr, int64_t r, float* host, int64_t ld, int64_t n) override {
    cpu->download(a, arr, r, host, ld, n);
  }
  void fill_random(const ArraySet& a, Array arr, int64_t r, int64_t n, uint64_t seed, float amp) override {
    cpu->fill_random(a, arr, r, n, seed, amp);
  }
};

}  // namespace dcp::test
