// The CPU backend: host allocations (fp32 everywhere) and the kernels of attention_cpu.h behind
// dcp::Backend.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "dcp/detail/attention_cpu.h"
#include "dcp/detail/bf16.h"
#include "dcp/error.h"
#include "dcp/executor.h"

namespace dcp {
namespace {

cpu::HeadLayout heads_of(const ArraySet& a) { return cpu::HeadLayout{a.q_heads, a.kv_heads, a.head_dim}; }

float load(const TensorView& v, int64_t index) {
  return v.type == ElemType::F32 ? static_cast<const float*>(v.data)[index]
                                 : from_bf16_bits(static_cast<const uint16_t*>(v.data)[index]);
}
void store(const TensorView& v, int64_t index, float x) {
  if (v.type == ElemType::F32) static_cast<float*>(v.data)[index] = x;
  else static_cast<uint16_t*>(v.data)[index] = to_bf16_bits(x);
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(Allocator* allocator) : allocator_(allocator) {}
  std::string name() const override { return "cpu"; }
  ElemType storage_type() const override { return ElemType::F32; }
  bool host_memory() const override { return true; }
  void* allocate(int64_t bytes) override {
    const auto n = static_cast<size_t>((bytes + 3) / 4);
    float* p = nullptr;
    if (allocator_ != nullptr) {
      p = static_cast<float*>(allocator_->allocate(bytes));
      external_.push_back(p);
    } else {
      buffers_.push_back(std::make_unique_for_overwrite<float[]>(n));
      p = buffers_.back().get();
    }
    ++num_allocations_;
    // Arrays start as NaN, not 0: a program that reads a row nobody wrote then fails every
    // check downstream instead of passing by luck (allocation happens once per executor).
    std::fill_n(p, n, std::nanf(""));
    return p;
  }
  int64_t num_allocations() const override { return num_allocations_; }
  void deallocate(void* p) override {
    if (auto it = std::find(external_.begin(), external_.end(), p); it != external_.end()) {
      allocator_->deallocate(p);
      external_.erase(it);
      return;
    }
    std::erase_if(buffers_, [&](const auto& b) { return b.get() == p; });
  }

  void attend(const ArraySet& a, const AttendCall& call) override {
    const cpu::HeadLayout heads = heads_of(a);
    const auto mask_of = [&](const AttendTile& t) {
      cpu::TileMaskView m;
      m.kind = t.kind;
      if (t.kind == TileKind::Partial) {
        m.row_offsets = call.row_offsets.subspan(static_cast<size_t>(t.mask), static_cast<size_t>(t.num_q + 1));
        m.ranges = call.ranges.subspan(static_cast<size_t>(t.ranges_begin),
                                       static_cast<size_t>(m.row_offsets.back()));
      }
      return m;
    };
    // One tile at a time, in order: later tiles may accumulate into earlier ones' outputs.
    for (const AttendTile& t : call.tiles) {
      if (call.pass == Pass::Forward) {
        cpu::ForwardTile f;
        f.num_q = t.num_q;
        f.num_kv = t.num_kv;
        f.mask = mask_of(t);
        f.q = f32(a, Array::Q, t.q);
        f.k = f32(a, Array::K, t.kv);
        f.v = f32(a, Array::V, t.kv);
        f.o = f32(a, Array::O, t.o);
        f.lse = f32(a, Array::LSE, t.lse);
        f.accumulate = t.accumulate_q;
        cpu::attend_forward(heads, {&f, 1});
        continue;
      }
      if (!t.accumulate_q) zero_rows(a, Array::dQ, t.dq, t.num_q);
      if (!t.accumulate_kv) {
        zero_rows(a, Array::dK, t.dkv, t.num_kv);
        zero_rows(a, Array::dV, t.dkv, t.num_kv);
      }
      cpu::BackwardTile b;
      b.num_q = t.num_q;
      b.num_kv = t.num_kv;
      b.mask = mask_of(t);
      b.q = f32(a, Array::Q, t.q);
      b.k = f32(a, Array::K, t.kv);
      b.v = f32(a, Array::V, t.kv);
      b.d_o = f32(a, Array::dO, t.d_o);
      b.lse = f32(a, Array::LSE, t.lse_in);
      b.delta = f32(a, Array::Delta, t.delta);
      b.dq = f32(a, Array::dQ, t.dq);
      b.dk = f32(a, Array::dK, t.dkv);
      b.dv = f32(a, Array::dV, t.dkv);
      cpu::attend_backward(heads, {&b, 1});
    }
  }

  void merge(const ArraySet& a, const MergeCall& m) override {
    const cpu::HeadLayout heads = heads_of(a);
    if (m.kind == DataKind::O) {
      const int64_t rows = m.num_rows * heads.q_heads;
      std::vector<float> o_acc(static_cast<size_t>(rows * heads.head_dim)), lse_acc(static_cast<size_t>(rows));
      std::vector<cpu::PartialView> parts;
      if (m.accumulate) parts.push_back({f32(a, Array::O, m.dst), f32(a, Array::LSE, m.dst_lse)});
      for (size_t i = 0; i < m.src.size(); ++i)
        parts.push_back({f32(a, Array::O, m.src[i]), f32(a, Array::LSE, m.src_lse[i])});
      cpu::merge_partials(parts, o_acc.data(), lse_acc.data(), rows, heads.head_dim);
      std::copy(o_acc.begin(), o_acc.end(), f32(a, Array::O, m.dst));
      std::copy(lse_acc.begin(), lse_acc.end(), f32(a, Array::LSE, m.dst_lse));
      return;
    }
    const std::vector<Array> parts =
        m.kind == DataKind::dQ ? std::vector<Array>{Array::dQ} : std::vector<Array>{Array::dK, Array::dV};
    for (Array arr : parts) {
      const int64_t n = m.num_rows * a.row_elems[static_cast<size_t>(arr)];
      float* dst = f32(a, arr, m.dst);
      std::vector<float> acc(static_cast<size_t>(n), 0.0f);
      if (m.accumulate) std::copy(dst, dst + n, acc.begin());
      for (int64_t s : m.src) cpu::sum_into(acc.data(), f32(a, arr, s), n);
      std::copy(acc.begin(), acc.end(), dst);
    }
  }

  void copy_rows(const ArraySet& a, Array arr, int64_t dst, int64_t src, int64_t num_rows) override {
    const auto n = static_cast<size_t>(num_rows * a.row_elems[static_cast<size_t>(arr)]);
    std::memmove(f32(a, arr, dst), f32(a, arr, src), n * sizeof(float));
  }
  void zero_rows(const ArraySet& a, Array arr, int64_t row, int64_t num_rows) override {
    std::fill_n(f32(a, arr, row), num_rows * a.row_elems[static_cast<size_t>(arr)], 0.0f);
  }
  void compute_delta(const ArraySet& a, int64_t d_o, int64_t o, int64_t delta, int64_t num_rows) override {
    cpu::compute_delta(f32(a, Array::dO, d_o), f32(a, Array::O, o), num_rows, a.q_heads, a.head_dim,
                       f32(a, Array::Delta, delta));
  }
  void exchange(const ArraySet& a, std::span<const LocalExchange> moves) override {
    for (const LocalExchange& x : moves) {
      const TensorView& t = x.tensor;
      const int64_t heads_per_group = t.heads / x.num_groups;
      for (int g = 0; g < x.num_groups; ++g)
        for (int64_t r = 0; r < x.num_rows; ++r) {
          float* row = f32(a, x.array, x.first_row + g * x.num_rows + r);
          for (int64_t h = 0; h < heads_per_group; ++h) {
            const int64_t at = r * t.row_stride + (g * heads_per_group + h) * t.head_stride;
            for (int64_t d = 0; d < t.head_dim; ++d) {
              float& slot = row[h * t.head_dim + d];
              if (x.import) slot = load(t, at + d);
              else store(t, at + d, slot);
            }
          }
        }
    }
  }
  void delta_from(const ArraySet& a, int64_t delta_row, int64_t num_rows, int num_groups, const TensorView& d_o,
                  const TensorView& o, const TensorView* d_lse) override {
    const int64_t heads_per_group = a.q_heads;
    for (int g = 0; g < num_groups; ++g)
      for (int64_t r = 0; r < num_rows; ++r) {
        float* delta = f32(a, Array::Delta, delta_row + g * num_rows + r);
        for (int64_t h = 0; h < heads_per_group; ++h) {
          const int64_t head = g * heads_per_group + h;
          const int64_t at_do = r * d_o.row_stride + head * d_o.head_stride;
          const int64_t at_o = r * o.row_stride + head * o.head_stride;
          double sum = 0;
          for (int64_t d = 0; d < a.head_dim; ++d) sum += double{load(d_o, at_do + d)} * double{load(o, at_o + d)};
          if (d_lse != nullptr) sum -= double{load(*d_lse, r * d_lse->row_stride + head * d_lse->head_stride)};
          delta[h] = static_cast<float>(sum);
        }
      }
  }
  void upload(const ArraySet& a, Array arr, int64_t row, const float* host, int64_t host_ld,
              int64_t num_rows) override {
    const int64_t w = a.row_elems[static_cast<size_t>(arr)];
    float* dst = f32(a, arr, row);
    for (int64_t r = 0; r < num_rows; ++r) std::copy_n(host + r * host_ld, w, dst + r * w);
  }
  void download(const ArraySet& a, Array arr, int64_t row, float* host, int64_t host_ld,
                int64_t num_rows) override {
    const int64_t w = a.row_elems[static_cast<size_t>(arr)];
    const float* src = f32(a, arr, row);
    for (int64_t r = 0; r < num_rows; ++r) std::copy_n(src + r * w, w, host + r * host_ld);
  }
  void fill_random(const ArraySet& a, Array arr, int64_t row, int64_t num_rows, uint64_t seed,
                   float amplitude) override {
    const int64_t n = num_rows * a.row_elems[static_cast<size_t>(arr)];
    float* p = f32(a, arr, row);
    for (int64_t i = 0; i < n; ++i) {
      uint64_t z = seed * 0x9e3779b97f4a7c15ULL + static_cast<uint64_t>(i) * 0xd1b54a32d192ed03ULL;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
      z ^= z >> 31;
      p[i] = amplitude * (static_cast<float>(z >> 40) * (2.0f / 16777216.0f) - 1.0f);
    }
  }

 private:
  static float* f32(const ArraySet& a, Array arr, int64_t row) { return static_cast<float*>(a.at(arr, row)); }
  Allocator* allocator_ = nullptr;
  std::vector<std::unique_ptr<float[]>> buffers_;
  std::vector<void*> external_;
  int64_t num_allocations_ = 0;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(Allocator* allocator) { return std::make_unique<CpuBackend>(allocator); }

}  // namespace dcp
