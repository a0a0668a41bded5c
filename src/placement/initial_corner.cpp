// The corner split of a full causal triangle.
#include "placement/initial_internal.h"

namespace dcp::placement::initial {

void fill_corner(const SubHypergraph& s, const std::vector<int32_t>& verts,
                 const std::vector<size_t>& row_starts, const std::vector<int32_t>& row_of,
                 const std::vector<int>& top, const std::vector<int>& bottom, bool zigzag_head,
                 const PartCaps& caps, Loads& l, std::vector<int32_t>& part, std::vector<int32_t>& head,
                 std::vector<int32_t>& corner, std::vector<double>& col_c) {
  const size_t num_rows = row_starts.size() - 1;
  head.clear(), corner.clear();
  size_t end = num_rows;  // rows [end, num_rows) are placed
  for (size_t j = 0; j < bottom.size() && end > 0; ++j) {
    const int p = bottom[j];
    const size_t stop = end;
    // Homes first, bottom up (a row's run starts with its token block).
    while (end > 0 && fits(s, verts[row_starts[end - 1]], p, l, caps)) put(s, verts[row_starts[--end]], p, l, part);
    // The key block where the part's compute room ends: the rows' tiles right of it fit.
    col_c.assign(num_rows, 0.0);
    for (size_t i = row_starts[end]; i < row_starts[stop]; ++i)
      if (s.group[verts[i]] >= 0) col_c[static_cast<size_t>(row_of[static_cast<size_t>(s.col[verts[i]])])] += s.compute[verts[i]];
    double room = std::max(0.0, caps.compute[p] - l.c[p]);
    size_t cut = num_rows;
    while (cut > 0 && col_c[cut - 1] <= room) room -= col_c[--cut];
    for (size_t r = end; r < stop; ++r)
      for (size_t i = row_starts[r]; i < row_starts[r + 1]; ++i) {
        const int32_t v = verts[i];
        if (s.group[v] < 0) continue;
        if (static_cast<size_t>(row_of[static_cast<size_t>(s.col[v])]) >= cut) put(s, v, p, l, part);
        else corner.push_back(v);
      }
  }
  for (size_t a = 0, b = end; a < b;) {
    head.insert(head.end(), verts.begin() + static_cast<std::ptrdiff_t>(row_starts[a]),
                verts.begin() + static_cast<std::ptrdiff_t>(row_starts[a + 1]));
    if (++a < b && zigzag_head) {
      --b;
      head.insert(head.end(), verts.begin() + static_cast<std::ptrdiff_t>(row_starts[b]),
                  verts.begin() + static_cast<std::ptrdiff_t>(row_starts[b + 1]));
    }
  }
  size_t h = 0, c = 0;
  for (size_t j = 0; j < top.size(); ++j) {
    const int p = top[j];
    const bool last = j + 1 == top.size();
    for (; h < head.size() && (last || fits(s, head[h], p, l, caps)); ++h) put(s, head[h], p, l, part);
    for (; c < corner.size() && (last || fits(s, corner[c], p, l, caps)); ++c) put(s, corner[c], p, l, part);
  }
}

}  // namespace dcp::placement::initial
