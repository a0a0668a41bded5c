// hMETIS .hgr export and partition-file import (format in dcp/partition.h).
#include <cmath>
#include <fstream>
#include <istream>
#include <ostream>
#include <sstream>
#include <string>

#include "dcp/error.h"
#include "dcp/partition.h"

namespace dcp {

namespace {
int64_t scaled(double x, double unit) {
  return std::max<int64_t>(1, static_cast<int64_t>(std::llround(x / unit)));
}
}  // namespace

void write_hgr(const PlacementHypergraph& h, const HgrOptions& opts, std::ostream& out) {
  if (!(opts.flops_unit > 0) || !(opts.bytes_unit > 0))
    raise(ErrorKind::InvalidInput, "write_hgr: flops_unit and bytes_unit must be > 0");
  out << h.num_nets() << ' ' << h.num_vertices() << " 11\n";
  for (int32_t e = 0; e < h.num_nets(); ++e) {
    out << scaled(static_cast<double>(h.net_bytes[e]), opts.bytes_unit);
    for (int64_t i = h.net_begin[e]; i < h.net_begin[e + 1]; ++i) out << ' ' << h.pins[i] + 1;
    out << '\n';
  }
  for (int32_t v = 0; v < h.num_vertices(); ++v) {
    const double w = opts.vertex_weight == HgrWeight::Compute
                         ? h.compute_flops[v] / opts.flops_unit
                         : static_cast<double>(h.memory_bytes[v]) / opts.bytes_unit;
    // Zero-weight vertices are legal in hMETIS but not in every reader; 1 keeps them visible.
    out << (w > 0 ? scaled(w, 1.0) : 1) << '\n';
  }
}

void write_vertex_weights(const PlacementHypergraph& h, std::ostream& out) {
  for (int32_t v = 0; v < h.num_vertices(); ++v)
    out << std::llround(h.compute_flops[v]) << ' ' << h.memory_bytes[v] << '\n';
}

void write_fixed_homes(const PlacementHypergraph& h, const std::vector<int32_t>& parts,
                       std::ostream& out) {
  if (static_cast<int32_t>(parts.size()) != h.num_vertices())
    raise(ErrorKind::InvalidInput, "write_fixed_homes: " + std::to_string(parts.size()) +
                                       " part ids for " + std::to_string(h.num_vertices()) +
                                       " vertices");
  for (int32_t v = 0; v < h.num_vertices(); ++v) out << (v < h.num_tiles ? -1 : parts[v]) << '\n';
}

void write_partition(const std::vector<int32_t>& parts, std::ostream& out) {
  for (int32_t p : parts) out << p << '\n';
}

std::vector<int32_t> read_partition(std::istream& in, const std::string& source,
                                    int32_t num_vertices, int num_devices) {
  std::vector<int32_t> parts;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    const auto first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos) continue;
    std::istringstream ls(line);
    long long id = 0;
    std::string rest;
    if (!(ls >> id) || (ls >> rest))
      raise(ErrorKind::InvalidInput, source + ":" + std::to_string(line_no) +
                                         ": expected one integer part id, got '" + line + "'");
    if (id < 0 || id >= num_devices)
      raise(ErrorKind::InvalidInput, source + ":" + std::to_string(line_no) + ": part id " +
                                         std::to_string(id) + " outside [0, " +
                                         std::to_string(num_devices) + ")");
    if (static_cast<int64_t>(parts.size()) >= num_vertices)
      raise(ErrorKind::InvalidInput, source + ":" + std::to_string(line_no) +
                                         ": more part ids than the " +
                                         std::to_string(num_vertices) + " vertices");
    parts.push_back(static_cast<int32_t>(id));
  }
  if (static_cast<int64_t>(parts.size()) != num_vertices)
    raise(ErrorKind::InvalidInput, source + ":" + std::to_string(line_no) + ": " +
                                       std::to_string(parts.size()) + " part ids, expected " +
                                       std::to_string(num_vertices) + " (one per vertex)");
  return parts;
}

Placement import_partition(const BlockTable& table, const std::string& path, int num_devices) {
  if (num_devices < 1)
    raise(ErrorKind::InvalidInput, "import_partition: num_devices must be >= 1");
  std::ifstream in(path);
  if (!in) raise(ErrorKind::InvalidInput, path + ": cannot open partition file");
  const PlacementHypergraph h = build_placement_hypergraph(table);
  const std::vector<int32_t> parts = read_partition(in, path, h.num_vertices(), num_devices);
  return parts_to_placement(h, parts, num_devices, "imported");
}

}  // namespace dcp
