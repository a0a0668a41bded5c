// attention_work.cpp — host side of the CUDA attention kernels: validation of tile lists, the
// per-CTA work lists, and mask-area FLOPs.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <bit>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <utility>

#include "dcp/detail/attention_cuda.h"
#include "dcp/error.h"

namespace dcp::cuda {

namespace detail {
void allow_shared_memory_on_device(const char* name, const void* kernel, int smem_bytes) {
  static std::mutex mutex;
  static std::set<std::pair<const void*, int>> done;  // (kernel, device) pairs already opted in
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess)
    raise(ErrorKind::Cuda, std::string(name) + ": cudaGetDevice: " + cudaGetErrorString(e));
  const std::lock_guard<std::mutex> lock(mutex);
  if (done.count({kernel, device}) != 0) return;
  const cudaError_t attr = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (attr != cudaSuccess) raise(ErrorKind::Cuda, std::string(name) + ": cudaFuncSetAttribute: " + cudaGetErrorString(attr));
  done.insert({kernel, device});
}

int multiprocessor_count() {
  static std::mutex mutex;
  static std::map<int, int> counts;  // per device: asked once, every persistent launch reads it
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess)
    raise(ErrorKind::Cuda, std::string("cudaGetDevice: ") + cudaGetErrorString(e));
  const std::lock_guard<std::mutex> lock(mutex);
  if (const auto it = counts.find(device); it != counts.end()) return it->second;
  int count = 0;
  if (const cudaError_t e = cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device); e != cudaSuccess)
    raise(ErrorKind::Cuda, std::string("cudaDeviceGetAttribute(multiprocessors): ") + cudaGetErrorString(e));
  return counts[device] = std::max(count, 1);
}
}  // namespace detail

namespace {

void validate(std::span<const AttnTile> tiles, const AttnShape& shape, const char* where) {
  if (shape.head_dim != 64 && shape.head_dim != 128) {
    raise(ErrorKind::Unsupported, std::string(where) + ": head_dim must be 64 or 128 (got " +
                                      std::to_string(shape.head_dim) + ")");
  }
  if (shape.num_kv_heads <= 0 || shape.num_q_heads <= 0 || shape.num_q_heads % shape.num_kv_heads != 0) {
    raise(ErrorKind::InvalidInput, std::string(where) + ": num_q_heads (" + std::to_string(shape.num_q_heads) +
                                       ") must be a positive multiple of num_kv_heads (" +
                                       std::to_string(shape.num_kv_heads) + ")");
  }
  for (std::size_t i = 0; i < tiles.size(); ++i) {
    const AttnTile& t = tiles[i];
    const bool ok = t.q_begin >= 0 && t.q_len >= 0 && t.kv_begin >= 0 && t.kv_len >= 0 && t.out_begin >= 0 &&
                    t.kv_head_begin >= 0 && t.kv_head_begin <= t.kv_head_end && t.kv_head_end <= shape.num_kv_heads &&
                    (t.kind == TileKind::Full || t.kind == TileKind::CausalDiagonal || t.kind == TileKind::Partial);
    if (!ok) {
      raise(ErrorKind::InvalidInput, std::string(where) + ": tile " + std::to_string(i) +
                                         " has a negative range, a bad kind or a head group outside [0, " +
                                         std::to_string(shape.num_kv_heads) + ")");
    }
  }
}

// The deterministic backward's walkers of tile t per 64-row sub-tile u: how many of its key
// block's `chunks` chunks have an allowed pair there (the kernel skips the other steps), and for a
// Partial tile which ones (bit c; at most 64 chunks). Causal diagonal: chunk c walks u >= 2 c.
struct StepWalkers {
  std::vector<int32_t> count;
  std::vector<uint64_t> partial;  // empty unless t is Partial
};
StepWalkers step_walkers(const AttnTile& t, int chunks, std::span<const int32_t> row_offsets,
                         std::span<const int32_t> ranges, const char* where, std::size_t index) {
  auto who = [&] { return std::string(where) + ": tile " + std::to_string(index); };
  const int nsub = (t.q_len + 63) / 64;
  StepWalkers w;
  w.count.assign(static_cast<std::size_t>(nsub), 0);
  if (t.kind != TileKind::Partial) {
    for (int u = 0; u < nsub; ++u)
      w.count[static_cast<std::size_t>(u)] = t.kind == TileKind::CausalDiagonal ? std::min(chunks, u / 2 + 1) : chunks;
    return w;
  }
  if (chunks > 64) raise(ErrorKind::Unsupported, who() + " is a partial tile over more than 8192 keys");
  w.partial.assign(static_cast<std::size_t>(nsub), 0);
  for (int r = 0; r < t.q_len; ++r) {
    const auto ri = static_cast<std::size_t>(t.range_row_begin + r);
    if (ri + 1 >= row_offsets.size()) raise(ErrorKind::InvalidInput, who() + " has rows past the end of row_offsets");
    for (int32_t q = row_offsets[ri]; q < row_offsets[ri + 1]; ++q) {
      if (2 * static_cast<std::size_t>(q) + 1 >= ranges.size())
        raise(ErrorKind::InvalidInput, who() + " has ranges past the end of the range list");
      const int b0 = std::max(ranges[2 * static_cast<std::size_t>(q)], 0);
      const int e0 = std::min(ranges[2 * static_cast<std::size_t>(q) + 1], t.kv_len);
      for (int c = b0 / kAttnBackwardChunkRows; e0 > b0 && c * kAttnBackwardChunkRows < e0; ++c)
        w.partial[static_cast<std::size_t>(r / 64)] |= uint64_t{1} << c;
    }
  }
  for (int u = 0; u < nsub; ++u) w.count[static_cast<std::size_t>(u)] = std::popcount(w.partial[static_cast<std::size_t>(u)]);
  return w;
}

// Key blocks (tiles sharing kv rows and dK/dV rows) in order of first appearance, and in each
// the input tiles per kv head: [block][kv head] -> tiles. The deterministic backwards' dK / dV
// items walk one head's tiles of one key block. Two key blocks may share dK/dV rows only for
// disjoint heads (InvalidInput otherwise).
std::vector<std::vector<std::vector<int>>> key_blocks(std::span<const AttnTile> tiles, int hkv, const char* where) {
  auto dkv_row0 = [](const AttnTile& t) { return t.dkv_begin >= 0 ? t.dkv_begin : t.kv_begin; };
  std::map<std::tuple<int, int, int>, std::size_t> block_of;
  std::vector<std::vector<std::vector<int>>> members;
  for (std::size_t i = 0; i < tiles.size(); ++i) {
    const AttnTile& t = tiles[i];
    if (t.q_len == 0 || t.kv_len == 0) continue;
    const auto [it, added] = block_of.emplace(std::make_tuple(t.kv_begin, t.kv_len, dkv_row0(t)), members.size());
    if (added) members.emplace_back(static_cast<std::size_t>(hkv));
    for (int h = t.kv_head_begin; h < t.kv_head_end; ++h)
      members[it->second][static_cast<std::size_t>(h)].push_back(static_cast<int>(i));
  }
  struct Rows {
    int begin, end;
    std::size_t block;
  };
  std::vector<Rows> rows;
  for (const auto& [key, blk] : block_of) rows.push_back({std::get<2>(key), std::get<2>(key) + std::get<1>(key), blk});
  std::sort(rows.begin(), rows.end(), [](const Rows& x, const Rows& y) { return x.begin < y.begin; });
  for (std::size_t x = 0; x < rows.size(); ++x) {
    for (std::size_t y = x + 1; y < rows.size() && rows[y].begin < rows[x].end; ++y) {
      for (int h = 0; h < hkv; ++h) {
        const auto& mx = members[rows[x].block][static_cast<std::size_t>(h)];
        const auto& my = members[rows[y].block][static_cast<std::size_t>(h)];
        if (mx.empty() || my.empty()) continue;
        raise(ErrorKind::InvalidInput, std::string(where) + ": tile " + std::to_string(my[0]) + " and tile " +
                                           std::to_string(mx[0]) + " share dK/dV rows of kv head " + std::to_string(h) +
                                           " but not their kv rows (a deterministic backward needs tiles that share key "
                                           "gradients to share their keys exactly)");
      }
    }
  }
  return members;
}

}  // namespace

std::vector<AttnWorkItem> make_forward_work(std::span<const AttnTile> tiles, const AttnShape& shape) {
  validate(tiles, shape, "make_forward_work");
  const int group = shape.num_q_heads / shape.num_kv_heads;
  std::vector<AttnWorkItem> work;
  for (std::size_t i = 0; i < tiles.size(); ++i) {
    const AttnTile& t = tiles[i];
    const int chunks = (t.q_len + kAttnForwardChunkRows - 1) / kAttnForwardChunkRows;
    // Causal chunks late in the tile carry the most keys: issue them first (longest first).
    for (int c = 0; c < chunks; ++c) {
      const int chunk = t.kind == TileKind::CausalDiagonal ? chunks - 1 - c : c;
      for (int h = t.kv_head_begin * group; h < t.kv_head_end * group; ++h) {
        work.push_back(AttnWorkItem{static_cast<int32_t>(i), chunk, h, 0});
      }
    }
  }
  return work;
}

std::vector<uint8_t> make_partial_cells(std::span<AttnTile> tiles, std::span<const int32_t> row_offsets,
                                        std::span<const int32_t> ranges) {
  std::vector<uint8_t> cells;
  // Per cell row, difference arrays over the cell columns: rows whose ranges touch a column, and
  // rows with one range covering it whole. O(ranges) per row and O(columns) per 64 rows, instead
  // of a pass over every column for every row. A column that a row covers only with two adjacent
  // ranges counts as not full: the kernels then build its row masks, which is exact, just slower.
  std::vector<int32_t> touched, whole;
  // Tiles of other head groups with the same mask rows and extent share their cells.
  std::map<std::tuple<int32_t, int32_t, int32_t>, int32_t> made;
  for (std::size_t i = 0; i < tiles.size(); ++i) {
    AttnTile& t = tiles[i];
    if (t.kind != TileKind::Partial) continue;
    if (const auto it = made.find({t.range_row_begin, t.q_len, t.kv_len}); it != made.end()) {
      t.cells_begin = it->second;
      continue;
    }
    const int cols = (t.kv_len + kAttnCellKeys - 1) / kAttnCellKeys;
    const int cell_rows = (t.q_len + kAttnCellRows - 1) / kAttnCellRows;
    if (cells.size() + static_cast<std::size_t>(cols) * cell_rows > static_cast<std::size_t>(std::numeric_limits<int32_t>::max()))
      raise(ErrorKind::Unsupported, "make_partial_cells: more than 2^31 cells in one list");
    if (t.range_row_begin < 0 || static_cast<std::size_t>(t.range_row_begin) + static_cast<std::size_t>(t.q_len) >= row_offsets.size())
      raise(ErrorKind::InvalidInput, "make_partial_cells: tile " + std::to_string(i) + " has rows past the end of row_offsets");
    t.cells_begin = static_cast<int32_t>(cells.size());
    made.emplace(std::tuple{t.range_row_begin, t.q_len, t.kv_len}, t.cells_begin);
    cells.resize(cells.size() + static_cast<std::size_t>(cols) * cell_rows, 0);
    for (int u = 0; u < cell_rows; ++u) {
      touched.assign(static_cast<std::size_t>(cols) + 1, 0);
      whole.assign(static_cast<std::size_t>(cols) + 1, 0);
      const int r_end = std::min(t.q_len, (u + 1) * kAttnCellRows);
      for (int r = u * kAttnCellRows; r < r_end; ++r) {
        const auto ri = static_cast<std::size_t>(t.range_row_begin) + static_cast<std::size_t>(r);
        for (int32_t q = row_offsets[ri]; q < row_offsets[ri + 1]; ++q) {
          if (q < 0 || 2 * static_cast<std::size_t>(q) + 1 >= ranges.size())
            raise(ErrorKind::InvalidInput, "make_partial_cells: tile " + std::to_string(i) + " has ranges past the end of the range list");
          const int b = std::max(ranges[2 * static_cast<std::size_t>(q)], 0);
          const int e = std::min(ranges[2 * static_cast<std::size_t>(q) + 1], t.kv_len);
          if (b >= e) continue;
          ++touched[static_cast<std::size_t>(b / kAttnCellKeys)];
          --touched[static_cast<std::size_t>((e - 1) / kAttnCellKeys + 1)];
          // Whole columns: from the first starting at or after b to the last ending at or before
          // e (the last column ends at kv_len).
          const int w0 = (b + kAttnCellKeys - 1) / kAttnCellKeys;
          const int w1 = e == t.kv_len ? cols : e / kAttnCellKeys;
          if (w0 < w1) {
            ++whole[static_cast<std::size_t>(w0)];
            --whole[static_cast<std::size_t>(w1)];
          }
        }
      }
      const int rows = r_end - u * kAttnCellRows;
      uint8_t* row_cells = cells.data() + t.cells_begin + static_cast<std::size_t>(u) * cols;
      int n_touched = 0, n_whole = 0;
      for (int c = 0; c < cols; ++c) {
        n_touched += touched[static_cast<std::size_t>(c)];
        n_whole += whole[static_cast<std::size_t>(c)];
        row_cells[c] = static_cast<uint8_t>((n_touched > 0 ? kAttnCellAny : 0) | (n_whole < rows ? kAttnCellNotFull : 0));
      }
    }
  }
  return cells;
}

std::vector<AttnWorkItem> make_backward_work(std::span<const AttnTile> tiles, const AttnShape& shape,
                                             std::span<const uint8_t> cells) {
  validate(tiles, shape, "make_backward_work");
  // Whether a Partial tile's 128-key chunk c has an allowed pair: one of its cell columns
  // 2 c, 2 c + 1 has a key in some cell row.
  auto live = [&](const AttnTile& t, std::size_t i, int c) {
    if (cells.empty() || t.kind != TileKind::Partial || t.cells_begin < 0) return true;
    const int cols = (t.kv_len + kAttnCellKeys - 1) / kAttnCellKeys;
    const int cell_rows = (t.q_len + kAttnCellRows - 1) / kAttnCellRows;
    if (static_cast<std::size_t>(t.cells_begin) + static_cast<std::size_t>(cols) * cell_rows > cells.size())
      raise(ErrorKind::InvalidInput, "make_backward_work: tile " + std::to_string(i) + " has cells past the end of the cell list");
    const int c0 = c * (kAttnBackwardChunkRows / kAttnCellKeys);
    const int c1 = std::min(cols, c0 + kAttnBackwardChunkRows / kAttnCellKeys);
    for (int u = 0; u < cell_rows; ++u)
      for (int col = c0; col < c1; ++col)
        if ((cells[static_cast<std::size_t>(t.cells_begin) + static_cast<std::size_t>(u) * cols + col] & kAttnCellAny) != 0)
          return true;
    return false;
  };
  std::vector<AttnWorkItem> work;
  for (std::size_t i = 0; i < tiles.size(); ++i) {
    const AttnTile& t = tiles[i];
    if (t.q_len == 0) continue;
    const int chunks = (t.kv_len + kAttnBackwardChunkRows - 1) / kAttnBackwardChunkRows;
    // Causal: early key chunks see the most query rows.
    for (int c = 0; c < chunks; ++c) {
      if (!live(t, i, c)) continue;
      for (int h = t.kv_head_begin; h < t.kv_head_end; ++h) {
        work.push_back(AttnWorkItem{static_cast<int32_t>(i), c, h, 0});
      }
    }
  }
  return work;
}

std::vector<AttnWorkItem> make_backward_work(std::span<const AttnTile> tiles, const AttnShape& shape) {
  return make_backward_work(tiles, shape, {});
}

DeterministicBackwardWork make_deterministic_backward_work(std::span<const AttnTile> tiles, const AttnShape& shape,
                                                           std::span<const int32_t> row_offsets,
                                                           std::span<const int32_t> ranges, int unit_rows) {
  const char* where = "make_deterministic_backward_work";
  validate(tiles, shape, where);
  const int hq = shape.num_q_heads;
  const int hkv = shape.num_kv_heads;
  auto dq_row0 = [](const AttnTile& t) { return t.dq_begin >= 0 ? t.dq_begin : t.q_begin; };
  auto name = [](std::size_t i) { return "tile " + std::to_string(i); };

  const std::vector<std::vector<std::vector<int>>> members = key_blocks(tiles, hkv, where);
  // dQ segments: tiles sharing dQ rows share them exactly; segments are disjoint.
  std::map<int, std::pair<int, int>> segments;  // first dQ row -> (length, segment index)
  for (std::size_t i = 0; i < tiles.size(); ++i) {
    const AttnTile& t = tiles[i];
    if (t.q_len == 0 || t.kv_len == 0) continue;
    const auto [it, added] = segments.emplace(dq_row0(t), std::make_pair(t.q_len, 0));
    if (!added && it->second.first != t.q_len) {
      raise(ErrorKind::InvalidInput, std::string(where) + ": " + name(i) + " writes " + std::to_string(t.q_len) +
                                         " dQ rows from row " + std::to_string(dq_row0(t)) + ", another tile " +
                                         std::to_string(it->second.first) +
                                         " rows from there (tiles sharing dQ rows must share them exactly)");
    }
  }
  std::vector<int> sem_base;
  int64_t sems = 0;
  int64_t prev_end = std::numeric_limits<int64_t>::min();
  for (auto& [row, seg] : segments) {
    if (row < prev_end) {
      raise(ErrorKind::InvalidInput, std::string(where) + ": dQ rows from " + std::to_string(row) +
                                         " overlap the previous tile's dQ rows (ending at " + std::to_string(prev_end) + ")");
    }
    prev_end = int64_t{row} + seg.first;
    seg.second = static_cast<int>(sem_base.size());
    sem_base.push_back(static_cast<int>(sems));
    sems += static_cast<int64_t>((seg.first + 63) / 64) * hq;
  }
  if (sems > std::numeric_limits<int32_t>::max()) raise(ErrorKind::InvalidInput, std::string(where) + ": too many dQ rows");

  DeterministicBackwardWork out;
  // Walkers seen so far per (segment, kv head, 64-row sub-tile), in work order: items of one head
  // run in block order, chunks last to first; other heads' items never share a semaphore.
  std::vector<int64_t> seg_sub(sem_base.size() + 1, 0);  // first sub-tile of each segment
  for (const auto& [row, seg] : segments)
    seg_sub[static_cast<std::size_t>(seg.second) + 1] = (seg.first + 63) / 64;
  for (std::size_t i = 1; i < seg_sub.size(); ++i) seg_sub[i] += seg_sub[i - 1];
  std::vector<int32_t> seen(static_cast<std::size_t>(seg_sub.back()) * static_cast<std::size_t>(hkv), 0);
  auto seg_of = [&](const AttnTile& t) { return static_cast<std::size_t>(segments.at(dq_row0(t)).second); };
  // Units: per key block and kv head, the tiles from the last dQ rows to the first (in a
  // sequence laid out in order, key block j's tiles cover q blocks j, j + 1, ...; walked from the
  // last, the units before it in the order below reach each shared q block no later than it),
  // whole, or cut into runs of at most unit_rows q rows (at least one tile each).
  struct Unit {
    std::size_t block;
    int head;
    int top;       // dQ row of the first tile walked (the unit's last dQ rows)
    int kv_begin;
    std::vector<int> tiles;
  };
  std::vector<Unit> units;
  for (std::size_t blk = 0; blk < members.size(); ++blk) {
    for (int h = 0; h < hkv; ++h) {
      std::vector<int> m = members[blk][static_cast<std::size_t>(h)];
      if (m.empty()) continue;
      std::stable_sort(m.begin(), m.end(), [&](int x, int y) {
        return dq_row0(tiles[static_cast<std::size_t>(x)]) > dq_row0(tiles[static_cast<std::size_t>(y)]);
      });
      int rows = 0;
      for (const int i : m) {
        const AttnTile& t = tiles[static_cast<std::size_t>(i)];
        const bool cut = unit_rows > 0 && rows + t.q_len > unit_rows;
        if (units.empty() || units.back().block != blk || units.back().head != h || cut) {
          units.push_back(Unit{blk, h, dq_row0(t), t.kv_begin, {}});
          rows = 0;
        }
        units.back().tiles.push_back(i);
        rows += t.q_len;
      }
    }
  }
  // Work order, by a key per unit, then key rows, then heads (kv heads innermost: the units of
  // one group share the key and key rows and take turns chunk by chunk, last chunk first).
  // Whole key blocks: fewer tiles first, since a key block that many q blocks attend (a causal
  // sequence's first block, an attention sink, a shared question) is one item walking all its
  // tiles, which every walker after it in the order would wait for. Cut units: by their first dQ
  // rows, so that of the units walking a q block, the earlier ones in the order reach it after
  // fewer tiles.
  std::vector<std::size_t> block_tiles(members.size(), 0);
  for (std::size_t b = 0; b < members.size(); ++b)
    for (const auto& m : members[b]) block_tiles[b] = std::max(block_tiles[b], m.size());
  auto order_key = [&](const Unit& u) {
    return unit_rows > 0 ? static_cast<int64_t>(u.top) : static_cast<int64_t>(block_tiles[u.block]);
  };
  std::vector<std::size_t> unit_order(units.size());
  for (std::size_t x = 0; x < units.size(); ++x) unit_order[x] = x;
  std::stable_sort(unit_order.begin(), unit_order.end(), [&](std::size_t x, std::size_t y) {
    const Unit& a = units[x];
    const Unit& b = units[y];
    if (order_key(a) != order_key(b)) return order_key(a) < order_key(b);
    if (a.kv_begin != b.kv_begin) return a.kv_begin < b.kv_begin;
    return a.head < b.head;
  });
  // dK / dV turns: the units of one (key block, head) in work order; a semaphore per chunk when
  // there are several.
  std::map<std::pair<std::size_t, int>, std::pair<int, int>> dkv_turns;  // -> (units so far, semaphore base)
  for (const std::size_t x : unit_order) ++dkv_turns[{units[x].block, units[x].head}].first;
  for (auto& [key, turn] : dkv_turns) {
    const int chunks =
        (tiles[static_cast<std::size_t>(members[key.first][static_cast<std::size_t>(key.second)][0])].kv_len +
         kAttnBackwardChunkRows - 1) / kAttnBackwardChunkRows;
    turn.second = -1;
    if (turn.first > 1) {
      turn.second = static_cast<int>(sems);
      sems += chunks;
    }
    turn.first = 0;
  }
  if (sems > std::numeric_limits<int32_t>::max()) raise(ErrorKind::InvalidInput, std::string(where) + ": too many dQ rows");
  out.num_semaphores = static_cast<int32_t>(sems);

  for (std::size_t gi = 0; gi < unit_order.size();) {
    // A group: units with the same start and key rows (one per kv head, usually).
    std::size_t ge = gi + 1;
    while (ge < unit_order.size() && order_key(units[unit_order[ge]]) == order_key(units[unit_order[gi]]) &&
           units[unit_order[ge]].kv_begin == units[unit_order[gi]].kv_begin &&
           units[unit_order[ge]].head > units[unit_order[ge - 1]].head)  // one unit per head in a group
      ++ge;
    const int chunks =
        (tiles[static_cast<std::size_t>(units[unit_order[gi]].tiles[0])].kv_len + kAttnBackwardChunkRows - 1) /
        kAttnBackwardChunkRows;
    std::vector<int32_t> first(ge - gi, -1);
    std::vector<std::pair<std::size_t, std::vector<int32_t>>> adds;  // the group's walkers, added after it
    for (std::size_t k = gi; k < ge; ++k) {
      const Unit& unit = units[unit_order[k]];
      const int h = unit.head;
      first[k - gi] = static_cast<int32_t>(out.tiles.size());
      std::set<std::size_t> segs;
      for (const int i : unit.tiles) {
        AttnTile t = tiles[static_cast<std::size_t>(i)];
        const std::size_t seg = seg_of(t);
        if (!segs.insert(seg).second) {
          raise(ErrorKind::InvalidInput, std::string(where) + ": " + name(static_cast<std::size_t>(i)) +
                                             " repeats the dQ rows of another tile over the same keys and kv head");
        }
        const int nsub = (t.q_len + 63) / 64;
        const StepWalkers walk = step_walkers(t, chunks, row_offsets, ranges, where, static_cast<std::size_t>(i));
        t.kv_head_begin = h;
        t.kv_head_end = h + 1;
        t.dq_sem = sem_base[seg];
        t.order = static_cast<int32_t>(out.order.size());
        const std::size_t at0 = (static_cast<std::size_t>(seg_sub[seg]) * static_cast<std::size_t>(hkv)) +
                                static_cast<std::size_t>(h) * static_cast<std::size_t>(nsub);
        for (int u = 0; u < nsub; ++u) out.order.push_back(seen[at0 + static_cast<std::size_t>(u)]);
        for (const uint64_t bits : walk.partial) {
          out.order.push_back(static_cast<int32_t>(static_cast<uint32_t>(bits)));
          out.order.push_back(static_cast<int32_t>(static_cast<uint32_t>(bits >> 32)));
        }
        adds.emplace_back(at0, walk.count);
        out.tiles.push_back(t);
      }
    }
    for (const auto& [at0, count] : adds)
      for (std::size_t u = 0; u < count.size(); ++u) seen[at0 + u] += count[u];
    std::vector<std::pair<int, int>> turn(ge - gi);  // (dK/dV semaphore base, turn) per unit
    for (std::size_t k = gi; k < ge; ++k) {
      auto& d = dkv_turns[{units[unit_order[k]].block, units[unit_order[k]].head}];
      turn[k - gi] = {d.second, d.first++};
    }
    for (int c = chunks - 1; c >= 0; --c) {
      for (std::size_t k = gi; k < ge; ++k) {
        const Unit& unit = units[unit_order[k]];
        AttnWorkItem w{first[k - gi], c, unit.head, 0};
        w.num_tiles = static_cast<int32_t>(unit.tiles.size());
        if (turn[k - gi].first >= 0) {
          w.dkv_sem = turn[k - gi].first + c;
          w.dkv_rank = turn[k - gi].second;
        }
        out.work.push_back(w);
      }
    }
    gi = ge;
  }
  if (out.order.empty()) out.order = {0};
  return out;
}

SplitBackwardWork make_split_backward_work(std::span<const AttnTile> tiles, const AttnShape& shape, int unit_rows) {
  const char* where = "make_split_backward_work";
  validate(tiles, shape, where);
  const int hq = shape.num_q_heads;
  const int hkv = shape.num_kv_heads;
  const int group = hq / hkv;
  auto dq_row0 = [](const AttnTile& t) { return t.dq_begin >= 0 ? t.dq_begin : t.q_begin; };
  // Work of a tile for one head, in key rows x q rows (a causal diagonal tile: half).
  auto area = [](const AttnTile& t, int keys) {
    return static_cast<double>(keys) * t.q_len * (t.kind == TileKind::CausalDiagonal ? 0.5 : 1.0);
  };
  SplitBackwardWork out;

  // dK / dV pass: units of key blocks per kv head, cut (unit_rows > 0) into runs of at most
  // unit_rows q rows; items (unit, chunk, head) heaviest first, and the turns of a cut key
  // block's units in that order, so that an item waits only for items launched before it.
  const std::vector<std::vector<std::vector<int>>> members = key_blocks(tiles, hkv, where);
  struct Item {
    double cost;
    AttnWorkItem w;
    std::size_t turn_key;  // (block, head, chunk) of a cut key block; SIZE_MAX: alone
  };
  std::vector<Item> items;
  std::size_t turn_keys = 0;
  for (const auto& block : members) {
    for (int h = 0; h < hkv; ++h) {
      const std::vector<int>& m = block[static_cast<std::size_t>(h)];
      if (m.empty()) continue;
      const int kv_len = tiles[static_cast<std::size_t>(m[0])].kv_len;
      const int chunks = (kv_len + kAttnBackwardChunkRows - 1) / kAttnBackwardChunkRows;
      std::vector<std::pair<int, int>> units;  // (first tile in dkv_tiles, tiles)
      int rows = 0;
      for (const int i : m) {
        AttnTile t = tiles[static_cast<std::size_t>(i)];
        if (units.empty() || (unit_rows > 0 && rows + t.q_len > unit_rows)) {
          units.emplace_back(static_cast<int>(out.dkv_tiles.size()), 0);
          rows = 0;
        }
        t.kv_head_begin = h;
        t.kv_head_end = h + 1;
        out.dkv_tiles.push_back(t);
        ++units.back().second;
        rows += t.q_len;
      }
      for (int c = 0; c < chunks; ++c) {
        const int keys = std::min(kAttnBackwardChunkRows, kv_len - c * kAttnBackwardChunkRows);
        const std::size_t key = units.size() > 1 ? turn_keys++ : SIZE_MAX;
        for (const auto& [first, count] : units) {
          double cost = 0.0;
          for (int k = first; k < first + count; ++k) cost += area(out.dkv_tiles[static_cast<std::size_t>(k)], keys);
          AttnWorkItem w{first, c, h, 0};
          w.num_tiles = count;
          items.push_back(Item{cost, w, key});
        }
      }
    }
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.cost > b.cost; });
  std::vector<int32_t> turns(turn_keys, 0);
  for (const Item& it : items) {
    AttnWorkItem w = it.w;
    if (it.turn_key != SIZE_MAX) {
      w.dkv_sem = static_cast<int32_t>(it.turn_key);
      w.dkv_rank = turns[it.turn_key]++;
    }
    out.dkv_work.push_back(w);
  }
  if (turn_keys > static_cast<std::size_t>(std::numeric_limits<int32_t>::max()))
    raise(ErrorKind::InvalidInput, std::string(where) + ": too many key blocks cut into units");
  out.num_semaphores = static_cast<int32_t>(turn_keys);

  // dQ pass: runs of tiles sharing dQ rows, in list order; their rows must not overlap.
  std::map<int, std::vector<int>> runs;  // first dQ row -> tiles
  for (std::size_t i = 0; i < tiles.size(); ++i) {
    const AttnTile& t = tiles[i];
    if (t.q_len == 0 || t.kv_len == 0) continue;
    auto& run = runs[dq_row0(t)];
    if (!run.empty()) {
      const AttnTile& f = tiles[static_cast<std::size_t>(run[0])];
      auto row_or = [](int32_t r, int32_t d) { return r >= 0 ? r : d; };
      if (t.q_len != f.q_len || t.q_begin != f.q_begin || row_or(t.dout_begin, t.q_begin) != row_or(f.dout_begin, f.q_begin) ||
          row_or(t.lse_begin, t.q_begin) != row_or(f.lse_begin, f.q_begin) ||
          row_or(t.delta_begin, t.q_begin) != row_or(f.delta_begin, f.q_begin)) {
        raise(ErrorKind::InvalidInput, std::string(where) + ": tile " + std::to_string(i) + " writes the dQ rows of tile " +
                                           std::to_string(run[0]) + " from row " + std::to_string(dq_row0(t)) +
                                           " but reads other q, dO, LSE or Delta rows, or another number of them");
      }
    }
    run.push_back(static_cast<int>(i));
  }
  struct DqItem {
    double cost;
    AttnWorkItem w;
  };
  std::vector<DqItem> dq_items;
  int64_t prev_end = std::numeric_limits<int64_t>::min();
  for (const auto& [row, run] : runs) {
    const AttnTile& f = tiles[static_cast<std::size_t>(run[0])];
    if (row < prev_end) {
      raise(ErrorKind::InvalidInput, std::string(where) + ": the dQ rows of tile " + std::to_string(run[0]) + " (from row " +
                                         std::to_string(row) + ") overlap those of an earlier tile (ending at row " +
                                         std::to_string(prev_end) + ")");
    }
    prev_end = int64_t{row} + f.q_len;
    const auto first = static_cast<int32_t>(out.dq_tiles.size());
    std::vector<double> head_cost(static_cast<std::size_t>(hkv), 0.0);
    for (const int i : run) {
      const AttnTile& t = tiles[static_cast<std::size_t>(i)];
      out.dq_tiles.push_back(t);
      for (int h = t.kv_head_begin; h < t.kv_head_end; ++h) head_cost[static_cast<std::size_t>(h)] += area(t, t.kv_len);
    }
    const int chunks = (f.q_len + kAttnForwardChunkRows - 1) / kAttnForwardChunkRows;
    for (int c = 0; c < chunks; ++c) {
      for (int qh = 0; qh < hq; ++qh) {
        const double cost = head_cost[static_cast<std::size_t>(qh / group)];
        if (cost == 0.0) continue;
        AttnWorkItem w{first, c, qh, 0};
        w.num_tiles = static_cast<int32_t>(run.size());
        dq_items.push_back(DqItem{cost, w});
      }
    }
  }
  std::stable_sort(dq_items.begin(), dq_items.end(), [](const DqItem& a, const DqItem& b) { return a.cost > b.cost; });
  for (const DqItem& it : dq_items) out.dq_work.push_back(it.w);
  return out;
}

double attention_forward_flops(std::span<const AttnTile> tiles, const AttnShape& shape,
                               std::span<const int32_t> row_offsets, std::span<const int32_t> ranges) {
  const int group = shape.num_kv_heads > 0 ? shape.num_q_heads / shape.num_kv_heads : 0;
  double flops = 0.0;
  for (const AttnTile& t : tiles) {
    double area = 0.0;
    if (t.kind == TileKind::Full) {
      area = static_cast<double>(t.q_len) * t.kv_len;
    } else if (t.kind == TileKind::CausalDiagonal) {
      for (int i = 0; i < t.q_len; ++i) area += std::min(i + 1, t.kv_len);
    } else {
      for (int i = 0; i < t.q_len; ++i) {
        const auto ri = static_cast<std::size_t>(t.range_row_begin + i);
        for (int r = row_offsets[ri]; r < row_offsets[ri + 1]; ++r) {
          const int b = std::max(ranges[2 * static_cast<std::size_t>(r)], 0);
          const int e = std::min(ranges[2 * static_cast<std::size_t>(r) + 1], t.kv_len);
          if (e > b) area += e - b;
        }
      }
    }
    const double heads = static_cast<double>(t.kv_head_end - t.kv_head_begin) * group;
    flops += 4.0 * area * shape.head_dim * heads;
  }
  return flops;
}

}  // namespace dcp::cuda
