// The shared-prefix spread: answer bands, then the prefix rows where there is room.
#include "placement/initial_internal.h"

namespace dcp::placement::initial {

void fill_prefix_spread(const SubHypergraph& s, const std::vector<int32_t>& verts,
                        const std::vector<size_t>& row_starts, const std::vector<double>& cut_cost,
                        size_t prefix_rows, const std::vector<int>& parts, const PartCaps& caps,
                        bool cheapest, Loads& l, std::vector<int32_t>& part, std::vector<int32_t>& rest,
                        std::vector<size_t>& rest_starts, std::vector<double>& rest_cut) {
  const size_t num_rows = row_starts.size() - 1;
  const size_t split = row_starts[prefix_rows];
  double pre_c = 0, rest_c = 0, room = 0;
  for (size_t i = 0; i < verts.size(); ++i) (i < split ? pre_c : rest_c) += s.compute[verts[i]];
  for (int p : parts) room += std::max(0.0, caps.compute[p] - l.c[p]);
  // The bands get their compute share plus half the slack; the prefix fills the rest.
  const double share =
      room > 0 ? std::min(1.0, (rest_c + 0.5 * std::max(0.0, room - rest_c - pre_c)) / room) : 1.0;
  PartCaps band = caps;
  for (int p : parts) band.compute[p] = l.c[p] + std::max(0.0, caps.compute[p] - l.c[p]) * share;
  rest.assign(verts.begin() + static_cast<std::ptrdiff_t>(split), verts.end());
  rest_starts.clear();
  rest_cut.clear();
  for (size_t r = prefix_rows; r <= num_rows; ++r) rest_starts.push_back(row_starts[r] - split);
  for (size_t r = prefix_rows; r < num_rows; ++r) rest_cut.push_back(cut_cost[r]);
  fill_bands(s, rest, rest_starts, rest_cut, parts, cheapest ? caps : band, cheapest, l, part);
  for (size_t r = prefix_rows; r-- > 0;) {
    double c = 0, m = 0;
    for (size_t i = row_starts[r]; i < row_starts[r + 1]; ++i) {
      c += s.compute[verts[i]];
      m += s.memory[verts[i]];
    }
    int best = -1;
    bool best_fits = false;
    double best_room = 0;
    for (int p : parts) {
      const bool ok = (c <= 0 || l.c[p] + c <= caps.compute[p]) && (m <= 0 || l.m[p] + m <= caps.memory[p]);
      const double f = room_fraction(p, c, m, l, caps);
      if (best < 0 || (ok && !best_fits) || (ok == best_fits && f > best_room)) {
        best = p;
        best_fits = ok;
        best_room = f;
      }
    }
    for (size_t i = row_starts[r]; i < row_starts[r + 1]; ++i) put(s, verts[i], best, l, part);
  }
}

}  // namespace dcp::placement::initial
