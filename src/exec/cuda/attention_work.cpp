// attention_work.cpp — host side of the CUDA attention kernels: validation of tile lists, the
// per-CTA work lists, and mask-area FLOPs.

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <ranges>
#include <string>
#include <tuple>
#include <utility>

#include "dcp/detail/attention_cuda.h"
#include "dcp/error.h"

namespace dcp::cuda {

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

// The q sub-tiles [first, end) of a Partial tile that its key chunk c walks, from the tile's spans
// in `cells` (make_partial_cells; first == end: the chunk has no allowed pair). InvalidInput where
// the spans lie past the end of the cells.
std::pair<int32_t, int32_t> key_chunk_rows(const AttnTile& t, std::span<const uint8_t> cells, int c, const char* where) {
  const int q_chunks = (t.q_len + kAttnForwardChunkRows - 1) / kAttnForwardChunkRows;
  const int key_chunks = (t.kv_len + kAttnBackwardChunkRows - 1) / kAttnBackwardChunkRows;
  const std::size_t at = static_cast<std::size_t>(t.spans_begin) + 8 * static_cast<std::size_t>(q_chunks);
  if (at + 8 * static_cast<std::size_t>(key_chunks) > cells.size())
    raise(ErrorKind::InvalidInput, std::string(where) + ": a tile's spans lie past the end of the cell list");
  int32_t span[2];
  std::memcpy(span, cells.data() + at + 8 * static_cast<std::size_t>(c), sizeof span);
  return {span[0], span[1]};
}

// The first dK / dV row of a tile (its kv rows' when it names none).
int32_t dkv_row0(const AttnTile& t) { return t.dkv_begin >= 0 ? t.dkv_begin : t.kv_begin; }

// Key blocks (tiles sharing kv rows and dK/dV rows) in order of first appearance, and in each
// the input tiles per kv head: [block][kv head] -> tiles. The deterministic backward's dK / dV
// items walk one head's tiles of one key block. Two key blocks may share dK/dV rows only for
// disjoint heads (InvalidInput otherwise).
std::vector<std::vector<std::vector<int>>> key_blocks(std::span<const AttnTile> tiles, int hkv, const char* where) {
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

std::vector<AttnWorkItem> make_forward_run_work(std::span<const AttnTile> tiles, std::span<const AttnRun> runs,
                                                const AttnShape& shape) {
  validate(tiles, shape, "make_forward_run_work");
  std::vector<std::pair<double, std::size_t>> order;  // (cost, run)
  std::vector<double> run_keys(runs.size(), 0.0);     // keys a run's items walk
  for (std::size_t r = 0; r < runs.size(); ++r) {
    const AttnRun& run = runs[r];
    if (run.count < 1 || run.first < 0 || static_cast<std::size_t>(run.first) + static_cast<std::size_t>(run.count) > tiles.size()) {
      raise(ErrorKind::InvalidInput, "make_forward_run_work: run " + std::to_string(r) + " (tiles " + std::to_string(run.first) +
                                         " + " + std::to_string(run.count) + ") is empty or outside the list of " +
                                         std::to_string(tiles.size()) + " tiles");
    }
    const AttnTile& head = tiles[static_cast<std::size_t>(run.first)];
    double cost = 0.0;
    for (int32_t i = run.first; i < run.first + run.count; ++i) {
      const AttnTile& t = tiles[static_cast<std::size_t>(i)];
      if (t.q_begin != head.q_begin || t.q_len != head.q_len) {
        raise(ErrorKind::InvalidInput, "make_forward_run_work: tile " + std::to_string(i) + " of run " + std::to_string(r) +
                                           " reads other q rows than the run's first tile");
      }
      cost += static_cast<double>(t.kv_len) * (t.kind == TileKind::CausalDiagonal ? 0.5 : 1.0);
      run_keys[r] += t.kv_len;
    }
    order.emplace_back(cost, r);
  }
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<AttnWorkItem> work;
  for (const auto& [cost, r] : order) {
    const AttnRun& run = runs[r];
    const int chunks = (tiles[static_cast<std::size_t>(run.first)].q_len + kAttnForwardChunkRows - 1) / kAttnForwardChunkRows;
    auto push = [&](int c, int h) {
      AttnWorkItem w{run.first, c, h, 0};
      w.num_tiles = run.count;
      w.accumulate = run.accumulate ? 1 : 0;
      work.push_back(w);
    };
    const double kv_bytes = run_keys[r] * shape.num_kv_heads * shape.head_dim * 2.0 * 2.0;  // K and V, bf16
    if (kv_bytes > kAttnForwardHeadMajorBytes) {
      const int group = shape.num_q_heads / shape.num_kv_heads;
      for (int g = 0; g < shape.num_kv_heads; ++g)
        for (int c = 0; c < chunks; ++c)
          for (int h = g * group; h < (g + 1) * group; ++h) push(c, h);
    } else {
      for (int c = 0; c < chunks; ++c)
        for (int h = 0; h < shape.num_q_heads; ++h) push(c, h);
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
  // The spans, from the cells: a q chunk is kAttnForwardChunkRows / kAttnCellRows cell rows and a
  // key sub-tile kAttnSpanKeys / kAttnCellKeys cell columns; a key chunk is
  // kAttnBackwardChunkRows / kAttnCellKeys cell columns and a q sub-tile one cell row.
  static_assert(kAttnForwardChunkRows % kAttnCellRows == 0 && kAttnSpanKeys % kAttnCellKeys == 0 &&
                kAttnBackwardChunkRows % kAttnCellKeys == 0);
  constexpr int kRowsPer = kAttnForwardChunkRows / kAttnCellRows, kColsPer = kAttnSpanKeys / kAttnCellKeys;
  constexpr int kKeyChunkCols = kAttnBackwardChunkRows / kAttnCellKeys;
  cells.resize((cells.size() + 3) / 4 * 4, 0);
  std::map<int32_t, int32_t> spans_of;  // cells_begin -> spans_begin
  for (AttnTile& t : tiles) {
    if (t.kind != TileKind::Partial || t.cells_begin < 0) continue;
    if (const auto it = spans_of.find(t.cells_begin); it != spans_of.end()) {
      t.spans_begin = it->second;
      continue;
    }
    const int cols = (t.kv_len + kAttnCellKeys - 1) / kAttnCellKeys;
    const int cell_rows = (t.q_len + kAttnCellRows - 1) / kAttnCellRows;
    const int chunks = (t.q_len + kAttnForwardChunkRows - 1) / kAttnForwardChunkRows;
    const int key_chunks = (t.kv_len + kAttnBackwardChunkRows - 1) / kAttnBackwardChunkRows;
    std::vector<int32_t> spans(2 * static_cast<std::size_t>(chunks + key_chunks), 0);
    for (int k = 0; k < chunks; ++k) {
      int first = -1, last = -1;
      for (int u = k * kRowsPer; u < std::min(cell_rows, (k + 1) * kRowsPer); ++u)
        for (int c = 0; c < cols; ++c)
          if ((cells[static_cast<std::size_t>(t.cells_begin) + static_cast<std::size_t>(u) * cols + c] & kAttnCellAny) != 0) {
            if (first < 0 || c / kColsPer < first) first = c / kColsPer;
            last = std::max(last, c / kColsPer);
          }
      if (first >= 0) {
        spans[2 * static_cast<std::size_t>(k)] = first;
        spans[2 * static_cast<std::size_t>(k) + 1] = last + 1;
      }
    }
    for (int k = 0; k < key_chunks; ++k) {
      int first = -1, last = -1;
      for (int u = 0; u < cell_rows; ++u)
        for (int c = k * kKeyChunkCols; c < std::min(cols, (k + 1) * kKeyChunkCols); ++c)
          if ((cells[static_cast<std::size_t>(t.cells_begin) + static_cast<std::size_t>(u) * cols + c] & kAttnCellAny) != 0) {
            if (first < 0) first = u;
            last = u;
          }
      if (first >= 0) {
        spans[2 * static_cast<std::size_t>(chunks + k)] = first;
        spans[2 * static_cast<std::size_t>(chunks + k) + 1] = last + 1;
      }
    }
    const std::size_t at = cells.size();
    if (at + spans.size() * 4 > static_cast<std::size_t>(std::numeric_limits<int32_t>::max()))
      raise(ErrorKind::Unsupported, "make_partial_cells: more than 2^31 bytes of cells in one list");
    t.spans_begin = static_cast<int32_t>(at);
    spans_of.emplace(t.cells_begin, t.spans_begin);
    cells.resize(at + spans.size() * 4);
    std::memcpy(cells.data() + at, spans.data(), spans.size() * 4);
  }
  return cells;
}

std::vector<AttnWorkItem> make_backward_work(std::span<const AttnTile> tiles, const AttnShape& shape,
                                             std::span<const uint8_t> cells) {
  validate(tiles, shape, "make_backward_work");
  // Key chunk c of a tile: whether it has an allowed pair (live) and whether its walk starts on the
  // tile's first row (from_first). A Partial tile's come from its spans (key_chunk_rows); without
  // cells every chunk is live and where it starts unknown. A Full tile's chunks all start on its
  // first row, a causal diagonal's first chunk only.
  struct Chunk {
    bool live, from_first;
  };
  auto chunk = [&](const AttnTile& t, int c) -> Chunk {
    if (t.kind != TileKind::Partial) return {true, t.kind == TileKind::Full || c == 0};
    if (cells.empty() || t.spans_begin < 0) return {true, false};
    const auto [first, end] = key_chunk_rows(t, cells, c, "make_backward_work");
    return {end > first, end > first && first == 0};
  };
  std::vector<AttnWorkItem> work;
  std::vector<int> live_chunks;
  for (std::size_t i = 0; i < tiles.size(); ++i) {
    const AttnTile& t = tiles[i];
    if (t.q_len == 0) continue;
    const int chunks = (t.kv_len + kAttnBackwardChunkRows - 1) / kAttnBackwardChunkRows;
    // Key chunks in order (causal: early chunks see the most q rows), the kv heads of a chunk
    // together. Where every chunk of a long tile walks from the tile's first row (Full tiles, a
    // window's lower edge), the running items move over the same rows, and chunk-major puts every
    // kv head's Q and dO rows in flight at once (such a window list at 4096 rows hits L2 on 60 %
    // of its loads, diagonal tiles on 78 %): there one head's chunks come together (head-major,
    // 1.07x / 1.17x on full / window lists of 4096 rows). Chunks that start on different rows (a
    // diagonal) keep the longest-first order, which head-major loses (0.95x).
    live_chunks.clear();
    bool head_major = t.q_len >= kAttnHeadMajorRows;
    for (int c = 0; c < chunks; ++c) {
      const Chunk k = chunk(t, c);
      if (!k.live) continue;
      live_chunks.push_back(c);
      head_major = head_major && k.from_first;
    }
    if (head_major) {
      for (int h = t.kv_head_begin; h < t.kv_head_end; ++h)
        for (const int c : live_chunks) work.push_back(AttnWorkItem{static_cast<int32_t>(i), c, h, 0});
    } else {
      for (const int c : live_chunks)
        for (int h = t.kv_head_begin; h < t.kv_head_end; ++h) work.push_back(AttnWorkItem{static_cast<int32_t>(i), c, h, 0});
    }
  }
  return work;
}

std::vector<AttnWorkItem> make_backward_work(std::span<const AttnTile> tiles, const AttnShape& shape) {
  return make_backward_work(tiles, shape, {});
}

int32_t partition_backward_work(std::span<AttnWorkItem> work, std::span<const AttnTile> tiles, const AttnShape& shape,
                                int min_q_rows) {
  if (shape.head_dim != 128) return 0;
  auto wide = [&](const AttnWorkItem& w) {
    if (w.tile < 0 || static_cast<std::size_t>(w.tile) >= tiles.size())
      raise(ErrorKind::InvalidInput, "partition_backward_work: work item names tile " + std::to_string(w.tile) + " of " +
                                         std::to_string(tiles.size()));
    const AttnTile& t = tiles[static_cast<std::size_t>(w.tile)];
    return t.kind == TileKind::Full && t.q_len >= min_q_rows &&
           t.kv_len - w.chunk * kAttnBackwardChunkRows >= kAttnBackwardChunkRows;
  };
  const auto mid = std::stable_partition(work.begin(), work.end(), wide);
  return static_cast<int32_t>(mid - work.begin());
}

int32_t make_backward_runs(std::vector<AttnTile>& tiles, std::vector<AttnWorkItem>& work, int32_t num_wide,
                           const AttnShape& shape, int max_rows) {
  const char* where = "make_backward_runs";
  if (num_wide < 0 || static_cast<std::size_t>(num_wide) > work.size())
    raise(ErrorKind::InvalidInput, std::string(where) + ": num_wide " + std::to_string(num_wide) + " outside the list of " +
                                       std::to_string(work.size()) + " items");
  if (max_rows < 1) raise(ErrorKind::InvalidInput, std::string(where) + ": max_rows must be positive");
  if (num_wide == 0) return 0;
  validate(tiles, shape, where);
  // The wide items of each tile (their indices in work), tiles in order of first appearance.
  std::vector<int> first_seen;
  std::vector<std::vector<int32_t>> items_of(tiles.size());
  for (int32_t i = 0; i < num_wide; ++i) {
    const AttnWorkItem& w = work[static_cast<std::size_t>(i)];
    if (w.tile < 0 || static_cast<std::size_t>(w.tile) >= tiles.size() ||
        tiles[static_cast<std::size_t>(w.tile)].kind != TileKind::Full || w.num_tiles != 1)
      raise(ErrorKind::InvalidInput, std::string(where) + ": wide item " + std::to_string(i) +
                                         " names no single Full tile of the list (tile " + std::to_string(w.tile) + ")");
    std::vector<int32_t>& mine = items_of[static_cast<std::size_t>(w.tile)];
    if (mine.empty()) first_seen.push_back(w.tile);
    mine.push_back(i);
  }
  struct Run {
    int64_t window;
    std::vector<int> tiles;
    bool alone = false;  // a tile with only some of its (chunk, head) items: those, as they were
  };
  std::vector<Run> runs;
  std::map<std::tuple<int, int, int, int, int, int, int64_t>, std::size_t> run_of;  // (key block, q_len, window) -> run
  for (const int ti : first_seen) {
    const AttnTile& t = tiles[static_cast<std::size_t>(ti)];
    const int64_t window = t.q_begin / max_rows;
    // A tile joins its key block's runs when its wide items are every (chunk, head) a Full tile
    // has (distinct ones: make_backward_work gives each once); else it is a run of its own.
    const auto num_items = static_cast<int64_t>(items_of[static_cast<std::size_t>(ti)].size());
    if (num_items != int64_t{t.kv_len / kAttnBackwardChunkRows} * (t.kv_head_end - t.kv_head_begin)) {
      runs.push_back({window, {ti}, true});
      continue;
    }
    const auto key = std::make_tuple(t.kv_begin, t.kv_len, dkv_row0(t), t.kv_head_begin, t.kv_head_end, t.q_len, window);
    const auto [it, added] = run_of.emplace(key, runs.size());
    if (added) runs.push_back({window, {}});
    runs[it->second].tiles.push_back(ti);
  }
  std::stable_sort(runs.begin(), runs.end(), [](const Run& a, const Run& b) { return a.window < b.window; });
  std::vector<AttnWorkItem> out;
  out.reserve(work.size());
  for (const Run& run : runs) {
    const auto first = static_cast<int32_t>(tiles.size());
    int64_t rows = 0;
    for (const int ti : run.tiles) {
      const AttnTile copy = tiles[static_cast<std::size_t>(ti)];
      rows += copy.q_len;
      tiles.push_back(copy);
    }
    const AttnTile& t = tiles[static_cast<std::size_t>(first)];
    if (run.alone) {
      for (const int32_t i : items_of[static_cast<std::size_t>(run.tiles[0])]) {
        AttnWorkItem w = work[static_cast<std::size_t>(i)];
        w.tile = first;
        out.push_back(w);
      }
      continue;
    }
    const int chunks = t.kv_len / kAttnBackwardChunkRows;
    auto push = [&](int c, int h) {
      AttnWorkItem w{first, c, h, 0};
      w.num_tiles = static_cast<int32_t>(run.tiles.size());
      out.push_back(w);
    };
    if (rows >= kAttnHeadMajorRows) {
      for (int h = t.kv_head_begin; h < t.kv_head_end; ++h)
        for (int c = 0; c < chunks; ++c) push(c, h);
    } else {
      for (int c = 0; c < chunks; ++c)
        for (int h = t.kv_head_begin; h < t.kv_head_end; ++h) push(c, h);
    }
  }
  const auto wide = static_cast<int32_t>(out.size());
  out.insert(out.end(), work.begin() + num_wide, work.end());
  work = std::move(out);
  return wide;
}

int32_t order_backward_turns(std::span<AttnWorkItem> work, std::span<const AttnTile> tiles, const AttnShape& shape) {
  const char* where = "order_backward_turns";
  validate(tiles, shape, where);
  // Tiles sharing dK / dV rows of a kv head must share their kv rows (key_blocks raises
  // otherwise), so the items adding to one chunk's rows are those of one (key block, chunk, head).
  key_blocks(tiles, shape.num_kv_heads, where);
  std::map<std::tuple<int, int, int>, std::vector<std::size_t>> adders;  // (dK/dV row, chunk, head) -> items
  for (std::size_t i = 0; i < work.size(); ++i) {
    AttnWorkItem& w = work[i];
    if (w.tile < 0 || static_cast<std::size_t>(w.tile) >= tiles.size())
      raise(ErrorKind::InvalidInput, std::string(where) + ": work item " + std::to_string(i) + " names tile " +
                                         std::to_string(w.tile) + " of " + std::to_string(tiles.size()));
    w.dkv_sem = -1;
    w.dkv_rank = 0;
    adders[{dkv_row0(tiles[static_cast<std::size_t>(w.tile)]), w.chunk, w.head}].push_back(i);
  }
  int64_t semaphores = 0;
  for (const auto& [key, items] : adders) {
    if (items.size() < 2) continue;  // one writer: no turn to wait for
    if (semaphores == std::numeric_limits<int32_t>::max()) raise(ErrorKind::InvalidInput, std::string(where) + ": too many turns");
    int32_t rank = 0;
    for (const std::size_t i : items) {  // list order: an item waits only for items launched before it
      work[i].dkv_sem = static_cast<int32_t>(semaphores);
      work[i].dkv_rank = rank++;
    }
    ++semaphores;
  }
  return static_cast<int32_t>(semaphores);
}

namespace {

// Where a tile stands in a deterministic key-block walk (make_deterministic_backward_work): 0 when
// every key chunk walks all of its q rows (a Full tile; a Partial tile whose every chunk's span is
// the whole tile), 1 when every chunk starts on the first row but some end earlier (a sliding
// window's lower edge), 2 when the chunks start on different rows or some skip the tile (a causal
// diagonal; a Partial tile without spans, whose chunks' walks are unknown).
int walk_order(const AttnTile& t, std::span<const uint8_t> cells) {
  if (t.kind == TileKind::Full) return 0;
  if (t.kind != TileKind::Partial || cells.empty() || t.spans_begin < 0) return 2;
  const int key_chunks = (t.kv_len + kAttnBackwardChunkRows - 1) / kAttnBackwardChunkRows;
  const int subs = (t.q_len + kAttnCellRows - 1) / kAttnCellRows;
  int order = 0;
  for (int c = 0; c < key_chunks; ++c) {
    const auto [first, end] = key_chunk_rows(t, cells, c, "make_deterministic_backward_work");
    if (first != 0 || end <= first) return 2;
    if (end != subs) order = 1;
  }
  return order;
}

}  // namespace

DeterministicBackwardWork make_deterministic_backward_work(std::span<const AttnTile> tiles, const AttnShape& shape, int unit_rows,
                                                           std::span<const uint8_t> cells) {
  const char* where = "make_deterministic_backward_work";
  validate(tiles, shape, where);
  const int hq = shape.num_q_heads;
  const int hkv = shape.num_kv_heads;
  const int group = hq / hkv;
  auto dq_row0 = [](const AttnTile& t) { return t.dq_begin >= 0 ? t.dq_begin : t.q_begin; };
  // Work of a tile for one head, in key rows x q rows (a causal diagonal tile: half).
  auto area = [](const AttnTile& t, int keys) {
    return static_cast<double>(keys) * t.q_len * (t.kind == TileKind::CausalDiagonal ? 0.5 : 1.0);
  };
  DeterministicBackwardWork out;

  // dK / dV pass: units of key blocks per kv head, cut (unit_rows > 0) into runs of at most
  // unit_rows q rows; items (unit, chunk, head), those of a (key block, head) together and these
  // groups heaviest first, and the turns of a cut key block's units in that order, so that an
  // item waits only for items launched before it. Together: the CTAs running at once share the Q
  // and dO rows of a few key blocks' tiles in L2 (items sorted one by one interleave every key
  // block's chunk c, a working set of all of them).
  const std::vector<std::vector<std::vector<int>>> members = key_blocks(tiles, hkv, where);
  std::vector<int8_t> order(tiles.size());  // each tile's walk_order, read once from its spans
  for (std::size_t i = 0; i < tiles.size(); ++i) order[i] = static_cast<int8_t>(walk_order(tiles[i], cells));
  struct Item {
    AttnWorkItem w;        // inside a group, items run by (chunk, head)
    std::size_t turn_key;  // (block, head, chunk) of a cut key block; SIZE_MAX: alone
    std::size_t group;     // (block, head), or (block) for a chunk-major key block
  };
  std::vector<Item> items;
  std::vector<double> group_cost;
  std::size_t turn_keys = 0;
  std::vector<std::pair<int, int>> walk;  // a unit's tiles: (walk_order, tile)
  for (const auto& block : members) {
    // A key block whose every tile has walk order 2 (a causal diagonal: chunk c from row 128 c) gains
    // nothing from its chunks walking in step: its items run chunk-major, chunk c of every kv head
    // together and the longest chunks first, as the default backward runs a diagonal.
    bool chunk_major = true;
    for (const std::vector<int>& m : block)
      for (const int i : m) chunk_major = chunk_major && order[static_cast<std::size_t>(i)] == 2;
    std::size_t block_group = SIZE_MAX;
    for (int h = 0; h < hkv; ++h) {
      const std::vector<int>& m = block[static_cast<std::size_t>(h)];
      if (m.empty()) continue;
      if (!chunk_major || block_group == SIZE_MAX) {
        block_group = group_cost.size();
        group_cost.push_back(0.0);
      }
      const std::size_t g = block_group;
      const int kv_len = tiles[static_cast<std::size_t>(m[0])].kv_len;
      const int chunks = (kv_len + kAttnBackwardChunkRows - 1) / kAttnBackwardChunkRows;
      std::vector<std::pair<int, int>> units;  // (first tile in dkv_tiles, tiles)
      int rows = 0;
      // A unit's walk: the tiles whose chunks walk every q row first (Full tiles), then those whose
      // chunks start on the first row, then the rest (a causal diagonal), each part in list order
      // (walk_order). The items of a (key block, head), one per key chunk, start together
      // and walk the same tiles in step, so the CTAs running at once read the same Q and dO rows
      // from L2. A diagonal's chunks see different numbers of q rows (chunk c from row 128 c):
      // walked first, it leaves the chunks up to a tile apart for the rest of the walk, and the
      // rows in flight outgrow L2 (sequence list, B 2048: 63 % of the one-pass kernel's requests
      // hit L2, against 93 % on the same tiles without the diagonals).
      walk.clear();
      for (const int i : m) walk.emplace_back(order[static_cast<std::size_t>(i)], i);
      std::stable_sort(walk.begin(), walk.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      for (const int i : walk | std::views::values) {
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
          items.push_back(Item{w, key, g});
          group_cost[g] += cost;
        }
      }
    }
  }
  std::stable_sort(items.begin(), items.end(), [&](const Item& a, const Item& b) {
    const double ca = group_cost[a.group], cb = group_cost[b.group];
    return ca > cb || (ca == cb && std::tie(a.group, a.w.chunk, a.w.head) < std::tie(b.group, b.w.chunk, b.w.head));
  });
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
