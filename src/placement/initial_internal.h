// placement/initial_internal.h — the pieces of the structured initial placement (initial.cpp):
// part loads, and the cuts of one sequence over a list of parts, one file per kind of cut
// (initial_bands.cpp, initial_prefix.cpp, initial_corner.cpp). Not part of the public interface.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "placement/kway.h"

namespace dcp::placement::initial {

struct Loads {
  std::vector<double> c, m;
};

inline bool fits(const SubHypergraph& s, int32_t v, int p, const Loads& l, const PartCaps& caps) {
  return (s.compute[v] <= 0 || l.c[p] + s.compute[v] <= caps.compute[p]) &&
         (s.memory[v] <= 0 || l.m[p] + s.memory[v] <= caps.memory[p]);
}

inline void put(const SubHypergraph& s, int32_t v, int p, Loads& l, std::vector<int32_t>& part) {
  l.c[p] += s.compute[v];
  l.m[p] += s.memory[v];
  part[v] = p;
}

// Room of part p as the fraction of (c, m) it can still take; resources the item does not use
// do not limit it.
inline double room_fraction(int p, double c, double m, const Loads& l, const PartCaps& caps) {
  double f = 1e300;
  if (c > 0) f = std::min(f, std::max(0.0, caps.compute[p] - l.c[p]) / c);
  if (m > 0) f = std::min(f, std::max(0.0, caps.memory[p] - l.m[p]) / m);
  return f;
}

// Share of the items still to come (totals c_r, m_r) that part p could still take if they were
// fluid: the capacity the rest of the batch needs, which a placement should spend last.
inline double rest_capacity(double room_c, double room_m, double c_r, double m_r) {
  double y = 1e300;
  if (c_r > 0) y = std::min(y, std::max(0.0, room_c) / c_r);
  if (m_r > 0) y = std::min(y, std::max(0.0, room_m) / m_r);
  return y;
}

struct Scratch {
  std::vector<int32_t> net_stamp;   // per net: last sequence that listed it
  std::vector<int32_t> part_stamp;  // per part: last net counted
  int32_t net_counter = 0;
};

// Objective of `nets` under `part` (nets never span sequences, so this is the sequence's
// whole contribution).
double nets_cost(const SubHypergraph& s, const std::vector<int32_t>& nets,
                 const std::vector<int32_t>& part, Scratch& sc);

// Fills `parts` in order with `verts` in order: a vertex goes to the current part while it
// fits, else the cut moves on to the next part; the last part takes what remains.
void fill(const SubHypergraph& s, const std::vector<int32_t>& verts, const std::vector<int>& parts,
          const PartCaps& caps, Loads& l, std::vector<int32_t>& part);

// Band ends (one past each part's last row) of the cheapest row bands: the cut points, one band
// per part in order (a band may be empty), that fit every part's room and minimise the summed
// cut cost, by dynamic programming over (part, end row). The summed cut cost is the exact cost of
// the bands when every net's readers form a run of rows (causal, answer and question KV), so
// this sees what the greedy cut cannot: on a shared-question sequence an early cheap cut in one
// answer pushes the next bands off the answer boundaries, and the answers then span three parts
// each instead of two (a 64-block sequence over 8 nodes: 13 answer key blocks crossing per
// answer instead of 7).
// Returns false when no cut points fit.
bool cheapest_band_ends(const std::vector<double>& rc, const std::vector<double>& rm,
                        const std::vector<double>& cut_cost, const std::vector<int>& parts,
                        const PartCaps& caps, const Loads& l, std::vector<size_t>& ends);

// Row bands with chosen cut points: part j (in order) ends its band at the row, among those it
// can hold and that leave the later parts room for the rest, where the fewest net bytes cross
// the cut (key blocks above it still read below it); ties go to the later row. On a
// shared-question sequence those cuts are the answer boundaries, where only the question's KV
// crosses; on a causal one the choice leans to earlier cuts. With `cheapest`, the cut points
// are chosen together instead (cheapest_band_ends) where they fit. Rows are the runs of `verts`
// given by `row_starts`; cut_cost[r] is the cost of cutting after row r.
void fill_bands(const SubHypergraph& s, const std::vector<int32_t>& verts,
                const std::vector<size_t>& row_starts, const std::vector<double>& cut_cost,
                const std::vector<int>& parts, const PartCaps& caps, bool cheapest, Loads& l,
                std::vector<int32_t>& part);

// Bands shared by several parts ("split the bottom bands by key block"): tiles in row-major order
// are cut top to bottom into runs, run u filling the compute room of sizes[u] consecutive parts
// of `parts`; a run of several parts is ordered by key block and cut among them, so they share
// its query rows (each extra part pays the Q side of a row once) but read each key block once.
// Why: a compute-balanced row band near the bottom of a causal triangle has few rows and reads
// almost every key block; two such bands merged and cut by column read about half as many
// remote key blocks for a few extra rows' Q side (measured: about 14 % fewer bytes for one
// causal sequence over 8 nodes). Homes are placed afterwards.
void fill_shared_bands(const SubHypergraph& s, const std::vector<int32_t>& tiles,
                       const std::vector<int>& sizes, const std::vector<int>& parts,
                       const PartCaps& caps, Loads& l, std::vector<int32_t>& part,
                       std::vector<int32_t>& run);

// Shared prefix spread ("question rows fill the gaps"): the rows after the prefix are cut into
// row bands that take a compute share of each part (answer bands), then every prefix row (home
// and tiles together) goes to the part with the most room left, heaviest row first. Why: on a
// shared-question sequence every part computing answer rows reads the whole question's KV
// anyway, so a question row costs nothing extra wherever it lands, while question rows are light
// in compute and full in memory: plain row bands put them all on the first parts, whose memory
// then fills long before their compute (at 65536 tokens on 8 nodes: 8 blocks per node), and the answer rows pushed
// on pay their Q side remote. Spreading the prefix gives every part the mix of light and heavy
// rows that meets both caps with homes next to their tiles. With `cheapest` the answer bands are
// cut together against the full caps (cheapest_band_ends): the compute share leaves too little
// slack for rows of 1-2 % of the batch each to be cut at all, and what the bands leave is room
// the light prefix rows fill well.
void fill_prefix_spread(const SubHypergraph& s, const std::vector<int32_t>& verts,
                        const std::vector<size_t>& row_starts, const std::vector<double>& cut_cost,
                        size_t prefix_rows, const std::vector<int>& parts, const PartCaps& caps,
                        bool cheapest, Loads& l, std::vector<int32_t>& part, std::vector<int32_t>& rest,
                        std::vector<size_t>& rest_starts, std::vector<double>& rest_cut);

// Corner split ("the top rows' nodes take the bottom-left corner"). Parts `bottom`, in order,
// take the last rows, bottom up, as many as their memory holds (homes inline), and of those rows
// the tiles right of the key block where their compute room ends (the same key block for all
// rows of a part); the tiles left of it form the corner. Parts `top` take the remaining top
// rows whole in zigzag order (a light and a heavy row each, homes inline) as far as memory
// allows, then the corner's tiles row by row while their compute allows; the last top part
// takes what is left (callers repair). Why: when a causal sequence spans many nodes, memory
// fixes each node's home share (one sequence of 64 blocks over 8 nodes: exactly 8 per node), so row
// bands must home the heavy bottom rows away from the big top band, and the node-level zigzag
// (a2a_p2p's layout) has every node read nearly all key blocks up to its last row. Here the
// bottom bands do not read the first key blocks, and the top nodes read mostly key blocks their
// own rows need anyway, for one Q side per corner row they take. Measured (bench/causal_layouts,
// one causal sequence of 32 or 64 blocks over 8 nodes x 2): place_dcp with this start pays 0.89
// of a2a_p2p's inter-node bytes (1.00 before), the best row bands 0.99-1.08; annealing finds
// layouts of this shape at 0.81.
void fill_corner(const SubHypergraph& s, const std::vector<int32_t>& verts,
                 const std::vector<size_t>& row_starts, const std::vector<int32_t>& row_of,
                 const std::vector<int>& top, const std::vector<int>& bottom, bool zigzag_head,
                 const PartCaps& caps, Loads& l, std::vector<int32_t>& part, std::vector<int32_t>& head,
                 std::vector<int32_t>& corner, std::vector<double>& col_c);

// Tiles (not token blocks) among `verts`.
size_t count_tiles(const SubHypergraph& s, const std::vector<int32_t>& verts);

// Homes after their tiles: each token block goes where most of its nets' bytes already are,
// among the parts with memory room (the most room on ties), else to the part with most room.
void place_homes(const SubHypergraph& s, const std::vector<int32_t>& homes,
                 const std::vector<int>& parts, const PartCaps& caps, Loads& l,
                 std::vector<int32_t>& part, std::vector<double>& score);

}  // namespace dcp::placement::initial
