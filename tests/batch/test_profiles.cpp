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
  for (Profile p : {Profile::Ldc, Profile::LongAlign, Profile::Uniform, Profile::Fixed}) {
    EXPECT_EQ(parse_profile(to_string(p)), p);
  }
  test::expect_invalid_input([] { parse_profile("pile"); }, {"'pile'", "ldc, longalign, uniform, fixed"});
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

}  // namespace
}  // namespace dcp
