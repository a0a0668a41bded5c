// dcp._dcp — the Python binding: a thin layer over the public C++ API. Each part registers its
// own classes and functions (bind_*.cpp); this file only makes the module and maps errors.
#include <nanobind/nanobind.h>

#include "bind.h"
#include "dcp/error.h"

namespace nb = nanobind;

NB_MODULE(_dcp, m) {
  m.doc() = "dcp: dynamic context parallelism (C++ core). Use the dcp package, not this module.";
  // Every dcp::Error becomes dcp.Error (a RuntimeError) whose message starts with the kind.
  static nb::object error_type = nb::borrow(PyErr_NewException("dcp._dcp.Error", PyExc_RuntimeError, nullptr));
  m.attr("Error") = error_type;
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const dcp::Error& e) {
      const std::string msg = std::string(dcp::to_string(e.kind())) + ": " + e.what();
      PyErr_SetString(error_type.ptr(), msg.c_str());
    }
  });
  dcp::python::bind_batch(m);
  dcp::python::bind_planner(m);
  dcp::python::bind_exec(m);
}
