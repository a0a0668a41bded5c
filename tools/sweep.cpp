#include "sweep.h"

#include <chrono>
#include <cmath>
#include <iostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "dcp/error.h"
#include "dcp/metrics.h"
#include "svg_plot.h"
#include "table.h"

namespace dcp::cli {
namespace {

const std::vector<std::string> kMaskKinds{"causal", "lambda", "causal_blockwise", "shared_question"};

struct Point {
  double inter_bytes = 0;  // mean per batch
  double plan_ms = 0;      // block table + placement, mean per batch
  double compute_imbalance = 0;
};

Point measure(const std::string& method, const std::vector<Batch>& batches, const BlockOptions& blocks,
              const Cluster& cluster, const PlacementOptions& popts) {
  Point p;
  for (const Batch& b : batches) {
    blocks.validate(b.shape);
    const PlacedMethod placed = place_method(method, b, blocks, cluster, popts);
    const PlacementMetrics m = compute_metrics(placed.placed.table, placed.placed.placement, cluster);
    p.inter_bytes += static_cast<double>(m.inter_bytes());
    p.plan_ms += placed.placement_ms;
    p.compute_imbalance = std::max(p.compute_imbalance, m.compute_imbalance);
  }
  const auto n = static_cast<double>(batches.size());
  p.inter_bytes /= n;
  p.plan_ms /= n;
  return p;
}

std::vector<Batch> batches_with_mask(const SweepInputs& in, const std::string& mask) {
  BatchSource src = in.batch;
  src.mask = mask;
  return resolve_batches(src, in.batches);
}

// The swept values (x) and, per series, one Point per x.
struct Study {
  std::string title, x_name;
  std::vector<double> xs;
  std::vector<std::string> series;
  std::vector<std::vector<Point>> points;  // [series][x]
  std::vector<std::string> x_notes;        // optional text per x (mask sparsity)
};

Study sweep_block(const SweepInputs& in, const Cluster& cluster) {
  Study s{"DCP inter-node volume vs block size", "block size", {512, 1024, 2048, 4096}, kMaskKinds, {}, {}};
  for (const auto& mask : s.series) {
    const std::vector<Batch> batches = batches_with_mask(in, mask);
    s.points.emplace_back();
    for (double b : s.xs) {
      Progress::show(in.progress, fmt::format("block sweep: {} B={}", mask, b));
      BlockOptions blocks = in.blocks;
      blocks.block_size = static_cast<int64_t>(b);
      s.points.back().push_back(measure("dcp", batches, blocks, cluster, in.placement));
    }
  }
  return s;
}

Study sweep_mask(const SweepInputs& in, const Cluster& cluster) {
  Study s{"inter-node volume vs lambda window (sink 64)", "window", {512, 1024, 2048, 4096, 8192, 16384},
          all_methods(), {}, {}};
  const std::vector<Batch> base = batches_with_mask(in, "causal");
  std::vector<std::vector<Batch>> per_x;
  for (double w : s.xs) {
    std::vector<Batch> batches = base;
    double area = 0, causal = 0;
    for (Batch& b : batches) {
      causal += static_cast<double>(b.mask_area());
      for (Sequence& q : b.sequences) q.mask = Mask::lambda(64, static_cast<int64_t>(w));
      b.validate();
      area += static_cast<double>(b.mask_area());
    }
    s.x_notes.push_back(fmt::format("{:.0f}% of causal", 100 * area / causal));
    per_x.push_back(std::move(batches));
  }
  for (const auto& method : s.series) {
    s.points.emplace_back();
    for (size_t i = 0; i < s.xs.size(); ++i) {
      Progress::show(in.progress, fmt::format("mask sweep: {} window {}", method, s.xs[i]));
      s.points.back().push_back(measure(method, per_x[i], in.blocks, cluster, in.placement));
    }
  }
  return s;
}

Study sweep_eps(const SweepInputs& in, const Cluster& cluster) {
  Study s{"DCP inter-node volume vs imbalance tolerance", "eps", {0.02, 0.05, 0.1, 0.2, 0.4, 0.8}, kMaskKinds, {}, {}};
  for (const auto& mask : s.series) {
    const std::vector<Batch> batches = batches_with_mask(in, mask);
    s.points.emplace_back();
    for (double eps : s.xs) {
      Progress::show(in.progress, fmt::format("eps sweep: {} eps={}", mask, eps));
      PlacementOptions popts = in.placement;
      popts.eps_compute = eps;
      popts.eps_memory = 2 * eps;
      s.points.back().push_back(measure("dcp", batches, in.blocks, cluster, popts));
    }
  }
  return s;
}

std::string x_text(const Study& s, size_t i) {
  std::string t = fmt::format("{}", s.xs[i]);
  if (!s.x_notes.empty()) t += " (" + s.x_notes[i] + ")";
  return t;
}

void print_table(const Study& s, const std::string& what, double (*value)(const Point&), int digits) {
  std::vector<std::string> header{s.x_name};
  header.insert(header.end(), s.series.begin(), s.series.end());
  Table t(header);
  for (size_t i = 0; i < s.xs.size(); ++i) {
    std::vector<std::string> row{x_text(s, i)};
    for (const auto& series : s.points) row.push_back(fixed(value(series[i]), digits));
    t.add_row(row);
  }
  std::cout << what << "\n" << t.render() << "\n";
}

Chart chart_of(const Study& s, const std::string& title, const std::string& y_label, double (*value)(const Point&)) {
  Chart c{title, s.x_name, y_label, s.x_name != "eps", {}};
  for (size_t k = 0; k < s.series.size(); ++k) {
    Series line{s.series[k], s.xs, {}};
    for (const Point& p : s.points[k]) line.y.push_back(value(p));
    c.series.push_back(std::move(line));
  }
  return c;
}

double inter_gb(const Point& p) { return p.inter_bytes / 1e9; }
double plan_ms(const Point& p) { return p.plan_ms; }
double imbalance(const Point& p) { return p.compute_imbalance; }

}  // namespace

int run_sweep(const SweepInputs& in) {
  const Cluster cluster = resolve_cluster(in.cluster);
  in.placement.validate();
  Study s;
  if (in.sweep == "block") s = sweep_block(in, cluster);
  else if (in.sweep == "mask") s = sweep_mask(in, cluster);
  else if (in.sweep == "eps") s = sweep_eps(in, cluster);
  else raise(ErrorKind::InvalidInput, "--sweep: unknown study '" + in.sweep + "' (expected block, mask or eps)");
  Progress::clear(in.progress);

  if (in.json) {
    nlohmann::json out{{"sweep", in.sweep},
                       {"title", s.title},
                       {"x_name", s.x_name},
                       {"x", s.xs},
                       {"batches", in.batches},
                       {"cluster", {{"name", cluster.name}, {"nodes", cluster.nodes}, {"devices", cluster.num_devices()}}},
                       {"series", nlohmann::json::array()}};
    for (size_t k = 0; k < s.series.size(); ++k) {
      nlohmann::json pts = nlohmann::json::array();
      for (const Point& p : s.points[k])
        pts.push_back({{"inter_bytes", p.inter_bytes}, {"plan_ms", p.plan_ms}, {"compute_imbalance", p.compute_imbalance}});
      out["series"].push_back({{"name", s.series[k]}, {"points", pts}});
    }
    if (!s.x_notes.empty()) out["x_notes"] = s.x_notes;
    std::cout << out.dump(2) << "\n";
  } else {
    std::cout << fmt::format("{} ({} batch(es) of ~{} tokens, {}, {} x {} devices of {})\n\n", s.title,
                             in.batches, in.batch.tokens, batch_source_label(in.batch), cluster.nodes, cluster.devices_per_node,
                             cluster.name);
    print_table(s, "inter-node bytes per batch (GB):", inter_gb, 3);
    if (in.sweep == "block") print_table(s, "planning time per batch (ms: block table + placement):", plan_ms, 1);
    if (in.sweep == "eps") print_table(s, "achieved compute imbalance (max/mean, worst batch):", imbalance, 3);
  }

  if (!in.svg.empty()) {
    std::vector<Chart> charts{chart_of(s, s.title, "inter-node GB per batch", inter_gb)};
    if (in.sweep == "block") charts.push_back(chart_of(s, "DCP planning time vs block size", "ms per batch", plan_ms));
    if (in.sweep == "eps") charts.push_back(chart_of(s, "achieved compute imbalance", "max / mean", imbalance));
    write_charts_svg(charts, in.svg);
    if (!in.json) std::cout << "charts: " << in.svg << "\n";
  }
  return 0;
}

}  // namespace dcp::cli
