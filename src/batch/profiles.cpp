// Synthetic batch profiles (docs/profiles.md). Everything random comes from one splitmix64
// stream seeded by opts.seed, drawn in a fixed order, so a seed gives the same batches on every
// platform with IEEE doubles and a correctly rounded libm exp/log/cos.
#include "dcp/profiles.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dcp/error.h"
#include "dcp/detail/rng.h"

namespace dcp {

namespace {


// LongDataCollections-like: lognormal with median 2048 tokens and sigma 1.4 (about 2.4% of
// sequences above 32K, 0.15% above 128K before the clamp to the budget).
constexpr double kLdcMedian = 2048.0;
constexpr double kLdcSigma = 1.4;
// LongAlign-10k-like: 90% log-uniform in [8K, 64K], 10% log-uniform in [1K, 8K).
constexpr double kLongAlignShortFraction = 0.1;

const char* const kMaskNames[] = {"full", "causal", "lambda", "causal_blockwise", "chunked", "shared_question", "mixed"};
const MaskKind kMixedKinds[] = {MaskKind::Causal, MaskKind::Lambda, MaskKind::CausalBlockwise,
                                MaskKind::SharedQuestion};

double raw_length(const ProfileOptions& o, SplitMix64& rng) {
  switch (o.profile) {
    case Profile::Ldc: return kLdcMedian * std::exp(kLdcSigma * rng.normal());
    case Profile::LongAlign:
      if (rng.uniform() < kLongAlignShortFraction) return rng.log_uniform(1024.0, 8192.0);
      return rng.log_uniform(8192.0, 65536.0);
    case Profile::Uniform: {
      const uint64_t span = static_cast<uint64_t>(o.uniform_max - o.uniform_min) + 1;
      return static_cast<double>(o.uniform_min + static_cast<int64_t>(rng.below(span)));
    }
    case Profile::Fixed: return static_cast<double>(o.fixed_length);
    case Profile::Lengths: break;  // LengthStream replays them
  }
  return 1.0;
}

// The raw lengths of a stream of documents: the named profiles draw each one; the lengths
// profile walks its lengths epoch by epoch, each epoch a Fisher-Yates shuffle (or the given
// order), so over n documents every length comes once, as from a data loader over a corpus.
class LengthStream {
 public:
  explicit LengthStream(const ProfileOptions& o) : o_(o) {}
  double next(SplitMix64& rng) {
    if (o_.profile != Profile::Lengths) return raw_length(o_, rng);
    if (pos_ == order_.size()) {
      if (order_.empty()) {
        order_.resize(o_.lengths.size());
        for (size_t i = 0; i < order_.size(); ++i) order_[i] = i;
      }
      if (o_.lengths_shuffle) {
        for (size_t i = order_.size() - 1; i > 0; --i)
          std::swap(order_[i], order_[static_cast<size_t>(rng.below(static_cast<int64_t>(i) + 1))]);
      }
      pos_ = 0;
    }
    return static_cast<double>(o_.lengths[order_[pos_++]]);
  }

 private:
  const ProfileOptions& o_;
  std::vector<size_t> order_;
  size_t pos_ = 0;
};

int64_t scaled_length(double raw, const ProfileOptions& o) {
  const double v = std::round(raw * o.scale);
  if (!(v >= 1.0)) return 1;
  if (v >= static_cast<double>(o.token_budget)) return o.token_budget;
  return static_cast<int64_t>(v);
}

MaskKind kind_from_name(const std::string& name) {
  if (name == "full") return MaskKind::Full;
  if (name == "lambda") return MaskKind::Lambda;
  if (name == "causal_blockwise") return MaskKind::CausalBlockwise;
  if (name == "chunked") return MaskKind::Chunked;
  if (name == "shared_question") return MaskKind::SharedQuestion;
  return MaskKind::Causal;
}

Mask mask_of_kind(MaskKind kind, int64_t length) {
  switch (kind) {
    case MaskKind::Full: return Mask::full();
    case MaskKind::Lambda: return Mask::lambda();
    case MaskKind::CausalBlockwise: return Mask::causal_blockwise();
    case MaskKind::Chunked: return Mask::chunked();
    case MaskKind::SharedQuestion:
      // A question and 4 answers need at least 5 tokens; shorter sequences stay causal.
      return length >= 5 ? Mask::shared_question_for(length) : Mask::causal();
    case MaskKind::Causal:
    case MaskKind::Ranges: break;
  }
  return Mask::causal();
}

bool full_enough(int64_t tokens, const ProfileOptions& o) {
  return static_cast<double>(tokens) >= o.min_fill * static_cast<double>(o.token_budget);
}

}  // namespace

const char* to_string(Profile p) {
  switch (p) {
    case Profile::Ldc: return "ldc";
    case Profile::LongAlign: return "longalign";
    case Profile::Uniform: return "uniform";
    case Profile::Fixed: return "fixed";
    case Profile::Lengths: return "lengths";
  }
  return "?";
}

Profile parse_profile(const std::string& s) {
  for (Profile p : {Profile::Ldc, Profile::LongAlign, Profile::Uniform, Profile::Fixed, Profile::Lengths}) {
    if (s == to_string(p)) return p;
  }
  raise(ErrorKind::InvalidInput,
        "profile: unknown profile '" + s + "' (expected one of ldc, longalign, uniform, fixed, lengths)");
}

void ProfileOptions::validate() const {
  auto bad = [](const std::string& what) { raise(ErrorKind::InvalidInput, "profile." + what); };
  if (token_budget < 1 || token_budget > kMaxBatchTokens) {
    bad("token_budget: must be in [1, " + std::to_string(kMaxBatchTokens) + "], got " + std::to_string(token_budget));
  }
  if (!(scale > 0.0) || !std::isfinite(scale)) bad("scale: must be a finite number > 0, got " + std::to_string(scale));
  if (!(min_fill >= 0.0 && min_fill <= 1.0)) bad("min_fill: must be in [0, 1], got " + std::to_string(min_fill));
  bool known_mask = false;
  std::string names;
  for (const char* n : kMaskNames) {
    known_mask = known_mask || mask == n;
    names += (names.empty() ? "" : ", ") + std::string(n);
  }
  if (!known_mask) bad("mask: unknown mask '" + mask + "' (expected one of " + names + ")");
  if (fixed_length < 1) bad("fixed_length: must be >= 1, got " + std::to_string(fixed_length));
  if (uniform_min < 1) bad("uniform_min: must be >= 1, got " + std::to_string(uniform_min));
  if (uniform_max < uniform_min) {
    bad("uniform_max: must be >= uniform_min " + std::to_string(uniform_min) + ", got " + std::to_string(uniform_max));
  }
  if (profile == Profile::Lengths && lengths.empty())
    bad("lengths: the lengths profile needs document lengths (dcp: --lengths FILE), got none");
  for (size_t i = 0; i < lengths.size(); ++i)
    if (lengths[i] < 1) bad("lengths[" + std::to_string(i) + "]: must be >= 1, got " + std::to_string(lengths[i]));
  shape.validate("profile.shape");
}

std::vector<Batch> generate_batches(const ProfileOptions& opts, int count) {
  opts.validate();
  if (count < 0) raise(ErrorKind::InvalidInput, "count: must be >= 0, got " + std::to_string(count));
  std::vector<Batch> kept;
  if (count == 0) return kept;
  kept.reserve(static_cast<size_t>(count));

  // Stop with an error rather than loop forever when the lengths can never fill a batch to
  // min_fill (e.g. fixed_length at 60% of the budget with min_fill 75%).
  const int64_t max_closed = 1000 + 100 * static_cast<int64_t>(count);
  int64_t num_closed = 0;

  SplitMix64 rng(opts.seed);
  LengthStream stream(opts);
  const bool mixed = opts.mask == "mixed";
  const MaskKind fixed_kind = kind_from_name(opts.mask);
  Batch current;
  current.shape = opts.shape;
  int64_t tokens = 0;
  while (static_cast<int>(kept.size()) < count) {
    const int64_t length = scaled_length(stream.next(rng), opts);
    const MaskKind kind = mixed ? kMixedKinds[rng.below(4)] : fixed_kind;
    if (tokens + length > opts.token_budget) {
      // Next-fit: the batch that cannot take this sequence is closed for good.
      if (full_enough(tokens, opts)) {
        kept.push_back(std::move(current));
      } else if (++num_closed > max_closed) {
        raise(ErrorKind::InvalidInput,
              "profile: cannot fill batches to min_fill " + std::to_string(opts.min_fill) + " of token_budget " +
                  std::to_string(opts.token_budget) + ": kept " + std::to_string(kept.size()) + " of " +
                  std::to_string(count) + " batches after discarding " + std::to_string(max_closed) +
                  " underfilled ones (expected lengths of profile '" + to_string(opts.profile) + "' x scale " +
                  std::to_string(opts.scale) + " that pack to min_fill; check fixed_length, the uniform range or the lengths)");
      }
      current = Batch{};
      current.shape = opts.shape;
      tokens = 0;
      if (static_cast<int>(kept.size()) == count) break;
    }
    current.sequences.push_back(Sequence{.length = length, .mask = mask_of_kind(kind, length), .id = {}});
    tokens += length;
  }
  return kept;
}

}  // namespace dcp
