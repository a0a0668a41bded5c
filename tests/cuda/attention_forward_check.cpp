// attention_forward_check.cpp — targeted forward checks: one q block (rows [0, q_len), outputs
// at rows out_begin..) against one or more kv blocks, per scenario, compared with fp64 per
// element (the fp64 reference of dcp/reference.h over the union of the tiles' masks); a failure
// names the first mismatching (tile, row, head, col).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "attention_cuda_check.h"
#include "check_util.h"
#include "dcp/detail/attention_cuda.h"
#include "dcp/reference.h"

namespace dcp::cuda::check {
namespace {

constexpr int kOutBegin = 3;  // outputs start past row 0: catches out_begin mix-ups

struct Lists {
  std::vector<AttnTile> tiles;
  std::vector<int32_t> row_offsets, ranges;
  int kv_rows = 0;                         // K/V buffer rows
  std::vector<std::vector<int>> launches;  // tile indices per launch (a launch = one work item run)
};

AttnTile block_tile(int q_len, int kv_begin, int kv_len, TileKind kind, int num_kv_heads) {
  AttnTile t = tile_of(0, q_len, kv_begin, kv_len, kind, 0, num_kv_heads);
  t.out_begin = kOutBegin;
  return t;
}

// Partial tile whose row i gets ranges_of(i) (sorted, disjoint, inside [0, kv_len)).
template <typename RangesOf>
AttnTile partial_tile(Lists& l, int q_len, int kv_begin, int kv_len, int num_kv_heads, RangesOf&& ranges_of) {
  AttnTile t = block_tile(q_len, kv_begin, kv_len, TileKind::Partial, num_kv_heads);
  append_row_ranges(l.row_offsets, l.ranges, t, ranges_of);
  return t;
}

Lists build(const ForwardCase& c, Rng& rng) {
  Lists l;
  const int hkv = c.num_kv_heads;
  switch (c.scenario) {
    case ForwardScenario::Full:
      l.tiles.push_back(block_tile(c.q_len, 0, c.kv_len, TileKind::Full, hkv));
      l.kv_rows = c.kv_len;
      break;
    case ForwardScenario::Causal:
      l.tiles.push_back(block_tile(c.q_len, 0, c.q_len, TileKind::CausalDiagonal, hkv));
      l.kv_rows = c.q_len;
      break;
    case ForwardScenario::Partial:
      // Rows of the first 128-row chunk: many ranges, every 7th row empty, every 11th all keys;
      // later rows only see keys < 100, so their chunk skips the later sub-tiles, or, with every
      // other seed, no key at all (a work item without a sub-tile: O = 0, LSE = -inf).
      l.tiles.push_back(partial_tile(l, c.q_len, 0, c.kv_len, hkv, [&](int i) {
        if (i % 7 == 3 || (i >= 128 && c.seed % 2 == 0)) return std::vector<std::pair<int, int>>{};
        if (i % 11 == 5) return std::vector<std::pair<int, int>>{{0, c.kv_len}};
        return random_ranges(rng, 0, i < 128 ? c.kv_len : std::min(c.kv_len, 100), 12);
      }));
      l.kv_rows = c.kv_len;
      break;
    case ForwardScenario::MultiTile: {
      // Launch 1: T0 alone. Launch 2: T1.. in one item with accumulate = 1. Rows i % 10 == 0 see
      // no key anywhere (O = 0, LSE = -inf through the accumulate), rows i % 10 == 1 only T0's;
      // with seeds 2 mod 4 rows from 128 on see only T0's keys too (their chunk's item in launch
      // 2 has no sub-tile and leaves T0's partial as it is).
      const bool with_full = c.seed % 2 == 1;
      const bool empty_chunk = c.seed % 4 == 2;
      auto none = [&](int i) { return i % 10 == 0 || i % 10 == 1 || (empty_chunk && i >= 128); };
      int kv = 0;
      l.tiles.push_back(partial_tile(l, c.q_len, kv, 150, hkv, [&](int i) {
        if (i % 5 == 0) return std::vector<std::pair<int, int>>{};
        return random_ranges(rng, 0, 150, 3);
      }));
      kv += 150;
      l.tiles.push_back(partial_tile(l, c.q_len, kv, c.kv_len, hkv, [&](int i) {
        if (none(i)) return std::vector<std::pair<int, int>>{};
        return random_ranges(rng, 0, c.kv_len, 8);
      }));
      kv += c.kv_len;
      l.tiles.push_back(block_tile(c.q_len, kv, 0, TileKind::Full, hkv));  // no keys at all
      l.tiles.push_back(partial_tile(l, c.q_len, kv, 260, hkv, [&](int i) {
        if (none(i)) return std::vector<std::pair<int, int>>{};
        return std::vector<std::pair<int, int>>{{rng.uniform_int(0, 259), 260}};
      }));
      kv += 260;
      if (with_full) {
        l.tiles.push_back(block_tile(c.q_len, kv, 70, TileKind::Full, hkv));
        kv += 70;
      }
      l.kv_rows = kv;
      l.launches.push_back({0});
      std::vector<int> second;
      for (int t = 1; t < static_cast<int>(l.tiles.size()); ++t) second.push_back(t);
      l.launches.push_back(second);
      break;
    }
  }
  if (l.launches.empty()) l.launches.push_back({0});
  if (l.row_offsets.empty()) l.row_offsets.push_back(0);
  if (l.ranges.empty()) l.ranges = {0, 0};
  return l;
}

}  // namespace

std::vector<AttnKernelRoute> kernel_routes() {
  std::vector<AttnKernelRoute> routes{AttnKernelRoute::Mma};
  if (wgmma_available()) {
    routes.push_back(AttnKernelRoute::Wgmma);
    routes.push_back(AttnKernelRoute::WgmmaBasic);
  }
  return routes;
}

std::vector<ForwardCase> forward_cases(AttnKernelRoute route) {
  std::vector<ForwardCase> out = scenario_grid<ForwardCase, ForwardScenario>(route);
  for (ForwardCase& c : out) {
    c.kv_rows_known = c.seed % 3 != 0;
    c.partial_cells = c.seed % 3 != 2;
    c.persistent_ctas = c.seed % 4 == 0 ? 0 : static_cast<int>(c.seed % 4) * 2 - 1;  // 0, 1, 3, 5
  }
  return out;
}

ForwardResult run_forward_case(const ForwardCase& c) {
  ForwardResult res;
  if (!gpu_available()) return res;
  res.ran = true;
  try {
    Rng rng{c.seed * 7919};
    Lists l = build(c, rng);
    const std::vector<uint8_t> cells =
        c.partial_cells ? make_partial_cells(l.tiles, l.row_offsets, l.ranges) : std::vector<uint8_t>{};
    res.num_tiles = static_cast<int>(l.tiles.size());
    const int hq = c.num_q_heads, hkv = c.num_kv_heads, dim = c.head_dim;
    const std::size_t q_elems = static_cast<std::size_t>(c.q_len) * hq * dim;
    const std::size_t kv_elems = static_cast<std::size_t>(l.kv_rows) * hkv * dim;
    auto rand_bf16 = [&](std::size_t n) {
      std::vector<uint16_t> v(n);
      for (auto& x : v) x = to_bf16(static_cast<float>(rng.uniform() * 2.0 - 1.0));
      return v;
    };
    const std::vector<uint16_t> hq_b = rand_bf16(q_elems), hk_b = rand_bf16(kv_elems), hv_b = rand_bf16(kv_elems);
    const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
    const AttnShape shape{hq, hkv, dim, static_cast<float>(scale)};

    DevBuf<uint16_t> d_q(q_elems), d_k(kv_elems), d_v(kv_elems);
    d_q.upload(hq_b);
    d_k.upload(hk_b);
    d_v.upload(hv_b);
    DevBuf<AttnTile> d_tiles(l.tiles.size());
    d_tiles.upload(l.tiles);
    DevBuf<int32_t> d_offsets(l.row_offsets.size()), d_ranges(l.ranges.size());
    d_offsets.upload(l.row_offsets);
    d_ranges.upload(l.ranges);
    DevBuf<uint8_t> d_cells(cells.size());
    d_cells.upload(cells);
    const int out_rows = kOutBegin + c.q_len;
    DevBuf<float> d_o(static_cast<std::size_t>(out_rows) * hq * dim), d_lse(static_cast<std::size_t>(out_rows) * hq);
    d_o.fill(0xFF);
    d_lse.fill(0xFF);
    DevBuf<int32_t> d_counter(2);
    d_counter.fill(0);
    const int chunks = (c.q_len + kAttnForwardChunkRows - 1) / kAttnForwardChunkRows;
    for (std::size_t li = 0; li < l.launches.size(); ++li) {
      const std::vector<int>& run = l.launches[li];
      std::vector<AttnWorkItem> work;
      for (int ch = 0; ch < chunks; ++ch) {
        for (int h = 0; h < hq; ++h) {
          AttnWorkItem w;
          w.tile = run.front();
          w.chunk = ch;
          w.head = h;
          w.num_tiles = static_cast<int32_t>(run.size());
          w.accumulate = li > 0 ? 1 : 0;
          work.push_back(w);
        }
      }
      DevBuf<AttnWorkItem> d_work(work.size());
      d_work.upload(work);
      AttnForwardParams fp;
      fp.shape = shape;
      fp.list = AttnTileList{d_tiles.ptr, d_work.ptr, static_cast<int32_t>(work.size()), d_offsets.ptr, d_ranges.ptr};
      fp.list.cells = c.partial_cells ? d_cells.ptr : nullptr;
      fp.q = d_q.ptr;
      fp.k = d_k.ptr;
      fp.v = d_v.ptr;
      fp.o = d_o.ptr;
      fp.lse = d_lse.ptr;
      fp.kv_rows = c.kv_rows_known ? l.kv_rows : 0;
      fp.q_rows = c.kv_rows_known ? c.q_len : 0;
      fp.route = c.route;
      if (c.persistent_ctas > 0) {
        fp.work_counter = d_counter.ptr;
        fp.max_ctas = c.persistent_ctas;
      }
      attention_forward(fp, nullptr);
      cuda_ok(cudaDeviceSynchronize(), "forward");
      const std::vector<int32_t> counter = d_counter.download();
      if (counter[0] != 0 || counter[1] != 0)
        throw std::runtime_error("persistent launch left its work counter at {" + std::to_string(counter[0]) + ", " +
                                 std::to_string(counter[1]) + "}");
    }
    const std::vector<float> o = d_o.download(), lse = d_lse.download();

    // fp64 reference over the union of every tile's keys (tiles cover disjoint kv rows).
    const std::vector<float> x_q = widen(hq_b), x_k = widen(hk_b), x_v = widen(hv_b);
    const ReferenceResult ref = reference_attention(union_problem(l.tiles, l.row_offsets, l.ranges, c.q_len, l.kv_rows, hq,
                                                                  hkv, dim, x_q.data(), x_k.data(), x_v.data()));
    RelErr e_o, e_l;
    std::vector<Range> keys;
    const double inf = std::numeric_limits<double>::infinity();
    // Per row, the tile a mismatch is reported against: the last one with a key.
    std::vector<int> last_tile_of(static_cast<std::size_t>(c.q_len), 0);
    for (int a = 0; a < c.q_len; ++a) {
      for (std::size_t ti = 0; ti < l.tiles.size(); ++ti) {
        keys.clear();
        append_tile_row_keys(l.tiles[ti], l.row_offsets, l.ranges, a, 0, keys);
        for (const Range& r : keys)
          if (r.end > r.begin) last_tile_of[static_cast<std::size_t>(a)] = static_cast<int>(ti);
      }
    }
    for (int h = 0; h < hq; ++h) {
      for (int a = 0; a < c.q_len; ++a) {
        const int last_tile = last_tile_of[static_cast<std::size_t>(a)];
        const std::size_t orow = static_cast<std::size_t>(kOutBegin + a) * hq + h;
        const std::size_t rh = static_cast<std::size_t>(a) * hq + h;
        if (std::isinf(ref.lse[rh])) {
          ++res.num_empty_rows;
          if (!(std::isinf(lse[orow]) && lse[orow] < 0)) {
            res.empty_rows_ok = false;
            if (res.first_mismatch.empty()) res.first_mismatch = mismatch_text(last_tile, a, h, -1, "LSE(empty row)", -inf, lse[orow]);
          }
          for (int d = 0; d < dim; ++d) {
            if (o[orow * dim + d] == 0.0F) continue;
            res.empty_rows_ok = false;
            if (res.first_mismatch.empty()) res.first_mismatch = mismatch_text(last_tile, a, h, d, "O(empty row)", 0.0, o[orow * dim + d]);
          }
          continue;
        }
        for (int d = 0; d < dim; ++d) {
          const double want = ref.o[rh * dim + d];
          const float got = o[orow * dim + d];
          if (std::isnan(got)) res.any_nan = true;
          e_o.add(got, want);
          if (!(std::fabs(got - want) <= kOElemTol)) {
            ++res.num_bad;
            if (res.first_mismatch.empty()) res.first_mismatch = mismatch_text(last_tile, a, h, d, "O", want, got);
          }
        }
        const double lse_ref = ref.lse[rh];
        if (std::isnan(lse[orow])) res.any_nan = true;
        e_l.add(lse[orow], lse_ref);
        if (!(std::fabs(lse[orow] - lse_ref) <= kLseElemTol)) {
          ++res.num_bad;
          if (res.first_mismatch.empty()) res.first_mismatch = mismatch_text(last_tile, a, h, -1, "LSE", lse_ref, lse[orow]);
        }
      }
    }
    res.o_rel = e_o.value();
    res.lse_rel = e_l.value();
  } catch (const std::exception& e) {
    res.error = e.what();
  }
  return res;
}

std::string describe(const ForwardCase& c, const ForwardResult& r) {
  static const char* const kNames[] = {"full", "causal", "partial", "multi-tile"};
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "fwd=%s %s q=%d kv=%d hq=%d hkv=%d d=%d seed=%llu kv_rows=%d cells=%d persistent=%d tiles=%d empty_rows=%d | O %.2e LSE %.2e bad=%d "
                "empty_ok=%d nan=%d %s",
                route_name(c.route), kNames[static_cast<int>(c.scenario)], c.q_len, c.kv_len, c.num_q_heads,
                c.num_kv_heads, c.head_dim, static_cast<unsigned long long>(c.seed), c.kv_rows_known ? 1 : 0, c.partial_cells ? 1 : 0, c.persistent_ctas, r.num_tiles, r.num_empty_rows,
                r.o_rel, r.lse_rel, r.num_bad, r.empty_rows_ok ? 1 : 0, r.any_nan ? 1 : 0, r.error.c_str());
  std::string text = buf;
  if (!r.first_mismatch.empty()) text += "\n    first mismatch: " + r.first_mismatch;
  return text;
}

}  // namespace dcp::cuda::check
