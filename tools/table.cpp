#include "table.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace dcp::cli {

std::string Table::render() const {
  std::vector<size_t> width(header_.size(), 0);
  auto widen = [&](const std::vector<std::string>& row) {
    for (size_t c = 0; c < row.size() && c < width.size(); ++c) width[c] = std::max(width[c], row[c].size());
  };
  widen(header_);
  for (const auto& r : rows_) widen(r);
  auto line = [&](const std::vector<std::string>& row) {
    std::string out;
    for (size_t c = 0; c < width.size(); ++c) {
      const std::string cell = c < row.size() ? row[c] : "";
      if (c > 0) out += "  ";
      out += c == 0 ? fmt::format("{:<{}}", cell, width[c]) : fmt::format("{:>{}}", cell, width[c]);
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    return out + "\n";
  };
  std::string out = line(header_);
  size_t total = 0;
  for (size_t w : width) total += w;
  total += 2 * (width.empty() ? 0 : width.size() - 1);
  out += std::string(total, '-') + "\n";
  for (const auto& r : rows_) out += line(r);
  return out;
}

static std::string scaled(double v, const char* const* units, int n, double base) {
  int u = 0;
  while (std::fabs(v) >= base && u + 1 < n) {
    v /= base;
    ++u;
  }
  return fmt::format("{:.2f} {}", v, units[u]);
}

std::string human_bytes(double bytes) {
  static const char* const kUnits[] = {"B", "KB", "MB", "GB", "TB", "PB"};
  return scaled(bytes, kUnits, 6, 1000.0);
}

std::string human_flops(double flops) {
  static const char* const kUnits[] = {"FLOP", "KFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP", "EFLOP"};
  return scaled(flops, kUnits, 7, 1000.0);
}

std::string fixed(double v, int digits) { return fmt::format("{:.{}f}", v, digits); }

}  // namespace dcp::cli
