// The CPU backend: host allocations and the kernels of attention_cpu.h behind dcp::Backend.
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "dcp/attention_cpu.h"
#include "dcp/executor.h"

namespace dcp {
namespace {

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  float* allocate(int64_t num_floats) override {
    buffers_.push_back(std::make_unique<float[]>(static_cast<size_t>(num_floats)));  // value-initialised: 0
    return buffers_.back().get();
  }
  void attend_forward(const cpu::HeadLayout& heads, std::span<const cpu::ForwardTile> tiles) override {
    cpu::attend_forward(heads, tiles);
  }
  void attend_backward(const cpu::HeadLayout& heads, std::span<const cpu::BackwardTile> tiles) override {
    cpu::attend_backward(heads, tiles);
  }
  void merge_partials(std::span<const cpu::PartialView> parts, float* o, float* lse, int64_t num_rows,
                      int head_dim) override {
    cpu::merge_partials(parts, o, lse, num_rows, head_dim);
  }
  void sum_into(float* dst, const float* src, int64_t n) override { cpu::sum_into(dst, src, n); }
  void copy_rows(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows,
                 int64_t row_floats) override {
    if (dst_ld == row_floats && src_ld == row_floats) {
      std::memmove(dst, src, static_cast<size_t>(rows * row_floats) * sizeof(float));
      return;
    }
    for (int64_t r = 0; r < rows; ++r)
      std::memmove(dst + r * dst_ld, src + r * src_ld, static_cast<size_t>(row_floats) * sizeof(float));
  }
  void fill(float* dst, int64_t n, float value) override { std::fill_n(dst, n, value); }
  void compute_delta(const float* d_o, const float* o, int64_t num_rows, int q_heads, int head_dim,
                     float* delta) override {
    cpu::compute_delta(d_o, o, num_rows, q_heads, head_dim, delta);
  }

 private:
  std::vector<std::unique_ptr<float[]>> buffers_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace dcp
