// Running plans from Python: comms (one rank, MPI, NCCL from a unique id, or callbacks into
// torch.distributed), backends (CPU, CUDA on the caller's stream and allocator), and Attention
// on caller tensors given as (pointer, type, rows, heads, head_dim, row stride, head stride).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <memory>
#include <optional>

#include "bind.h"
#include "dcp/attention.h"
#include "dcp/comm.h"
#include "dcp/cuda_backend.h"
#include "dcp/error.h"
#include "dcp/nccl_comm.h"

namespace nb = nanobind;

namespace dcp::python {
namespace {

using View = std::tuple<uintptr_t, int, int64_t, int64_t, int64_t, int64_t, int64_t>;

TensorView view_of(const View& v) {
  const auto& [ptr, type, rows, heads, dim, row_stride, head_stride] = v;
  if (type != 0 && type != 1) raise(ErrorKind::InvalidInput, "tensor: element type must be 0 (fp32) or 1 (bf16)");
  return TensorView{reinterpret_cast<void*>(ptr), type == 1 ? ElemType::BF16 : ElemType::F32, rows, heads, dim,
                    row_stride, head_stride};
}

// An Allocator that asks a Python object: allocate(nbytes) -> int pointer, free(pointer). The
// package's allocator takes the blocks from PyTorch's caching allocator on the current stream.
class PyAllocator final : public Allocator {
 public:
  explicit PyAllocator(nb::object impl) : impl_(std::move(impl)) {}
  ~PyAllocator() override {
    nb::gil_scoped_acquire gil;
    impl_.reset();
  }
  void* allocate(int64_t bytes) override {
    nb::gil_scoped_acquire gil;
    return reinterpret_cast<void*>(nb::cast<uintptr_t>(impl_.attr("allocate")(bytes)));
  }
  void deallocate(void* p) noexcept override {
    try {
      nb::gil_scoped_acquire gil;
      impl_.attr("free")(reinterpret_cast<uintptr_t>(p));
    } catch (...) {  // the allocator keeps the block; nothing to do in a destructor path
    }
  }

 private:
  nb::object impl_;
};

// A comm whose rounds a Python object carries (torch.distributed over gloo for CPU ranks):
// start(round, [(peer, send, pointer, nbytes), ...]), wait(round, timeout_s), barrier(timeout_s),
// abort(reason). Python exceptions come back as dcp errors (Timeout when the message says so).
class PyComm final : public Comm {
 public:
  PyComm(nb::object impl, int rank, int world, bool host) : impl_(std::move(impl)), rank_(rank), world_(world), host_(host) {}
  ~PyComm() override {
    nb::gil_scoped_acquire gil;
    impl_.reset();
  }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string name() const override { return "python"; }
  bool host_memory() const override { return host_; }
  void start(int32_t round, std::span<const CommOp> ops) override {
    for (const CommOp& op : ops)
      if (op.peer < 0 || op.peer >= world_ || op.peer == rank_)
        raise(ErrorKind::InvalidInput, "python comm: peer " + std::to_string(op.peer) + " is not another rank");
    call([&] {
      nb::list list;
      for (const CommOp& op : ops)
        list.append(nb::make_tuple(op.peer, op.send, reinterpret_cast<uintptr_t>(op.data), op.bytes));
      impl_.attr("start")(round, list);
    });
  }
  void wait(int32_t round, double timeout_s) override { call([&] { impl_.attr("wait")(round, timeout_s); }); }
  void barrier(double timeout_s) override { call([&] { impl_.attr("barrier")(timeout_s); }); }
  void abort(const std::string& reason) noexcept override {
    try {
      nb::gil_scoped_acquire gil;
      impl_.attr("abort")(reason);
    } catch (...) {
    }
  }

 private:
  template <class F>
  void call(F&& f) {
    nb::gil_scoped_acquire gil;
    try {
      f();
    } catch (nb::python_error& e) {
      const std::string what = e.what();
      const bool timeout = what.find("imeout") != std::string::npos || what.find("imed out") != std::string::npos;
      raise(timeout ? ErrorKind::Timeout : ErrorKind::System, "python comm rank " + std::to_string(rank_) + ": " + what);
    }
  }
  nb::object impl_;
  int rank_, world_;
  bool host_;
};

// MPI is initialised once per process, on first use, and finalised at exit.
std::unique_ptr<MpiSession>& mpi_session() {
  static std::unique_ptr<MpiSession> session;
  return session;
}

// An Attention with the objects it runs on kept alive.
struct PyAttention {
  std::shared_ptr<const Plan> plan;
  std::shared_ptr<Backend> backend;
  std::shared_ptr<Comm> comm;
  std::unique_ptr<Attention> attention;
};

}  // namespace

void bind_exec(nb::module_& m) {
  nb::class_<Comm>(m, "Comm")
      .def_prop_ro("rank", &Comm::rank)
      .def_prop_ro("world_size", &Comm::world_size)
      .def_prop_ro("name", &Comm::name)
      .def("barrier", &Comm::barrier, nb::arg("timeout_s") = 120.0, nb::call_guard<nb::gil_scoped_release>());
  m.def(
      "self_comm", [](bool host_memory) { return std::shared_ptr<Comm>(make_self_comm(host_memory)); },
      nb::arg("host_memory"));
  m.def(
      "python_comm",
      [](nb::object impl, int rank, int world, bool host_memory) {
        return std::shared_ptr<Comm>(std::make_shared<PyComm>(std::move(impl), rank, world, host_memory));
      },
      nb::arg("impl"), nb::arg("rank"), nb::arg("world_size"), nb::arg("host_memory") = true);
  m.def("mpi_available", &mpi_available);
  m.def("mpi_comm_world", [] {
    if (!mpi_session()) mpi_session() = std::make_unique<MpiSession>(nullptr, nullptr);
    return std::shared_ptr<Comm>(make_mpi_comm_world());
  });
  m.def("nccl_available", &nccl_available);
  m.def("nccl_unique_id", [] {
    const NcclUniqueId id = nccl_unique_id();
    return nb::bytes(id.bytes.data(), id.bytes.size());
  });
  m.def(
      "nccl_comm",
      [](nb::bytes id, int rank, int world, int device, bool blocking_wait) {
        NcclUniqueId uid;
        if (id.size() != uid.bytes.size())
          raise(ErrorKind::InvalidInput, "nccl comm: unique id of " + std::to_string(id.size()) + " bytes, expected " +
                                             std::to_string(uid.bytes.size()));
        std::memcpy(uid.bytes.data(), id.data(), uid.bytes.size());
        NcclCommOptions options;
        options.device = device;
        options.blocking_wait = blocking_wait;
        nb::gil_scoped_release release;
        return std::shared_ptr<Comm>(make_nccl_comm(uid, rank, world, options));
      },
      nb::arg("unique_id"), nb::arg("rank"), nb::arg("world_size"), nb::arg("device"), nb::arg("blocking_wait") = true);

  nb::class_<Backend>(m, "Backend")
      .def_prop_ro("name", &Backend::name)
      .def_prop_ro("num_allocations", &Backend::num_allocations)
      .def("set_stream", [](Backend& b, uintptr_t stream) { b.set_compute_stream(reinterpret_cast<void*>(stream)); })
      .def("synchronize", &Backend::synchronize, nb::call_guard<nb::gil_scoped_release>());
  m.def("cpu_backend", [] { return std::shared_ptr<Backend>(make_cpu_backend()); });
  m.def("cuda_available", &cuda_backend_available);
  m.def("cuda_device_count", &cuda_device_count);
  m.def("cuda_device_name", &cuda_device_name, nb::arg("device"), "The device's product name; '' without CUDA.");
  m.def(
      "cuda_backend",
      [](int device, uintptr_t stream, nb::object allocator, const std::string& forward, const std::string& backward,
         const std::string& dq, const std::string& deterministic, const std::string& deterministic_one_pass,
         const std::string& deterministic_ordered) {
        // The backend owns its allocator: both die together.
        struct Owned {
          std::unique_ptr<PyAllocator> allocator;
          std::unique_ptr<Backend> backend;
        };
        auto owned = std::make_shared<Owned>();
        CudaBackendOptions o;
        o.device = device;
        o.own_stream = false;  // the caller's stream (PyTorch's current one; 0 = its default stream)
        o.stream = reinterpret_cast<void*>(stream);
        if (!allocator.is_none()) {
          owned->allocator = std::make_unique<PyAllocator>(allocator);
          o.allocator = owned->allocator.get();
        }
        o.kernels.forward = parse_kernel_route(forward, "forward kernel");
        o.kernels.backward = parse_kernel_route(backward, "backward kernel");
        o.kernels.dq = parse_dq_reduction(dq, "dq reduction");
        o.kernels.deterministic_backward = parse_switch(deterministic, "deterministic (DCP_ATTN_DETERMINISTIC)");
        if (!deterministic_one_pass.empty())  // empty: the library's default
          o.kernels.deterministic_one_pass =
              parse_switch(deterministic_one_pass, "deterministic_one_pass (DCP_ATTN_DETERMINISTIC_ONE_PASS)");
        if (!deterministic_ordered.empty())
          o.kernels.deterministic_ordered =
              parse_switch(deterministic_ordered, "deterministic_ordered (DCP_ATTN_DETERMINISTIC_ORDERED)");
        owned->backend = make_cuda_backend(o);
        return std::shared_ptr<Backend>(owned, owned->backend.get());
      },
      nb::arg("device"), nb::arg("stream") = 0, nb::arg("allocator") = nb::none(), nb::arg("forward") = "auto",
      nb::arg("backward") = "auto", nb::arg("dq") = "bulk", nb::arg("deterministic") = "0",
      nb::arg("deterministic_one_pass") = "", nb::arg("deterministic_ordered") = "");

  nb::class_<PyAttention>(m, "Attention")
      .def(
          "__init__",
          [](PyAttention* self, std::shared_ptr<const Plan> plan, std::shared_ptr<Backend> backend,
             std::shared_ptr<Comm> comm, double timeout_s) {
            std::unique_ptr<Attention> attention;
            {
              nb::gil_scoped_release release;  // the allocator and comm call back into Python
              attention = std::make_unique<Attention>(*plan, *backend, *comm, ExecOptions{.comm_timeout_s = timeout_s});
            }
            new (self) PyAttention{plan, backend, comm, std::move(attention)};
          },
          nb::arg("plan"), nb::arg("backend"), nb::arg("comm"), nb::arg("timeout_s") = 120.0)
      .def_prop_ro("num_tokens", [](const PyAttention& a) { return a.attention->num_tokens(); })
      .def_prop_ro("scratch_bytes", [](const PyAttention& a) { return a.attention->scratch_bytes(); })
      .def(
          "forward",
          [](PyAttention& a, const View& q, const View& k, const View& v, const View& o, const View& lse) {
            const AttentionForwardArgs args{view_of(q), view_of(k), view_of(v), view_of(o), view_of(lse)};
            nb::gil_scoped_release release;
            a.attention->forward(args);
          },
          nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("o"), nb::arg("lse"))
      .def(
          "backward",
          [](PyAttention& a, const View& q, const View& k, const View& v, const View& o, const View& lse, const View& d_o,
             const View& dq, const View& dk, const View& dv, const std::optional<View>& d_lse) {
            AttentionBackwardArgs args{view_of(q),   view_of(k),  view_of(v),  view_of(o), view_of(lse),
                                       view_of(d_o), view_of(dq), view_of(dk), view_of(dv)};
            if (d_lse) args.d_lse = view_of(*d_lse);
            nb::gil_scoped_release release;
            a.attention->backward(args);
          },
          nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("o"), nb::arg("lse"), nb::arg("d_o"), nb::arg("dq"),
          nb::arg("dk"), nb::arg("dv"), nb::arg("d_lse") = nb::none());
}

}  // namespace dcp::python
