// tools/table.h — aligned text tables for people (the --json flags print the same facts for
// programs).
#pragma once

#include <string>
#include <vector>

namespace dcp::cli {

class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  void add_row(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  // First column left-aligned, the others right-aligned (they hold numbers).
  std::string render() const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

std::string human_bytes(double bytes);   // "1.50 GB" (decimal units, like bandwidths)
std::string human_flops(double flops);   // "3.20 TFLOP"
std::string fixed(double v, int digits);

}  // namespace dcp::cli
