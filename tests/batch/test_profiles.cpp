// Synthetic profiles: determinism, packing bounds, scale, mask kinds.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "batch/test_helpers.h"
#include "dcp/io.h"
#include "dcp/profiles.h"

namespace dcp {
namespace {

std::vector<int64_t> all_lengths(const std::vector<Batch>& batches) {
  std::vector<int64_t> out;
  for (const Batch& b : batches)
    for (const Sequence& s : b.sequences) out.push_back(s.length);
  return out;
}

int64_t median(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

TEST(Profiles, NamesRoundTrip) {
  for (Profile p : {Profile::Ldc, Profile::LongAlign, Profile::Uniform, Profile::Fixed, Profile::Lengths}) {
    EXPECT_EQ(parse_profile(to_string(p)), p);
  }
  test::expect_invalid_input([] { parse_profile("pile"); }, {"'pile'", "ldc, longalign, uniform, fixed, lengths"});
}

TEST(Profiles, OptionsValidate) {
  ProfileOptions o;
  EXPECT_NO_THROW(o.validate());
  o.scale = -1;
  test::expect_invalid_input([&] { o.validate(); }, {"profile.scale", "-1"});
  o = ProfileOptions{};
  o.min_fill = 1.5;
  test::expect_invalid_input([&] { o.validate(); }, {"profile.min_fill", "1.5"});
  o = ProfileOptions{};
  o.mask = "ranges";
  test::expect_invalid_input([&] { o.validate(); }, {"profile.mask", "'ranges'", "mixed"});
  o = ProfileOptions{};
  o.token_budget = 0;
  test::expect_invalid_input([&] { o.validate(); }, {"profile.token_budget", "got 0"});
  o = ProfileOptions{};
  o.uniform_min = 100;
  o.uniform_max = 50;
  test::expect_invalid_input([&] { o.validate(); }, {"profile.uniform_max", "got 50"});
  o = ProfileOptions{};
  o.shape.kv_heads = 3;
  test::expect_invalid_input([&] { o.validate(); }, {"profile.shape.kv: 3 does not divide"});
}

TEST(Profiles, SameSeedSameBatchesOtherSeedOtherBatches) {
  for (Profile p : {Profile::Ldc, Profile::LongAlign, Profile::Uniform}) {
    ProfileOptions o;
    o.profile = p;
    o.mask = "mixed";
    o.seed = 42;
    const auto a = generate_batches(o, 4);
    const auto b = generate_batches(o, 4);
    o.seed = 43;
    const auto c = generate_batches(o, 4);
    std::string ta, tb, tc;
    for (const Batch& x : a) ta += batch_to_json(x, false);
    for (const Batch& x : b) tb += batch_to_json(x, false);
    for (const Batch& x : c) tc += batch_to_json(x, false);
    EXPECT_EQ(ta, tb) << to_string(p);
    EXPECT_NE(ta, tc) << to_string(p);
  }
}

TEST(Profiles, BudgetAndFillRespected) {
  for (Profile p : {Profile::Ldc, Profile::LongAlign, Profile::Uniform, Profile::Fixed}) {
    for (double scale : {0.5, 1.0, 2.0, 4.0}) {
      ProfileOptions o;
      o.profile = p;
      o.scale = scale;
      o.fixed_length = 5000;
      const auto batches = generate_batches(o, 8);
      ASSERT_EQ(batches.size(), 8u);
      for (const Batch& b : batches) {
        EXPECT_LE(b.total_tokens(), o.token_budget);
        EXPECT_GE(static_cast<double>(b.total_tokens()), o.min_fill * static_cast<double>(o.token_budget));
        for (const Sequence& s : b.sequences) EXPECT_GE(s.length, 1);
      }
    }
  }
}

TEST(Profiles, ScaleDoublesTheMedian) {
  ProfileOptions o;
  o.seed = 7;
  const int64_t m1 = median(all_lengths(generate_batches(o, 40)));
  o.scale = 2.0;
  const int64_t m2 = median(all_lengths(generate_batches(o, 40)));
  const double ratio = static_cast<double>(m2) / static_cast<double>(m1);
  EXPECT_GT(ratio, 1.6) << m1 << " -> " << m2;
  EXPECT_LT(ratio, 2.5) << m1 << " -> " << m2;
  // The ldc profile is meant to have a median near 2K tokens.
  EXPECT_GT(m1, 1200);
  EXPECT_LT(m1, 3500);
}

TEST(Profiles, LengthsFollowTheirProfile) {
  ProfileOptions o;
  o.profile = Profile::Fixed;
  o.fixed_length = 3000;
  o.scale = 0.5;
  for (int64_t len : all_lengths(generate_batches(o, 3))) EXPECT_EQ(len, 1500);
  o.fixed_length = 1 << 20;  // above the budget: clamped, one sequence per batch
  o.scale = 1.0;
  for (const Batch& b : generate_batches(o, 3)) {
    ASSERT_EQ(b.sequences.size(), 1u);
    EXPECT_EQ(b.sequences[0].length, o.token_budget);
  }
  o = ProfileOptions{};
  o.profile = Profile::Uniform;
  o.uniform_min = 1000;
  o.uniform_max = 2000;
  o.scale = 2.0;
  for (int64_t len : all_lengths(generate_batches(o, 3))) {
    EXPECT_GE(len, 2000);
    EXPECT_LE(len, 4000);
  }
  o = ProfileOptions{};
  o.profile = Profile::LongAlign;
  const auto lens = all_lengths(generate_batches(o, 30));
  const auto in_range = std::count_if(lens.begin(), lens.end(), [](int64_t l) { return l >= 8192 && l <= 65536; });
  EXPECT_GT(static_cast<double>(in_range), 0.75 * static_cast<double>(lens.size()));
}

TEST(Profiles, UnreachableFillIsAnError) {
  ProfileOptions o;
  o.profile = Profile::Fixed;
  o.fixed_length = 80000;  // 61% of 131072; two never fit
  test::expect_invalid_input([&] { generate_batches(o, 2); }, {"min_fill", "token_budget 131072"});
}

TEST(Profiles, EveryMaskKindFitsItsSequence) {
  const std::vector<std::pair<std::string, MaskKind>> kinds = {
      {"full", MaskKind::Full}, {"causal", MaskKind::Causal}, {"lambda", MaskKind::Lambda},
      {"causal_blockwise", MaskKind::CausalBlockwise}, {"shared_question", MaskKind::SharedQuestion}};
  for (const auto& [name, kind] : kinds) {
    ProfileOptions o;
    o.mask = name;
    o.token_budget = 32768;
    o.scale = 0.5;
    for (const Batch& b : generate_batches(o, 3)) {
      EXPECT_NO_THROW(b.validate()) << name;
      for (const Sequence& s : b.sequences) {
        const MaskKind expected = (kind == MaskKind::SharedQuestion && s.length < 5) ? MaskKind::Causal : kind;
        EXPECT_EQ(s.mask.kind, expected) << name << " length " << s.length;
        if (s.mask.kind == MaskKind::SharedQuestion) {
          int64_t total = s.mask.question;
          for (int64_t a : s.mask.answers) total += a;
          EXPECT_EQ(total, s.length);
          EXPECT_EQ(s.mask.answers.size(), 4u);
        }
      }
    }
  }
}

TEST(Profiles, MixedUsesEveryKindAndShortSharedQuestionsFallBack) {
  ProfileOptions o;
  o.mask = "mixed";
  o.token_budget = 65536;
  std::set<MaskKind> seen;
  for (const Batch& b : generate_batches(o, 4)) {
    EXPECT_NO_THROW(b.validate());
    for (const Sequence& s : b.sequences) seen.insert(s.mask.kind);
  }
  EXPECT_EQ(seen, (std::set<MaskKind>{MaskKind::Causal, MaskKind::Lambda, MaskKind::CausalBlockwise,
                                       MaskKind::SharedQuestion}));
  o = ProfileOptions{};
  o.profile = Profile::Fixed;
  o.fixed_length = 4;
  o.token_budget = 16;
  o.mask = "shared_question";
  for (const Batch& b : generate_batches(o, 2))
    for (const Sequence& s : b.sequences) EXPECT_EQ(s.mask.kind, MaskKind::Causal);
}

// The lengths profile replays a corpus: with nothing discarded (min_fill 0), the stream of
// sequences is the kept batches in order, and every window of n = |lengths| documents that
// starts at an epoch boundary holds each length once.
TEST(Profiles, LengthsReplayEveryDocumentOncePerEpoch) {
  ProfileOptions o;
  o.profile = Profile::Lengths;
  o.token_budget = 50000;
  o.min_fill = 0;
  for (int i = 0; i < 37; ++i) o.lengths.push_back(100 + 977 * i % 20011);
  std::vector<int64_t> sorted = o.lengths;
  std::sort(sorted.begin(), sorted.end());
  for (const bool shuffle : {true, false}) {
    o.lengths_shuffle = shuffle;
    const std::vector<int64_t> stream = all_lengths(generate_batches(o, 40));
    ASSERT_GE(stream.size(), 3 * o.lengths.size());
    for (size_t epoch = 0; epoch < 3; ++epoch) {
      std::vector<int64_t> window(stream.begin() + static_cast<std::ptrdiff_t>(epoch * o.lengths.size()),
                                  stream.begin() + static_cast<std::ptrdiff_t>((epoch + 1) * o.lengths.size()));
      if (!shuffle) {
        EXPECT_EQ(window, o.lengths) << "epoch " << epoch;
      }
      std::sort(window.begin(), window.end());
      EXPECT_EQ(window, sorted) << "epoch " << epoch << (shuffle ? " shuffled" : " in order");
    }
  }
  // Shuffled epochs differ from the file's order and from each other, and follow the seed.
  o.lengths_shuffle = true;
  const std::vector<int64_t> a = all_lengths(generate_batches(o, 40));
  EXPECT_NE(std::vector<int64_t>(a.begin(), a.begin() + 37), o.lengths);
  EXPECT_NE(std::vector<int64_t>(a.begin(), a.begin() + 37), std::vector<int64_t>(a.begin() + 37, a.begin() + 74));
  EXPECT_EQ(a, all_lengths(generate_batches(o, 40)));
  o.seed = 2;
  EXPECT_NE(a, all_lengths(generate_batches(o, 40)));
}

TEST(Profiles, LengthsScaledClampedAndPacked) {
  ProfileOptions o;
  o.profile = Profile::Lengths;
  o.lengths = {3000, 12000, 70000, 500};
  o.token_budget = 16384;
  o.scale = 2;
  std::set<int64_t> allowed{6000, 16384, 1000};  // 24000 and 140000 clamp to the budget
  for (const Batch& b : generate_batches(o, 20)) {
    EXPECT_LE(b.total_tokens(), o.token_budget);
    EXPECT_GE(static_cast<double>(b.total_tokens()), o.min_fill * static_cast<double>(o.token_budget));
    for (const Sequence& s : b.sequences) EXPECT_TRUE(allowed.count(s.length)) << s.length;
  }
  o.lengths.clear();
  test::expect_invalid_input([&] { generate_batches(o, 1); }, {"profile.lengths", "--lengths FILE"});
  o.lengths = {5, 0};
  test::expect_invalid_input([&] { o.validate(); }, {"profile.lengths[1]: must be >= 1, got 0"});
}

TEST(LengthsFile, ReadsOneLengthPerLineAndNamesBadLines) {
  EXPECT_EQ(parse_lengths("# tokens per document\n4096\n\n  17 \r\n900000\n", "c.txt"),
            (std::vector<int64_t>{4096, 17, 900000}));
  test::expect_invalid_input([] { parse_lengths("12\n3.5\n", "c.txt"); }, {"c.txt:line 2", "'3.5'"});
  test::expect_invalid_input([] { parse_lengths("12 13\n", "c.txt"); }, {"c.txt:line 1", "'12 13'"});
  test::expect_invalid_input([] { parse_lengths("1\n2\n-4\n", "c.txt"); }, {"c.txt:line 3", ">= 1, got -4"});
  test::expect_invalid_input([] { parse_lengths("99999999999999999999\n", "c.txt"); }, {"c.txt:line 1", "out of range"});
  test::expect_invalid_input([] { parse_lengths("# nothing\n\n", "c.txt"); }, {"c.txt: no document lengths"});
  test::expect_invalid_input([] { load_lengths("/nonexistent/lengths.txt"); }, {"/nonexistent/lengths.txt"});
}

}  // namespace
}  // namespace dcp
