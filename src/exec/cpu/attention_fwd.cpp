// Forward blockwise attention on the CPU (see dcp/detail/attention_cpu.h for the math and layout).
//
// Work unit: (tile, q head, chunk of <= 64 query rows). Units of one tile write disjoint rows of
// O/LSE, so they run in parallel; tiles run in order, which keeps accumulate = true safe when
// tiles share outputs. Per unit, keys are visited in sub-blocks of 64 with the online softmax
// (running max m, running sum l, unnormalised O accumulator).
#include <cmath>
#include <limits>
#include <string>

#include "dcp/detail/attention_cpu.h"
#include "dcp/error.h"
#include "exec/cpu/microkernels.h"
#include "exec/cpu/tile_mask.h"

namespace dcp::cpu {
namespace {

using detail::BlockClass;
using detail::F16;
using detail::kKeyBlock;
using detail::kRowBlock;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct FwdUnit {
  const ForwardTile* tile;
  const float* k_panels;  // [kv_heads][key blocks][head_dim][64]: K^T packed once per tile
  int q_head;
  int64_t r0;
  int64_t r1;
};

// Writes (or merges) one finished row: o_acc / l and m + log(l).
void finish_row(const float* o_acc, float m, float l, int dim, bool accumulate, float* o, float* lse) {
  if (!accumulate || *lse == kNegInf) {
    if (l == 0.0f) {
      for (int x = 0; x < dim; ++x) o[x] = 0.0f;
      *lse = kNegInf;
      return;
    }
    const float inv = 1.0f / l;
    for (int x = 0; x < dim; ++x) o[x] = o_acc[x] * inv;
    *lse = m + std::log(l);
    return;
  }
  if (l == 0.0f) return;  // a -inf partial is the identity of the merge
  const float lse_new = m + std::log(l);
  const float mx = std::max(*lse, lse_new);
  const float w_old = std::exp(*lse - mx);
  const float w_new = std::exp(lse_new - mx);
  const float total = w_old + w_new;
  // o_acc / l is the new partial; fold 1/l into its weight.
  const float a = w_old / total;
  const float b = w_new / (total * l);
  for (int x = 0; x < dim; ++x) o[x] = a * o[x] + b * o_acc[x];
  *lse = mx + std::log(total);
}

DCP_CPU_CLONES
void forward_unit(const HeadLayout& heads, const FwdUnit& unit) {
  const ForwardTile& t = *unit.tile;
  const int dim = heads.head_dim;
  const RowStrides ld = t.ld.resolved(heads);
  const int64_t ldq = ld.q;
  const int64_t ldk = ld.kv;
  const int kv_head = unit.q_head / heads.gqa_ratio();
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  const int64_t rows = unit.r1 - unit.r0;
  const detail::TileRows mask(t.mask, t.num_kv);

  detail::Scratch s(kRowBlock * kKeyBlock);
  detail::Scratch o_acc(kRowBlock * static_cast<int64_t>(dim));
  float m[kRowBlock];
  float l[kRowBlock];
  for (int r = 0; r < kRowBlock; ++r) {
    m[r] = kNegInf;
    l[r] = 0.0f;
  }
  const float* q = t.q + unit.r0 * ldq + static_cast<int64_t>(unit.q_head) * dim;
  const int64_t key_blocks = (t.num_kv + kKeyBlock - 1) / kKeyBlock;
  const float* panels = unit.k_panels + kv_head * key_blocks * dim * kKeyBlock;
  const float* v = t.v + static_cast<int64_t>(kv_head) * dim;

  for (int64_t c0 = 0; c0 < t.num_kv; c0 += kKeyBlock) {
    const int nk = static_cast<int>(std::min<int64_t>(kKeyBlock, t.num_kv - c0));
    const BlockClass cls = mask.classify(unit.r0, unit.r1, c0, c0 + nk);
    if (cls == BlockClass::Empty) continue;
    detail::scores(q, ldq, rows, panels + (c0 / kKeyBlock) * dim * kKeyBlock, dim, s.get());
    for (int64_t r = 0; r < rows; ++r) {
      float* sr = s.get() + r * kKeyBlock;
      for (int j = 0; j < kKeyBlock; j += 16) detail::store(sr + j, detail::load(sr + j) * scale);
      if (cls == BlockClass::Mixed) mask.mask_row(unit.r0 + r, c0, sr);
      for (int j = nk; j < kKeyBlock; ++j) sr[j] = kNegInf;
      float mx = kNegInf;
      for (int j = 0; j < nk; ++j) mx = std::max(mx, sr[j]);
      const float m_new = std::max(m[r], mx);
      if (m_new == kNegInf) {  // nothing allowed in this row so far
        for (int j = 0; j < kKeyBlock; ++j) sr[j] = 0.0f;
        continue;
      }
      const float alpha = std::exp(m[r] - m_new);  // exactly 0 when m was -inf
      F16 sum{};
      for (int j = 0; j < kKeyBlock; j += 16) {
        const F16 p = detail::exp16(detail::load(sr + j) - m_new);
        detail::store(sr + j, p);
        sum += p;
      }
      float row_sum = 0.0f;
      for (int x = 0; x < 16; ++x) row_sum += sum[x];
      l[r] = l[r] * alpha + row_sum;
      m[r] = m_new;
      if (alpha != 1.0f) {
        float* orow = o_acc.get() + r * dim;
        for (int x = 0; x < dim; x += 16) detail::store(orow + x, detail::load(orow + x) * alpha);
      }
    }
    detail::probs_times(s.get(), rows, nk, v + c0 * ldk, ldk, o_acc.get(), dim, dim);
  }

  float* o = t.o + unit.r0 * ld.o + static_cast<int64_t>(unit.q_head) * dim;
  float* lse = t.lse + unit.r0 * ld.lse + unit.q_head;
  for (int64_t r = 0; r < rows; ++r)
    finish_row(o_acc.get() + r * dim, m[r], l[r], dim, t.accumulate, o + r * ld.o, lse + r * ld.lse);
}

}  // namespace

void attend_forward(const HeadLayout& heads, std::span<const ForwardTile> tiles) {
  heads.validate();
  for (size_t i = 0; i < tiles.size(); ++i) {
    const ForwardTile& t = tiles[i];
    const std::string where = "attend_forward: tiles[" + std::to_string(i) + "]";
    detail::validate_tile_mask(t.mask, t.num_q, t.num_kv, where.c_str());
    if (t.num_q > 0 && (t.q == nullptr || t.o == nullptr || t.lse == nullptr ||
                        (t.num_kv > 0 && (t.k == nullptr || t.v == nullptr))))
      raise(ErrorKind::InvalidInput, where + ": null data pointer");
  }
  const int dim = heads.head_dim;
  for (const ForwardTile& t : tiles) {
    if (t.num_q == 0) continue;
    const int64_t ldk = t.ld.resolved(heads).kv;
    const bool parallel = detail::worth_threads(t.num_q * t.num_kv * heads.q_heads * dim);
    // Every unit of a kv head reads all of its keys: transpose K into panels once per tile.
    const int64_t key_blocks = (t.num_kv + kKeyBlock - 1) / kKeyBlock;
    detail::Scratch k_panels(std::max<int64_t>(1, heads.kv_heads * key_blocks * dim * kKeyBlock));
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t i = 0; i < heads.kv_heads * key_blocks; ++i) {
      const int64_t g = i / key_blocks;
      const int64_t c0 = (i % key_blocks) * kKeyBlock;
      const int nk = static_cast<int>(std::min<int64_t>(kKeyBlock, t.num_kv - c0));
      detail::pack_transposed(t.k + c0 * ldk + g * dim, ldk, nk, dim, k_panels.get() + i * dim * kKeyBlock);
    }
    const int64_t chunks = (t.num_q + kRowBlock - 1) / kRowBlock;
    const int64_t num_units = chunks * heads.q_heads;
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
    for (int64_t u = 0; u < num_units; ++u) {
      const int64_t chunk = u / heads.q_heads;
      const FwdUnit unit{&t, k_panels.get(), static_cast<int>(u % heads.q_heads), chunk * kRowBlock,
                         std::min(t.num_q, (chunk + 1) * kRowBlock)};
      forward_unit(heads, unit);
    }
  }
}

}  // namespace dcp::cpu
