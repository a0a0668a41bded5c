// dcp simulate --layer-masks: the attention of a model whose layers use several masks, per
// placement method, with every kind on one token placement (plan_step_kinds).
#include "layer_kinds.h"

#include <algorithm>
#include <chrono>
#include <iostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common.h"
#include "dcp/error.h"
#include "dcp/metrics.h"
#include "dcp/planner.h"
#include "table.h"

namespace dcp::cli {
namespace {

const char* const kKinds[] = {"causal", "full", "lambda", "causal_blockwise", "chunked", "shared_question"};

// The kind's paper mask for a sequence of `length` tokens (as the profiles make them).
Mask mask_named(const std::string& kind, int64_t length) {
  if (kind == "causal") return Mask::causal();
  if (kind == "full") return Mask::full();
  if (kind == "lambda") return Mask::lambda();
  if (kind == "causal_blockwise") return Mask::causal_blockwise();
  if (kind == "chunked") return Mask::chunked();
  return length >= 5 ? Mask::shared_question_for(length) : Mask::causal();
}

struct MethodRow {
  std::string method;
  std::vector<double> kind_s;  // forward + backward, per kind
  double step_s = 0;           // sum over kinds of kind_s x layers, summed over batches
  double inter_bytes = 0, intra_bytes = 0;  // per step (x layers), summed over batches
  double plan_ms = 0;
  std::vector<std::string> notes;
};

}  // namespace

LayerPattern parse_layer_pattern(const std::string& spelling) {
  LayerPattern p;
  size_t at = 0;
  while (at <= spelling.size()) {
    const size_t end = std::min(spelling.find('+', at), spelling.size());
    const std::string part = spelling.substr(at, end - at);
    const size_t star = part.find('*');
    const std::string kind = part.substr(0, star);
    if (std::find(std::begin(kKinds), std::end(kKinds), kind) == std::end(kKinds))
      raise(ErrorKind::InvalidInput, "--layer-masks '" + spelling + "': '" + kind +
                                         "' is not a mask kind (causal, full, lambda, causal_blockwise, chunked, shared_question)");
    double layers = 1;
    if (star != std::string::npos) {
      const std::string n = part.substr(star + 1);
      if (n.empty() || n.find_first_not_of("0123456789") != std::string::npos || std::stoll(n) < 1)
        raise(ErrorKind::InvalidInput, "--layer-masks '" + spelling + "': '*" + n +
                                           "' must repeat a kind a positive number of times");
      layers = static_cast<double>(std::stoll(n));
    }
    const auto same = std::find(p.kinds.begin(), p.kinds.end(), kind);
    if (same != p.kinds.end()) {
      p.layers[static_cast<size_t>(same - p.kinds.begin())] += layers;
    } else {
      p.kinds.push_back(kind);
      p.layers.push_back(layers);
    }
    at = end + 1;
  }
  return p;
}

int run_layer_kinds(const LayerKindsInputs& inputs) {
  const SweepInputs& in = inputs.in;
  const LayerPattern& pattern = inputs.pattern;
  const std::vector<Batch> batches = resolve_batches(in.batch, in.batches);
  const Cluster cluster = resolve_cluster(in.cluster);
  in.placement.validate();
  std::vector<std::string> methods = inputs.methods.empty() ? all_methods() : inputs.methods;
  for (const auto& m : methods) check_method(m, "--method");
  std::stable_partition(methods.begin(), methods.end(), [](const std::string& m) { return m == "dcp"; });
  const size_t nk = pattern.kinds.size();
  SimOptions so;
  so.calibration = inputs.calibration;

  // Rows: every method with the kinds on one placement, then DCP with every kind alone.
  std::vector<MethodRow> rows(methods.size() + 1);
  for (size_t m = 0; m < methods.size(); ++m) rows[m].method = methods[m];
  rows.back().method = "dcp (each kind alone)";
  for (MethodRow& r : rows) r.kind_s.assign(nk, 0.0);
  for (size_t b = 0; b < batches.size(); ++b) {
    std::vector<Batch> kinds(nk, batches[b]);
    for (size_t k = 0; k < nk; ++k)
      for (Sequence& s : kinds[k].sequences) s.mask = mask_named(pattern.kinds[k], s.length);
    for (size_t m = 0; m <= methods.size(); ++m) {
      const bool alone = m == methods.size();
      const std::string method = alone ? "dcp" : methods[m];
      Progress::show(in.progress, fmt::format("batch {}/{}: {}", b + 1, batches.size(), rows[m].method));
      StepPlanOptions o;
      o.method = method;
      o.blocks = in.blocks;
      o.placement = in.placement;
      o.plan = inputs.plan;
      o.kinds_finer_blocks = inputs.finer_blocks;
      if (inputs.search && method == "dcp") {
        o.search_candidates = true;
        o.search.block_sizes = inputs.search_blocks;
        o.search.eps_compute = inputs.search_eps;
        o.search.reseed_best = inputs.search_reseed;
        o.search.tighten_best = inputs.search_tighten;
        o.search.threads = inputs.search_threads;
        o.search.placement = in.placement;
        o.search.plan = inputs.plan;
        o.search.calibration = so.calibration;
        if (inputs.dcp_only) o.search.static_layouts.clear();
      }
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<Plan> plans;
      if (alone) {
        for (const Batch& kb : kinds) plans.push_back(plan_step(kb, cluster, o));
      } else {
        plans = plan_step_kinds(kinds, cluster, o, pattern.layers);
      }
      MethodRow& r = rows[m];
      r.plan_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      for (size_t k = 0; k < nk; ++k) {
        const SimResult sim = simulate(plans[k], cluster, so);
        const PlacementMetrics metrics = compute_metrics(plans[k].table, plans[k].placement, cluster);
        r.kind_s[k] += sim.total_s();
        r.step_s += pattern.layers[k] * sim.total_s();
        r.inter_bytes += pattern.layers[k] * static_cast<double>(metrics.inter_bytes());
        r.intra_bytes += pattern.layers[k] * static_cast<double>(metrics.intra_bytes());
      }
    }
  }
  Progress::clear(in.progress);
  const double n = static_cast<double>(batches.size());
  const MethodRow* dcp = methods.front() == "dcp" ? &rows.front() : nullptr;
  const auto speedup = [&](const MethodRow& r) { return dcp && dcp->step_s > 0 ? r.step_s / dcp->step_s : 0.0; };

  if (in.json) {
    nlohmann::json out;
    out["batches"] = batches.size();
    out["tokens_per_batch"] = batches.front().total_tokens();
    out["cluster"] = {{"name", cluster.name}, {"nodes", cluster.nodes}, {"devices_per_node", cluster.devices_per_node}};
    out["calibration"] = so.calibration.name;
    out["kinds"] = pattern.kinds;
    out["layers"] = pattern.layers;
    out["methods"] = nlohmann::json::array();
    for (const MethodRow& r : rows) {
      nlohmann::json kind_ms = nlohmann::json::array();
      for (double s : r.kind_s) kind_ms.push_back(s / n * 1e3);
      out["methods"].push_back({{"method", r.method},
                                {"kind_ms", kind_ms},
                                {"step_ms", r.step_s / n * 1e3},
                                {"dcp_speedup", speedup(r)},
                                {"inter_bytes", r.inter_bytes / n},
                                {"intra_bytes", r.intra_bytes / n},
                                {"plan_ms", r.plan_ms / n}});
    }
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::string layout;
  for (size_t k = 0; k < nk; ++k) layout += fmt::format("{}{} x {}", k ? ", " : "", pattern.layers[k], pattern.kinds[k]);
  std::cout << fmt::format("{} batch(es) of ~{} tokens ({}), layers: {}; B={}{}\n", batches.size(),
                           batches.front().total_tokens(), batch_source_label(in.batch),
                           layout, in.blocks.block_size, inputs.search ? " (DCP: searched)" : "");
  std::cout << fmt::format("cluster: {} x {} devices ({}), calibration {}\n\n", cluster.nodes, cluster.devices_per_node,
                           cluster.name, so.calibration.name);
  std::vector<std::string> header{"method"};
  for (const std::string& k : pattern.kinds) header.push_back(k + " ms");
  for (const char* h : {"step ms", "DCP speed-up", "inter bytes", "plan ms"}) header.push_back(h);
  Table t(header);
  for (const MethodRow& r : rows) {
    std::vector<std::string> row{r.method};
    for (double s : r.kind_s) row.push_back(fixed(s / n * 1e3, 2));
    row.push_back(fixed(r.step_s / n * 1e3, 2));
    row.push_back(dcp && &r != dcp ? fmt::format("{:.2f}x", speedup(r)) : "-");
    row.push_back(human_bytes(r.inter_bytes / n));
    row.push_back(fixed(r.plan_ms / n, 1));
    t.add_row(row);
  }
  std::cout << t.render();
  std::cout << "\nkind ms: predicted forward + backward attention time of one layer of that kind (slowest device),\n"
               "mean per batch; step ms: every layer's (each kind's times its layers); inter bytes per step.\n"
               "Every method runs all kinds on one token placement (the layers between attentions see whole\n"
               "tokens); 'each kind alone' places every kind by itself: no model can run it, it is what one\n"
               "placement for every kind costs.\n";
  return 0;
}

}  // namespace dcp::cli
