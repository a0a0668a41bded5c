// Small random batches, shapes and clusters for the baseline and metrics property tests.
// Deterministic: a splitmix64 stream seeded by the test.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/rng.h"
#include "dcp/batch.h"
#include "dcp/blocks.h"
#include "dcp/cluster.h"

namespace dcp::test {


// A random mask of `kind` that fits `length` tokens.
inline Mask random_mask(Rng& rng, MaskKind kind, int64_t length) {
  switch (kind) {
    case MaskKind::Full: return Mask::full();
    case MaskKind::Causal: return Mask::causal();
    case MaskKind::Lambda: return Mask::lambda(rng.uniform(1, 8), rng.uniform(1, 48));
    case MaskKind::CausalBlockwise:
      return Mask::causal_blockwise(rng.uniform(1, 24), rng.uniform(1, 3), rng.uniform(0, 2));
    case MaskKind::SharedQuestion: {
      if (length < 8) return Mask::causal();
      const int num_answers = static_cast<int>(rng.uniform(1, 4));
      return Mask::shared_question_for(length, 0.25, num_answers);
    }
    case MaskKind::Chunked: return Mask::chunked(rng.uniform(1, 40));
    case MaskKind::Ranges: {
      // Each row: up to three random ranges (sorted, disjoint), some rows empty.
      std::vector<std::vector<Range>> rows(static_cast<size_t>(length));
      for (auto& row : rows) {
        int64_t at = 0;
        const int64_t num = rng.uniform(0, 3);
        for (int64_t k = 0; k < num && at < length; ++k) {
          const int64_t begin = rng.uniform(at, length - 1);
          const int64_t end = rng.uniform(begin + 1, length);
          row.push_back({begin, end});
          at = end + 1;
        }
      }
      return Mask::ranges(std::move(rows));
    }
  }
  return Mask::causal();
}

inline const std::vector<MaskKind>& all_mask_kinds() {
  static const std::vector<MaskKind> kinds = {MaskKind::Full,           MaskKind::Causal,
                                              MaskKind::Lambda,         MaskKind::CausalBlockwise,
                                              MaskKind::SharedQuestion, MaskKind::Ranges,
                                              MaskKind::Chunked};
  return kinds;
}

struct Case {
  Batch batch;
  BlockOptions opts;
  Cluster cluster;
};

// The smallest fixed case: one causal sequence of 64 tokens, 4 heads x 16, B = 16, one node of
// `devices` devices.
inline Case one_causal_case(int devices) {
  Case c;
  c.batch.shape = {.q_heads = 4, .kv_heads = 4, .head_dim = 16, .dtype = DType::BF16};
  c.batch.sequences.push_back({.length = 64, .mask = Mask::causal(), .id = ""});
  c.opts.block_size = 16;
  c.cluster.nodes = 1;
  c.cluster.devices_per_node = devices;
  return c;
}

// Attention shapes with GQA ratios 1..4 and MQA, and head-group sizes that are finer, default
// or coarser than one KV head.
inline void random_shape(Rng& rng, Batch& batch, BlockOptions& opts) {
  struct Choice {
    int q_heads, kv_heads, q_heads_per_group;
  };
  static const Choice choices[] = {{4, 4, 0}, {8, 2, 0}, {4, 1, 0}, {12, 4, 0}, {6, 3, 0},
                                   {16, 8, 0}, {8, 2, 2}, {8, 2, 8}, {6, 6, 2}, {2, 2, 0},
                                   {24, 8, 0}, {10, 5, 0}};
  const Choice& c = choices[rng.uniform(0, std::size(choices) - 1)];
  batch.shape.q_heads = c.q_heads;
  batch.shape.kv_heads = c.kv_heads;
  batch.shape.head_dim = rng.uniform(0, 1) ? 16 : 32;
  batch.shape.dtype = DType::BF16;
  opts.q_heads_per_group = c.q_heads_per_group;
  opts.block_size = 16 * rng.uniform(1, 4);
}

// Random cluster with 1..12 devices: any node count and devices per node (non-powers of two,
// one device per node, single node).
inline Cluster random_cluster(Rng& rng) {
  Cluster cluster;
  for (;;) {
    cluster.nodes = static_cast<int>(rng.uniform(1, 4));
    cluster.devices_per_node = static_cast<int>(rng.uniform(1, 6));
    if (cluster.num_devices() <= 12) return cluster;
  }
}

inline Case random_case(Rng& rng) {
  Case c;
  random_shape(rng, c.batch, c.opts);
  const int64_t num_seqs = rng.uniform(1, 4);
  const auto& kinds = all_mask_kinds();
  for (int64_t s = 0; s < num_seqs; ++s) {
    Sequence seq;
    // Mostly short, sometimes shorter than the number of chunks, sometimes several blocks.
    seq.length = rng.uniform(0, 3) == 0 ? rng.uniform(1, 12) : rng.uniform(13, 200);
    seq.mask = random_mask(rng, kinds[rng.uniform(0, kinds.size() - 1)], seq.length);
    c.batch.sequences.push_back(std::move(seq));
  }
  c.cluster = random_cluster(rng);
  return c;
}

}  // namespace dcp::test
