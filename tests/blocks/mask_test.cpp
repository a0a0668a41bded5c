// Masks: per-row ranges, pieces and areas against a per-token evaluation of the formulas.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "blocks/brute.h"
#include "dcp/error.h"
#include "dcp/mask.h"

namespace dcp {
namespace {

using test::Rng;

std::string describe(const Mask& m, int64_t L) {
  return std::string(to_string(m.kind)) + " L=" + std::to_string(L) + " sink=" + std::to_string(m.sink) +
         " window=" + std::to_string(m.window) + " block=" + std::to_string(m.block) +
         " local=" + std::to_string(m.local_blocks) + " sink_blocks=" + std::to_string(m.sink_blocks) +
         " question=" + std::to_string(m.question) + " answers=" + std::to_string(m.answers.size());
}

// Fixed lengths around the interesting boundaries plus random ones.
std::vector<int64_t> lengths(Rng& rng, int n) {
  std::vector<int64_t> out{1, 2, 3, 16, 17, 64, 300};
  for (int i = 0; i < n; ++i) out.push_back(rng.uniform(1, 300));
  return out;
}

TEST(Mask, RowRangesPiecesAndAreaMatchPerTokenFormulas) {
  Rng rng(0x5eed0001);
  int checked = 0;
  for (int64_t L : lengths(rng, 120)) {
    for (int rep = 0; rep < 3; ++rep) {
      const Mask m = test::random_mask(rng, L);
      SCOPED_TRACE(describe(m, L));
      ASSERT_NO_THROW(m.validate(L, "mask"));
      const std::vector<uint8_t> grid = test::allowed_grid(m, L);

      // (a) canonical row ranges.
      std::vector<Range> got;
      int64_t brute_area = 0;
      for (int64_t i = 0; i < L; ++i) {
        m.row_ranges(i, L, got);
        const std::vector<Range> want = test::grid_row_ranges(grid, L, i, 0, L);
        ASSERT_EQ(got, want) << "row " << i;
        for (const Range& r : want) brute_area += r.end - r.begin;
      }

      // (b) pieces cover every allowed pair exactly once and nothing else.
      const std::vector<MaskPiece> pieces = m.pieces(L);
      std::vector<int> cover(static_cast<size_t>(L * L), 0);
      for (size_t p = 0; p < pieces.size(); ++p) {
        const MaskPiece& pc = pieces[p];
        if (p > 0) {
          ASSERT_LE(pieces[p - 1].row_begin, pc.row_begin) << "pieces sorted by row_begin";
        }
        ASSERT_TRUE(pc.lo.slope == 0 || pc.lo.slope == 1);
        ASSERT_TRUE(pc.hi.slope == 0 || pc.hi.slope == 1);
        ASSERT_LE(0, pc.row_begin);
        ASSERT_LT(pc.row_begin, pc.row_end);
        ASSERT_LE(pc.row_end, L);
        for (int64_t i = pc.row_begin; i < pc.row_end; ++i) {
          ASSERT_LE(pc.lo.at(i), pc.hi.at(i)) << "piece " << p << " row " << i;
          ASSERT_LE(0, pc.lo.at(i));
          ASSERT_LE(pc.hi.at(i), L);
          for (int64_t k = pc.lo.at(i); k < pc.hi.at(i); ++k) ++cover[static_cast<size_t>(i * L + k)];
        }
      }
      for (int64_t c = 0; c < L * L; ++c) {
        ASSERT_EQ(cover[static_cast<size_t>(c)], grid[static_cast<size_t>(c)])
            << "pair (" << c / L << ", " << c % L << ")";
      }

      // (c) area.
      ASSERT_EQ(m.area(L), brute_area);
      ++checked;
    }
  }
  EXPECT_GT(checked, 300);
}

TEST(Mask, ClosedFormsAreCompact) {
  // Named kinds compile to a few pieces, and explicit ranges that follow a named kind coalesce.
  EXPECT_EQ(Mask::causal().pieces(100000).size(), 1u);
  EXPECT_EQ(Mask::lambda(64, 4096).pieces(131072).size(), 3u);
  const Mask lam = Mask::lambda(10, 61);
  std::vector<std::vector<Range>> rows(1000);
  for (int64_t i = 0; i < 1000; ++i) lam.row_ranges(i, 1000, rows[static_cast<size_t>(i)]);
  const Mask r = Mask::ranges(rows);
  ASSERT_NO_THROW(r.validate(1000, "mask"));
  EXPECT_LE(r.pieces(1000).size(), 6u);
  EXPECT_EQ(r.area(1000), lam.area(1000));
}

TEST(Mask, ParametersLargerThanTheSequence) {
  const int64_t L = 50;
  for (const Mask& m : {Mask::lambda(1000000, 1), Mask::lambda(0, 1000000), Mask::lambda(int64_t{1} << 62, int64_t{1} << 62),
                        Mask::causal_blockwise(1000000, 3, 1), Mask::causal_blockwise(7, 1000000, 1000000),
                        Mask::causal_blockwise(int64_t{1} << 62, int64_t{1} << 40, int64_t{1} << 40),
                        Mask::chunked(1000000), Mask::chunked(int64_t{1} << 62)}) {
    SCOPED_TRACE(describe(m, L));
    ASSERT_NO_THROW(m.validate(L, "mask"));
    int64_t brute = 0;
    std::vector<Range> got;
    for (int64_t i = 0; i < L; ++i) {
      m.row_ranges(i, L, got);
      for (const Range& r : got) brute += r.end - r.begin;
    }
    EXPECT_EQ(m.area(L), brute);
  }
  EXPECT_EQ(Mask::lambda(int64_t{1} << 62, 5).area(L), L * (L + 1) / 2);
}

TEST(Mask, SharedQuestionFor) {
  const Mask m = Mask::shared_question_for(1003, 0.2, 4);
  EXPECT_EQ(m.question, 201);
  EXPECT_EQ(m.answers, (std::vector<int64_t>{201, 201, 200, 200}));
  EXPECT_NO_THROW(m.validate(1003, "mask"));
  // Fewer tokens than answers: fewer (non-empty) answers.
  const Mask s = Mask::shared_question_for(3, 0.0, 4);
  EXPECT_EQ(s.answers, (std::vector<int64_t>{1, 1, 1}));
  EXPECT_NO_THROW(s.validate(3, "mask"));
  const Mask q = Mask::shared_question_for(10, 1.0, 4);
  EXPECT_TRUE(q.answers.empty());
  EXPECT_NO_THROW(q.validate(10, "mask"));
}

TEST(Mask, KindSpellings) {
  EXPECT_STREQ(to_string(MaskKind::Full), "full");
  EXPECT_STREQ(to_string(MaskKind::Causal), "causal");
  EXPECT_STREQ(to_string(MaskKind::Lambda), "lambda");
  EXPECT_STREQ(to_string(MaskKind::CausalBlockwise), "causal_blockwise");
  EXPECT_STREQ(to_string(MaskKind::SharedQuestion), "shared_question");
  EXPECT_STREQ(to_string(MaskKind::Ranges), "ranges");
  EXPECT_STREQ(to_string(MaskKind::Chunked), "chunked");
}

// Expects InvalidInput whose message names `where` and contains every fragment.
void expect_invalid(const Mask& m, int64_t L, const std::vector<std::string>& fragments) {
  try {
    m.validate(L, "sequences[7].mask");
    ADD_FAILURE() << "no error for " << describe(m, L);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("sequences[7].mask"), std::string::npos) << msg;
    for (const std::string& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << msg << " lacks " << f;
  }
}

TEST(Mask, BadParametersNameTheField) {
  expect_invalid(Mask::lambda(64, 0), 10, {"window", "0"});
  expect_invalid(Mask::lambda(-1, 5), 10, {"sink", "-1"});
  expect_invalid(Mask::causal_blockwise(0, 2, 1), 10, {"block", "0"});
  expect_invalid(Mask::causal_blockwise(16, -2, 1), 10, {"local_blocks", "-2"});
  expect_invalid(Mask::causal_blockwise(16, 2, -3), 10, {"sink_blocks", "-3"});
  expect_invalid(Mask::chunked(0), 10, {"chunk", "0"});

  Mask sq{.kind = MaskKind::SharedQuestion};
  sq.question = -1;
  sq.answers = {11};
  expect_invalid(sq, 10, {"question", "-1"});
  sq.question = 4;
  sq.answers = {3, 0, 3};
  expect_invalid(sq, 10, {"answers[1]", "0"});
  sq.answers = {3, 5};
  expect_invalid(sq, 10, {"exceeds", "10"});
  sq.answers = {3, 2};
  expect_invalid(sq, 10, {"sum(answers)", "9"});
  sq.question = 12;
  sq.answers = {};
  expect_invalid(sq, 10, {"question", "12"});

  expect_invalid(Mask::ranges({{}, {{0, 1}}}), 3, {"rows", "3", "2"});
  expect_invalid(Mask::ranges({{{0, 1}}, {{1, 1}}}), 2, {"rows[1][0]", "begin < end"});
  expect_invalid(Mask::ranges({{{0, 1}}, {{0, 3}}}), 2, {"rows[1][0]", "inside"});
  expect_invalid(Mask::ranges({{{-1, 1}}, {{0, 1}}}), 2, {"rows[0][0]", "-1"});
  expect_invalid(Mask::ranges({{{2, 3}, {0, 1}}, {}, {}}), 3, {"rows[0][1]", "sorted"});
  expect_invalid(Mask::ranges({{{0, 2}, {1, 3}}, {}, {}}), 3, {"rows[0][1]", "disjoint"});
  Mask missing{.kind = MaskKind::Ranges};
  expect_invalid(missing, 3, {"rows"});
  // Touching ranges are fine (row_ranges merges them).
  EXPECT_NO_THROW(Mask::ranges({{{0, 1}, {1, 2}}, {}}).validate(2, "m"));
}

}  // namespace
}  // namespace dcp
