// Structured initial placement of one level: pack whole sequences, split only those that fit
// nowhere, and split them the cheapest of a few geometric ways (measured exactly).
//
// Why these cuts: a tile reads one Q-side and one KV-side data group, and the Q side carries
// about three times the bytes of the KV side (Q, O, dO, dQ, LSE, Delta against KV, dKV). So a
// split along query rows (tiles stay with their queries' home; only KV travels) is the cheap
// cut across nodes, and a causal band [a, b) pays for the a key blocks above it: the top band
// (light rows) goes to the part with the least room, which keeps every band start low. Inside
// a node, a piece that reads data homed on another node should not be cut into row bands (each
// device would fetch the same remote KV again); cutting it by head group instead costs only
// intra-node Q traffic, since head groups share no KV set. The candidates are costed on the
// sequence's own nets (nets never cross sequences), so trying several is cheap and exact.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>

#include "placement/initial_internal.h"

namespace dcp::placement {

using namespace initial;

namespace {

// The vertices by (sequence, query row, head group, key block, id), a total order: a token block
// (head group -1) before its row's tiles. The keys are small integers (block, group and sequence
// ids), so four stable counting passes, least significant key first, starting from the ids in
// ascending order, give that order in linear time; keys spread over a range much wider than the
// level fall back to a comparison sort (the same order).
std::vector<int32_t> vertex_order(const SubHypergraph& s) {
  const int32_t n = s.num_vertices();
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  if (n == 0) return order;
  const std::vector<int32_t>* keys[] = {&s.col, &s.group, &s.row, &s.seq};  // least significant first
  bool counting = true;
  int32_t lo[4], hi[4];
  for (int j = 0; j < 4; ++j) {
    const auto [mn, mx] = std::minmax_element(keys[j]->begin(), keys[j]->end());
    lo[j] = *mn;
    hi[j] = *mx;
    counting = counting && static_cast<int64_t>(hi[j]) - lo[j] <= 4 * static_cast<int64_t>(n) + 1024;
  }
  if (counting) {
    std::vector<int32_t> next(static_cast<size_t>(n)), count;
    for (int j = 0; j < 4; ++j) {
      const int32_t* key = keys[j]->data();
      const int32_t base = lo[j];
      count.assign(static_cast<size_t>(hi[j] - base) + 2, 0);
      for (int32_t v = 0; v < n; ++v) ++count[static_cast<size_t>(key[v] - base) + 1];
      for (size_t b = 1; b < count.size(); ++b) count[b] += count[b - 1];
      for (int32_t v : order) next[static_cast<size_t>(count[static_cast<size_t>(key[v] - base)]++)] = v;
      order.swap(next);
    }
    return order;
  }
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    if (s.seq[a] != s.seq[b]) return s.seq[a] < s.seq[b];
    if (s.row[a] != s.row[b]) return s.row[a] < s.row[b];
    if (s.group[a] != s.group[b]) return s.group[a] < s.group[b];
    if (s.col[a] != s.col[b]) return s.col[a] < s.col[b];
    return a < b;
  });
  return order;
}

// structured_initial; with `shared` (strategy Best only) also SharedBands's start into *shared
// and its shared_bands_apply into *shared_apply.
std::vector<int32_t> structured(const SubHypergraph& s, const PartCaps& caps, InitialStrategy requested,
                                bool* shared_bands_apply, std::vector<int32_t>* shared, bool* shared_apply) {
  if (shared_bands_apply != nullptr) *shared_bands_apply = false;
  const int k = caps.k();
  const int32_t n = s.num_vertices();
  std::vector<int32_t> placed(static_cast<size_t>(n), -1);
  if (k <= 1) {
    std::fill(placed.begin(), placed.end(), 0);
    if (shared != nullptr) *shared = placed, *shared_apply = false;
    return placed;
  }
  if (requested == InitialStrategy::GroupSplit) {
    // Head group g's tiles on part g * k / G, homes where their nets already are.
    int32_t num_groups = 0;
    for (int32_t v = 0; v < n; ++v) num_groups = std::max(num_groups, s.group[v] + 1);
    Loads l{std::vector<double>(static_cast<size_t>(k), 0.0), std::vector<double>(static_cast<size_t>(k), 0.0)};
    std::vector<int32_t> homes;
    for (int32_t v = 0; v < n; ++v) {
      if (s.group[v] < 0) homes.push_back(v);
      else put(s, v, static_cast<int>(static_cast<int64_t>(s.group[v]) * k / num_groups), l, placed);
    }
    // Heaviest first, so the coarse blocks that fill a part's memory are placed while it has room.
    std::stable_sort(homes.begin(), homes.end(),
                     [&](int32_t a, int32_t b) { return s.memory[a] > s.memory[b]; });
    std::vector<int> all(static_cast<size_t>(k));
    std::iota(all.begin(), all.end(), 0);
    std::vector<double> score(static_cast<size_t>(k), 0.0);
    place_homes(s, homes, all, caps, l, placed, score);
    return placed;
  }
  // Vertices by (sequence, query row, token block before tiles, head group, key block, id).
  const std::vector<int32_t> order = vertex_order(s);
  struct Seq {
    size_t begin, end;
    double c = 0, m = 0;
  };
  std::vector<Seq> seqs;
  for (size_t i = 0; i < order.size();) {
    Seq q{i, i};
    while (q.end < order.size() && s.seq[order[q.end]] == s.seq[order[i]]) {
      q.c += s.compute[order[q.end]];
      q.m += s.memory[order[q.end]];
      ++q.end;
    }
    seqs.push_back(q);
    i = q.end;
  }
  double total_c = 0, total_m = 0;
  for (const Seq& q : seqs) {
    total_c += q.c;
    total_m += q.m;
  }
  auto size_of = [&](const Seq& q) {
    return std::max(total_c > 0 ? q.c / total_c : 0.0, total_m > 0 ? q.m / total_m : 0.0);
  };
  std::vector<size_t> seq_order(seqs.size());
  std::iota(seq_order.begin(), seq_order.end(), size_t{0});
  std::stable_sort(seq_order.begin(), seq_order.end(),
                   [&](size_t a, size_t b) { return size_of(seqs[a]) > size_of(seqs[b]); });

  Loads loads{std::vector<double>(static_cast<size_t>(k), 0.0), std::vector<double>(static_cast<size_t>(k), 0.0)};
  Scratch sc;
  int32_t cuts = 0;  // sequences cut so far: the stamp of each one's nets in sc.net_stamp
  sc.net_stamp.assign(static_cast<size_t>(s.num_nets()), -1);
  sc.part_stamp.assign(static_cast<size_t>(k), 0);
  std::vector<double> score(static_cast<size_t>(k), 0.0);
  std::vector<int32_t> nets, tiles_row, tiles_group, tiles_zigzag, tiles_plain, homes, run_scratch,
      prefix_rest, corner_head, corner_tiles;
  std::vector<int> corner_top, corner_bottom;
  std::vector<double> corner_cols;
  bool corner_zigzag = true;
  std::vector<int> band_sizes;
  std::vector<size_t> row_starts;
  std::vector<double> cut_cost, rest_cut;
  std::vector<size_t> rest_starts;
  size_t prefix_rows = 0;
  // Token block id -> row index inside the sequence being cut (rows are token blocks).
  std::vector<int32_t> row_index(
      static_cast<size_t>(n == 0 ? 0 : *std::max_element(s.row.begin(), s.row.end()) + 1), -1);
  // Totals of the sequences placed after position i of the order.
  std::vector<double> rest_c(seqs.size() + 1, 0.0), rest_m(seqs.size() + 1, 0.0);
  for (size_t i = seqs.size(); i-- > 1;) {
    rest_c[i - 1] = rest_c[i] + seqs[seq_order[i]].c;
    rest_m[i - 1] = rest_m[i] + seqs[seq_order[i]].m;
  }
  // Best's winner of a sequence, kept by a SharedBands cut before its shared bands are tried
  // (every candidate before them is Best's, in Best's order), and whether a shared band won.
  struct Fork {
    std::vector<int32_t> best_part;
    Loads best_l;
    bool diverged = false;
  };
  // Places the sequence at position `pos` of seq_order on top of loads `l` and `part` (each
  // candidate only reads the sequence's own nets and the loads).
  int64_t wins = 0;  // candidates that became their sequence's best so far
  auto cut_sequence = [&](size_t pos, InitialStrategy strategy, Loads& l, std::vector<int32_t>& part,
                          bool* apply, Fork* fork) {
    const size_t qi = seq_order[pos];
    const Seq& q = seqs[qi];
    const double c_r = rest_c[pos], m_r = rest_m[pos];
    // Whole, where it fits both caps and costs the rest of the batch the least capacity (two
    // resources: a dense sequence belongs where memory, not compute, limits the rest); then the
    // most room left.
    int best = -1;
    double best_loss = 0, best_slack = 0;
    for (int p = 0; p < k; ++p) {
      const double rc = caps.compute[p] - l.c[p], rm = caps.memory[p] - l.m[p];
      if ((q.c > 0 && rc < q.c) || (q.m > 0 && rm < q.m)) continue;
      const double y0 = rest_capacity(rc, rm, c_r, m_r);
      const double loss = y0 >= 1e299 ? 0.0 : y0 - rest_capacity(rc - q.c, rm - q.m, c_r, m_r);
      const double slack = std::min(caps.compute[p] > 0 ? (rc - q.c) / caps.compute[p] : 0.0,
                                    caps.memory[p] > 0 ? (rm - q.m) / caps.memory[p] : 0.0);
      if (best < 0 || loss < best_loss - 1e-12 ||
          (loss <= best_loss + 1e-12 && slack > best_slack)) {
        best = p;
        best_loss = loss;
        best_slack = slack;
      }
    }
    if (best >= 0) {
      for (size_t i = q.begin; i < q.end; ++i) put(s, order[i], best, l, part);
      return;
    }
    // Split over the fewest parts (most room first) that hold the sequence while keeping room
    // for the rest: the rest goes first to the parts left out, and what they cannot take is
    // reserved on the chosen parts in proportion to their capacity for it.
    std::vector<int> by_room(static_cast<size_t>(k));
    std::iota(by_room.begin(), by_room.end(), 0);
    std::vector<double> frac(static_cast<size_t>(k)), y0(static_cast<size_t>(k));
    for (int p = 0; p < k; ++p) {
      frac[p] = room_fraction(p, q.c, q.m, l, caps);
      y0[p] = rest_capacity(caps.compute[p] - l.c[p], caps.memory[p] - l.m[p], c_r, m_r);
    }
    std::stable_sort(by_room.begin(), by_room.end(), [&](int a, int b) { return frac[a] > frac[b]; });
    const bool has_rest = c_r > 0 || m_r > 0;
    PartCaps lim = caps;
    std::vector<int> chosen;
    for (int j = 1; j <= k; ++j) {
      double outside = 0, inside = 0;
      for (int i = 0; i < k; ++i) (i < j ? inside : outside) += has_rest ? y0[by_room[i]] : 0.0;
      const double rest_share = has_rest ? std::max(0.0, 1.0 - outside) : 0.0;
      double room_c = 0, room_m = 0;
      for (int i = 0; i < j; ++i) {
        const int p = by_room[i];
        const double share = inside > 0 ? rest_share * y0[p] / inside : 0.0;
        lim.compute[p] = std::max(l.c[p], caps.compute[p] - share * c_r);
        lim.memory[p] = std::max(l.m[p], caps.memory[p] - share * m_r);
        room_c += lim.compute[p] - l.c[p];
        room_m += lim.memory[p] - l.m[p];
      }
      if ((room_c >= q.c && room_m >= q.m) || j == k) {
        chosen.assign(by_room.begin(), by_room.begin() + j);
        if (j == k && (room_c < q.c || room_m < q.m)) lim = caps;  // the rest must split too
        break;
      }
      lim = caps;
    }
    // Nets of the sequence, for costing the candidates.
    nets.clear();
    const int32_t stamp = cuts++;
    for (size_t i = q.begin; i < q.end; ++i) {
      const int32_t v = order[i];
      for (int64_t j = s.vertex_begin[v]; j < s.vertex_begin[v + 1]; ++j) {
        const int32_t e = s.vertex_nets[j];
        if (sc.net_stamp[e] != stamp) {
          sc.net_stamp[e] = stamp;
          nets.push_back(e);
        }
      }
    }
    // Candidate orders: row-major with homes inline (bands; memory counted as they fill), and
    // group-major tiles with homes placed afterwards.
    tiles_row.assign(order.begin() + static_cast<std::ptrdiff_t>(q.begin),
                     order.begin() + static_cast<std::ptrdiff_t>(q.end));
    tiles_group.clear();
    homes.clear();
    for (int32_t v : tiles_row) (s.group[v] < 0 ? homes : tiles_group).push_back(v);
    std::stable_sort(tiles_group.begin(), tiles_group.end(),
                     [&](int32_t a, int32_t b) { return s.group[a] < s.group[b]; });
    const bool several_groups =
        !tiles_group.empty() && s.group[tiles_group.front()] != s.group[tiles_group.back()];
    // Zigzag rows (first, last, second, second last, ...): each part gets a light and a heavy
    // run of a causal sequence, so compute and memory stay proportional when memory binds.
    row_starts.clear();
    for (size_t i = 0; i < tiles_row.size(); ++i)
      if (i == 0 || s.row[tiles_row[i]] != s.row[tiles_row[i - 1]]) row_starts.push_back(i);
    row_starts.push_back(tiles_row.size());
    tiles_zigzag.clear();
    const size_t num_rows = row_starts.size() - 1;
    for (size_t a = 0, b = num_rows; a < b;) {
      for (size_t i = row_starts[a]; i < row_starts[a + 1]; ++i) tiles_zigzag.push_back(tiles_row[i]);
      ++a;
      if (a < b) {
        --b;
        for (size_t i = row_starts[b]; i < row_starts[b + 1]; ++i) tiles_zigzag.push_back(tiles_row[i]);
      }
    }

    std::vector<int> ascending = chosen;
    std::reverse(ascending.begin(), ascending.end());
    double best_cost = 0, best_over = 0;
    std::vector<int32_t> best_part;
    Loads best_l;
    auto consider = [&](int variant, const std::vector<int>& parts, bool cheapest = false) {
      Loads trial = l;
      if (variant == 0) {
        fill(s, tiles_row, parts, lim, trial, part);
      } else if (variant == 1) {
        fill(s, tiles_group, parts, lim, trial, part);
        place_homes(s, homes, parts, lim, trial, part, score);
      } else if (variant == 2) {
        fill(s, tiles_zigzag, parts, lim, trial, part);
      } else if (variant == 3) {
        fill_bands(s, tiles_row, row_starts, cut_cost, parts, lim, false, trial, part);
      } else if (variant == 5) {
        fill_prefix_spread(s, tiles_row, row_starts, cut_cost, prefix_rows, parts, lim, cheapest, trial, part,
                           prefix_rest, rest_starts, rest_cut);
      } else if (variant == 6) {
        fill_corner(s, tiles_row, row_starts, row_index, corner_top, corner_bottom, corner_zigzag, lim, trial, part,
                    corner_head, corner_tiles, corner_cols);
      } else {
        fill_shared_bands(s, tiles_plain, band_sizes, parts, lim, trial, part, run_scratch);
        place_homes(s, homes, parts, lim, trial, part, score);
      }
      const double cost = nets_cost(s, nets, part, sc);
      // Overflow beyond the limits must be repaired later at a cost not counted here, so a
      // cut that fits wins over a cheaper one that does not.
      double over = 0;
      for (int p : parts) {
        over += std::max(0.0, trial.c[p] - lim.compute[p]) / std::max(1e-300, caps.compute[p]);
        over += std::max(0.0, trial.m[p] - lim.memory[p]) / std::max(1e-300, caps.memory[p]);
      }
      const bool better = best_part.empty() || over < best_over - 1e-3 ||
                          (over <= best_over + 1e-3 && cost < best_cost);
      if (better) {
        ++wins;
        best_cost = cost;
        best_over = over;
        best_part.assign(tiles_row.size(), 0);
        for (size_t i = 0; i < tiles_row.size(); ++i) best_part[i] = part[tiles_row[i]];
        best_l = trial;
      }
      for (int32_t v : tiles_row) part[v] = -1;
    };
    // A strategy other than Best tries only its own cut where it applies (row bands otherwise).
    const bool group_ok = several_groups && (s.sub_parts <= 1 || strategy == InitialStrategy::GroupFirst);
    const bool best_like = strategy == InitialStrategy::Best || strategy == InitialStrategy::SharedBands;
    const bool use_rows = best_like ||
                          (strategy == InitialStrategy::GroupFirst && !group_ok) ||
                          (strategy == InitialStrategy::Zigzag && num_rows <= 2);
    if (use_rows) {
      consider(0, ascending);
      consider(0, chosen);
    }
    if (group_ok && strategy != InitialStrategy::Zigzag) {
      consider(1, ascending);
      consider(1, chosen);
    }
    if (num_rows > 2 && strategy != InitialStrategy::GroupFirst) consider(2, chosen);
    if (num_rows > 2 && chosen.size() > 1 && best_like) {
      // Cost of a cut after each row: nets whose rows span it (a KV block read further down).
      for (size_t r = 0; r < num_rows; ++r)
        row_index[static_cast<size_t>(s.row[tiles_row[row_starts[r]]])] = static_cast<int32_t>(r);
      cut_cost.assign(num_rows, 0.0);
      std::vector<double> diff(num_rows + 1, 0.0);
      for (int32_t e : nets) {
        int32_t lo = -1, hi = -1;
        for (int64_t i = s.net_begin[e]; i < s.net_begin[e + 1]; ++i) {
          const int32_t r = row_index[static_cast<size_t>(s.row[s.pins[i]])];
          lo = lo < 0 ? r : std::min(lo, r);
          hi = std::max(hi, r);
        }
        if (hi > lo) {
          diff[static_cast<size_t>(lo)] += s.net_weight[e];
          diff[static_cast<size_t>(hi)] -= s.net_weight[e];
        }
      }
      double run = 0;
      for (size_t r = 0; r < num_rows; ++r) cut_cost[r] = (run += diff[r]);
      consider(3, ascending);
      consider(3, chosen);
      // Corner splits, at a node level of 2 devices per node (see fill_corner), of a full causal
      // triangle (row r reads key blocks 0..r): parts from the front of `chosen` or of
      // `ascending` take the top rows and the corner, 2 fewer to 2 more than half of them, with
      // the top rows in zigzag or in plain order. On lambda, causal-blockwise and shared-question
      // sequences it was chosen by its initial cost but ended worse after refinement (ldc sparse
      // masks at 65536 tokens on 8 x 2: 0.314 -> 0.325 of the best static layout's inter-node
      // bytes), so it is not tried there.
      const size_t groups_per_row = row_starts[1] - row_starts[0] - 1;  // row 0: home + (0, 0) per group
      const bool full_causal = count_tiles(s, tiles_row) == groups_per_row * num_rows * (num_rows + 1) / 2;
      if (s.sub_parts == 2 && chosen.size() >= 5 && full_causal) {
        const size_t m = chosen.size();
        for (size_t m1 = std::max<size_t>(1, m / 2 - 2); m1 <= std::min(m - 1, m / 2 + 2); ++m1)
          for (const auto* order_parts : {&chosen, &ascending}) {
            corner_top.assign(order_parts->begin(), order_parts->begin() + static_cast<std::ptrdiff_t>(m1));
            corner_bottom.assign(order_parts->begin() + static_cast<std::ptrdiff_t>(m1), order_parts->end());
            for (const bool zz : {true, false}) {
              corner_zigzag = zz;
              consider(6, chosen);
            }
          }
      }
      // A shared prefix: the key blocks that rows read before a gap in their key blocks (a
      // shared question; a sink block of lambda / causal-blockwise, too short to try).
      int32_t prefix_end = std::numeric_limits<int32_t>::max();
      for (size_t r = 0; r < num_rows; ++r) {
        int32_t g = -1, prev = -1;
        for (size_t i = row_starts[r]; i < row_starts[r + 1]; ++i) {
          const int32_t v = tiles_row[i];
          if (s.group[v] < 0) continue;
          if (g < 0) g = s.group[v];
          if (s.group[v] != g) break;
          if (prev >= 0 && s.col[v] != prev + 1) {
            prefix_end = std::min(prefix_end, prev + 1);
            break;
          }
          prev = s.col[v];
        }
      }
      prefix_rows = 0;
      while (prefix_rows < num_rows && s.row[tiles_row[row_starts[prefix_rows]]] < prefix_end) ++prefix_rows;
      if (prefix_rows >= 2 && prefix_rows < num_rows) {
        consider(5, ascending);
        consider(5, chosen);
        // The answer bands cut together (cheapest_band_ends), where each node's two devices
        // split it by head group (ldc shared question at 65536 tokens on 8 x 2: 31.0 -> 25.9 GB
        // inter-node over 80 batches). With 8 devices per node (131072 tokens on 4 x 8) it
        // changed bytes by under 1 % and left one more batch over the full-memory bound, so it
        // is not tried there.
        if (s.sub_parts == 2) consider(5, ascending, true);
      }
    }
    // Bands shared by 2 or 3 parts at the bottom (light single bands on top), every mix of
    // pairs and triples: they pay off from about 5 parts (fewer: plain row bands win). Every
    // other choice above is the same for Best and SharedBands.
    const bool shared_bands = num_rows > 2 && chosen.size() >= static_cast<size_t>(kSharedBandsMinParts);
    if (shared_bands && apply != nullptr) *apply = true;
    if (shared_bands && strategy == InitialStrategy::SharedBands) {
      if (fork != nullptr) {
        fork->best_part = best_part;
        fork->best_l = best_l;
      }
      const int64_t wins_before = wins;
      tiles_plain.clear();
      for (int32_t v : tiles_row)
        if (s.group[v] >= 0) tiles_plain.push_back(v);
      const int m = static_cast<int>(chosen.size());
      for (int triples = 0; 3 * triples <= m; ++triples)
        for (int pairs = 0; 3 * triples + 2 * pairs <= m; ++pairs) {
          if (triples + pairs == 0) continue;
          band_sizes.assign(static_cast<size_t>(m - 3 * triples - 2 * pairs), 1);
          band_sizes.insert(band_sizes.end(), static_cast<size_t>(pairs), 2);
          band_sizes.insert(band_sizes.end(), static_cast<size_t>(triples), 3);
          consider(4, ascending);
        }
      if (fork != nullptr) fork->diverged = wins != wins_before;
    }
    for (size_t i = 0; i < tiles_row.size(); ++i) part[tiles_row[i]] = best_part[i];
    l = best_l;
  };
  if (shared == nullptr) {
    for (size_t pos = 0; pos < seq_order.size(); ++pos)
      cut_sequence(pos, requested, loads, placed, shared_bands_apply, nullptr);
    return placed;
  }
  // Best and SharedBands at once: SharedBands tries every cut Best does, in the same order, and
  // then its shared bands, so while no shared band wins a sequence both place it alike and one
  // SharedBands run, keeping Best's winner aside, makes both. From the first sequence a shared
  // band wins, each strategy goes on alone from its own placement and loads.
  Fork fork;
  bool common_apply = false;
  size_t pos = 0;
  while (pos < seq_order.size() && !fork.diverged)
    cut_sequence(pos++, InitialStrategy::SharedBands, loads, placed, &common_apply, &fork);
  bool best_apply = common_apply;
  *shared_apply = common_apply;
  std::vector<int32_t> best_placed = placed;
  if (fork.diverged) {
    // Best's placement of the diverging sequence (tiles_row still holds it): its winner before
    // the shared bands, with the loads it left.
    for (size_t i = 0; i < tiles_row.size(); ++i) best_placed[tiles_row[i]] = fork.best_part[i];
    Loads best_loads = fork.best_l;
    for (; pos < seq_order.size(); ++pos) {
      cut_sequence(pos, InitialStrategy::Best, best_loads, best_placed, &best_apply, nullptr);
      cut_sequence(pos, InitialStrategy::SharedBands, loads, placed, shared_apply, nullptr);
    }
  }
  if (shared_bands_apply != nullptr) *shared_bands_apply = best_apply;
  *shared = std::move(placed);
  return best_placed;
}

}  // namespace

std::vector<int32_t> structured_initial(const SubHypergraph& s, const PartCaps& caps,
                                        InitialStrategy strategy, bool* shared_bands_apply) {
  return structured(s, caps, strategy, shared_bands_apply, nullptr, nullptr);
}

std::vector<int32_t> structured_best_and_shared(const SubHypergraph& s, const PartCaps& caps,
                                                std::vector<int32_t>& shared, bool* best_apply,
                                                bool* shared_apply) {
  bool unused = false;
  return structured(s, caps, InitialStrategy::Best, best_apply, &shared,
                    shared_apply != nullptr ? shared_apply : &unused);
}

}  // namespace dcp::placement
