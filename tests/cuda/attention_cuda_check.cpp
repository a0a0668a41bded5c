// attention_cuda_check.cpp — random tile lists of every kind over one sequence, run through the
// CUDA kernels and compared with the fp64 reference (dcp/reference.h): per tile for the partials,
// over the union of the tiles' masks for the merge and the backward.
#include "attention_cuda_check.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "check_util.h"
#include "dcp/detail/attention_cuda.h"
#include "dcp/reference.h"

namespace dcp::cuda::check {

bool gpu_available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no GPU (or no driver): leave no error behind for later calls
    return false;
  }
  return n > 0;
}

CaseResult run_case(const CaseConfig& cfg) {
  CaseResult res;
  if (!gpu_available()) return res;
  res.ran = true;
  try {
    Rng rng{cfg.seed};
    const int hq = cfg.num_q_heads, hkv = cfg.num_kv_heads, dim = cfg.head_dim;
    const int group = hq / hkv;
    std::vector<int> block_begin{0};
    for (int b = 0; b < cfg.num_blocks; ++b) block_begin.push_back(block_begin.back() + rng.uniform_int(1, cfg.max_block_len));
    const int n_tok = block_begin.back();

    // Tiles (i, j <= i), some dropped, some split into two head groups.
    std::vector<AttnTile> tiles;
    std::vector<int32_t> row_offsets, ranges;
    int out_rows = 0;
    for (int i = 0; i < cfg.num_blocks; ++i) {
      for (int j = 0; j <= i; ++j) {
        if (rng.uniform() < 0.15) continue;
        AttnTile t;
        t.q_begin = block_begin[static_cast<std::size_t>(i)];
        t.q_len = block_begin[static_cast<std::size_t>(i) + 1] - t.q_begin;
        t.kv_begin = block_begin[static_cast<std::size_t>(j)];
        t.kv_len = block_begin[static_cast<std::size_t>(j) + 1] - t.kv_begin;
        t.out_begin = out_rows;
        out_rows += t.q_len;
        const double u = rng.uniform();
        t.kind = u < 0.4 ? TileKind::Partial : (i == j && u < 0.8) ? TileKind::CausalDiagonal : TileKind::Full;
        if (t.kind == TileKind::Partial) {
          t.range_row_begin = static_cast<int32_t>(row_offsets.size());
          // Suffix tiles: every row's keys run to the end of the kv block, so whole sub-tiles
          // (the short last one too) are fully covered and take the unmasked path.
          const bool suffix = rng.uniform() < 0.3;
          for (int r = 0; r < t.q_len; ++r) {
            row_offsets.push_back(static_cast<int32_t>(ranges.size() / 2));
            if (suffix) {
              ranges.push_back(rng.uniform_int(0, std::min(t.kv_len - 1, 40)));
              ranges.push_back(t.kv_len);
              continue;
            }
            const int n_ranges = rng.uniform_int(0, 3);  // 0: a fully masked row
            int pos = 0;
            for (int q = 0; q < n_ranges && pos < t.kv_len; ++q) {
              const int b = rng.uniform_int(pos, t.kv_len - 1);
              const int e = rng.uniform_int(b + 1, std::min(t.kv_len, b + 1 + rng.uniform_int(1, 150)));
              ranges.push_back(b);
              ranges.push_back(e);
              pos = e + 1;
            }
          }
          row_offsets.push_back(static_cast<int32_t>(ranges.size() / 2));
        }
        const bool split = hkv >= 2 && rng.uniform() < 0.3;
        const int cut = split ? rng.uniform_int(1, hkv - 1) : hkv;
        t.kv_head_begin = 0;
        t.kv_head_end = cut;
        tiles.push_back(t);
        if (split) {
          AttnTile t2 = t;
          t2.kv_head_begin = cut;
          t2.kv_head_end = hkv;
          tiles.push_back(t2);
        }
      }
    }
    if (row_offsets.empty()) row_offsets.push_back(0);
    if (ranges.empty()) ranges = {0, 0};
    res.num_tiles = static_cast<int>(tiles.size());

    auto rand_bf16 = [&](std::size_t n) {
      std::vector<uint16_t> v(n);
      for (auto& x : v) x = to_bf16(static_cast<float>(rng.uniform() * 2.0 - 1.0));
      return v;
    };
    const std::size_t q_elems = static_cast<std::size_t>(n_tok) * hq * dim;
    const std::size_t kv_elems = static_cast<std::size_t>(n_tok) * hkv * dim;
    const std::vector<uint16_t> hq_b = rand_bf16(q_elems), hk_b = rand_bf16(kv_elems), hv_b = rand_bf16(kv_elems),
                                hdo_b = rand_bf16(q_elems);
    const std::vector<float> x_q = widen(hq_b), x_k = widen(hk_b), x_v = widen(hv_b), x_do = widen(hdo_b);
    const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
    AttnShape shape{hq, hkv, dim, static_cast<float>(scale)};

    DevBuf<uint16_t> d_q(q_elems), d_k(kv_elems), d_v(kv_elems), d_do(q_elems), d_obf(q_elems);
    d_q.upload(hq_b);
    d_k.upload(hk_b);
    d_v.upload(hv_b);
    d_do.upload(hdo_b);
    DevBuf<AttnTile> d_tiles(tiles.size());
    d_tiles.upload(tiles);
    DevBuf<int32_t> d_offsets(row_offsets.size()), d_ranges(ranges.size());
    d_offsets.upload(row_offsets);
    d_ranges.upload(ranges);

    // ---- forward partials -------------------------------------------------------------------
    const std::vector<AttnWorkItem> fwork = make_forward_work(tiles, shape);
    DevBuf<AttnWorkItem> d_fwork(fwork.size());
    d_fwork.upload(fwork);
    DevBuf<float> d_opart(static_cast<std::size_t>(out_rows) * hq * dim), d_lpart(static_cast<std::size_t>(out_rows) * hq);
    d_opart.fill(0xFF);
    d_lpart.fill(0xFF);
    AttnForwardParams fp;
    fp.shape = shape;
    fp.list = AttnTileList{d_tiles.ptr, d_fwork.ptr, static_cast<int32_t>(fwork.size()), d_offsets.ptr, d_ranges.ptr};
    fp.q = d_q.ptr;
    fp.k = d_k.ptr;
    fp.v = d_v.ptr;
    fp.o = d_opart.ptr;
    fp.lse = d_lpart.ptr;
    fp.kv_rows = n_tok;
    fp.q_rows = n_tok;
    fp.route = cfg.forward_route;
    attention_forward(fp, nullptr);
    cuda_ok(cudaDeviceSynchronize(), "forward");
    const std::vector<float> o_part = d_opart.download(), l_part = d_lpart.download();

    // fp64 reference of each tile alone (every head; the tile's own heads are compared).
    std::vector<ReferenceProblem> tile_problems(tiles.size());
    for (std::size_t ti = 0; ti < tiles.size(); ++ti) {
      const AttnTile& t = tiles[ti];
      ReferenceProblem& p = tile_problems[ti];
      p.num_q = t.q_len;
      p.num_kv = t.kv_len;
      p.q_heads = hq;
      p.kv_heads = hkv;
      p.head_dim = dim;
      p.q = x_q.data() + static_cast<std::size_t>(t.q_begin) * hq * dim;
      p.k = x_k.data() + static_cast<std::size_t>(t.kv_begin) * hkv * dim;
      p.v = x_v.data() + static_cast<std::size_t>(t.kv_begin) * hkv * dim;
      p.row_keys = [&t, &row_offsets, &ranges](int64_t a, std::vector<Range>& out) {
        append_tile_row_keys(t, row_offsets, ranges, static_cast<int>(a), 0, out);
      };
    }
    const std::vector<ReferenceResult> tile_refs = reference_attention(tile_problems);
    RelErr e_o, e_l;
    for (const AttnTile& t : tiles) {
      const ReferenceResult& ref = tile_refs[static_cast<std::size_t>(&t - tiles.data())];
      for (int h = t.kv_head_begin * group; h < t.kv_head_end * group; ++h) {
        for (int a = 0; a < t.q_len; ++a) {
          const std::size_t orow = static_cast<std::size_t>(t.out_begin + a) * hq + static_cast<std::size_t>(h);
          const std::size_t rh = static_cast<std::size_t>(a) * hq + static_cast<std::size_t>(h);
          if (std::isinf(ref.lse[rh])) {
            ++res.num_empty_rows;
            if (!(std::isinf(l_part[orow]) && l_part[orow] < 0)) {
              res.fwd_empty_rows_ok = false;
              if (res.first_mismatch.empty())
                res.first_mismatch = mismatch_text(&t - tiles.data(), a, h, -1, "LSE(empty row)", -INFINITY, l_part[orow]);
            }
            for (int d = 0; d < dim; ++d) {
              if (o_part[orow * dim + d] == 0.0F) continue;
              res.fwd_empty_rows_ok = false;
              if (res.first_mismatch.empty())
                res.first_mismatch = mismatch_text(&t - tiles.data(), a, h, d, "O(empty row)", 0.0, o_part[orow * dim + d]);
            }
            continue;
          }
          for (int d = 0; d < dim; ++d) {
            const float got = o_part[orow * dim + d];
            const double want = ref.o[rh * dim + d];
            if (std::isnan(got)) res.any_nan = true;
            e_o.add(got, want);
            if (res.first_mismatch.empty() && !(std::fabs(got - want) <= kOElemTol))
              res.first_mismatch = mismatch_text(&t - tiles.data(), a, h, d, "O", want, got);
          }
          const double lse_ref = ref.lse[rh];
          if (std::isnan(l_part[orow])) res.any_nan = true;
          e_l.add(l_part[orow], lse_ref);
          if (res.first_mismatch.empty() && !(std::fabs(l_part[orow] - lse_ref) <= kLseElemTol))
            res.first_mismatch = mismatch_text(&t - tiles.data(), a, h, -1, "LSE", lse_ref, l_part[orow]);
        }
      }
    }
    res.fwd_o_rel = e_o.value();
    res.fwd_lse_rel = e_l.value();

    // ---- merge: each token's partial list = the tiles covering its q block and its head -----
    std::vector<int32_t> part_offsets{0}, part_rows;
    // Merge per (row) over all heads: only tiles that cover every head can be listed per row, so
    // merge per kv-head-group slice is not expressible; tiles split by heads share out rows.
    for (int r = 0; r < n_tok; ++r) {
      for (const AttnTile& t : tiles) {
        if (t.kv_head_begin != 0) continue;  // the second half of a split tile shares out rows
        if (r >= t.q_begin && r < t.q_begin + t.q_len) part_rows.push_back(t.out_begin + (r - t.q_begin));
      }
      part_offsets.push_back(static_cast<int32_t>(part_rows.size()));
    }
    // fp64 reference over the union mask, forward and backward: the merge's O and LSE, the
    // backward's inputs LSE and Delta and its dQ, dK, dV.
    require_whole_head_sets(tiles, hkv);
    ReferenceProblem whole;
    whole.num_q = whole.num_kv = n_tok;
    whole.q_heads = hq;
    whole.kv_heads = hkv;
    whole.head_dim = dim;
    whole.q = x_q.data();
    whole.k = x_k.data();
    whole.v = x_v.data();
    whole.d_o = x_do.data();
    whole.row_keys = [&](int64_t r, std::vector<Range>& out) { append_union_row_keys(tiles, row_offsets, ranges, r, out); };
    const ReferenceResult union_ref = reference_attention(whole);
    const std::vector<double>& ref_o = union_ref.o;
    const std::vector<double>& ref_lse = union_ref.lse;
    const std::vector<double>& ref_delta = union_ref.delta;
    DevBuf<int32_t> d_poff(part_offsets.size()), d_prows(std::max<std::size_t>(part_rows.size(), 1));
    d_poff.upload(part_offsets);
    if (!part_rows.empty()) d_prows.upload(part_rows);
    DevBuf<float> d_of32(q_elems), d_lse(static_cast<std::size_t>(n_tok) * hq);
    d_of32.fill(0xFF);
    d_obf.fill(0xFF);
    d_lse.fill(0xFF);
    AttnMergeParams mp{n_tok, hq, dim, d_poff.ptr, d_prows.ptr, d_opart.ptr, d_lpart.ptr, d_of32.ptr, d_obf.ptr, d_lse.ptr};
    attention_merge(mp, nullptr);
    cuda_ok(cudaDeviceSynchronize(), "merge");
    const std::vector<float> m_o = d_of32.download(), m_l = d_lse.download();
    const std::vector<uint16_t> m_obf = d_obf.download();
    RelErr e_mo, e_mob, e_ml;
    for (std::size_t rh = 0; rh < ref_lse.size(); ++rh) {
      const bool empty = std::isinf(ref_lse[rh]);
      if (std::isnan(m_l[rh])) res.any_nan = true;
      if (empty) {
        if (!(std::isinf(m_l[rh]) && m_l[rh] < 0)) res.fwd_empty_rows_ok = false;
      } else {
        e_ml.add(m_l[rh], ref_lse[rh]);
      }
      for (int d = 0; d < dim; ++d) {
        const std::size_t i = rh * dim + d;
        if (std::isnan(m_o[i]) || std::isnan(from_bf16(m_obf[i]))) res.any_nan = true;
        e_mo.add(m_o[i], ref_o[i]);
        e_mob.add(from_bf16(m_obf[i]), ref_o[i]);
      }
    }
    res.merge_o_rel = e_mo.value();
    res.merge_o_bf16_rel = e_mob.value();
    res.merge_lse_rel = e_ml.value();

    // ---- Delta kernel and backward -------------------------------------------------------------
    DevBuf<float> d_delta(static_cast<std::size_t>(n_tok) * hq);
    d_delta.fill(0xFF);
    attention_backward_delta(d_do.ptr, d_obf.ptr, d_delta.ptr, n_tok, hq, dim, nullptr);
    cuda_ok(cudaDeviceSynchronize(), "delta");
    const std::vector<float> g_delta = d_delta.download();
    // The Delta kernel reads the merged bf16 O: its exact value is rowsum(dO * bf16 O).
    RelErr e_delta;
    for (std::size_t rh = 0; rh < ref_lse.size(); ++rh) {
      double ref_bf = 0;
      for (int d = 0; d < dim; ++d) ref_bf += static_cast<double>(x_do[rh * dim + d]) * from_bf16(m_obf[rh * dim + d]);
      if (std::isnan(g_delta[rh])) res.any_nan = true;
      e_delta.add(g_delta[rh], ref_bf);
    }
    res.delta_rel = e_delta.value();
    // The backward gets the fp64-derived LSE and Delta (the kernels under test are separate).
    std::vector<float> h_lse(ref_lse.size()), h_delta(ref_lse.size());
    for (std::size_t i = 0; i < ref_lse.size(); ++i) {
      h_lse[i] = static_cast<float>(ref_lse[i]);
      h_delta[i] = static_cast<float>(ref_delta[i]);
    }
    d_lse.upload(h_lse);
    d_delta.upload(h_delta);
    // The deterministic backward runs two lists of its own: the dK / dV pass's (one tile per kv
    // head, by key block) and the dQ pass's.
    // The ordered method runs the default work, with turns.
    DeterministicBackwardWork det;
    const bool ordered = cfg.deterministic_backward && cfg.det_fused && cfg.det_ordered;
    const bool unit_lists = cfg.deterministic_backward && !ordered;
    if (cfg.deterministic_backward) det = make_deterministic_backward_work(tiles, shape, cfg.det_unit_rows);
    std::vector<AttnWorkItem> bwork = unit_lists ? det.dkv_work : make_backward_work(tiles, shape);
    const int32_t num_wide = unit_lists ? 0 : partition_backward_work(bwork, tiles, shape, 0);
    if (ordered) det.num_semaphores = order_backward_turns(bwork, tiles, shape);
    DevBuf<AttnWorkItem> d_bwork(bwork.size());
    d_bwork.upload(bwork);
    DevBuf<AttnTile> d_btiles(std::max<std::size_t>(det.dkv_tiles.size(), 1)), d_dq_tiles(std::max<std::size_t>(det.dq_tiles.size(), 1));
    DevBuf<AttnWorkItem> d_dq_work(std::max<std::size_t>(det.dq_work.size(), 1));
    DevBuf<int32_t> d_sems(static_cast<std::size_t>(std::max(det.num_semaphores, 1)));
    DevBuf<float> d_bound(static_cast<std::size_t>(2 * cfg.num_kv_heads));
    DevBuf<int32_t> d_units(static_cast<std::size_t>(n_tok) * static_cast<std::size_t>(cfg.num_q_heads));
    if (cfg.deterministic_backward) {
      d_btiles.upload(det.dkv_tiles);
      d_dq_tiles.upload(det.dq_tiles);
      d_dq_work.upload(det.dq_work);
    }
    DevBuf<float> d_dq(q_elems), d_dk(kv_elems), d_dv(kv_elems);
    d_dq.fill(0);
    d_dk.fill(0);
    d_dv.fill(0);
    AttnBackwardParams bp;
    bp.shape = shape;
    bp.list = AttnTileList{unit_lists ? d_btiles.ptr : d_tiles.ptr, d_bwork.ptr,
                           static_cast<int32_t>(bwork.size()), d_offsets.ptr, d_ranges.ptr};
    bp.list.num_wide = num_wide;
    if (cfg.deterministic_backward) {
      bp.deterministic = true;
      bp.semaphores = d_sems.ptr;
      bp.num_semaphores = det.num_semaphores;
      bp.dq_list = bp.list;
      bp.dq_list.tiles = d_dq_tiles.ptr;
      bp.dq_list.work = d_dq_work.ptr;
      bp.dq_list.num_work = static_cast<int32_t>(det.dq_work.size());
      bp.kv_rows = n_tok;  // K / V of the dQ pass by TMA (tails by cp.async)
      if (cfg.det_fused) {
        deterministic_dq_units(d_k.ptr, d_v.ptr, n_tok, d_do.ptr, n_tok, shape, d_bound.ptr, d_units.ptr, nullptr);
        bp.dq_units = d_units.ptr;
        bp.ordered = ordered;
      }
    }
    bp.q = d_q.ptr;
    bp.k = d_k.ptr;
    bp.v = d_v.ptr;
    bp.dout = d_do.ptr;
    bp.lse = d_lse.ptr;
    bp.delta = d_delta.ptr;
    bp.dq = d_dq.ptr;
    bp.dk = d_dk.ptr;
    bp.dv = d_dv.ptr;
    bp.dq_rows = n_tok;
    bp.dkv_rows = n_tok;
    bp.q_rows = n_tok;
    bp.dout_rows = n_tok;
    bp.route = cfg.backward_route;
    // The one-pass method leaves dq as integer counts of its units until they are converted.
    const auto backward = [&] {
      attention_backward(bp, nullptr);
      if (bp.deterministic && bp.dq_units != nullptr) deterministic_dq_from_units(d_dq.ptr, d_units.ptr, n_tok, shape, nullptr);
    };
    backward();
    cuda_ok(cudaDeviceSynchronize(), "backward");
    const std::vector<float> g_dq = d_dq.download(), g_dk = d_dk.download(), g_dv = d_dv.download();
    if (cfg.deterministic_backward) {
      for (int repeat = 0; repeat < 3 && res.repeat_bitwise; ++repeat) {
        d_dq.fill(0);
        d_dk.fill(0);
        d_dv.fill(0);
        backward();
        cuda_ok(cudaDeviceSynchronize(), "backward (repeat)");
        const auto same = [](const std::vector<float>& x, const std::vector<float>& y) {
          return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
        };
        res.repeat_bitwise = same(d_dq.download(), g_dq) && same(d_dk.download(), g_dk) && same(d_dv.download(), g_dv);
      }
    }

    // Norms decide; the first element beyond 5e-2 rms + 3e-2 |ref| is reported (row, head, col).
    auto rel = [&](const char* what, const std::vector<float>& got, const std::vector<double>& ref, int heads) {
      double sq = 0;
      for (const double x : ref) sq += x * x;
      const double rms = std::sqrt(sq / static_cast<double>(std::max<std::size_t>(ref.size(), 1)));
      RelErr e;
      for (std::size_t i = 0; i < ref.size(); ++i) {
        if (std::isnan(got[i])) res.any_nan = true;
        e.add(got[i], ref[i]);
        if (res.first_bwd_mismatch.empty() && !(std::fabs(got[i] - ref[i]) <= 5e-2 * rms + 3e-2 * std::fabs(ref[i]))) {
          const std::size_t rh = i / static_cast<std::size_t>(dim);
          res.first_bwd_mismatch = mismatch_text(-1, static_cast<int>(rh / static_cast<std::size_t>(heads)),
                                                 static_cast<int>(rh % static_cast<std::size_t>(heads)),
                                                 static_cast<int>(i % static_cast<std::size_t>(dim)), what, ref[i], got[i]);
        }
      }
      return e.value();
    };
    res.dq_rel = rel("dQ", g_dq, union_ref.dq, hq);
    res.dk_rel = rel("dK", g_dk, union_ref.dk, hkv);
    res.dv_rel = rel("dV", g_dv, union_ref.dv, hkv);
  } catch (const std::exception& e) {
    res.error = e.what();
  }
  return res;
}

std::string describe(const CaseConfig& c, const CaseResult& r) {
  char buf[640];
  std::snprintf(buf, sizeof buf,
                "fwd=%s bwd=%s seed=%llu hq=%d hkv=%d d=%d tiles=%d empty_rows=%d | fwd O %.2e LSE %.2e empty_ok=%d | merge O %.2e "
                "O_bf16 %.2e LSE %.2e | delta %.2e | dQ %.2e dK %.2e dV %.2e | nan=%d det=%d bitwise=%d %s",
                route_name(c.forward_route), route_name(c.backward_route), static_cast<unsigned long long>(c.seed), c.num_q_heads, c.num_kv_heads, c.head_dim, r.num_tiles,
                r.num_empty_rows, r.fwd_o_rel, r.fwd_lse_rel, r.fwd_empty_rows_ok ? 1 : 0, r.merge_o_rel,
                r.merge_o_bf16_rel, r.merge_lse_rel, r.delta_rel, r.dq_rel, r.dk_rel, r.dv_rel, r.any_nan ? 1 : 0,
                c.deterministic_backward ? 1 : 0, r.repeat_bitwise ? 1 : 0, r.error.c_str());
  std::string text = buf;
  if (!passed(r) && !r.first_mismatch.empty()) text += "\n    first forward mismatch: " + r.first_mismatch;
  if (!passed(r) && !r.first_bwd_mismatch.empty()) text += "\n    first gradient mismatch: " + r.first_bwd_mismatch;
  return text;
}

}  // namespace dcp::cuda::check
