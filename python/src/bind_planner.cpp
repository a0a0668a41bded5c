// Plans from Python: options, one-shot planning, the planning-ahead queue, and what a rank needs
// to know of a plan (its tokens, their positions, its memory, the plan's identity).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>

#include "bind.h"
#include "dcp/dispatch.h"
#include "dcp/error.h"
#include "dcp/io.h"
#include "dcp/planner.h"
#include "dcp/sim.h"
#include "dcp/validate.h"

namespace nb = nanobind;

namespace dcp::python {
namespace {

using PlanPtr = std::shared_ptr<const Plan>;

const DeviceProgram& device_of(const Plan& p, int rank) {
  if (rank < 0 || rank >= static_cast<int>(p.devices.size()))
    raise(ErrorKind::InvalidInput, "plan: rank " + std::to_string(rank) + " outside [0, " +
                                       std::to_string(p.devices.size()) + ")");
  return p.devices[static_cast<size_t>(rank)];
}

// A numpy array that owns a copy of `v`.
template <class T>
nb::ndarray<nb::numpy, T, nb::ndim<1>> to_numpy(std::vector<T> v) {
  auto* owned = new std::vector<T>(std::move(v));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T, nb::ndim<1>>(owned->data(), {owned->size()}, owner);
}

}  // namespace

void bind_planner(nb::module_& m) {
  nb::class_<StepPlanOptions>(m, "PlanOptions")
      .def(nb::init<>())
      .def_rw("method", &StepPlanOptions::method)
      .def_prop_rw(
          "block_size", [](const StepPlanOptions& o) { return o.blocks.block_size; },
          [](StepPlanOptions& o, int64_t b) { o.blocks.block_size = b; })
      .def_prop_rw(
          "q_heads_per_group", [](const StepPlanOptions& o) { return o.blocks.q_heads_per_group; },
          [](StepPlanOptions& o, int g) { o.blocks.q_heads_per_group = g; })
      .def_prop_rw(
          "stages", [](const StepPlanOptions& o) { return o.plan.schedule.num_comm_stages; },
          [](StepPlanOptions& o, int s) { o.plan.schedule.num_comm_stages = s; })
      .def_prop_rw(
          "eps_compute", [](const StepPlanOptions& o) { return o.placement.eps_compute; },
          [](StepPlanOptions& o, double e) { o.placement.eps_compute = e; })
      .def_prop_rw(
          "eps_memory", [](const StepPlanOptions& o) { return o.placement.eps_memory; },
          [](StepPlanOptions& o, double e) { o.placement.eps_memory = e; })
      .def_prop_rw(
          "seed", [](const StepPlanOptions& o) { return o.placement.seed; },
          [](StepPlanOptions& o, uint64_t s) { o.placement.seed = s; })
      .def_prop_rw(
          "placement_threads", [](const StepPlanOptions& o) { return o.placement.threads; },
          [](StepPlanOptions& o, int n) { o.placement.threads = o.search.placement.threads = n; })
      .def_prop_rw(
          "outputs_in_place", [](const StepPlanOptions& o) { return o.plan.outputs_in_place; },
          [](StepPlanOptions& o, bool v) { o.plan.outputs_in_place = o.search.plan.outputs_in_place = v; })
      .def_rw("search", &StepPlanOptions::search_candidates)
      .def_prop_rw(
          "search_block_sizes", [](const StepPlanOptions& o) { return o.search.block_sizes; },
          [](StepPlanOptions& o, std::vector<int64_t> v) { o.search.block_sizes = std::move(v); })
      .def_prop_rw(
          "search_eps_compute", [](const StepPlanOptions& o) { return o.search.eps_compute; },
          [](StepPlanOptions& o, std::vector<double> v) { o.search.eps_compute = std::move(v); })
      .def_prop_rw(
          "search_reseed_best", [](const StepPlanOptions& o) { return o.search.reseed_best; },
          [](StepPlanOptions& o, int n) { o.search.reseed_best = n; })
      .def_prop_rw(
          "search_tighten_best", [](const StepPlanOptions& o) { return o.search.tighten_best; },
          [](StepPlanOptions& o, int n) { o.search.tighten_best = n; })
      .def_prop_rw(
          "search_threads", [](const StepPlanOptions& o) { return o.search.threads; },
          [](StepPlanOptions& o, int n) { o.search.threads = n; })
      .def_prop_rw(
          "search_static_layouts", [](const StepPlanOptions& o) { return o.search.static_layouts; },
          [](StepPlanOptions& o, std::vector<std::string> v) { o.search.static_layouts = std::move(v); })
      .def("validate", &StepPlanOptions::validate);
  m.def("placement_methods", &placement_methods);

  nb::class_<Plan>(m, "Plan")
      .def_prop_ro("world_size", [](const Plan& p) { return p.header.world_size; })
      .def_prop_ro("method", [](const Plan& p) { return p.header.method; })
      .def_prop_ro("block_size", [](const Plan& p) { return p.header.block_size; })
      .def_prop_ro("total_tokens", [](const Plan& p) { return p.table.total_tokens(); })
      .def_prop_ro("num_sequences", [](const Plan& p) { return p.table.seq_length.size(); })
      .def_prop_ro("shape",
                   [](const Plan& p) {
                     const AttentionShape& s = p.header.shape;
                     return nb::make_tuple(s.q_heads, s.kv_heads, s.head_dim, std::string(to_string(s.dtype)));
                   })
      .def_prop_ro("hash", [](const Plan& p) { return plan_hash(p); })
      .def("num_tokens", [](const Plan& p, int rank) { return device_of(p, rank).owned_tokens; }, nb::arg("rank"))
      .def(
          "local_rows",
          [](const Plan& p, int rank) { return to_numpy(local_tokens(p.table, device_of(p, rank).owned_blocks).global_row); },
          nb::arg("rank"), "Row in the packed global batch of each of the rank's tokens, in dispatch order.")
      .def(
          "local_positions",
          [](const Plan& p, int rank) { return to_numpy(local_tokens(p.table, device_of(p, rank).owned_blocks).position); },
          nb::arg("rank"), "Position of each of the rank's tokens inside its sequence (RoPE ids).")
      .def(
          "local_sequences",
          [](const Plan& p, int rank) { return to_numpy(local_tokens(p.table, device_of(p, rank).owned_blocks).seq); },
          nb::arg("rank"), "Sequence index of each of the rank's tokens.")
      .def(
          "memory",
          [](const Plan& p, int rank) {
            const DeviceMemory mem = plan_memory(p, rank);
            nb::dict d;
            d["local_bytes"] = mem.local_bytes;
            d["fwd_slot_bytes"] = mem.fwd.slots_total_bytes;
            d["bwd_slot_bytes"] = mem.bwd.slots_total_bytes;
            d["peak_bytes"] = mem.peak_bytes;
            return d;
          },
          nb::arg("rank"))
      .def("validate", [](const Plan& p) { return validate_plan(p); }, nb::call_guard<nb::gil_scoped_release>(),
           "Violations found by the symbolic validator (empty: the plan computes exactly the masked attention).")
      .def("to_bytes",
           [](const Plan& p) {
             const std::vector<uint8_t> b = serialize_plan(p);
             return nb::bytes(reinterpret_cast<const char*>(b.data()), b.size());
           })
      .def("to_json", [](const Plan& p) { return plan_to_json(p, true); })
      .def(
          "simulate",
          [](const Plan& p, const Cluster& cluster, const std::string& calibration, bool trace) {
            cluster.validate("simulate: cluster");
            check_plan_world_size(p, cluster.num_devices(), "simulate");
            SimOptions o;
            o.calibration = calibration.empty() ? calibration_from_cluster(cluster) : load_calibration(calibration);
            o.trace = trace;
            SimResult r;
            {
              nb::gil_scoped_release release;
              check_plan(p);  // the simulator's precondition, for plans from anywhere
              r = simulate(p, cluster, o);
            }
            nb::dict d;
            d["fwd_ms"] = r.fwd_s * 1e3;
            d["bwd_ms"] = r.bwd_s * 1e3;
            d["total_ms"] = r.total_s() * 1e3;
            d["comm_ms"] = r.comm_s * 1e3;
            d["exposed_comm_ms"] = r.exposed_comm_s * 1e3;
            d["hidden_fraction"] = r.hidden_fraction;
            d["calibration"] = o.calibration.name;
            d["critical_path"] = r.critical_path;
            nb::list devices;
            for (const DeviceSim& dev : r.devices) {
              nb::dict e;
              const char* pass[2] = {"fwd", "bwd"};
              for (int k = 0; k < 2; ++k) {
                e[(std::string(pass[k]) + "_ms").c_str()] = dev.finish_s[k] * 1e3;
                e[(std::string(pass[k]) + "_compute_ms").c_str()] = dev.compute_s[k] * 1e3;
                e[(std::string(pass[k]) + "_stall_ms").c_str()] = dev.stall_s[k] * 1e3;
                e[(std::string(pass[k]) + "_exposed_comm_ms").c_str()] = dev.exposed_comm_s[k] * 1e3;
              }
              devices.append(e);
            }
            d["devices"] = devices;
            if (trace) d["trace_json"] = r.trace_json;
            return d;
          },
          nb::arg("cluster"), nb::arg("calibration") = "", nb::arg("trace") = false,
          "Predicted attention time of this plan on `cluster` (sim.h): forward and backward of the slowest "
          "device, communication hidden, each device's finish, compute and stall times, the critical path; "
          "calibration: a JSON file (default: the cluster's own rates), trace: also a Perfetto timeline.");
  m.def(
      "plan_from_bytes",
      [](nb::bytes b) {
        const auto* p = static_cast<const uint8_t*>(b.data());
        std::vector<uint8_t> bytes(p, p + b.size());
        nb::gil_scoped_release release;
        return std::make_shared<const Plan>(deserialize_plan(bytes, "plan bytes"));
      },
      nb::arg("data"));
  m.def(
      "plan_step",
      [](const Batch& batch, const Cluster& cluster, const StepPlanOptions& options) {
        return std::make_shared<const Plan>(plan_step(batch, cluster, options));
      },
      nb::arg("batch"), nb::arg("cluster"), nb::arg("options"), nb::call_guard<nb::gil_scoped_release>());

  m.def(
      "plan_step_kinds",
      [](const std::vector<Batch>& kinds, const Cluster& cluster, const StepPlanOptions& options,
         const std::vector<double>& layers) {
        std::vector<std::shared_ptr<const Plan>> out;
        for (Plan& p : plan_step_kinds(kinds, cluster, options, layers)) out.push_back(std::make_shared<const Plan>(std::move(p)));
        return out;
      },
      nb::arg("kinds"), nb::arg("cluster"), nb::arg("options"), nb::arg("layers") = std::vector<double>{},
      nb::call_guard<nb::gil_scoped_release>());

  nb::class_<PlanQueue>(m, "PlanQueue")
      .def(nb::init<Cluster, StepPlanOptions, int, int>(), nb::arg("cluster"), nb::arg("options"), nb::arg("threads"),
           nb::arg("reuse_batches") = 2)
      .def("submit", &PlanQueue::submit, nb::arg("step"), nb::arg("batch"), nb::call_guard<nb::gil_scoped_release>())
      .def("submit_kinds", &PlanQueue::submit_kinds, nb::arg("step"), nb::arg("kinds"),
           nb::arg("layers") = std::vector<double>{}, nb::call_guard<nb::gil_scoped_release>())
      .def("get", &PlanQueue::get, nb::arg("step"), nb::arg("timeout_s") = 600.0,
           nb::call_guard<nb::gil_scoped_release>())
      .def("get_kinds", &PlanQueue::get_kinds, nb::arg("step"), nb::arg("timeout_s") = 600.0,
           nb::call_guard<nb::gil_scoped_release>())
      .def("stats",
           [](const PlanQueue& q, int64_t step) {
             const PlanQueue::StepStats s = q.stats(step);
             nb::dict d;
             d["planning_ms"] = s.planning_ms;
             d["queued_ms"] = s.queued_ms;
             d["waited_ms"] = s.waited_ms;
             d["reused"] = s.reused;
             return d;
           })
      .def_prop_ro("in_flight", &PlanQueue::in_flight);
}

}  // namespace dcp::python
