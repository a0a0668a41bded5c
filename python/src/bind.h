// The parts of the Python binding; each registers its classes and functions on the module.
#pragma once

#include <nanobind/nanobind.h>

namespace dcp::python {

void bind_batch(nanobind::module_& m);    // Batch, masks, Cluster
void bind_planner(nanobind::module_& m);  // plan options, Plan, PlanQueue
void bind_exec(nanobind::module_& m);     // comms, backends, Attention on caller tensors

}  // namespace dcp::python
