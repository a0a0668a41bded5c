// dcp/mask.h — attention masks: which keys each query row of one sequence may see.
//
// For query row i (0-based) of a sequence of length L the allowed keys are a sorted list of
// disjoint half-open ranges [begin, end) inside [0, L). Named kinds have closed forms; the
// generic kind `Ranges` stores explicit ranges with no limit on ranges per row.
//
// The closed forms are also compiled into MaskPieces: rectangles/trapezoids in (row, key)
// space whose key bounds are affine in the row with slope 0 or 1. Tile areas are sums over
// pieces computed with interval arithmetic (see area.h), never by visiting every token.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dcp {

struct Range {
  int64_t begin = 0;  // first allowed key
  int64_t end = 0;    // one past the last allowed key
  friend bool operator==(const Range&, const Range&) = default;
};

enum class MaskKind { Full, Causal, Lambda, CausalBlockwise, SharedQuestion, Ranges, Chunked };

const char* to_string(MaskKind kind);  // the JSON spelling: "full", "causal", "lambda", ...

// An affine key bound c + slope * row, slope in {0, 1}.
struct AffineBound {
  int64_t c = 0;
  int64_t slope = 0;
  int64_t at(int64_t row) const { return c + slope * row; }
};

// Rows [row_begin, row_end) each see keys [lo.at(row), hi.at(row)). Within one mask the pieces
// of a row are disjoint, and lo <= hi on every row of the piece.
struct MaskPiece {
  int64_t row_begin = 0;
  int64_t row_end = 0;
  AffineBound lo;
  AffineBound hi;
};

struct Mask {
  MaskKind kind = MaskKind::Causal;
  // Lambda (attention sink + sliding window): rows see [0, min(sink, i+1)) and
  // [max(0, i-window+1), i+1). Paper defaults.
  int64_t sink = 64;
  int64_t window = 4096;
  // CausalBlockwise: mask block size, local blocks and sink blocks (paper defaults 256/2/1).
  // Chunked (local attention in chunks, as Llama 4's chunked layers): rows see their own chunk
  // causally, [block * floor(i / block), i+1); `block` is the chunk size.
  int64_t block = 256;
  int64_t local_blocks = 2;
  int64_t sink_blocks = 1;
  // SharedQuestion: question length and answer lengths; question + sum(answers) == length.
  int64_t question = 0;
  std::vector<int64_t> answers{};
  // Ranges: rows[i] = the allowed ranges of row i (sorted, disjoint; may be empty).
  std::shared_ptr<const std::vector<std::vector<Range>>> rows{};

  static Mask full() { Mask m; m.kind = MaskKind::Full; return m; }
  static Mask causal() { Mask m; m.kind = MaskKind::Causal; return m; }
  static Mask lambda(int64_t sink = 64, int64_t window = 4096);
  static Mask causal_blockwise(int64_t block = 256, int64_t local_blocks = 2, int64_t sink_blocks = 1);
  static Mask chunked(int64_t chunk = 8192);
  // Question = `question_fraction` of the length, the rest split into `num_answers` answers.
  static Mask shared_question_for(int64_t length, double question_fraction = 0.2, int num_answers = 4);
  static Mask ranges(std::vector<std::vector<Range>> rows);

  // Throws InvalidInput naming `where` (e.g. "sequences[3].mask") and the field at fault if the
  // parameters do not fit a sequence of `length` tokens.
  void validate(int64_t length, const std::string& where) const;

  // Allowed key ranges of row i, canonical (sorted, disjoint, adjacent ranges merged, empty
  // ranges dropped). Appends to `out` after clearing it.
  void row_ranges(int64_t i, int64_t length, std::vector<Range>& out) const;

  // The mask as pieces (see MaskPiece). Pieces are sorted by row_begin.
  std::vector<MaskPiece> pieces(int64_t length) const;

  // Number of allowed (query, key) pairs over the whole sequence.
  int64_t area(int64_t length) const;
};

}  // namespace dcp
