// bench_block_table: time to build the block table of a 131072-token batch (one core).
//
// Cases: one causal sequence, and a long-tailed mix of lengths (LongDataCollections-like,
// made up here) with causal and with sparse masks. B = 512, 32 query / 8 KV heads (8 head
// groups). Median of 20 builds after one warm-up. Target: < 20 ms per build on one core.
//
// Usage: bench_block_table [--json PATH]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "dcp/blocks.h"

namespace {

constexpr int64_t kBatchTokens = 131072;
constexpr int kRuns = 20;
constexpr double kTargetMs = 20.0;

dcp::Batch make_batch(const std::vector<int64_t>& lengths, const dcp::Mask& mask, bool shared_question) {
  dcp::Batch b;
  b.shape = {.q_heads = 32, .kv_heads = 8, .head_dim = 128, .dtype = dcp::DType::BF16};
  for (int64_t len : lengths) {
    b.sequences.push_back({len, shared_question ? dcp::Mask::shared_question_for(len) : mask, ""});
  }
  return b;
}

// A long-tailed mix: a few long documents and many short ones, 131072 tokens in all.
std::vector<int64_t> ldc_like_lengths() {
  std::vector<int64_t> out{38912, 20480, 13312, 9216, 7168, 5120, 4096, 3584, 3072, 2560, 2048, 1792,
                           1536, 1280, 1152, 1024, 896, 768, 704, 640, 576, 512, 448, 384,
                           352, 320, 288, 256, 224, 192, 160, 128, 96, 64};
  int64_t sum = 0;
  for (int64_t v : out) sum += v;
  out.push_back(kBatchTokens - sum);
  return out;
}

struct Case {
  std::string name;
  dcp::Batch batch;
};

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--json PATH]\n", argv[0]);
      return 2;
    }
  }
#ifndef NDEBUG
  fmt::print("warning: assertions are on (not a Release build); timings are not representative\n");
#endif
  const std::vector<int64_t> mix = ldc_like_lengths();
  std::vector<Case> cases;
  cases.push_back({"causal, 1 x 131072", make_batch({kBatchTokens}, dcp::Mask::causal(), false)});
  cases.push_back({"causal, ldc-like mix", make_batch(mix, dcp::Mask::causal(), false)});
  cases.push_back({"lambda(64,4096), 1 x 131072", make_batch({kBatchTokens}, dcp::Mask::lambda(), false)});
  cases.push_back({"causal_blockwise, 1 x 131072", make_batch({kBatchTokens}, dcp::Mask::causal_blockwise(), false)});
  cases.push_back({"shared_question, ldc-like mix", make_batch(mix, dcp::Mask::causal(), true)});

  const dcp::BlockOptions opts{.block_size = 512, .q_heads_per_group = 0};
  nlohmann::json results = nlohmann::json::array();
  fmt::print("block table build, {} tokens, B={}, 32 q / 8 kv heads, median of {} runs\n", kBatchTokens,
             opts.block_size, kRuns);
  fmt::print("{:<32} {:>6} {:>8} {:>10} {:>10} {:>10}\n", "case", "seqs", "blocks", "tiles", "median_ms", "min_ms");
  double headline_ms = 0;
  for (const Case& c : cases) {
    size_t num_tiles = 0;
    int num_blocks = 0;
    {
      const dcp::BlockTable warm = dcp::build_block_table(c.batch, opts);
      num_tiles = warm.tiles.size();
      num_blocks = warm.num_token_blocks();
    }
    std::vector<double> ms;
    for (int r = 0; r < kRuns; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      const dcp::BlockTable t = dcp::build_block_table(c.batch, opts);
      const auto t1 = std::chrono::steady_clock::now();
      if (t.tiles.size() != num_tiles) return 1;
      ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    const double median = (ms[kRuns / 2 - 1] + ms[kRuns / 2]) / 2;
    if (headline_ms == 0) headline_ms = median;
    fmt::print("{:<32} {:>6} {:>8} {:>10} {:>10.3f} {:>10.3f}\n", c.name, c.batch.sequences.size(), num_blocks,
               num_tiles, median, ms.front());
    results.push_back({{"case", c.name}, {"tiles", num_tiles}, {"median_ms", median}, {"min_ms", ms.front()}, {"max_ms", ms.back()}});
  }
  fmt::print("target: < {:.0f} ms per build on one core (causal 1 x 131072): {}\n", kTargetMs,
             headline_ms < kTargetMs ? "met" : "NOT met");
  if (!json_path.empty()) {
    std::ofstream(json_path) << nlohmann::json{{"bench", "block_table"}, {"block_size", opts.block_size},
                                               {"tokens", kBatchTokens}, {"results", results}}
                                    .dump(2)
                             << "\n";
  }
  fmt::print("RESULT causal_131072_B512_median_ms={:.3f}\n", headline_ms);
  return 0;
}
