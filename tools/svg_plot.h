// tools/svg_plot.h — a tiny self-contained SVG line-chart writer for the sweep studies of
// `dcp simulate --sweep`: axes, ticks, axis labels, a legend, one polyline (with markers) per
// series. No scripts, no external fonts or styles.
#pragma once

#include <string>
#include <vector>

namespace dcp::cli {

struct Series {
  std::string name;
  std::vector<double> x;
  std::vector<double> y;  // same size as x; non-finite points are skipped
};

struct Chart {
  std::string title;
  std::string x_label;
  std::string y_label;
  bool log2_x = false;  // x ticks at the data's x values, spaced by log2 (block sizes)
  std::vector<Series> series;
};

// Charts stacked vertically in one SVG document.
std::string charts_to_svg(const std::vector<Chart>& charts);
// Writes charts_to_svg to `path`; throws InvalidInput naming the path if it cannot be written.
void write_charts_svg(const std::vector<Chart>& charts, const std::string& path);

}  // namespace dcp::cli
