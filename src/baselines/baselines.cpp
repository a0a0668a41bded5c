// Static context parallelism as placements.
//
// Every cutting baseline (ring, zigzag, ulysses, a2a_p2p) describes each sequence as a list of
// pieces in sequence order; each non-empty piece becomes one token block with a home device and
// a "compute slot": the tiles whose queries lie in the piece run on device
// slot_base + head_group % head_degree. Ring-like methods have head_degree 1 (queries stay);
// head-parallel methods spread the head groups over the head_degree devices of a slot.
#include "dcp/baselines.h"

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string>

#include "dcp/error.h"

namespace dcp {

const char* to_string(BaselineKind kind) {
  switch (kind) {
    case BaselineKind::Ring: return "ring";
    case BaselineKind::Zigzag: return "zigzag";
    case BaselineKind::Ulysses: return "ulysses";
    case BaselineKind::A2AP2P: return "a2a_p2p";
    case BaselineKind::Packing: return "packing";
  }
  return "unknown";
}

std::vector<BaselineKind> all_baselines() {
  return {BaselineKind::Ring, BaselineKind::Zigzag, BaselineKind::Ulysses, BaselineKind::A2AP2P,
          BaselineKind::Packing};
}

namespace {

struct Piece {
  int64_t length = 0;
  int32_t home = 0;
  int32_t slot_base = 0;  // first device of the slot computing this piece's query tiles
};

// Size of chunk i of n when `length` tokens are cut as evenly as possible, the first chunks
// taking the remainder.
int64_t even_chunk(int64_t length, int n, int i) {
  return length / n + (i < length % n ? 1 : 0);
}

int num_head_groups(const AttentionShape& shape, const BlockOptions& opts) {
  const int q_per_group = opts.q_heads_per_group > 0 ? opts.q_heads_per_group : shape.group_ratio();
  return shape.q_heads / q_per_group;
}

// Largest divisor of n that also divides m.
int largest_common_divisor(int n, int m) { return std::gcd(n, m); }

// Pieces of one sequence for each cutting method.
void ring_pieces(int64_t length, int num_devices, std::vector<Piece>& out) {
  for (int d = 0; d < num_devices; ++d) out.push_back({even_chunk(length, num_devices, d), d, d});
}

void zigzag_pieces(int64_t length, int num_devices, std::vector<Piece>& out) {
  const int num_chunks = 2 * num_devices;
  for (int c = 0; c < num_chunks; ++c) {
    const int32_t owner = c < num_devices ? c : num_chunks - 1 - c;
    out.push_back({even_chunk(length, num_chunks, c), owner, owner});
  }
}

void ulysses_pieces(int64_t length, int num_devices, int head_degree, std::vector<Piece>& out) {
  for (int p = 0; p < num_devices; ++p) {
    out.push_back({even_chunk(length, num_devices, p), p, (p / head_degree) * head_degree});
  }
}

// Zigzag over `num_slots` slots of `head_degree` devices; every zigzag chunk is sub-cut into one
// piece per device of its slot.
void a2a_p2p_pieces(int64_t length, int num_slots, int head_degree, std::vector<Piece>& out) {
  const int num_chunks = 2 * num_slots;
  for (int c = 0; c < num_chunks; ++c) {
    const int slot = c < num_slots ? c : num_chunks - 1 - c;
    const int64_t chunk = even_chunk(length, num_chunks, c);
    const int32_t base = slot * head_degree;
    for (int j = 0; j < head_degree; ++j) {
      out.push_back({even_chunk(chunk, head_degree, j), base + j, base});
    }
  }
}

struct CutMethod {
  BaselineKind kind;
  int num_devices;
  int head_degree;  // devices sharing a slot by head groups (1 = queries stay on their home)
  int num_slots;    // a2a_p2p only
};

PlacedBatch make_cut_baseline(const CutMethod& m, const Batch& batch, const BlockOptions& opts,
                              std::string note) {
  const int num_seqs = static_cast<int>(batch.sequences.size());
  std::vector<std::vector<int64_t>> cuts(num_seqs);
  std::vector<Piece> block_pieces;  // one per non-empty piece, in global block order
  std::vector<Piece> pieces;
  int num_short = 0;
  for (int s = 0; s < num_seqs; ++s) {
    const int64_t length = batch.sequences[s].length;
    pieces.clear();
    switch (m.kind) {
      case BaselineKind::Ring: ring_pieces(length, m.num_devices, pieces); break;
      case BaselineKind::Zigzag: zigzag_pieces(length, m.num_devices, pieces); break;
      case BaselineKind::Ulysses: ulysses_pieces(length, m.num_devices, m.head_degree, pieces); break;
      case BaselineKind::A2AP2P: a2a_p2p_pieces(length, m.num_slots, m.head_degree, pieces); break;
      case BaselineKind::Packing: DCP_ASSERT(false);
    }
    cuts[s].push_back(0);
    bool has_empty = false;
    for (const Piece& p : pieces) {
      if (p.length == 0) {
        has_empty = true;
        continue;
      }
      cuts[s].push_back(cuts[s].back() + p.length);
      block_pieces.push_back(p);
    }
    DCP_ASSERT(cuts[s].back() == length);
    if (has_empty) ++num_short;
  }

  PlacedBatch out{build_block_table_with_cuts(batch, opts, cuts), {}};
  const BlockTable& table = out.table;
  DCP_ASSERT_MSG(table.num_token_blocks() == static_cast<int>(block_pieces.size()),
                 "block table does not have one token block per cut");
  Placement& pl = out.placement;
  pl.method = to_string(m.kind);
  pl.num_devices = m.num_devices;
  pl.block_home.resize(block_pieces.size());
  for (size_t b = 0; b < block_pieces.size(); ++b) pl.block_home[b] = block_pieces[b].home;
  pl.tile_device.resize(table.tiles.size());
  for (size_t t = 0; t < table.tiles.size(); ++t) {
    const Tile& tile = table.tiles[t];
    pl.tile_device[t] = block_pieces[tile.q_block].slot_base + tile.head_group % m.head_degree;
  }
  if (num_short > 0) {
    note += "; " + std::to_string(num_short) +
            " sequence(s) shorter than the number of chunks (empty chunks skipped)";
  }
  pl.note = std::move(note);
  return out;
}

PlacedBatch make_packing(const Batch& batch, const BlockOptions& opts, int num_devices) {
  PlacedBatch out{build_block_table(batch, opts), {}};
  const BlockTable& table = out.table;
  const int num_seqs = table.num_sequences();
  // Mask area is proportional to forward FLOPs (same shape for every sequence) and exact.
  std::vector<int64_t> seq_area(num_seqs, 0);
  for (const Tile& t : table.tiles) seq_area[t.seq] += t.area;
  std::vector<int> order(num_seqs);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    if (seq_area[a] != seq_area[b]) return seq_area[a] > seq_area[b];
    if (table.seq_length[a] != table.seq_length[b]) return table.seq_length[a] > table.seq_length[b];
    return a < b;
  });
  std::vector<int64_t> load(num_devices, 0);
  std::vector<int32_t> seq_device(num_seqs, 0);
  for (int s : order) {
    const auto least = std::min_element(load.begin(), load.end());  // first on ties
    seq_device[s] = static_cast<int32_t>(least - load.begin());
    *least += seq_area[s];
  }
  Placement& pl = out.placement;
  pl.method = to_string(BaselineKind::Packing);
  pl.num_devices = num_devices;
  pl.block_home.resize(table.token_blocks.size());
  for (size_t b = 0; b < table.token_blocks.size(); ++b) {
    pl.block_home[b] = seq_device[table.token_blocks[b].seq];
  }
  pl.tile_device.resize(table.tiles.size());
  for (size_t t = 0; t < table.tiles.size(); ++t) pl.tile_device[t] = seq_device[table.tiles[t].seq];

  const int64_t max_load = *std::max_element(load.begin(), load.end());
  const int64_t total = std::accumulate(load.begin(), load.end(), int64_t{0});
  const int num_idle = static_cast<int>(std::count(load.begin(), load.end(), int64_t{0}));
  std::string note = std::to_string(num_seqs) + " whole sequence(s) on " +
                     std::to_string(num_devices) + " device(s), longest first";
  if (total > 0) {
    const double ratio = static_cast<double>(max_load) * num_devices / static_cast<double>(total);
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3f", ratio);
    note += "; compute max/mean " + std::string(buf);
  }
  if (num_idle > 0) note += "; " + std::to_string(num_idle) + " device(s) idle";
  pl.note = std::move(note);
  return out;
}

}  // namespace

PlacedBatch make_baseline(BaselineKind kind, const Batch& batch, const BlockOptions& opts,
                          const Cluster& cluster) {
  cluster.validate("cluster");
  batch.validate();
  opts.validate(batch.shape);
  const int num_devices = cluster.num_devices();
  const int num_groups = num_head_groups(batch.shape, opts);
  const std::string p_str = std::to_string(num_devices);
  const std::string g_str = std::to_string(num_groups);

  switch (kind) {
    case BaselineKind::Ring:
      return make_cut_baseline({kind, num_devices, 1, num_devices}, batch, opts,
                               "ring over " + p_str + " device(s): " + p_str +
                                   " contiguous chunks per sequence");
    case BaselineKind::Zigzag:
      return make_cut_baseline({kind, num_devices, 1, num_devices}, batch, opts,
                               "zigzag over " + p_str + " device(s): " +
                                   std::to_string(2 * num_devices) +
                                   " chunks per sequence, device d owns chunks d and " +
                                   std::to_string(2 * num_devices - 1) + "-d");
    case BaselineKind::Ulysses: {
      const int u = largest_common_divisor(num_devices, num_groups);
      std::string note = "ulysses degree " + std::to_string(u) + " x ring " +
                         std::to_string(num_devices / u);
      if (u < num_devices) {
        note += num_groups < num_devices
                    ? " (" + g_str + " head group(s) < " + p_str + " devices"
                    : " (" + g_str + " head group(s) not divisible by " + p_str + " devices";
        note += ": heads split " + std::to_string(u) + " ways, contiguous ring over the rest)";
      }
      return make_cut_baseline({kind, num_devices, u, num_devices / u}, batch, opts, note);
    }
    case BaselineKind::A2AP2P: {
      const int u = largest_common_divisor(cluster.devices_per_node, num_groups);
      const int r = num_devices / u;
      std::string note = "a2a degree " + std::to_string(u) + " x zigzag ring " +
                         std::to_string(r) + " (" + std::to_string(2 * r) +
                         " chunks per sequence, each cut into " + std::to_string(u) + " pieces";
      note += u == cluster.devices_per_node
                  ? "; ring slots = nodes)"
                  : "; " + g_str + " head group(s) do not fill " +
                        std::to_string(cluster.devices_per_node) +
                        " devices per node, so slots are " + std::to_string(u) +
                        " devices inside a node)";
      return make_cut_baseline({kind, num_devices, u, r}, batch, opts, note);
    }
    case BaselineKind::Packing:
      return make_packing(batch, opts, num_devices);
  }
  raise(ErrorKind::InvalidInput, "make_baseline: unknown baseline kind " +
                                     std::to_string(static_cast<int>(kind)));
}

}  // namespace dcp
