// Backward blockwise attention on the CPU (see dcp/detail/attention_cpu.h for the math and layout).
//
// Work unit: (tile, kv head, split of the keys). A unit owns the dK/dV rows of its keys, so units
// of one tile run in parallel; every q head of the kv head and every query row is visited inside
// the unit (flash-attention-2 loop order: keys outer, queries inner). dQ contributions of a unit
// go to a private buffer, and the buffers are added to dQ in split order after the tile, so the
// result does not depend on the number of threads. The split count depends on the tile shape
// only (at most kMaxKvSplits, each at least kMinKeysPerSplit keys).
#include <cmath>
#include <limits>
#include <string>
#include <vector>

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
constexpr float kPosInf = std::numeric_limits<float>::infinity();
constexpr int64_t kMaxKvSplits = 4;
constexpr int64_t kMinKeysPerSplit = 2 * kKeyBlock;

struct BwdUnit {
  const BackwardTile* tile;
  int kv_head;
  int64_t c_begin;
  int64_t c_end;
  float* dq_private;  // [num_q][gqa_ratio][head_dim], zeroed
};

DCP_CPU_CLONES
void backward_unit(const HeadLayout& heads, const BwdUnit& unit) {
  const BackwardTile& t = *unit.tile;
  const int dim = heads.head_dim;
  const int ratio = heads.gqa_ratio();
  const RowStrides ld = t.ld.resolved(heads);
  const int64_t ldq = ld.q;
  const int64_t ldk = ld.kv;
  const int64_t ldp = static_cast<int64_t>(ratio) * dim;  // row stride of dq_private
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  const detail::TileRows mask(t.mask, t.num_kv);

  detail::Scratch k_panel(static_cast<int64_t>(dim) * kKeyBlock);
  detail::Scratch v_panel(static_cast<int64_t>(dim) * kKeyBlock);
  detail::Scratch p(kRowBlock * kKeyBlock);
  detail::Scratch ds(kRowBlock * kKeyBlock);
  detail::Scratch dk_acc(kKeyBlock * static_cast<int64_t>(dim));
  detail::Scratch dv_acc(kKeyBlock * static_cast<int64_t>(dim));
  const float* k_head = t.k + static_cast<int64_t>(unit.kv_head) * dim;
  const float* v_head = t.v + static_cast<int64_t>(unit.kv_head) * dim;

  for (int64_t c0 = unit.c_begin; c0 < unit.c_end; c0 += kKeyBlock) {
    const int nk = static_cast<int>(std::min<int64_t>(kKeyBlock, unit.c_end - c0));
    const float* k = k_head + c0 * ldk;
    detail::pack_transposed(k, ldk, nk, dim, k_panel.get());
    detail::pack_transposed(v_head + c0 * ldk, ldk, nk, dim, v_panel.get());
    std::fill_n(dk_acc.get(), kKeyBlock * dim, 0.0f);
    std::fill_n(dv_acc.get(), kKeyBlock * dim, 0.0f);
    bool touched = false;

    for (int hl = 0; hl < ratio; ++hl) {
      const int q_head = unit.kv_head * ratio + hl;
      for (int64_t r0 = 0; r0 < t.num_q; r0 += kRowBlock) {
        const int64_t r1 = std::min(t.num_q, r0 + kRowBlock);
        const int64_t rows = r1 - r0;
        const BlockClass cls = mask.classify(r0, r1, c0, c0 + nk);
        if (cls == BlockClass::Empty) continue;
        touched = true;
        const float* q = t.q + r0 * ldq + static_cast<int64_t>(q_head) * dim;
        const float* d_o = t.d_o + r0 * ld.d_o + static_cast<int64_t>(q_head) * dim;
        // P = exp(scale * Q K^T - LSE); masked keys and rows with LSE = -inf give exactly 0.
        detail::scores(q, ldq, rows, k_panel.get(), dim, p.get());
        for (int64_t r = 0; r < rows; ++r) {
          float* pr = p.get() + r * kKeyBlock;
          const float lse_raw = t.lse[(r0 + r) * ld.lse + q_head];
          const float lse = lse_raw == kNegInf ? kPosInf : lse_raw;
          if (cls == BlockClass::Mixed) {
            for (int j = 0; j < kKeyBlock; j += 16) detail::store(pr + j, detail::load(pr + j) * scale);
            mask.mask_row(r0 + r, c0, pr);
            for (int j = nk; j < kKeyBlock; ++j) pr[j] = kNegInf;
            for (int j = 0; j < kKeyBlock; j += 16) detail::store(pr + j, detail::exp16(detail::load(pr + j) - lse));
          } else {
            for (int j = 0; j < kKeyBlock; j += 16)
              detail::store(pr + j, detail::exp16(detail::load(pr + j) * scale - lse));
            for (int j = nk; j < kKeyBlock; ++j) pr[j] = 0.0f;
          }
        }
        // dV += P^T dO
        detail::probs_t_times(p.get(), rows, nk, d_o, ld.d_o, dv_acc.get(), dim);
        // dP = dO V^T, then dS = scale * P * (dP - Delta) in place.
        detail::scores(d_o, ld.d_o, rows, v_panel.get(), dim, ds.get());
        for (int64_t r = 0; r < rows; ++r) {
          const float delta = t.delta[(r0 + r) * ld.delta + q_head];
          float* dsr = ds.get() + r * kKeyBlock;
          const float* pr = p.get() + r * kKeyBlock;
          for (int j = 0; j < kKeyBlock; j += 16) {
            const F16 d = detail::load(pr + j) * (detail::load(dsr + j) - delta) * scale;
            detail::store(dsr + j, d);
          }
        }
        // dQ += dS K ; dK += dS^T Q
        detail::probs_times(ds.get(), rows, nk, k, ldk, unit.dq_private + r0 * ldp + hl * dim, ldp, dim);
        detail::probs_t_times(ds.get(), rows, nk, q, ldq, dk_acc.get(), dim);
      }
    }
    if (!touched) continue;
    for (int j = 0; j < nk; ++j) {
      float* dk = t.dk + (c0 + j) * ld.dkv + static_cast<int64_t>(unit.kv_head) * dim;
      float* dv = t.dv + (c0 + j) * ld.dkv + static_cast<int64_t>(unit.kv_head) * dim;
      const float* ak = dk_acc.get() + static_cast<int64_t>(j) * dim;
      const float* av = dv_acc.get() + static_cast<int64_t>(j) * dim;
      for (int x = 0; x < dim; ++x) {
        dk[x] += ak[x];
        dv[x] += av[x];
      }
    }
  }
}

}  // namespace

void attend_backward(const HeadLayout& heads, std::span<const BackwardTile> tiles) {
  heads.validate();
  for (size_t i = 0; i < tiles.size(); ++i) {
    const BackwardTile& t = tiles[i];
    const std::string where = "attend_backward: tiles[" + std::to_string(i) + "]";
    detail::validate_tile_mask(t.mask, t.num_q, t.num_kv, where.c_str());
    if (t.num_q > 0 && t.num_kv > 0 &&
        (t.q == nullptr || t.k == nullptr || t.v == nullptr || t.d_o == nullptr || t.lse == nullptr ||
         t.delta == nullptr || t.dq == nullptr || t.dk == nullptr || t.dv == nullptr))
      raise(ErrorKind::InvalidInput, where + ": null data pointer");
  }
  const int dim = heads.head_dim;
  const int ratio = heads.gqa_ratio();
  std::vector<float> dq_private;
  for (const BackwardTile& t : tiles) {
    if (t.num_q == 0 || t.num_kv == 0) continue;
    const int64_t key_blocks = (t.num_kv + kKeyBlock - 1) / kKeyBlock;
    const int64_t splits = std::clamp<int64_t>(t.num_kv / kMinKeysPerSplit, 1, kMaxKvSplits);
    const int64_t blocks_per_split = (key_blocks + splits - 1) / splits;
    const int64_t private_floats = t.num_q * ratio * dim;
    const int64_t num_units = splits * heads.kv_heads;
    dq_private.assign(static_cast<size_t>(num_units * private_floats), 0.0f);
#pragma omp parallel for schedule(dynamic, 1) if (detail::worth_threads(t.num_q * t.num_kv * heads.q_heads * heads.head_dim))
    for (int64_t u = 0; u < num_units; ++u) {
      const int64_t split = u % splits;
      const BwdUnit unit{&t, static_cast<int>(u / splits), std::min(t.num_kv, split * blocks_per_split * kKeyBlock),
                         std::min(t.num_kv, (split + 1) * blocks_per_split * kKeyBlock),
                         dq_private.data() + u * private_floats};
      backward_unit(heads, unit);
    }
    // dQ rows are disjoint across (row, kv head); splits are added in order.
    const int64_t ldq = t.ld.resolved(heads).dq;
#pragma omp parallel for schedule(static) if (detail::worth_threads(private_floats * splits * heads.kv_heads))
    for (int64_t r = 0; r < t.num_q; ++r) {
      for (int g = 0; g < heads.kv_heads; ++g) {
        float* dq = t.dq + r * ldq + static_cast<int64_t>(g) * ratio * dim;
        for (int64_t split = 0; split < splits; ++split) {
          const float* src = dq_private.data() + (g * splits + split) * private_floats + r * ratio * dim;
          for (int64_t x = 0; x < static_cast<int64_t>(ratio) * dim; ++x) dq[x] += src[x];
        }
      }
    }
  }
}

}  // namespace dcp::cpu
