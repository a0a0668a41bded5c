// attention_common.cuh — device building blocks shared by the attention kernels: mma.sync,
// ldmatrix, cp.async, the swizzled shared-memory tile layout and the per-row range masks.
//
// Shared-memory tiles are [rows][cols] bf16 with rows of 64/128 elements (128/256 bytes); each
// 16-byte chunk c of row r is stored at chunk c ^ (r & 7), so that ldmatrix reading 8 rows at one
// logical chunk touches 8 distinct bank groups (no conflicts).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "dcp/detail/attention_cuda.h"
#include "dcp/error.h"
#include "launch_setup.h"

namespace dcp::cuda::detail {

inline constexpr int kThreads = 128;  // 4 warps
inline constexpr int kRows = 64;      // rows of a q sub-tile and keys of a kv sub-tile
inline constexpr float kLog2e = 1.4426950408889634F;
inline constexpr float kLn2 = 0.6931471805599453F;

enum SubTileClass : int { kEmpty = 0, kFull = 1, kMasked = 2 };

// Registers a CTA of `threads` threads holds when it is launched with __launch_bounds__(threads, 1):
// the compiler caps each thread at 65536 / threads, rounded down to the allocation granule of 8 (and
// at 255), and setmaxnreg only redistributes that pool between warpgroups. A split asking for more
// than the pool never completes: the warpgroup that raises its count waits forever.
constexpr int cta_register_pool(int threads) {
  const int per_thread = (65536 / threads) / 8 * 8;
  return (per_thread > 248 ? 248 : per_thread) * threads;
}
static_assert(cta_register_pool(384) == 168 * 384, "three warpgroups: 168 registers a thread at launch");

// Byte offset of element (row, col) in a swizzled tile with `cols` bf16 per row.
template <int kCols>
__device__ __forceinline__ uint32_t swz(int row, int col) {
  constexpr int kChunks = kCols / 8;
  const int chunk = (col >> 3) ^ (row & 7);
  return static_cast<uint32_t>((row * kChunks + chunk) * 16 + (col & 7) * 2);
}

// Two adjacent fp32 additions into global memory: one 8-byte atomic where the GPU has vector
// atomics (sm_90), two 4-byte ones before it.
__device__ __forceinline__ void atomic_add2(float* p, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(p), make_float2(a, b));
#else
  atomicAdd(p, a);
  atomicAdd(p + 1, b);
#endif
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;  // 0: zero-fill the destination
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Loads `kRows` rows of a [tokens][heads][kCols] bf16 buffer (row stride `stride` elements,
// `valid_rows` of them real; the rest zero-filled) into a swizzled tile.
template <int kCols, int kNumThreads = kThreads>
__device__ __forceinline__ void load_tile_async(uint32_t tile, const __nv_bfloat16* src, int64_t stride,
                                                int valid_rows) {
  constexpr int kChunks = kCols / 8;
  constexpr int kPerThread = kRows * kChunks / kNumThreads;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int idx = static_cast<int>(threadIdx.x) + i * kNumThreads;
    const int row = idx / kChunks;
    const int chunk = idx % kChunks;
    const bool valid = row < valid_rows;
    const __nv_bfloat16* g = src + (valid ? row * stride + chunk * 8 : 0);
    cp_async16(tile + swz<kCols>(row, chunk * 8), g, valid);
  }
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// A fragment (16 x 16, m x k) of a row-major [m][k] tile at (m0, k0).
template <int kCols>
__device__ __forceinline__ void load_a(uint32_t (&r)[4], uint32_t tile, int m0, int k0) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  ldmatrix_x4(r, tile + swz<kCols>(m0 + (lane & 15), k0 + (lane >> 4) * 8));
}
// A fragment (16 x 16, m x k) read from a [k][m] tile (transposed storage) at (m0, k0).
template <int kCols>
__device__ __forceinline__ void load_a_trans(uint32_t (&r)[4], uint32_t tile, int m0, int k0) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  ldmatrix_x4_trans(r, tile + swz<kCols>(k0 + (lane & 7) + (lane >> 4) * 8, m0 + ((lane >> 3) & 1) * 8));
}
// B fragments of two n8 tiles (k16 x n16) from a [n][k] tile at (n0, k0): r[0..1] tile n0,
// r[2..3] tile n0 + 8.
template <int kCols>
__device__ __forceinline__ void load_b_nk(uint32_t (&r)[4], uint32_t tile, int n0, int k0) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  ldmatrix_x4(r, tile + swz<kCols>(n0 + (lane & 7) + (lane >> 4) * 8, k0 + ((lane >> 3) & 1) * 8));
}
// B fragments of two n8 tiles (k16 x n16) from a [k][n] tile at (k0, n0).
template <int kCols>
__device__ __forceinline__ void load_b_kn(uint32_t (&r)[4], uint32_t tile, int k0, int n0) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  ldmatrix_x4_trans(r, tile + swz<kCols>(k0 + (lane & 7) + ((lane >> 3) & 1) * 8, n0 + (lane >> 4) * 8));
}

// d += a * b, m16n8k16, bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 2^x as one MUFU.EX2 (ex2.approx.ftz): no denormal handling, so a result below 2^-126 becomes 0,
// far below the resolution of bf16 P and of fp32 row sums; exp2f adds a range fix-up per call.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Accumulators of two adjacent n8 tiles (16 columns) as the A fragment of the next product.
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
  a[0] = pack_bf16(c0[0], c0[1]);
  a[1] = pack_bf16(c0[2], c0[3]);
  a[2] = pack_bf16(c1[0], c1[1]);
  a[3] = pack_bf16(c1[2], c1[3]);
}

// Bit j set <=> key kv0 + j (tile-local) is allowed for the row whose ranges start at
// row_offsets[row_index]; keys at or past kv_len are never set.
__device__ __forceinline__ uint64_t row_key_mask(const int32_t* row_offsets, const int32_t* ranges,
                                                 int row_index, int kv0, int kv_len) {
  int lo = row_offsets[row_index];
  const int end = row_offsets[row_index + 1];
  int hi = end;
  while (lo < hi) {  // first range whose end lies past kv0
    const int mid = (lo + hi) >> 1;
    if (ranges[2 * mid + 1] <= kv0) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  const int window_end = min(kv0 + kRows, kv_len);
  uint64_t mask = 0;
  for (int r = lo; r < end; ++r) {
    const int b = max(ranges[2 * r], kv0);
    const int e = min(ranges[2 * r + 1], window_end);
    if (b >= window_end) break;
    if (e <= b) continue;
    const int width = e - b;
    const uint64_t bits = width == 64 ? ~uint64_t{0} : ((uint64_t{1} << width) - 1);
    mask |= bits << (b - kv0);
  }
  return mask;
}

// Class of the Partial sub-tile rows [r0, r0 + rows) x keys [kv0, kv0 + kKeys) from the tile's
// host-made cells (make_partial_cells): the same answer as voting over its row masks. r0 and kv0
// are multiples of the cell sizes and rows <= kMaxRows. Every thread reads the same bytes, so the
// result is uniform.
template <int kMaxRows, int kKeys>
__device__ __forceinline__ int classify_from_cells(const uint8_t* cells, const AttnTile& t, int r0, int rows, int kv0) {
  const int cols = (t.kv_len + kAttnCellKeys - 1) / kAttnCellKeys;
  const uint8_t* at = cells + t.cells_begin + (r0 / kAttnCellRows) * cols + kv0 / kAttnCellKeys;
  uint32_t bits = 0;
#pragma unroll
  for (int u = 0; u < kMaxRows / kAttnCellRows; ++u) {
#pragma unroll
    for (int c = 0; c < kKeys / kAttnCellKeys; ++c) {
      if (u * kAttnCellRows < rows && kv0 + c * kAttnCellKeys < t.kv_len) bits |= at[u * cols + c];
    }
  }
  if ((bits & kAttnCellAny) == 0) return kEmpty;
  return (bits & kAttnCellNotFull) == 0 && t.kv_len - kv0 >= kKeys ? kFull : kMasked;
}

__device__ __forceinline__ uint64_t valid_bits(int valid) {
  return valid >= 64 ? ~uint64_t{0} : ((uint64_t{1} << valid) - 1);
}

// ---- Sub-tile classification shared by the forward kernels (mma.sync and wgmma) -------------
// A forward CTA covers q rows [r0, r0 + rows) of a tile and walks its keys in sub-tiles of kKeys.

// Sub-tiles [0, end) that the chunk can see (a causal diagonal tile stops at the chunk's last row).
template <int kKeys>
__device__ __forceinline__ int kv_sub_tile_end(const AttnTile& t, int r0, int rows) {
  const int num_sub = (t.kv_len + kKeys - 1) / kKeys;
  return t.kind == TileKind::CausalDiagonal ? min(num_sub, (r0 + rows - 1) / kKeys + 1) : num_sub;
}

// Sub-tiles [first, end) of kKeys keys that a chunk of q rows [r0, r0 + rows) walks: those up to
// kv_sub_tile_end, narrowed for a Partial tile to the key span that make_partial_cells stored for
// the chunk (kKeys = kAttnSpanKeys, r0 a multiple of kAttnForwardChunkRows), so that the empty
// sub-tiles around its allowed pairs are neither visited nor classified.
template <int kKeys>
__device__ __forceinline__ int2 kv_sub_tile_span(const AttnTileList& list, const AttnTile& t, int r0, int rows) {
  static_assert(kKeys == kAttnSpanKeys, "spans count sub-tiles of kAttnSpanKeys keys");
  const int end = kv_sub_tile_end<kKeys>(t, r0, rows);
  if (t.kind == TileKind::Partial && list.cells != nullptr && t.spans_begin >= 0) {
    const int* span = reinterpret_cast<const int*>(list.cells + t.spans_begin) + 2 * (r0 / kAttnForwardChunkRows);
    return make_int2(span[0], min(span[1], end));
  }
  return make_int2(0, end);
}

// Class of the Full or CausalDiagonal sub-tile [kv0, kv0 + kKeys). Keys past kv_len load as
// zeros (score 0, not -inf), so a short sub-tile is always masked.
template <int kKeys>
__device__ __forceinline__ int classify_dense(const AttnTile& t, int kv0, int r0, int rows) {
  const bool whole = t.kv_len - kv0 >= kKeys;
  if (t.kind == TileKind::Full) return whole ? kFull : kMasked;
  if (kv0 > r0 + rows - 1) return kEmpty;
  return (kv0 + kKeys - 1 <= r0 && whole) ? kFull : kMasked;
}

// Whether tile-local key `key` is allowed for tile-local q row `q_row` of a Full or
// CausalDiagonal tile.
__device__ __forceinline__ bool dense_key_allowed(TileKind kind, int key, int kv_len, int q_row) {
  return key < kv_len && (kind == TileKind::Full || key <= q_row);
}

// Class of the Partial sub-tile [kv0, kv0 + 64 kWords). Each of the kAttnForwardChunkRows *
// kWords threads of the CTA computes one 64-key word of one row's mask: word w = tid / 128 of
// chunk row tid % 128 goes to masks[w * 128 + row] (rows past `rows` get 0). Block-wide votes:
// every thread of the CTA must call it.
template <int kWords>
__device__ __forceinline__ int classify_partial(const AttnTile& t, const int32_t* row_offsets, const int32_t* ranges,
                                                int kv0, int r0, int rows, uint64_t* masks) {
  constexpr int kChunk = kAttnForwardChunkRows;
  const int tid = static_cast<int>(threadIdx.x);
  const int row = tid % kChunk;
  const int kv_word = kv0 + 64 * (tid / kChunk);
  const bool row_valid = row < rows;
  uint64_t mask = 0;
  if (row_valid && kv_word < t.kv_len) mask = row_key_mask(row_offsets, ranges, t.range_row_begin + r0 + row, kv_word, t.kv_len);
  masks[tid] = mask;
  if (__syncthreads_or(mask != 0) == 0) return kEmpty;
  const int valid = min(max(t.kv_len - kv_word, 0), 64);
  const bool full = __syncthreads_and(!row_valid || mask == valid_bits(valid)) != 0;
  return full && t.kv_len - kv0 >= 64 * kWords ? kFull : kMasked;
}

// ---- Step classification and staging shared by the backward kernels (mma.sync and wgmma) -------
// A backward CTA covers keys [c0, c0 + keys) (keys <= kKeys) of a tile and walks 64-row q
// sub-tiles (steps); q rows [rq0, rq0 + rows) of the tile in a step.

// The steps of a backward work item (keys from c0 of tile t, kv head kvh): step s is q head
// kvh * group + s / per_head and 64-row q sub-tile first_sub + s % per_head, where a causal
// diagonal tile starts at the sub-tile of the CTA's first key (the rows above see none of its
// keys). The second form walks only the key chunk's row span that make_partial_cells stored for
// a Partial tile (c0 a multiple of kAttnBackwardChunkRows): none of the tile when it is empty.
// stagger() makes the walk start part-way and wrap around (the same steps, another order).
struct BwSteps {
  int first_sub, per_head, num_steps;
  int rot = 0;  // the walk starts at step rot (stagger)
  int chunks;   // 128-key chunks of the tile
  bool partial;
  __device__ __forceinline__ BwSteps(const AttnTile& t, int c0, int group)
      : first_sub(t.kind == TileKind::CausalDiagonal ? c0 / kRows : 0),
        per_head((t.q_len + kRows - 1) / kRows - first_sub),
        num_steps(per_head * group),
        chunks((t.kv_len + kAttnBackwardChunkRows - 1) / kAttnBackwardChunkRows),
        partial(t.kind == TileKind::Partial) {}
  __device__ __forceinline__ BwSteps(const AttnTile& t, int c0, int group, const AttnTileList& list) : BwSteps(t, c0, group) {
    static_assert(kRows == kAttnCellRows, "a row span counts 64-row q sub-tiles");
    if (t.kind == TileKind::Partial && list.cells != nullptr && t.spans_begin >= 0) {
      const int q_chunks = (t.q_len + kAttnForwardChunkRows - 1) / kAttnForwardChunkRows;
      const int* span = reinterpret_cast<const int*>(list.cells + t.spans_begin) + 2 * (q_chunks + c0 / kAttnBackwardChunkRows);
      first_sub = span[0];
      per_head = span[1] - span[0];
      num_steps = per_head * group;
    }
  }
  // Where the walk starts (step rot, wrapping around). The chunks of a Partial tile whose spans
  // start on its first row but end on different rows (a band's upper edge) start evenly spread
  // over their walks: walked in step from the first row they ran 7-9 % slower on sliding-window
  // lists at B >= 2048 (bench/results/cuda_attention_h200.md). Full tiles keep the walk in step,
  // where their chunks share each Q / dO sub-tile in L2 (a spread walk lost 2-4 % there).
  __device__ __forceinline__ void stagger(int chunk) {
    if (partial && first_sub == 0 && num_steps > 0) {
      rot = static_cast<int>(static_cast<int64_t>(chunk) * num_steps / chunks) % num_steps;
    }
  }
  __device__ __forceinline__ int at(int s) const {
    const int u = s + rot;
    return u >= num_steps ? u - num_steps : u;
  }
  __device__ __forceinline__ int q_head(int s, int kvh, int group) const { return kvh * group + at(s) / per_head; }
  __device__ __forceinline__ int row0(int s) const { return (first_sub + at(s) % per_head) * kRows; }
};

// Class of a Full or CausalDiagonal step. Keys past kv_len are masked too: their zero rows would
// add nothing stored, but with an extreme LSE exp(0 - LSE) could overflow and inf * 0 would reach
// dQ as NaN.
template <int kKeys>
__device__ __forceinline__ int classify_dense_bw(TileKind kind, int rq0, int rows, int c0, int keys) {
  const bool all_keys = keys == kKeys;
  if (kind == TileKind::Full) return all_keys ? kFull : kMasked;
  if (rq0 + rows - 1 < c0) return kEmpty;
  return rq0 >= c0 + kKeys - 1 && all_keys ? kFull : kMasked;
}

// Class of a Partial step of a 128-key CTA: thread tid < 128 (q row tid & 63, key half tid >> 6)
// writes the bits of keys c0 + 64 half .. + 63 to masks[half * 64 + row]; the other threads only
// vote. Block-wide votes: every thread of the CTA must call it.
__device__ __forceinline__ int classify_partial_bw(const AttnTile& t, const int32_t* row_offsets, const int32_t* ranges,
                                                   int rq0, int rows, int c0, bool all_keys, uint64_t* masks) {
  const int tid = static_cast<int>(threadIdx.x);
  const bool active = tid < 2 * kRows;
  const int row = tid & (kRows - 1);
  const int half = (tid >> 6) & 1;
  uint64_t mask = 0;
  const bool row_valid = active && row < rows;
  if (row_valid) mask = row_key_mask(row_offsets, ranges, t.range_row_begin + rq0 + row, c0 + half * kRows, t.kv_len);
  if (active) masks[half * kRows + row] = mask;
  if (__syncthreads_or(mask != 0) == 0) return kEmpty;
  const bool full = __syncthreads_and(!row_valid || mask == ~uint64_t{0}) != 0;
  return full && all_keys ? kFull : kMasked;
}

// Row i (< 64) of a step's LSE (log2 units) and Delta of q head qh (of hq), from the final `lse`
// and `delta` buffers: rows at or past `rows` get LSE = +inf (so P = 0 there) and Delta = 0, as
// does a row whose LSE is -inf (no key). load_lse_delta reads them into registers (a producer
// reads a step's before its slot is free, off the path from the consumers' release to the
// slot's fill); stage_lse_delta also stores them into the slot.
struct LseDelta {
  float lse2 = INFINITY;
  float delta = 0.0F;
};
__device__ __forceinline__ LseDelta load_lse_delta(const float* lse, const float* delta, int hq, const AttnTile& t, int rq0,
                                                   int rows, int qh, int i) {
  LseDelta v;
  if (i < rows) {
    const int lse_row0 = t.lse_begin >= 0 ? t.lse_begin : t.q_begin;
    const int delta_row0 = t.delta_begin >= 0 ? t.delta_begin : t.q_begin;
    const float l = lse[static_cast<int64_t>(lse_row0 + rq0 + i) * hq + qh];
    v.lse2 = l == -INFINITY ? INFINITY : l * kLog2e;
    v.delta = delta[static_cast<int64_t>(delta_row0 + rq0 + i) * hq + qh];
  }
  return v;
}
__device__ __forceinline__ void stage_lse_delta(const float* lse, const float* delta, int hq, const AttnTile& t, int rq0,
                                                int rows, int qh, int i, float* lse2_out, float* delta_out) {
  const LseDelta v = load_lse_delta(lse, delta, hq, t, rq0, rows, qh, i);
  lse2_out[i] = v.lse2;
  delta_out[i] = v.delta;
}

// Host side of every tile-list launcher: checks the shape, turns the runtime head dim into the
// template argument (the one runtime -> template switch of these kernels), and checks the launch.
// `launch` is a template lambda: launch.template operator()<kD>().
template <typename Launch>
void launch_for_head_dim(const char* name, const AttnShape& shape, Launch&& launch) {
  if (shape.num_kv_heads <= 0 || shape.num_q_heads % shape.num_kv_heads != 0)
    raise(ErrorKind::InvalidInput, std::string(name) + ": num_q_heads must be a positive multiple of num_kv_heads");
  switch (shape.head_dim) {
    case 64: launch.template operator()<64>(); break;
    case 128: launch.template operator()<128>(); break;
    default:
      raise(ErrorKind::Unsupported,
            std::string(name) + ": head_dim must be 64 or 128 (got " + std::to_string(shape.head_dim) + ")");
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) raise(ErrorKind::Cuda, std::string(name) + ": launch: " + cudaGetErrorString(err));
}

// allow_shared_memory_on_device for a kernel (launch_setup.h).
template <typename Kernel>
void allow_shared_memory(const char* name, Kernel kernel, int smem_bytes) {
  allow_shared_memory_on_device(name, reinterpret_cast<const void*>(kernel), smem_bytes);
}

// Launchers by route (attention_forward() / attention_backward() pick one): mma.sync; the plain
// Hopper kernels (route WgmmaBasic: attention_forward_sm90.cu, attention_backward_sm90.cu); the
// fastest Hopper kernels measured (route Wgmma: the warp-specialised forward attention_forward_sm90_ws.cu,
// the warp-specialised backward attention_backward_sm90_ws.cu).
void attention_forward_mma(const AttnForwardParams& params, cudaStream_t stream);
void attention_forward_wgmma_basic(const AttnForwardParams& params, cudaStream_t stream);
void attention_forward_wgmma_ws(const AttnForwardParams& params, cudaStream_t stream);
void attention_backward_mma(const AttnBackwardParams& params, cudaStream_t stream);
void attention_backward_wgmma(const AttnBackwardParams& params, cudaStream_t stream);
void attention_backward_wgmma_ws(const AttnBackwardParams& params, cudaStream_t stream);
// The split deterministic backward's dQ pass (attention_backward_dq_sm90.cu): params.dq_list.
void attention_backward_dq_wgmma(const AttnBackwardParams& params, cudaStream_t stream);

// Route selection shared by forward and backward (attention_forward.cu). Returns Mma, Wgmma or
// WgmmaBasic: an explicit request as is, Auto as Wgmma on an sm_90 device for head_dim 64 / 128
// and Mma elsewhere; a wgmma route off sm_90 raises Unsupported.
AttnKernelRoute resolve_route(AttnKernelRoute requested, int head_dim, const char* who);


}  // namespace dcp::cuda::detail
