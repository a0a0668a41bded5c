// Masks: factories, validation, per-row ranges and the closed-form pieces.
//
// Every kind is defined by its per-row formula (row_ranges). pieces() compiles the same formula
// into a few trapezoids; the tests check both against a per-token evaluation.
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "dcp/detail/area.h"
#include "dcp/error.h"
#include "dcp/mask.h"

namespace dcp {

const char* to_string(MaskKind kind) {
  switch (kind) {
    case MaskKind::Full: return "full";
    case MaskKind::Causal: return "causal";
    case MaskKind::Lambda: return "lambda";
    case MaskKind::CausalBlockwise: return "causal_blockwise";
    case MaskKind::SharedQuestion: return "shared_question";
    case MaskKind::Ranges: return "ranges";
    case MaskKind::Chunked: return "chunked";
  }
  return "unknown";
}

Mask Mask::lambda(int64_t sink, int64_t window) {
  Mask m{.kind = MaskKind::Lambda};
  m.sink = sink;
  m.window = window;
  return m;
}

Mask Mask::causal_blockwise(int64_t block, int64_t local_blocks, int64_t sink_blocks) {
  Mask m{.kind = MaskKind::CausalBlockwise};
  m.block = block;
  m.local_blocks = local_blocks;
  m.sink_blocks = sink_blocks;
  return m;
}

Mask Mask::chunked(int64_t chunk) {
  Mask m{.kind = MaskKind::Chunked};
  m.block = chunk;
  return m;
}

Mask Mask::shared_question_for(int64_t length, double question_fraction, int num_answers) {
  if (length < 0) {
    raise(ErrorKind::InvalidInput,
          "shared_question_for: length must be >= 0 (got " + std::to_string(length) + ")");
  }
  if (!(question_fraction >= 0.0 && question_fraction <= 1.0)) {
    raise(ErrorKind::InvalidInput, "shared_question_for: question fraction must be in [0, 1] (got " +
                                       std::to_string(question_fraction) + ")");
  }
  if (num_answers < 1) {
    raise(ErrorKind::InvalidInput,
          "shared_question_for: number of answers must be >= 1 (got " + std::to_string(num_answers) + ")");
  }
  Mask m{.kind = MaskKind::SharedQuestion};
  m.question = std::clamp<int64_t>(std::llround(question_fraction * static_cast<double>(length)), 0, length);
  const int64_t rest = length - m.question;
  // Answers must be non-empty, so a short rest gets fewer answers than asked for.
  const int64_t count = std::min<int64_t>(num_answers, rest);
  for (int64_t k = 0; k < count; ++k) m.answers.push_back(rest / count + (k < rest % count ? 1 : 0));
  return m;
}

Mask Mask::ranges(std::vector<std::vector<Range>> rows) {
  Mask m{.kind = MaskKind::Ranges};
  m.rows = std::make_shared<const std::vector<std::vector<Range>>>(std::move(rows));
  return m;
}

namespace {

[[noreturn]] void bad(const std::string& where, const std::string& what) {
  raise(ErrorKind::InvalidInput, where + ": " + what);
}

std::string got(int64_t v) { return " (got " + std::to_string(v) + ")"; }

void validate_ranges(const Mask& m, int64_t length, const std::string& where) {
  if (!m.rows) bad(where, "rows is missing for a 'ranges' mask");
  const auto& rows = *m.rows;
  if (static_cast<int64_t>(rows.size()) != length) {
    bad(where, "rows must have one entry per token (expected " + std::to_string(length) + ", got " +
                   std::to_string(rows.size()) + ")");
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    int64_t prev_end = 0;
    for (size_t j = 0; j < rows[i].size(); ++j) {
      const Range& r = rows[i][j];
      const std::string field = "rows[" + std::to_string(i) + "][" + std::to_string(j) + "]";
      const std::string value = " (got [" + std::to_string(r.begin) + ", " + std::to_string(r.end) + "))";
      if (r.begin >= r.end) bad(where, field + " must have begin < end" + value);
      if (r.begin < 0 || r.end > length) {
        bad(where, field + " must lie inside [0, " + std::to_string(length) + ")" + value);
      }
      if (j > 0 && r.begin < prev_end) {
        bad(where, field + " must start at or after the end of the previous range (" +
                       std::to_string(prev_end) + "): ranges are sorted and disjoint" + value);
      }
      prev_end = r.end;
    }
  }
}

}  // namespace

void Mask::validate(int64_t length, const std::string& where) const {
  if (length < 0) bad(where, "sequence length must be >= 0" + got(length));
  switch (kind) {
    case MaskKind::Full:
    case MaskKind::Causal: return;
    case MaskKind::Lambda:
      if (sink < 0) bad(where, "sink must be >= 0" + got(sink));
      if (window < 1) bad(where, "window must be >= 1" + got(window));
      return;
    case MaskKind::CausalBlockwise:
      if (block <= 0) bad(where, "block must be > 0" + got(block));
      if (local_blocks < 0) bad(where, "local_blocks must be >= 0" + got(local_blocks));
      if (sink_blocks < 0) bad(where, "sink_blocks must be >= 0" + got(sink_blocks));
      return;
    case MaskKind::Chunked:
      if (block <= 0) bad(where, "chunk must be > 0" + got(block));
      return;
    case MaskKind::SharedQuestion: {
      if (question < 0) bad(where, "question must be >= 0" + got(question));
      if (question > length) {
        bad(where, "question exceeds the sequence length " + std::to_string(length) + got(question));
      }
      int64_t total = question;
      for (size_t k = 0; k < answers.size(); ++k) {
        const std::string field = "answers[" + std::to_string(k) + "]";
        if (answers[k] <= 0) bad(where, field + " must be > 0" + got(answers[k]));
        if (answers[k] > length - total) {
          bad(where, "question + answers[0.." + std::to_string(k) + "] exceeds the sequence length " +
                         std::to_string(length) + got(total + std::min(answers[k], length)));
        }
        total += answers[k];
      }
      if (total != length) {
        bad(where, "question + sum(answers) must equal the sequence length (expected " +
                       std::to_string(length) + ", got " + std::to_string(total) + ")");
      }
      return;
    }
    case MaskKind::Ranges: validate_ranges(*this, length, where); return;
  }
}

namespace {

// Appends r to out, merging with the last range when they overlap or touch; drops empty ones.
void push_canonical(std::vector<Range>& out, Range r) {
  if (r.begin >= r.end) return;
  if (!out.empty() && r.begin <= out.back().end) {
    out.back().end = std::max(out.back().end, r.end);
    return;
  }
  out.push_back(r);
}

// Number of mask blocks of a causal_blockwise mask over `length` tokens (length >= 1).
int64_t num_mask_blocks(int64_t length, int64_t block) { return (length - 1) / block + 1; }

}  // namespace

void Mask::row_ranges(int64_t i, int64_t length, std::vector<Range>& out) const {
  out.clear();
  switch (kind) {
    case MaskKind::Full: push_canonical(out, {0, length}); return;
    case MaskKind::Causal: push_canonical(out, {0, i + 1}); return;
    case MaskKind::Lambda: {
      // Both ranges start at or below i + 1, so they are in order; push_canonical merges them.
      push_canonical(out, {0, std::min(sink, i + 1)});
      const int64_t lo = window > i ? 0 : i - window + 1;
      push_canonical(out, {lo, i + 1});
      return;
    }
    case MaskKind::CausalBlockwise: {
      const int64_t b = i / block;
      const int64_t nb = num_mask_blocks(length, block);
      if (b < sink_blocks || b == nb - 1) {
        push_canonical(out, {0, i + 1});
        return;
      }
      // Here sink_blocks <= b < nb - 1, so the products stay below the length.
      const int64_t sink_end = sink_blocks * block;
      const int64_t local_begin = local_blocks >= b ? 0 : (b - local_blocks) * block;
      push_canonical(out, {0, sink_end});
      push_canonical(out, {std::max(sink_end, local_begin), i + 1});
      return;
    }
    case MaskKind::SharedQuestion: {
      if (i < question) {
        push_canonical(out, {0, i + 1});
        return;
      }
      int64_t start = question;
      for (int64_t a : answers) {
        if (i < start + a) break;
        start += a;
      }
      push_canonical(out, {0, question});
      push_canonical(out, {start, i + 1});
      return;
    }
    case MaskKind::Ranges:
      for (const Range& r : (*rows)[static_cast<size_t>(i)]) push_canonical(out, r);
      return;
    case MaskKind::Chunked: push_canonical(out, {i / block * block, i + 1}); return;
  }
}

namespace {

constexpr AffineBound constant(int64_t c) { return {c, 0}; }
constexpr AffineBound diagonal(int64_t c) { return {c, 1}; }  // c + row

void add_piece(std::vector<MaskPiece>& out, int64_t r0, int64_t r1, AffineBound lo, AffineBound hi) {
  if (r0 < r1) out.push_back({r0, r1, lo, hi});
}

// Explicit ranges, coalesced: a range of row i extends a piece of row i-1 when both of its ends
// moved by the piece's slopes (0 or 1; a one-row piece still chooses its slopes). Causal,
// windowed and constant runs written out as ranges thus become a single piece each.
std::vector<MaskPiece> ranges_pieces(const std::vector<std::vector<Range>>& rows) {
  struct Open {
    MaskPiece piece;
    int64_t lo_prev = 0;  // bounds on the last row of the piece
    int64_t hi_prev = 0;
    bool slopes_known = false;
  };
  std::vector<MaskPiece> done;
  std::vector<Open> open;
  std::vector<Open> next;
  const auto fits = [](const Open& o, const Range& r) {
    const int64_t dl = r.begin - o.lo_prev;
    const int64_t dh = r.end - o.hi_prev;
    if (o.slopes_known) return dl == o.piece.lo.slope && dh == o.piece.hi.slope;
    return (dl == 0 || dl == 1) && (dh == 0 || dh == 1);
  };
  const int64_t num_rows = static_cast<int64_t>(rows.size());
  for (int64_t i = 0; i < num_rows; ++i) {
    next.clear();
    size_t p = 0;
    for (const Range& r : rows[static_cast<size_t>(i)]) {
      // Open pieces are sorted by lo_prev; those that end too far left cannot take r or later ranges.
      while (p < open.size() && open[p].lo_prev + 1 < r.begin) done.push_back(open[p++].piece);
      if (p < open.size() && fits(open[p], r)) {
        Open o = open[p++];
        if (!o.slopes_known) {
          o.piece.lo.slope = r.begin - o.lo_prev;
          o.piece.hi.slope = r.end - o.hi_prev;
          o.piece.lo.c = r.begin - o.piece.lo.slope * i;
          o.piece.hi.c = r.end - o.piece.hi.slope * i;
          o.slopes_known = true;
        }
        o.piece.row_end = i + 1;
        o.lo_prev = r.begin;
        o.hi_prev = r.end;
        next.push_back(o);
      } else {
        next.push_back({{i, i + 1, constant(r.begin), constant(r.end)}, r.begin, r.end, false});
      }
    }
    while (p < open.size()) done.push_back(open[p++].piece);
    std::swap(open, next);
  }
  for (const Open& o : open) done.push_back(o.piece);
  std::stable_sort(done.begin(), done.end(),
                   [](const MaskPiece& a, const MaskPiece& b) { return a.row_begin < b.row_begin; });
  return done;
}

}  // namespace

std::vector<MaskPiece> Mask::pieces(int64_t length) const {
  std::vector<MaskPiece> out;
  if (length <= 0) return out;
  const int64_t L = length;
  switch (kind) {
    case MaskKind::Full: add_piece(out, 0, L, constant(0), constant(L)); break;
    case MaskKind::Causal: add_piece(out, 0, L, constant(0), diagonal(1)); break;
    case MaskKind::Lambda: {
      // Rows i < sink + window see [0, i+1) (the two ranges touch); later rows see [0, sink) and
      // the window, separated by a gap. Clamping to L keeps sums from overflowing.
      const int64_t s = std::min(sink, L);
      const int64_t w = std::min(window, L);
      const int64_t split = std::min(L, s + w);
      add_piece(out, 0, split, constant(0), diagonal(1));
      if (s > 0) add_piece(out, split, L, constant(0), constant(s));
      add_piece(out, split, L, diagonal(1 - w), diagonal(1));
      break;
    }
    case MaskKind::CausalBlockwise: {
      // Blocks b <= sink_blocks + local_blocks and the last block are causal; each middle block
      // sees the sink blocks and its own local window, separated by a gap.
      const int64_t m = block;
      const int64_t nb = num_mask_blocks(L, m);
      const int64_t sb = std::min(sink_blocks, nb);
      const int64_t lb = std::min(local_blocks, nb);
      const int64_t first_middle = sb + lb + 1;
      if (first_middle >= nb - 1) {
        add_piece(out, 0, L, constant(0), diagonal(1));
        break;
      }
      const int64_t last_begin = (nb - 1) * m;
      add_piece(out, 0, first_middle * m, constant(0), diagonal(1));
      if (sb > 0) add_piece(out, first_middle * m, last_begin, constant(0), constant(sb * m));
      for (int64_t b = first_middle; b < nb - 1; ++b) {
        add_piece(out, b * m, (b + 1) * m, constant((b - lb) * m), diagonal(1));
      }
      add_piece(out, last_begin, L, constant(0), diagonal(1));
      break;
    }
    case MaskKind::SharedQuestion: {
      // The question and the first answer form one causal run; later answers see the question
      // and their own causal prefix.
      const int64_t first_end = answers.empty() ? L : question + answers.front();
      add_piece(out, 0, first_end, constant(0), diagonal(1));
      if (question > 0) add_piece(out, first_end, L, constant(0), constant(question));
      int64_t start = first_end;
      for (size_t k = 1; k < answers.size(); ++k) {
        add_piece(out, start, start + answers[k], constant(start), diagonal(1));
        start += answers[k];
      }
      break;
    }
    case MaskKind::Ranges: return ranges_pieces(*rows);
    case MaskKind::Chunked:
      // One causal triangle per chunk, starting at the chunk's first key.
      for (int64_t c = 0; c < L; c += block) add_piece(out, c, std::min(L, c + block), constant(c), diagonal(1));
      break;
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const MaskPiece& a, const MaskPiece& b) { return a.row_begin < b.row_begin; });
  return out;
}

int64_t Mask::area(int64_t length) const {
  int64_t total = 0;
  if (kind == MaskKind::Ranges) {
    for (const auto& row : *rows)
      for (const Range& r : row) total += r.end - r.begin;
    return total;
  }
  for (const MaskPiece& p : pieces(length)) total += piece_area(p, p.row_begin, p.row_end, 0, length);
  return total;
}

}  // namespace dcp
