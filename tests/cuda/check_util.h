// check_util.h — small host helpers shared by the GPU checks: PRNG, bf16 conversion, device
// buffers, a relative-error accumulator and the masks of tile lists as key ranges (the form the
// fp64 reference, dcp/reference.h, reads).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "dcp/detail/attention_cuda.h"
#include "dcp/detail/bf16.h"
#include "dcp/detail/rng.h"
#include "dcp/mask.h"
#include "dcp/reference.h"

namespace dcp::cuda::check {

struct Rng : SplitMix64 {
  explicit Rng(uint64_t seed) : SplitMix64(seed) {}
  int uniform_int(int lo, int hi) { return lo + static_cast<int>(below(static_cast<uint64_t>(hi - lo + 1))); }
};

// A tile of rows [q_begin, + q_len) against keys [kv_begin, + kv_len), kv heads [h0, h1).
inline AttnTile tile_of(int q_begin, int q_len, int kv_begin, int kv_len, TileKind kind, int h0, int h1) {
  AttnTile t;
  t.q_begin = q_begin;
  t.q_len = q_len;
  t.kv_begin = kv_begin;
  t.kv_len = kv_len;
  t.kind = kind;
  t.kv_head_begin = h0;
  t.kv_head_end = h1;
  return t;
}

// Up to max_ranges random sorted disjoint ranges inside [lo, hi), some a single key long.
inline std::vector<std::pair<int, int>> random_ranges(Rng& rng, int lo, int hi, int max_ranges) {
  std::vector<std::pair<int, int>> out;
  const int n = rng.uniform_int(1, max_ranges);
  int pos = lo;
  for (int r = 0; r < n && pos < hi; ++r) {
    const int b = rng.uniform_int(pos, std::min(hi - 1, pos + 90));
    const int e = rng.uniform_int(b + 1, std::min(hi, b + (rng.uniform() < 0.3 ? 1 : 1 + rng.uniform_int(1, 140))));
    out.emplace_back(b, e);
    pos = e + rng.uniform_int(0, 20);
  }
  return out;
}

// Makes Partial tile t's row i take ranges_of(i) (sorted, disjoint, inside [0, kv_len)),
// appended to a tile list's row_offsets / ranges.
template <typename RangesOf>
void append_row_ranges(std::vector<int32_t>& row_offsets, std::vector<int32_t>& ranges, AttnTile& t, RangesOf&& ranges_of) {
  t.range_row_begin = static_cast<int32_t>(row_offsets.size());
  for (int i = 0; i < t.q_len; ++i) {
    row_offsets.push_back(static_cast<int32_t>(ranges.size() / 2));
    for (const auto& [b, e] : ranges_of(i)) {
      ranges.push_back(b);
      ranges.push_back(e);
    }
  }
  row_offsets.push_back(static_cast<int32_t>(ranges.size() / 2));
}

inline uint16_t to_bf16(float f) { return dcp::to_bf16_bits(f); }
inline float from_bf16(uint16_t h) { return dcp::from_bf16_bits(h); }

inline void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

template <typename T>
struct DevBuf {
  T* ptr = nullptr;
  std::size_t n = 0;
  explicit DevBuf(std::size_t count) : n(count) {
    cuda_ok(cudaMalloc(reinterpret_cast<void**>(&ptr), std::max<std::size_t>(count, 1) * sizeof(T)), "cudaMalloc");
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() { cudaFree(ptr); }
  void upload(const std::vector<T>& h) { cuda_ok(cudaMemcpy(ptr, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "upload"); }
  std::vector<T> download() const {
    std::vector<T> h(n);
    cuda_ok(cudaMemcpy(h.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return h;
  }
  void fill(int byte) { cuda_ok(cudaMemset(ptr, byte, std::max<std::size_t>(n, 1) * sizeof(T)), "cudaMemset"); }
};

struct RelErr {
  double num = 0, den = 0;
  void add(double got, double ref) {
    num += (got - ref) * (got - ref);
    den += ref * ref;
  }
  double value() const { return den > 0 ? std::sqrt(num / den) : std::sqrt(num); }
};

// Per-token allowed keys of a tile: local (i, j).
inline bool allowed(const AttnTile& t, const std::vector<int32_t>& row_offsets, const std::vector<int32_t>& ranges, int i, int j) {
  switch (t.kind) {
    case TileKind::Full: return true;
    case TileKind::CausalDiagonal: return j <= i;
    case TileKind::Partial:
      for (int r = row_offsets[static_cast<std::size_t>(t.range_row_begin + i)];
           r < row_offsets[static_cast<std::size_t>(t.range_row_begin + i + 1)]; ++r) {
        if (j >= ranges[2 * static_cast<std::size_t>(r)] && j < ranges[2 * static_cast<std::size_t>(r) + 1]) return true;
      }
      return false;
  }
  return false;
}

// Tile t's allowed keys of its row i as ranges of kv rows: the tile-local ranges plus `offset`
// (t.kv_begin for rows of the whole K / V buffer, 0 for the tile's own), appended to `out`.
inline void append_tile_row_keys(const AttnTile& t, const std::vector<int32_t>& row_offsets,
                                 const std::vector<int32_t>& ranges, int i, int64_t offset, std::vector<Range>& out) {
  switch (t.kind) {
    case TileKind::Full: out.push_back({offset, offset + t.kv_len}); return;
    case TileKind::CausalDiagonal: out.push_back({offset, offset + std::min(i + 1, t.kv_len)}); return;
    case TileKind::Partial:
      for (int r = row_offsets[static_cast<std::size_t>(t.range_row_begin + i)];
           r < row_offsets[static_cast<std::size_t>(t.range_row_begin + i + 1)]; ++r)
        out.push_back({offset + ranges[2 * static_cast<std::size_t>(r)], offset + ranges[2 * static_cast<std::size_t>(r) + 1]});
      return;
  }
}

// The union mask of a tile list: the keys of Q row `row` over every tile, in tile order (which
// must be kv order for each row). A tile split by kv heads counts once: its parts, the tiles
// with kv_head_begin > 0, cover the same keys (require_whole_head_sets checks it).
inline void append_union_row_keys(const std::vector<AttnTile>& tiles, const std::vector<int32_t>& row_offsets,
                                  const std::vector<int32_t>& ranges, int64_t row, std::vector<Range>& out) {
  for (const AttnTile& t : tiles) {
    if (t.kv_head_begin != 0 || row < t.q_begin || row >= t.q_begin + t.q_len) continue;
    append_tile_row_keys(t, row_offsets, ranges, static_cast<int>(row - t.q_begin), t.kv_begin, out);
  }
}

// One fp64 problem of `num_q` query rows against the list's `num_kv` key rows under the list's
// union mask, over widened inputs (q, k, v outlive it; so does the tile list it reads).
inline dcp::ReferenceProblem union_problem(const std::vector<AttnTile>& tiles, const std::vector<int32_t>& row_offsets,
                                           const std::vector<int32_t>& ranges, int64_t num_q, int64_t num_kv, int hq,
                                           int hkv, int dim, const float* q, const float* k, const float* v) {
  dcp::ReferenceProblem p;
  p.num_q = num_q;
  p.num_kv = num_kv;
  p.q_heads = hq;
  p.kv_heads = hkv;
  p.head_dim = dim;
  p.q = q;
  p.k = k;
  p.v = v;
  p.row_keys = [&tiles, &row_offsets, &ranges](int64_t a, std::vector<Range>& out) {
    append_union_row_keys(tiles, row_offsets, ranges, a, out);
  };
  return p;
}

// The union mask is the same for every kv head only when each tile split by heads has parts
// that together cover heads [0, num_kv_heads): throws otherwise.
inline void require_whole_head_sets(const std::vector<AttnTile>& tiles, int num_kv_heads) {
  auto same_block = [](const AttnTile& a, const AttnTile& b) {
    return a.q_begin == b.q_begin && a.q_len == b.q_len && a.kv_begin == b.kv_begin && a.kv_len == b.kv_len &&
           a.kind == b.kind && a.range_row_begin == b.range_row_begin;
  };
  for (const AttnTile& t : tiles) {
    if (t.kv_head_begin != 0) continue;
    int end = t.kv_head_end;
    while (end < num_kv_heads) {
      const auto next = std::find_if(tiles.begin(), tiles.end(),
                                     [&](const AttnTile& u) { return same_block(t, u) && u.kv_head_begin == end; });
      if (next == tiles.end()) throw std::runtime_error("a tile's kv heads are not covered by its head-split parts");
      end = next->kv_head_end;
    }
  }
}

// bf16 values as floats (exact), the inputs of the fp64 reference.
inline std::vector<float> widen(const std::vector<uint16_t>& v) {
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = from_bf16(v[i]);
  return out;
}

// Per-element bounds for the first-mismatch report (the pass/fail verdict uses the norms).
inline constexpr double kOElemTol = 3e-2;
inline constexpr double kLseElemTol = 2e-3;

// "tile 3 row 17 head 5 col 64: O expected 0.1234 got 0.5678" (col < 0: no column).
inline std::string mismatch_text(std::ptrdiff_t tile, int row, int head, int col, const char* what, double expected,
                                 double got) {
  char buf[200];
  std::snprintf(buf, sizeof buf, "tile %td row %d head %d col %d: %s expected %.6g got %.6g", tile, row, head, col, what,
                expected, got);
  return buf;
}

inline const char* route_name(AttnKernelRoute r) {
  switch (r) {
    case AttnKernelRoute::Mma: return "mma";
    case AttnKernelRoute::Wgmma: return "wgmma";
    case AttnKernelRoute::WgmmaBasic: return "wgmma-basic";
    default: return "auto";
  }
}

// Whether the wgmma forward can run here (an sm_90 device).
inline bool wgmma_available() {
  int dev = 0, major = 0, minor = 0;
  return cudaGetDevice(&dev) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
         cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess && major == 9 && minor == 0;
}

}  // namespace dcp::cuda::check
