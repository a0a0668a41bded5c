// Batches and clusters from Python: lengths with one mask spec per sequence, and cluster presets.
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "bind.h"
#include "dcp/batch.h"
#include "dcp/cluster.h"
#include "dcp/error.h"
#include "dcp/io.h"
#include "dcp/profiles.h"

namespace nb = nanobind;

namespace dcp::python {
namespace {

// (kind, params, rows) as the package's mask helpers make them:
//   full, causal: no params; lambda: (sink, window); causal_blockwise: (block, local, sink);
//   chunked: (chunk);
//   shared_question: (question, answer lengths...); ranges: rows = per row [(begin, end), ...].
using MaskSpec = std::tuple<std::string, std::vector<int64_t>, std::vector<std::vector<std::pair<int64_t, int64_t>>>>;

Mask mask_from(const MaskSpec& spec, size_t index) {
  const auto& [kind, p, rows] = spec;
  const std::string where = "masks[" + std::to_string(index) + "]";
  auto need = [&](size_t n, const char* what) {
    if (p.size() != n)
      raise(ErrorKind::InvalidInput, where + ": " + kind + " takes " + what + " (" + std::to_string(n) + " numbers, got " +
                                         std::to_string(p.size()) + ")");
  };
  if (kind == "full") return need(0, "nothing"), Mask::full();
  if (kind == "causal") return need(0, "nothing"), Mask::causal();
  if (kind == "lambda") return need(2, "sink, window"), Mask::lambda(p[0], p[1]);
  if (kind == "causal_blockwise") return need(3, "block, local blocks, sink blocks"), Mask::causal_blockwise(p[0], p[1], p[2]);
  if (kind == "chunked") return need(1, "the chunk size"), Mask::chunked(p[0]);
  if (kind == "shared_question") {
    if (p.size() < 2) raise(ErrorKind::InvalidInput, where + ": shared_question takes the question length and answer lengths");
    Mask m;
    m.kind = MaskKind::SharedQuestion;
    m.question = p[0];
    m.answers.assign(p.begin() + 1, p.end());
    return m;
  }
  if (kind == "ranges") {
    std::vector<std::vector<Range>> r(rows.size());
    for (size_t i = 0; i < rows.size(); ++i)
      for (const auto& [b, e] : rows[i]) r[i].push_back({b, e});
    return Mask::ranges(std::move(r));
  }
  raise(ErrorKind::InvalidInput, where + ": unknown mask kind '" + kind +
                                     "' (expected full, causal, lambda, causal_blockwise, chunked, shared_question, ranges)");
}

}  // namespace

void bind_batch(nb::module_& m) {
  nb::class_<Batch>(m, "Batch")
      .def_prop_ro("total_tokens", &Batch::total_tokens)
      .def_prop_ro("num_sequences", [](const Batch& b) { return b.sequences.size(); })
      .def_prop_ro("lengths",
                   [](const Batch& b) {
                     std::vector<int64_t> out;
                     for (const Sequence& s : b.sequences) out.push_back(s.length);
                     return out;
                   })
      .def_prop_ro("mask_area", &Batch::mask_area)
      .def_prop_ro("forward_flops", &Batch::forward_flops)
      .def_prop_ro("shape", [](const Batch& b) {
        return std::make_tuple(b.shape.q_heads, b.shape.kv_heads, b.shape.head_dim, std::string(to_string(b.shape.dtype)));
      });

  m.def(
      "make_batch",
      [](const std::vector<int64_t>& lengths, const std::vector<MaskSpec>& masks, int q_heads, int kv_heads, int head_dim,
         const std::string& dtype, bool validate) {
        if (masks.size() != lengths.size())
          raise(ErrorKind::InvalidInput, "batch: " + std::to_string(lengths.size()) + " lengths but " +
                                             std::to_string(masks.size()) + " masks");
        Batch b;
        b.shape = AttentionShape{q_heads, kv_heads, head_dim, parse_dtype(dtype, "dtype")};
        for (size_t i = 0; i < lengths.size(); ++i) b.sequences.push_back(Sequence{lengths[i], mask_from(masks[i], i), ""});
        if (validate) b.validate();
        return b;
      },
      nb::arg("lengths"), nb::arg("masks"), nb::arg("q_heads"), nb::arg("kv_heads"), nb::arg("head_dim"),
      nb::arg("dtype"), nb::arg("validate") = true,
      "A batch: one (kind, params, rows) mask spec per sequence length; checked unless validate=False (the\n"
      "planner checks it on its worker, so the error reaches get() naming the step).");

  m.def(
      "load_batch", [](const std::string& path) { return load_batch(path); }, nb::arg("path"),
      "A batch from its JSON file (docs/formats.md).");
  m.def(
      "profile_batches",
      [](const std::string& profile, uint64_t seed, int64_t tokens, const std::string& mask, int q_heads, int kv_heads,
         int head_dim, int count, double scale, const std::vector<int64_t>& lengths, bool shuffle) {
        ProfileOptions o;
        o.profile = parse_profile(profile);
        o.lengths = lengths;
        o.lengths_shuffle = shuffle;
        o.seed = seed;
        o.token_budget = tokens;
        o.mask = mask;
        o.scale = scale;
        o.shape = AttentionShape{q_heads, kv_heads, head_dim, DType::BF16};
        o.validate();
        nb::gil_scoped_release release;
        return generate_batches(o, count);
      },
      nb::arg("profile"), nb::arg("seed"), nb::arg("tokens"), nb::arg("mask"), nb::arg("q_heads"), nb::arg("kv_heads"),
      nb::arg("head_dim"), nb::arg("count"), nb::arg("scale") = 1.0, nb::arg("lengths") = std::vector<int64_t>{},
      nb::arg("shuffle") = true,
      "Batches of a profile (docs/profiles.md): the same stream as the dcp command's --profile/--seed/--index; "
      "profile 'lengths' replays `lengths` (a corpus's document lengths) in seeded shuffled epochs, or in order "
      "with shuffle=False (the command's --lengths FILE).");

  nb::class_<Cluster>(m, "Cluster")
      .def_ro("name", &Cluster::name)
      .def_ro("nodes", &Cluster::nodes)
      .def_ro("devices_per_node", &Cluster::devices_per_node)
      .def_prop_ro("num_devices", &Cluster::num_devices)
      .def("__repr__", [](const Cluster& c) {
        return "Cluster(" + c.name + ", " + std::to_string(c.nodes) + " x " + std::to_string(c.devices_per_node) + ")";
      });
  m.def(
      "cluster",
      [](const std::string& preset, int nodes, int devices_per_node) {
        Cluster c = cluster_preset(preset, nodes);
        if (devices_per_node > 0) c.devices_per_node = devices_per_node;
        c.validate("cluster");
        return c;
      },
      nb::arg("preset"), nb::arg("nodes"), nb::arg("devices_per_node") = 0,
      "A cluster preset (a100-p4d, h100-sxm, h200-nvl) of `nodes` nodes; devices_per_node overrides the preset's.");
  m.def("load_cluster", &load_cluster, nb::arg("path"), "A cluster from its JSON file (docs/formats.md).");
  m.def("cluster_presets", &cluster_preset_names);
  m.def("cluster_preset_for_gpu", &cluster_preset_for_gpu, nb::arg("gpu_name"),
        "The preset measured on the GPU of this product name ('NVIDIA H100 80GB HBM3' -> 'h100-sxm'); '' for others.");
  m.def(
      "node_layout_of",
      [](const std::vector<int>& node_of_rank) {
        const NodeLayout l = node_layout_of(node_of_rank);
        return std::pair{l.nodes, l.devices_per_node};
      },
      nb::arg("node_of_rank"),
      "(nodes, devices per node) of ranks on the machines node_of_rank (rank order); raises unless each "
      "machine's ranks are consecutive and equally many.");
}

}  // namespace dcp::python
