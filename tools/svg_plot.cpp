#include "svg_plot.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>

#include <fmt/format.h>

#include "dcp/error.h"

namespace dcp::cli {
namespace {

constexpr double kWidth = 640, kHeight = 360;                       // one chart
constexpr double kLeft = 80, kRight = 170, kTop = 40, kBottom = 56;  // margins (legend on the right)
const char* const kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// A "nice" step (1, 2 or 5 x 10^k) giving about `target` ticks over [lo, hi].
double nice_step(double lo, double hi, int target) {
  const double raw = (hi - lo) / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw) return m * mag;
  return 10 * mag;
}

std::string tick_label(double v) {
  if (v == 0) return "0";
  const double a = std::abs(v);
  if (a >= 1e4 || a < 1e-2) return fmt::format("{:.1e}", v);
  if (a == std::floor(a)) return fmt::format("{:.0f}", v);
  return fmt::format("{:.3g}", v);
}

void render_chart(const Chart& c, double y0, std::string& svg) {
  double xmin = std::numeric_limits<double>::infinity(), xmax = -xmin, ymin = 0, ymax = -xmin;
  std::vector<double> xs;
  auto fx = [&](double x) { return c.log2_x ? std::log2(x) : x; };
  for (const Series& s : c.series)
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i]) || (c.log2_x && s.x[i] <= 0)) continue;
      xmin = std::min(xmin, fx(s.x[i]));
      xmax = std::max(xmax, fx(s.x[i]));
      ymin = std::min(ymin, s.y[i]);
      ymax = std::max(ymax, s.y[i]);
      xs.push_back(s.x[i]);
    }
  if (xs.empty()) {  // nothing to draw: an empty frame still says what was asked
    xmin = 0, xmax = 1, ymax = 1;
  }
  if (xmax == xmin) xmin -= 1, xmax += 1;
  if (ymax <= ymin) ymax = ymin + 1;
  const double ystep = nice_step(ymin, ymax, 5);
  ymax = std::ceil(ymax / ystep) * ystep;
  ymin = std::floor(ymin / ystep) * ystep;
  const double pw = kWidth - kLeft - kRight, ph = kHeight - kTop - kBottom;
  auto px = [&](double x) { return kLeft + (fx(x) - xmin) / (xmax - xmin) * pw; };
  auto py = [&](double y) { return y0 + kTop + (1 - (y - ymin) / (ymax - ymin)) * ph; };

  svg += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"15\" text-anchor=\"middle\" font-weight=\"bold\">{}</text>\n",
                     kLeft + pw / 2, y0 + 24, escape(c.title));
  svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333\"/>\n", kLeft,
                     y0 + kTop, pw, ph);
  for (double v = ymin; v <= ymax + ystep * 1e-9; v += ystep) {
    const double y = py(v);
    svg += fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>\n", kLeft, y, kLeft + pw, y);
    svg += fmt::format("<text x=\"{}\" y=\"{:.1f}\" font-size=\"11\" text-anchor=\"end\">{}</text>\n", kLeft - 6, y + 4,
                       tick_label(v));
  }
  // x ticks: the data's own x values when few (block sizes, windows), else a nice step.
  std::sort(xs.begin(), xs.end());
  xs.erase(std::unique(xs.begin(), xs.end()), xs.end());
  std::vector<double> xticks = xs;
  if (xs.size() > 10 || xs.empty()) {
    xticks.clear();
    const double step = nice_step(xmin, xmax, 6);
    for (double v = std::ceil(xmin / step) * step; v <= xmax + step * 1e-9; v += step) xticks.push_back(v);
  }
  for (double v : xticks) {
    const double x = px(v);
    svg += fmt::format("<line x1=\"{:.1f}\" y1=\"{}\" x2=\"{:.1f}\" y2=\"{}\" stroke=\"#333\"/>\n", x, y0 + kTop + ph, x,
                       y0 + kTop + ph + 5);
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\" font-size=\"11\" text-anchor=\"middle\">{}</text>\n", x,
                       y0 + kTop + ph + 18, tick_label(v));
  }
  svg += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"12\" text-anchor=\"middle\">{}</text>\n", kLeft + pw / 2,
                     y0 + kHeight - 12, escape(c.x_label));
  svg += fmt::format(
      "<text x=\"{}\" y=\"{}\" font-size=\"12\" text-anchor=\"middle\" transform=\"rotate(-90 {} {})\">{}</text>\n", 18,
      y0 + kTop + ph / 2, 18, y0 + kTop + ph / 2, escape(c.y_label));

  for (size_t si = 0; si < c.series.size(); ++si) {
    const Series& s = c.series[si];
    const char* color = kColors[si % std::size(kColors)];
    std::string points;
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i]) || (c.log2_x && s.x[i] <= 0)) continue;
      points += fmt::format("{:.1f},{:.1f} ", px(s.x[i]), py(s.y[i]));
      svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>\n", px(s.x[i]), py(s.y[i]), color);
    }
    svg += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"/>\n", points, color);
    const double ly = y0 + kTop + 12 + 18 * static_cast<double>(si);
    svg += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"2\"/>\n", kLeft + pw + 14,
                       ly, kLeft + pw + 36, ly, color);
    svg += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"12\">{}</text>\n", kLeft + pw + 42, ly + 4, escape(s.name));
  }
}

}  // namespace

std::string charts_to_svg(const std::vector<Chart>& charts) {
  const double height = kHeight * static_cast<double>(std::max<size_t>(charts.size(), 1));
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
      "font-family=\"sans-serif\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      kWidth, height, kWidth, height);
  for (size_t i = 0; i < charts.size(); ++i) render_chart(charts[i], kHeight * static_cast<double>(i), svg);
  svg += "</svg>\n";
  return svg;
}

void write_charts_svg(const std::vector<Chart>& charts, const std::string& path) {
  std::ofstream out(path);
  if (!out) raise(ErrorKind::InvalidInput, "--svg: cannot write " + path);
  out << charts_to_svg(charts);
  if (!out) raise(ErrorKind::InvalidInput, "--svg: cannot write " + path);
}

}  // namespace dcp::cli
