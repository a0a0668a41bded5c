// The block table: token blocks, head groups and tiles with exact areas.
//
// Tile geometry depends only on the sequence (its length, mask and cuts), so it is computed
// once per sequence and replicated over head groups. For each q block the mask pieces that
// overlap its rows are walked; each piece touches a contiguous run of kv blocks (its key span
// over those rows), and its area inside each of them is summed by interval arithmetic. Work is
// proportional to (piece, kv block) incidences, never to tokens.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "dcp/detail/area.h"
#include "dcp/blocks.h"
#include "dcp/error.h"

namespace dcp {

const char* to_string(TileKind kind) {
  switch (kind) {
    case TileKind::Full: return "full";
    case TileKind::CausalDiagonal: return "causal_diagonal";
    case TileKind::Partial: return "partial";
  }
  return "unknown";
}

const char* to_string(DataKind kind) {
  switch (kind) {
    case DataKind::Q: return "Q";
    case DataKind::KV: return "KV";
    case DataKind::O: return "O";
    case DataKind::LSE: return "LSE";
    case DataKind::dO: return "dO";
    case DataKind::dQ: return "dQ";
    case DataKind::dKV: return "dKV";
    case DataKind::Delta: return "Delta";
  }
  return "unknown";
}

namespace {

// Local copy of the element size so that this part does not depend on batch.cpp.
int64_t dtype_size_bytes(DType t) {
  switch (t) {
    case DType::BF16:
    case DType::FP16: return 2;
    case DType::FP32: return 4;
  }
  return 2;
}

void check_heads(const AttentionShape& shape) {
  const std::string where = "block options: ";
  if (shape.q_heads < 1) raise(ErrorKind::InvalidInput, where + "shape.q_heads must be >= 1 (got " + std::to_string(shape.q_heads) + ")");
  if (shape.kv_heads < 1) raise(ErrorKind::InvalidInput, where + "shape.kv_heads must be >= 1 (got " + std::to_string(shape.kv_heads) + ")");
  if (shape.q_heads % shape.kv_heads != 0) {
    raise(ErrorKind::InvalidInput, where + "shape.q_heads (" + std::to_string(shape.q_heads) +
                                       ") must be a multiple of shape.kv_heads (" + std::to_string(shape.kv_heads) + ")");
  }
}

HeadGroups make_groups(const AttentionShape& shape, int requested) {
  check_heads(shape);
  const int ratio = shape.group_ratio();
  const int h = requested == 0 ? ratio : requested;
  const std::string what = "block options: --q-heads-per-group (q_heads_per_group) ";
  const std::string got = " (got " + std::to_string(requested) + ", q_heads " + std::to_string(shape.q_heads) +
                          ", kv_heads " + std::to_string(shape.kv_heads) + ")";
  if (h < 0) raise(ErrorKind::InvalidInput, what + "must be >= 0" + got);
  HeadGroups g;
  g.q_heads_per_group = h;
  if (h <= ratio) {
    if (ratio % h != 0) {
      raise(ErrorKind::InvalidInput, what + "must divide q_heads / kv_heads = " + std::to_string(ratio) + got);
    }
    g.kv_heads_per_group = 1;
    g.groups_per_kv_set = ratio / h;
  } else {
    if (h % ratio != 0 || shape.q_heads % h != 0) {
      raise(ErrorKind::InvalidInput, what + "above q_heads / kv_heads = " + std::to_string(ratio) +
                                         " must be a multiple of it that divides q_heads" + got);
    }
    g.kv_heads_per_group = h / ratio;
    g.groups_per_kv_set = 1;
  }
  g.num_groups = shape.q_heads / h;
  return g;
}

struct GeoTile {
  int32_t q_block = 0;  // local to the sequence
  int32_t kv_block = 0;
  TileKind kind = TileKind::Full;
  int64_t area = 0;
};

// Reusable buffers for the per-sequence walk (sized to the largest sequence).
struct Scratch {
  std::vector<int64_t> acc;
  std::vector<uint8_t> touched_mark;
  std::vector<int32_t> touched;
  std::vector<const MaskPiece*> active;
};

// Appends the tiles of one sequence, ordered by (q block, kv block).
// `cuts` are its block boundaries; `uniform_b` > 0 when all blocks but the last have that size.
// Stops (returning false) once more than `max_tiles` tiles were appended, so a caller checking a
// given tile list never pays for more geometry than the list could match.
bool sequence_geometry(const Mask& mask, int64_t length, const std::vector<int64_t>& cuts, int64_t uniform_b,
                       Scratch& s, std::vector<GeoTile>& out, size_t max_tiles = SIZE_MAX) {
  const size_t out_begin = out.size();
  const std::vector<MaskPiece> pieces = mask.pieces(length);
  const int32_t nb = static_cast<int32_t>(cuts.size()) - 1;
  s.acc.assign(static_cast<size_t>(nb), 0);
  s.touched_mark.assign(static_cast<size_t>(nb), 0);
  s.touched.clear();
  s.active.clear();
  const auto block_of = [&](int64_t key) -> int32_t {
    if (uniform_b > 0) return static_cast<int32_t>(key / uniform_b);
    return static_cast<int32_t>(std::upper_bound(cuts.begin(), cuts.end(), key) - cuts.begin()) - 1;
  };
  size_t next = 0;
  for (int32_t qb = 0; qb < nb; ++qb) {
    const int64_t q0 = cuts[static_cast<size_t>(qb)];
    const int64_t q1 = cuts[static_cast<size_t>(qb) + 1];
    while (next < pieces.size() && pieces[next].row_begin < q1) s.active.push_back(&pieces[next++]);
    std::erase_if(s.active, [q0](const MaskPiece* p) { return p->row_end <= q0; });
    for (const MaskPiece* p : s.active) {
      const int64_t ra = std::max(q0, p->row_begin);
      const int64_t rb = std::min(q1, p->row_end);
      if (ra >= rb) continue;
      // Slopes are >= 0, so the key span over the rows is [lo(first row), hi(last row)).
      const int64_t klo = std::max<int64_t>(0, p->lo.at(ra));
      const int64_t khi = std::min(length, p->hi.at(rb - 1));
      if (klo >= khi) continue;
      const int32_t kb_last = block_of(khi - 1);
      for (int32_t kb = block_of(klo); kb <= kb_last; ++kb) {
        const int64_t a = piece_area(*p, ra, rb, cuts[static_cast<size_t>(kb)], cuts[static_cast<size_t>(kb) + 1]);
        if (a == 0) continue;
        if (!s.touched_mark[static_cast<size_t>(kb)]) {
          s.touched_mark[static_cast<size_t>(kb)] = 1;
          s.touched.push_back(kb);
        }
        s.acc[static_cast<size_t>(kb)] += a;
      }
    }
    if (!std::is_sorted(s.touched.begin(), s.touched.end())) std::sort(s.touched.begin(), s.touched.end());
    const int64_t rows = q1 - q0;
    for (int32_t kb : s.touched) {
      const int64_t area = s.acc[static_cast<size_t>(kb)];
      const int64_t cols = cuts[static_cast<size_t>(kb) + 1] - cuts[static_cast<size_t>(kb)];
      TileKind kind = TileKind::Partial;
      if (area == rows * cols) {
        kind = TileKind::Full;
      } else if (kb == qb && area == rows * (rows + 1) / 2) {
        // Same count as the triangle keys <= row; it is the triangle iff all of it is allowed.
        int64_t inside = 0;
        for (const MaskPiece* p : s.active) inside += piece_area_causal(*p, q0, rows);
        if (inside == area) kind = TileKind::CausalDiagonal;
      }
      out.push_back({qb, kb, kind, area});
      s.acc[static_cast<size_t>(kb)] = 0;
      s.touched_mark[static_cast<size_t>(kb)] = 0;
    }
    s.touched.clear();
    if (out.size() - out_begin > max_tiles) return false;
  }
  return true;
}

// The keys [0, s) that rows read at any distance from them (an attention sink); 0 where the
// mask has none.
int64_t sink_tokens(const Mask& mask) {
  switch (mask.kind) {
    case MaskKind::Lambda: return mask.sink;
    case MaskKind::CausalBlockwise: return mask.block * mask.sink_blocks;
    default: return 0;
  }
}

void check_sequences(const Batch& batch) {
  for (size_t i = 0; i < batch.sequences.size(); ++i) {
    const Sequence& seq = batch.sequences[i];
    const std::string where = "sequences[" + std::to_string(i) + "]";
    if (seq.length < 1) {
      raise(ErrorKind::InvalidInput, where + ".length must be >= 1 (got " + std::to_string(seq.length) + ")");
    }
    seq.mask.validate(seq.length, where + ".mask");
  }
}

BlockTable build(const Batch& batch, const HeadGroups& groups, int64_t block_size,
                 const std::vector<std::vector<int64_t>>& cuts) {
  BlockTable t;
  t.shape = batch.shape;
  t.block_size = block_size;
  t.groups = groups;
  const size_t num_seqs = batch.sequences.size();
  t.seq_first_block.reserve(num_seqs + 1);
  t.seq_length.reserve(num_seqs);
  t.seq_mask.reserve(num_seqs);
  size_t num_blocks = 0;
  size_t max_blocks = 0;
  for (const auto& c : cuts) {
    num_blocks += c.size() - 1;
    max_blocks = std::max(max_blocks, c.size() - 1);
  }
  if (num_blocks > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    raise(ErrorKind::InvalidInput, "block table: too many token blocks (" + std::to_string(num_blocks) +
                                       "); use a larger --block (block_size)");
  }
  t.token_blocks.reserve(num_blocks);

  Scratch scratch;
  scratch.acc.reserve(max_blocks);
  scratch.touched_mark.reserve(max_blocks);
  scratch.touched.reserve(max_blocks);
  std::vector<GeoTile> geo;
  std::vector<size_t> geo_begin{0};
  int64_t global = 0;
  for (size_t s = 0; s < num_seqs; ++s) {
    const Sequence& seq = batch.sequences[s];
    t.seq_first_block.push_back(static_cast<int32_t>(t.token_blocks.size()));
    t.seq_length.push_back(seq.length);
    t.seq_mask.push_back(seq.mask);
    const auto& c = cuts[s];
    for (size_t b = 0; b + 1 < c.size(); ++b) {
      t.token_blocks.push_back({static_cast<int32_t>(s), static_cast<int32_t>(b), c[b], c[b + 1] - c[b], global + c[b]});
    }
    global += seq.length;
    sequence_geometry(seq.mask, seq.length, c, block_size, scratch, geo);
    geo_begin.push_back(geo.size());
  }
  t.seq_first_block.push_back(static_cast<int32_t>(t.token_blocks.size()));

  t.tiles.reserve(geo.size() * static_cast<size_t>(groups.num_groups));
  for (size_t s = 0; s < num_seqs; ++s) {
    const int32_t first = t.seq_first_block[s];
    for (int32_t g = 0; g < groups.num_groups; ++g) {
      for (size_t e = geo_begin[s]; e < geo_begin[s + 1]; ++e) {
        const GeoTile& x = geo[e];
        t.tiles.push_back({static_cast<int32_t>(s), g, first + x.q_block, first + x.kv_block, x.kind, x.area});
      }
    }
  }
  DCP_HEAVY_ASSERT((t.validate(), true));
  return t;
}

}  // namespace

void check_tiles_against_masks(const BlockTable& t) {
  auto invalid = [](const std::string& what) { raise(ErrorKind::InvalidPlan, "block table: " + what); };
  Scratch scratch;
  std::vector<GeoTile> geo;
  std::vector<int64_t> cuts;
  size_t next = 0;  // first tile of the sequence being checked
  for (int s = 0; s < t.num_sequences(); ++s) {
    const auto su = static_cast<size_t>(s);
    const int64_t length = t.seq_length[su];
    try {
      t.seq_mask[su].validate(length, "seq_mask[" + std::to_string(s) + "]");
    } catch (const Error& e) {
      invalid(e.what());
    }
    size_t end = next;
    while (end < t.tiles.size() && t.tiles[end].seq == s) ++end;
    const size_t given = end - next;
    const auto groups = static_cast<size_t>(t.groups.num_groups);
    const int32_t first = t.seq_first_block[su];
    cuts.clear();
    for (int32_t b = first; b < t.seq_first_block[su + 1]; ++b) cuts.push_back(t.token_blocks[static_cast<size_t>(b)].begin);
    cuts.push_back(length);
    geo.clear();
    const bool complete = sequence_geometry(t.seq_mask[su], length, cuts, t.block_size, scratch, geo, given / groups);
    if (!complete || geo.size() * groups != given)
      invalid("sequence " + std::to_string(s) + " has " + std::to_string(given) + " tiles, its mask makes " +
              (complete ? std::to_string(geo.size() * groups) : "more"));
    // Tiles are ordered by (seq, head group, q block, kv block): group g repeats the geometry.
    for (size_t i = 0; i < given; ++i) {
      const Tile& x = t.tiles[next + i];
      const GeoTile& want = geo[i % geo.size()];
      if (x.head_group != static_cast<int32_t>(i / geo.size()) || x.q_block != first + want.q_block ||
          x.kv_block != first + want.kv_block || x.kind != want.kind || x.area != want.area)
        invalid("tiles[" + std::to_string(next + i) + "] (seq " + std::to_string(s) + ", group " +
                std::to_string(x.head_group) + ", q " + std::to_string(x.q_block) + ", kv " + std::to_string(x.kv_block) +
                ", " + to_string(x.kind) + ", area " + std::to_string(x.area) + ") is not the tile its mask makes (q " +
                std::to_string(first + want.q_block) + ", kv " + std::to_string(first + want.kv_block) + ", " +
                to_string(want.kind) + ", area " + std::to_string(want.area) + ")");
    }
    next = end;
  }
  if (next != t.tiles.size()) invalid("tiles past the last sequence");
}

void BlockOptions::validate(const AttentionShape& shape) const {
  if (block_size <= 0 || block_size % 16 != 0) {
    raise(ErrorKind::InvalidInput, "block options: --block (block_size) must be a positive multiple of 16 (got " +
                                       std::to_string(block_size) + ")");
  }
  (void)make_groups(shape, q_heads_per_group);
}

BlockTable build_block_table(const Batch& batch, const BlockOptions& opts) {
  opts.validate(batch.shape);
  check_sequences(batch);
  std::vector<std::vector<int64_t>> cuts(batch.sequences.size());
  bool uniform = true;
  for (size_t s = 0; s < cuts.size(); ++s) {
    const int64_t len = batch.sequences[s].length;
    auto& c = cuts[s];
    c.reserve(static_cast<size_t>((len - 1) / opts.block_size + 3));
    for (int64_t b = 0; b < len; b += opts.block_size) c.push_back(b);
    c.push_back(len);
    const int64_t sink = opts.split_sink ? sink_tokens(batch.sequences[s].mask) : 0;
    if (sink > 0 && sink < std::min(opts.block_size, len)) {
      c.insert(c.begin() + 1, sink);
      uniform = false;
    }
  }
  return build(batch, make_groups(batch.shape, opts.q_heads_per_group), uniform ? opts.block_size : 0, cuts);
}

BlockTable build_block_table_with_cuts(const Batch& batch, const BlockOptions& opts,
                                       const std::vector<std::vector<int64_t>>& cuts) {
  const HeadGroups groups = make_groups(batch.shape, opts.q_heads_per_group);
  check_sequences(batch);
  if (cuts.size() != batch.sequences.size()) {
    raise(ErrorKind::InvalidInput, "block cuts: expected one cut list per sequence (" +
                                       std::to_string(batch.sequences.size()) + "), got " + std::to_string(cuts.size()));
  }
  for (size_t s = 0; s < cuts.size(); ++s) {
    const auto& c = cuts[s];
    const int64_t len = batch.sequences[s].length;
    const std::string where = "block cuts[" + std::to_string(s) + "]";
    if (c.size() < 2 || c.front() != 0 || c.back() != len) {
      raise(ErrorKind::InvalidInput, where + ": must start at 0 and end at the sequence length " + std::to_string(len));
    }
    for (size_t i = 1; i < c.size(); ++i) {
      if (c[i] <= c[i - 1]) {
        raise(ErrorKind::InvalidInput, where + ": must be strictly increasing (cut " + std::to_string(i) + " is " +
                                           std::to_string(c[i]) + " after " + std::to_string(c[i - 1]) + ")");
      }
    }
  }
  return build(batch, groups, 0, cuts);
}

int64_t BlockTable::total_tokens() const {
  int64_t total = 0;
  for (int64_t len : seq_length) total += len;
  return total;
}

int64_t BlockTable::total_area() const {
  int64_t total = 0;
  for (const Tile& t : tiles) total += t.area;
  return total;
}

double BlockTable::tile_flops_fwd(const Tile& t) const {
  return 4.0 * static_cast<double>(t.area) * shape.head_dim * groups.q_heads_per_group;
}

int64_t BlockTable::data_bytes(DataKind kind, int64_t tokens) const {
  const int64_t eb = dtype_size_bytes(shape.dtype);
  const int64_t qh = groups.q_heads_per_group;
  const int64_t kvh = groups.kv_heads_per_group;
  switch (kind) {
    case DataKind::Q:
    case DataKind::O:
    case DataKind::dO:
    case DataKind::dQ: return tokens * qh * shape.head_dim * eb;
    case DataKind::KV:
    case DataKind::dKV: return 2 * tokens * kvh * shape.head_dim * eb;
    case DataKind::LSE:
    case DataKind::Delta: return tokens * qh * 4;
  }
  return 0;
}

int64_t BlockTable::partial_bytes(DataKind kind, int64_t tokens) const {
  switch (kind) {
    case DataKind::O:
    case DataKind::dQ: return tokens * groups.q_heads_per_group * shape.head_dim * 4;
    case DataKind::dKV: return 2 * tokens * groups.kv_heads_per_group * shape.head_dim * 4;
    default: return data_bytes(kind, tokens);
  }
}

void BlockTable::tile_row_ranges(const Tile& t, int64_t row, std::vector<Range>& out) const {
  const TokenBlock& qb = token_blocks[static_cast<size_t>(t.q_block)];
  const TokenBlock& kb = token_blocks[static_cast<size_t>(t.kv_block)];
  DCP_ASSERT_MSG(row >= qb.begin && row < qb.begin + qb.length, "row " + std::to_string(row) + " outside the q block");
  seq_mask[static_cast<size_t>(t.seq)].row_ranges(row, seq_length[static_cast<size_t>(t.seq)], out);
  const int64_t k0 = kb.begin;
  const int64_t k1 = kb.begin + kb.length;
  size_t n = 0;
  for (const Range& r : out) {
    const Range c{std::max(r.begin, k0), std::min(r.end, k1)};
    if (c.begin < c.end) out[n++] = c;
  }
  out.resize(n);
}

}  // namespace dcp
