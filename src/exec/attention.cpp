// Attention on caller tensors: the plan's executor with one layer of local arrays that each call
// fills from the caller's tensors and empties into them (exchange), so layers and passes may run
// in any order while the slots are shared.
#include "dcp/attention.h"

#include <string>
#include <utility>

#include "dcp/error.h"

namespace dcp {

struct Attention::Impl {
  const Plan& plan;
  Backend& backend;
  Executor executor;
  int64_t tokens = 0;

  Impl(const Plan& p, Backend& b, Comm& c, ExecOptions o)
      : plan(p), backend(b), executor(p, b, c, with_one_layer(o)), tokens(executor.local_rows()) {
    executor.prepare();
  }
  static ExecOptions with_one_layer(ExecOptions o) {
    o.num_layers = 1;
    return o;
  }

  // The tensor fits this rank's tokens and the plan's heads, with strides that keep every head
  // of every row inside its own elements.
  void check(const char* name, const TensorView& v, int64_t heads, int64_t head_dim) const {
    const std::string where = std::string("attention: ") + name;
    auto shape = [](int64_t a, int64_t b, int64_t c) {
      std::string out("[");
      out += std::to_string(a);
      out += ", ";
      out += std::to_string(b);
      out += ", ";
      out += std::to_string(c);
      out += "]";
      return out;
    };
    if (v.rows != tokens || v.heads != heads || v.head_dim != head_dim)
      raise(ErrorKind::InvalidInput, where + " is " + shape(v.rows, v.heads, v.head_dim) + ", this rank's plan needs " +
                                         shape(tokens, heads, head_dim) + " (tokens, heads, head_dim)");
    const bool gpu = !backend.host_memory();
    if (gpu && v.type != ElemType::BF16 && v.type != ElemType::F32)
      raise(ErrorKind::InvalidInput, where + ": element type must be bf16 or fp32");
    if (tokens > 0 && v.data == nullptr) raise(ErrorKind::InvalidInput, where + ": no data");
    // Heads and tokens may come in either order in memory (token-major [T, H, D], or a head-major
    // view like [1, H, T, D] transposed), but no two (token, head) rows may share an element.
    const TensorView r = v.resolved();
    std::pair<int64_t, int64_t> dims[2] = {{r.head_stride, heads}, {r.row_stride, tokens}};
    if (dims[0].first > dims[1].first) std::swap(dims[0], dims[1]);
    const bool inner_ok = dims[0].second <= 1 || dims[0].first >= head_dim;
    const bool outer_ok = dims[1].second <= 1 || dims[1].first >= (dims[0].second - 1) * dims[0].first + head_dim;
    if (r.row_stride < 0 || r.head_stride < 0 || !inner_ok || !outer_ok)
      raise(ErrorKind::InvalidInput, where + ": strides (row " + std::to_string(r.row_stride) + ", head " +
                                         std::to_string(r.head_stride) + ") overlap the " + std::to_string(head_dim) +
                                         " elements of a head");
  }
  // The tensors both passes take: q, k, v, o and lse (fp32).
  void check_qkv_o_lse(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                       const TensorView& lse) const {
    const AttentionShape& s = plan.header.shape;
    check("q", q, s.q_heads, s.head_dim);
    check("k", k, s.kv_heads, s.head_dim);
    check("v", v, s.kv_heads, s.head_dim);
    check("o", o, s.q_heads, s.head_dim);
    check("lse", lse, s.q_heads, 1);
    check_type("lse", lse, ElemType::F32);
  }
  void check_type(const char* name, const TensorView& v, ElemType want) const {
    if (v.type != want)
      raise(ErrorKind::InvalidInput, std::string("attention: ") + name + " must be " + to_string(want) + ", got " +
                                         to_string(v.type));
  }
};

Attention::Attention(const Plan& plan, Backend& backend, Comm& comm, ExecOptions options)
    : impl_(std::make_unique<Impl>(plan, backend, comm, options)) {}
Attention::~Attention() = default;

int64_t Attention::num_tokens() const { return impl_->tokens; }
int64_t Attention::scratch_bytes() const { return impl_->executor.bytes_allocated(); }
const Plan& Attention::plan() const { return impl_->plan; }

ExecStats Attention::forward(const AttentionForwardArgs& args) {
  Impl& m = *impl_;
  m.check_qkv_o_lse(args.q, args.k, args.v, args.o, args.lse);
  const std::pair<Array, TensorView> in[] = {{Array::Q, args.q}, {Array::K, args.k}, {Array::V, args.v}};
  const std::pair<Array, TensorView> out[] = {{Array::O, args.o}, {Array::LSE, args.lse}};
  if (m.tokens > 0) m.executor.exchange(0, in, {});
  ExecStats stats = m.executor.forward_layer(0);
  if (m.tokens > 0) m.executor.exchange(0, {}, out);
  return stats;
}

ExecStats Attention::backward(const AttentionBackwardArgs& args) {
  Impl& m = *impl_;
  const AttentionShape& s = m.plan.header.shape;
  m.check_qkv_o_lse(args.q, args.k, args.v, args.o, args.lse);
  m.check("d_o", args.d_o, s.q_heads, s.head_dim);
  m.check("dq", args.dq, s.q_heads, s.head_dim);
  m.check("dk", args.dk, s.kv_heads, s.head_dim);
  m.check("dv", args.dv, s.kv_heads, s.head_dim);
  const bool d_lse = args.d_lse.data != nullptr || args.d_lse.rows != 0;
  if (d_lse) {
    m.check("d_lse", args.d_lse, s.q_heads, 1);
    m.check_type("d_lse", args.d_lse, ElemType::F32);
  }
  const std::pair<Array, TensorView> in[] = {
      {Array::Q, args.q}, {Array::K, args.k}, {Array::V, args.v}, {Array::dO, args.d_o}, {Array::LSE, args.lse}};
  const std::pair<Array, TensorView> out[] = {{Array::dQ, args.dq}, {Array::dK, args.dk}, {Array::dV, args.dv}};
  if (m.tokens > 0) {
    m.executor.exchange(0, in, {});
    m.executor.delta_from(0, args.d_o, args.o, d_lse ? &args.d_lse : nullptr);
  }
  ExecStats stats = m.executor.backward_layer_with_delta(0);
  if (m.tokens > 0) m.executor.exchange(0, {}, out);
  return stats;
}

}  // namespace dcp
