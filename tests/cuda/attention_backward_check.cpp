// attention_backward_check.cpp — targeted backward checks: tile lists over one q block (and, for
// the multi-tile scenario, a second q block and several kv blocks sharing rows), run through a
// chosen backward route and compared with fp64 per element; a failure names the first
// mismatching (tile, row, head, col) with expected and actual values.
//
// The backward's inputs LSE and Delta are given (not computed): LSE is the fp64 log-sum-exp of
// each row over every tile's allowed keys (-inf for rows with none), Delta random in [-0.5, 0.5]
// (the kernels use it only through ds = p (dp - Delta)). The reference (dcp/reference.h) takes
// the same two as given statistics.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "attention_cuda_check.h"
#include "check_util.h"
#include "dcp/detail/attention_cuda.h"
#include "dcp/reference.h"

namespace dcp::cuda::check {
namespace {

constexpr int kShift = 5;  // multi-tile: dO / LSE / Delta / dQ / dK / dV rows sit kShift rows later

struct BwdLists {
  std::vector<AttnTile> tiles;
  std::vector<int32_t> row_offsets, ranges;
  int q_rows = 0, kv_rows = 0;  // Q and K / V buffer rows
  int shift = 0;                // rows added to the other buffers (tiles name them explicitly)
};

// Every tile names its dO / LSE / Delta / dQ / dK / dV rows explicitly, kShift after its Q / K rows.
void shift_operand_rows(BwdLists& l) {
  l.shift = kShift;
  for (AttnTile& t : l.tiles) {
    t.lse_begin = t.q_begin + kShift;
    t.dout_begin = t.q_begin + kShift;
    t.delta_begin = t.q_begin + kShift;
    t.dq_begin = t.q_begin + kShift;
    t.dkv_begin = t.kv_begin + kShift;
  }
}

BwdLists build_backward(const BackwardCase& c, Rng& rng) {
  BwdLists l;
  const int hkv = c.num_kv_heads;
  switch (c.scenario) {
    case BackwardScenario::Full:
      l.tiles.push_back(tile_of(0, c.q_len, 0, c.kv_len, TileKind::Full, 0, hkv));
      l.q_rows = c.q_len;
      l.kv_rows = c.kv_len;
      break;
    case BackwardScenario::Causal:
      l.tiles.push_back(tile_of(0, c.q_len, 0, c.q_len, TileKind::CausalDiagonal, 0, hkv));
      l.q_rows = l.kv_rows = c.q_len;
      break;
    case BackwardScenario::Partial: {
      // Many ranges per row, every 7th row empty, every 11th all keys; rows past 128 only see
      // keys < 100 (later key chunks skip their q sub-tiles).
      AttnTile t = tile_of(0, c.q_len, 0, c.kv_len, TileKind::Partial, 0, hkv);
      append_row_ranges(l.row_offsets, l.ranges, t, [&](int i) {
        if (i % 7 == 3) return std::vector<std::pair<int, int>>{};
        if (i % 11 == 5) return std::vector<std::pair<int, int>>{{0, c.kv_len}};
        return random_ranges(rng, 0, i < 128 ? c.kv_len : std::min(c.kv_len, 100), 12);
      });
      l.tiles.push_back(t);
      l.q_rows = c.q_len;
      l.kv_rows = c.kv_len;
      break;
    }
    case BackwardScenario::Long: {
      // Keys [0, n): the causal diagonal. Keys [n, n + 256): a window's lower edge, row i sees
      // keys from i * 256 / n on (every 7th row none), so every key chunk walks from the first
      // row. Keys [n + 256, n + 384): Full. At n >= kAttnHeadMajorRows the last two tiles' items
      // come kv head by kv head (make_backward_work).
      const int n = c.q_len;
      l.tiles.push_back(tile_of(0, n, 0, n, TileKind::CausalDiagonal, 0, hkv));
      AttnTile t = tile_of(0, n, n, 256, TileKind::Partial, 0, hkv);
      append_row_ranges(l.row_offsets, l.ranges, t, [&](int i) {
        if (i % 7 == 3) return std::vector<std::pair<int, int>>{};
        return std::vector<std::pair<int, int>>{{static_cast<int>(static_cast<int64_t>(i) * 256 / n), 256}};
      });
      l.tiles.push_back(t);
      l.tiles.push_back(tile_of(0, n, n + 256, 128, TileKind::Full, 0, hkv));
      l.q_rows = n;
      l.kv_rows = n + 384;
      break;
    }
    case BackwardScenario::Runs: {
      // Keys [0, kv_len) and [kv_len, kv_len + 200); q blocks of n rows at 0, n, 2n and one of
      // 100 rows at 3n (another q_len: runs of its own). Every operand row kShift later.
      const int n = c.q_len;
      for (int i = 0; i < 4; ++i) {
        const int q0 = i * n, rows = i < 3 ? n : 100;
        l.tiles.push_back(tile_of(q0, rows, 0, c.kv_len, TileKind::Full, 0, hkv));
        l.tiles.push_back(tile_of(q0, rows, c.kv_len, 200, TileKind::Full, 0, hkv));
      }
      l.q_rows = 3 * n + 100;
      l.kv_rows = c.kv_len + 200;
      shift_operand_rows(l);
      break;
    }
    case BackwardScenario::MultiTile: {
      // q block A = rows [0, q_len), q block B = rows [q_len, q_len + 70). Keys: [0, 150)
      // Partial for A and Full for B (dK / dV of those keys summed over CTAs of two tiles);
      // [150, 150 + kv_len) Full for A, split into two head groups when hkv >= 2; a causal
      // diagonal of B over keys [150, 220) (overlapping the previous one: its contributions add).
      // Every tile names its dO / LSE / Delta / dQ / dK / dV rows explicitly (kShift later).
      const int qb = c.q_len;
      AttnTile t0 = tile_of(0, c.q_len, 0, 150, TileKind::Partial, 0, hkv);
      append_row_ranges(l.row_offsets, l.ranges, t0, [&](int i) {
        if (i % 5 == 0) return std::vector<std::pair<int, int>>{};
        return random_ranges(rng, 0, 150, 4);
      });
      l.tiles.push_back(t0);
      l.tiles.push_back(tile_of(qb, 70, 0, 150, TileKind::Full, 0, hkv));
      const int cut = hkv >= 2 ? hkv / 2 : hkv;
      l.tiles.push_back(tile_of(0, c.q_len, 150, c.kv_len, TileKind::Full, 0, cut));
      if (cut < hkv) l.tiles.push_back(tile_of(0, c.q_len, 150, c.kv_len, TileKind::Full, cut, hkv));
      l.tiles.push_back(tile_of(qb, 70, 150, 70, TileKind::CausalDiagonal, 0, hkv));
      l.q_rows = qb + 70;
      l.kv_rows = 150 + std::max(c.kv_len, 70);
      shift_operand_rows(l);
      break;
    }
  }
  if (l.row_offsets.empty()) l.row_offsets.push_back(0);
  if (l.ranges.empty()) l.ranges = {0, 0};
  return l;
}

int row_of(int begin, int fallback) { return begin >= 0 ? begin : fallback; }

// The backward captured into a graph on a new thread's stream and replayed once (BackwardCase::captured).
void run_captured(const AttnBackwardParams& bp) {
  int device = 0;
  cuda_ok(cudaGetDevice(&device), "cudaGetDevice");
  std::string error;
  std::thread([&] {
    cudaStream_t stream = nullptr;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    try {
      cuda_ok(cudaSetDevice(device), "cudaSetDevice");
      cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
      cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "begin capture");
      try {
        attention_backward(bp, stream);
      } catch (...) {
        (void)cudaStreamEndCapture(stream, &graph);
        throw;
      }
      cuda_ok(cudaStreamEndCapture(stream, &graph), "end capture");
      cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
      cuda_ok(cudaGraphLaunch(exec, stream), "replay");
      cuda_ok(cudaStreamSynchronize(stream), "replay");
    } catch (const std::exception& e) {
      error = e.what();
    }
    if (exec != nullptr) (void)cudaGraphExecDestroy(exec);
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    if (stream != nullptr) (void)cudaStreamDestroy(stream);
  }).join();
  if (!error.empty()) throw std::runtime_error("captured backward: " + error);
}

}  // namespace

std::vector<BackwardCase> backward_cases(AttnKernelRoute route) {
  std::vector<BackwardCase> out = scenario_grid<BackwardCase, BackwardScenario>(route);
  for (BackwardCase& c : out) {
    c.accumulate = c.seed % 2 == 0;
    c.dq_rows_known = c.seed % 3 != 0;
    c.q_rows_known = c.seed % 4 != 1;
    c.partial_cells = c.seed % 3 != 2;
    c.wide = c.seed % 5 != 4;
    c.captured = c.seed % 3 == 1;
  }
  // Tiles of kAttnHeadMajorRows rows, the head-major order among them.
  BackwardCase long_tiles;
  long_tiles.seed = 101;
  long_tiles.num_q_heads = 4;
  long_tiles.num_kv_heads = 2;
  long_tiles.head_dim = 64;
  long_tiles.scenario = BackwardScenario::Long;
  long_tiles.q_len = kAttnHeadMajorRows;
  long_tiles.kv_len = 256;
  long_tiles.accumulate = true;
  long_tiles.route = route;
  out.push_back(long_tiles);
  // The wide kernel's runs: a key block's tiles in one run (run_rows past the list) or cut at
  // two q blocks' rows; q lengths that end the steps in each way (300: a short step, 224: a 64-row
  // one, 336: four); every operand path (dQ by atomics, Q / dO by cp.async, a captured launch).
  // Only the Wgmma route's wide kernel walks runs; the other routes take an item as one tile.
  if (route != AttnKernelRoute::Wgmma) return out;
  uint64_t seed = 200;
  for (const int q_len : {300, 224, 336}) {
    for (const int gqa : {1, 4}) {
      BackwardCase r;
      r.seed = seed++;
      r.num_q_heads = 8;
      r.num_kv_heads = 8 / gqa;
      r.scenario = BackwardScenario::Runs;
      r.q_len = q_len;
      r.kv_len = 256;
      r.run_rows = r.seed % 2 == 0 ? 1 << 20 : 2 * q_len;
      r.accumulate = r.seed % 3 == 0;
      r.dq_rows_known = r.seed % 4 != 1;
      r.q_rows_known = r.seed % 5 != 2;
      r.captured = r.seed % 3 == 1;
      r.route = route;
      out.push_back(r);
    }
  }
  return out;
}

BackwardResult run_backward_case(const BackwardCase& c) {
  BackwardResult res;
  if (!gpu_available()) return res;
  res.ran = true;
  try {
    Rng rng{c.seed * 104729 + 17};
    BwdLists l = build_backward(c, rng);
    const std::vector<uint8_t> cells =
        c.partial_cells ? make_partial_cells(l.tiles, l.row_offsets, l.ranges) : std::vector<uint8_t>{};
    res.num_tiles = static_cast<int>(l.tiles.size());
    const int hq = c.num_q_heads, hkv = c.num_kv_heads, dim = c.head_dim, group = hq / hkv;
    const std::size_t d = static_cast<std::size_t>(dim);
    const int qo_rows = l.q_rows + l.shift;    // dO / LSE / Delta / dQ rows
    const int kvo_rows = l.kv_rows + l.shift;  // dK / dV rows
    const std::size_t q_elems = static_cast<std::size_t>(l.q_rows) * hq * d;
    const std::size_t qo_elems = static_cast<std::size_t>(qo_rows) * hq * d;
    const std::size_t kv_elems = static_cast<std::size_t>(l.kv_rows) * hkv * d;
    const std::size_t kvo_elems = static_cast<std::size_t>(kvo_rows) * hkv * d;
    auto rand_bf16 = [&](std::size_t n) {
      std::vector<uint16_t> v(n);
      for (auto& x : v) x = to_bf16(static_cast<float>(rng.uniform() * 2.0 - 1.0));
      return v;
    };
    auto rand_f32 = [&](std::size_t n, double amp) {
      std::vector<float> v(n);
      for (auto& x : v) x = static_cast<float>((rng.uniform() * 2.0 - 1.0) * amp);
      return v;
    };
    const std::vector<uint16_t> h_q = rand_bf16(q_elems), h_k = rand_bf16(kv_elems), h_v = rand_bf16(kv_elems),
                                h_do = rand_bf16(qo_elems);
    const std::vector<float> h_delta = rand_f32(static_cast<std::size_t>(qo_rows) * hq, 0.5);
    const double amp0 = c.accumulate ? 1.0 : 0.0;
    const std::vector<float> dq0 = rand_f32(qo_elems, amp0), dk0 = rand_f32(kvo_elems, amp0), dv0 = rand_f32(kvo_elems, amp0);
    const std::vector<float> x_q = widen(h_q), x_k = widen(h_k), x_v = widen(h_v), x_do = widen(h_do);
    const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
    const AttnShape shape{hq, hkv, dim, static_cast<float>(scale)};

    // Every tile puts its dO / LSE / Delta / dQ rows l.shift after its Q rows and its dK / dV rows
    // l.shift after its K / V rows, so one fp64 problem over the union of the tiles' masks (a
    // row's keys may come from several tiles) reads dO and the statistics l.shift rows later.
    require_whole_head_sets(l.tiles, hkv);
    for (const AttnTile& t : l.tiles) {
      const int q_rows[] = {t.lse_begin, t.dout_begin, t.delta_begin, t.dq_begin};
      for (const int r : q_rows)
        if (row_of(r, t.q_begin) != t.q_begin + l.shift) throw std::runtime_error("tile rows not shifted uniformly");
      if (row_of(t.dkv_begin, t.kv_begin) != t.kv_begin + l.shift) throw std::runtime_error("tile rows not shifted uniformly");
    }
    ReferenceProblem p = union_problem(l.tiles, l.row_offsets, l.ranges, l.q_rows, l.kv_rows, hq, hkv, dim, x_q.data(),
                                       x_k.data(), x_v.data());
    // LSE: the forward's, rounded to the fp32 the kernels read; -inf for rows without keys.
    const ReferenceResult fwd = reference_attention(p);
    std::vector<float> h_lse(static_cast<std::size_t>(qo_rows) * hq, -std::numeric_limits<float>::infinity());
    std::vector<uint8_t> covered(static_cast<std::size_t>(l.q_rows), 0);
    for (const AttnTile& t : l.tiles)
      for (int a = 0; a < t.q_len; ++a) covered[static_cast<std::size_t>(t.q_begin + a)] = 1;
    for (std::size_t rh = 0; rh < fwd.lse.size(); ++rh) {
      h_lse[static_cast<std::size_t>(l.shift) * hq + rh] = static_cast<float>(fwd.lse[rh]);
      if (std::isinf(fwd.lse[rh]) && covered[rh / static_cast<std::size_t>(hq)] != 0) ++res.num_empty_rows;
    }

    DevBuf<uint16_t> d_q(q_elems), d_k(kv_elems), d_v(kv_elems), d_do(qo_elems);
    d_q.upload(h_q);
    d_k.upload(h_k);
    d_v.upload(h_v);
    d_do.upload(h_do);
    DevBuf<float> d_lse(h_lse.size()), d_delta(h_delta.size()), d_dq(qo_elems), d_dk(kvo_elems), d_dv(kvo_elems);
    d_lse.upload(h_lse);
    d_delta.upload(h_delta);
    d_dq.upload(dq0);
    d_dk.upload(dk0);
    d_dv.upload(dv0);
    std::vector<AttnWorkItem> work = make_backward_work(l.tiles, shape, cells);
    std::vector<AttnTile> tiles = l.tiles;  // with the runs' copies
    int32_t num_wide = c.wide ? partition_backward_work(work, tiles, shape, 0) : 0;
    if (c.run_rows > 0) num_wide = make_backward_runs(tiles, work, num_wide, shape, c.run_rows);
    DevBuf<AttnTile> d_tiles(tiles.size());
    d_tiles.upload(tiles);
    DevBuf<int32_t> d_offsets(l.row_offsets.size()), d_ranges(l.ranges.size());
    d_offsets.upload(l.row_offsets);
    d_ranges.upload(l.ranges);
    DevBuf<uint8_t> d_cells(cells.size());
    d_cells.upload(cells);
    DevBuf<AttnWorkItem> d_work(work.size());
    d_work.upload(work);
    AttnBackwardParams bp;
    bp.shape = shape;
    bp.list = AttnTileList{d_tiles.ptr, d_work.ptr, static_cast<int32_t>(work.size()), d_offsets.ptr, d_ranges.ptr};
    bp.list.num_wide = num_wide;
    bp.list.cells = c.partial_cells ? d_cells.ptr : nullptr;
    bp.q = d_q.ptr;
    bp.k = d_k.ptr;
    bp.v = d_v.ptr;
    bp.dout = d_do.ptr;
    bp.lse = d_lse.ptr;
    bp.delta = d_delta.ptr;
    bp.dq = d_dq.ptr;
    bp.dk = d_dk.ptr;
    bp.dv = d_dv.ptr;
    bp.dq_rows = c.dq_rows_known ? qo_rows : 0;
    bp.dkv_rows = c.dq_rows_known ? kvo_rows : 0;
    bp.q_rows = c.q_rows_known ? l.q_rows : 0;
    bp.dout_rows = c.q_rows_known ? qo_rows : 0;
    bp.route = c.route;
    if (c.captured) {
      run_captured(bp);
    } else {
      attention_backward(bp, nullptr);
    }
    cuda_ok(cudaDeviceSynchronize(), "backward");
    const std::vector<float> g_dq = d_dq.download(), g_dk = d_dk.download(), g_dv = d_dv.download();

    // fp64 reference under the LSE and Delta the kernels were given.
    const std::size_t q_shift = static_cast<std::size_t>(l.shift) * hq, kv_shift = static_cast<std::size_t>(l.shift) * hkv;
    p.d_o = x_do.data() + q_shift * d;
    p.backward_lse = h_lse.data() + q_shift;
    p.backward_delta = h_delta.data() + q_shift;
    const ReferenceResult bwd = reference_attention(p);
    std::vector<double> r_dq(qo_elems, 0.0), r_dk(kvo_elems, 0.0), r_dv(kvo_elems, 0.0);
    std::copy(bwd.dq.begin(), bwd.dq.end(), r_dq.begin() + static_cast<std::ptrdiff_t>(q_shift * d));
    std::copy(bwd.dk.begin(), bwd.dk.end(), r_dk.begin() + static_cast<std::ptrdiff_t>(kv_shift * d));
    std::copy(bwd.dv.begin(), bwd.dv.end(), r_dv.begin() + static_cast<std::ptrdiff_t>(kv_shift * d));
    // For each output element the last tile that touched it (for reports).
    std::vector<int> q_tile(static_cast<std::size_t>(qo_rows) * hq, -1), kv_tile(static_cast<std::size_t>(kvo_rows) * hkv, -1);
    for (std::size_t ti = 0; ti < l.tiles.size(); ++ti) {
      const AttnTile& t = l.tiles[ti];
      for (int a = 0; a < t.q_len; ++a) {
        for (int b = 0; b < t.kv_len; ++b) {
          if (!allowed(t, l.row_offsets, l.ranges, a, b)) continue;
          for (int kh = t.kv_head_begin; kh < t.kv_head_end; ++kh) {
            kv_tile[static_cast<std::size_t>(t.kv_begin + l.shift + b) * hkv + kh] = static_cast<int>(ti);
            for (int h = kh * group; h < (kh + 1) * group; ++h)
              q_tile[static_cast<std::size_t>(t.q_begin + l.shift + a) * hq + h] = static_cast<int>(ti);
          }
        }
      }
    }
    // Per element: |got - init - ref| <= kGradAbs * scale + kGradRel * |ref|, scale the larger of
    // rms(ref) over the whole output and over the element's 64-row group. The local part holds an
    // element whose sum cancels to near zero to the size of its neighbours' sums: in a long causal
    // tile the first keys' dK / dV sum thousands of large terms whose bf16 P rounds by 2^-9 each,
    // while the later keys' small sums pull the whole output's rms down.
    constexpr double kGradAbs = 5e-2, kGradRel = 3e-2;
    constexpr std::size_t kGroupRows = 64;
    auto compare = [&](const char* what, const std::vector<float>& got, const std::vector<float>& init,
                       const std::vector<double>& ref, int heads, const std::vector<int>& tile_at) {
      const std::size_t row_elems = static_cast<std::size_t>(heads) * d;
      const std::size_t group_elems = kGroupRows * row_elems;
      double sq = 0;
      std::vector<double> group_sq((ref.size() + group_elems - 1) / group_elems, 0.0);
      for (std::size_t i = 0; i < ref.size(); ++i) {
        sq += ref[i] * ref[i];
        group_sq[i / group_elems] += ref[i] * ref[i];
      }
      const double rms = std::sqrt(sq / static_cast<double>(std::max<std::size_t>(ref.size(), 1)));
      auto local_scale = [&](std::size_t i) {
        const std::size_t g = i / group_elems;
        const std::size_t n = std::min(group_elems, ref.size() - g * group_elems);
        return std::max(rms, std::sqrt(group_sq[g] / static_cast<double>(n)));
      };
      RelErr e;
      for (std::size_t i = 0; i < ref.size(); ++i) {
        const double delta_got = static_cast<double>(got[i]) - init[i];
        if (std::isnan(got[i])) res.any_nan = true;
        e.add(delta_got, ref[i]);
        if (!(std::fabs(delta_got - ref[i]) <= kGradAbs * local_scale(i) + kGradRel * std::fabs(ref[i]))) {
          ++res.num_bad;
          if (res.first_mismatch.empty()) {
            const std::size_t rh = i / d;
            res.first_mismatch = mismatch_text(tile_at[rh], static_cast<int>(rh / static_cast<std::size_t>(heads)),
                                               static_cast<int>(rh % static_cast<std::size_t>(heads)),
                                               static_cast<int>(i % d), what, init[i] + ref[i], got[i]);
          }
        }
      }
      return e.value();
    };
    res.dq_rel = compare("dQ", g_dq, dq0, r_dq, hq, q_tile);
    res.dk_rel = compare("dK", g_dk, dk0, r_dk, hkv, kv_tile);
    res.dv_rel = compare("dV", g_dv, dv0, r_dv, hkv, kv_tile);
  } catch (const std::exception& e) {
    res.error = e.what();
  }
  return res;
}

std::string describe(const BackwardCase& c, const BackwardResult& r) {
  static const char* const kNames[] = {"full", "causal", "partial", "multi-tile", "long", "runs"};
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "bwd=%s %s q=%d kv=%d hq=%d hkv=%d d=%d seed=%llu acc=%d dq_rows=%d q_rows=%d cells=%d wide=%d runs=%d captured=%d tiles=%d empty_rows=%d | dQ %.2e dK %.2e "
                "dV %.2e bad=%d nan=%d %s",
                route_name(c.route), kNames[static_cast<int>(c.scenario)], c.q_len, c.kv_len, c.num_q_heads,
                c.num_kv_heads, c.head_dim, static_cast<unsigned long long>(c.seed), c.accumulate ? 1 : 0, c.dq_rows_known ? 1 : 0, c.q_rows_known ? 1 : 0, c.partial_cells ? 1 : 0,
                c.wide ? 1 : 0, c.run_rows, c.captured ? 1 : 0, r.num_tiles, r.num_empty_rows, r.dq_rel, r.dk_rel, r.dv_rel, r.num_bad, r.any_nan ? 1 : 0, r.error.c_str());
  std::string text = buf;
  if (!r.first_mismatch.empty()) text += "\n    first mismatch: " + r.first_mismatch;
  return text;
}

}  // namespace dcp::cuda::check
