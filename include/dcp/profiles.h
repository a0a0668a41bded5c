// dcp/profiles.h — synthetic batch generators, deterministic from a seed.
//
// The named profiles imitate the length distributions of public long-context datasets; they are
// synthetic (no dataset is read). The `lengths` profile replays document lengths you give (your
// corpus's, from a file: load_lengths in dcp/io.h). See docs/profiles.md for their parameters.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dcp/batch.h"

namespace dcp {

enum class Profile { Ldc, LongAlign, Uniform, Fixed, Lengths };
const char* to_string(Profile p);
Profile parse_profile(const std::string& s);  // throws InvalidInput listing the known names

struct ProfileOptions {
  Profile profile = Profile::Ldc;
  uint64_t seed = 1;
  int64_t token_budget = 131072;  // tokens per batch
  double scale = 1.0;             // length scale factor (paper: 0.5, 1, 2, 4)
  double min_fill = 0.75;         // keep a batch only if it is at least this full
  // Mask of every sequence: a kind name ("causal", "lambda", "causal_blockwise", "chunked",
  // "shared_question", "full") with paper parameters, or "mixed" (a random kind per sequence).
  std::string mask = "causal";
  int64_t fixed_length = 8192;          // Fixed profile
  int64_t uniform_min = 1024, uniform_max = 32768;  // Uniform profile
  // Lengths profile: the documents' lengths (each >= 1), replayed in epochs, as a data loader
  // reads a corpus: each epoch visits every length once, in a seeded shuffle (or in the given
  // order when lengths_shuffle is false).
  std::vector<int64_t> lengths;
  bool lengths_shuffle = true;
  AttentionShape shape;
  void validate() const;
};

// `count` batches, each packed to at most token_budget tokens and at least min_fill of it.
std::vector<Batch> generate_batches(const ProfileOptions& opts, int count);

}  // namespace dcp
