// dcp/attention_cuda.h — CUDA attention kernels over DCP tile lists (forward, backward, merge).
//
// A tile is one (q token range) x (kv token range) x (kv head group) piece of a stage's attention
// work. One launch runs a whole tile list, so a stage with thousands of small tiles still costs
// one kernel launch. Kernels are standalone from the executor: raw device pointers, a stream.
// Built (CMake target dcp_cuda / dcp::cuda; sm_80 and sm_90a by default) only when a CUDA compiler
// is found; measured
// figures and the route to a wgmma/TMA version: bench/results/cuda_attention_*.md.
//
// Data layout (every buffer, every data block): [tokens][heads][head_dim], row-major, i.e.
// element (t, h, d) of a buffer with H heads lives at ((t * H) + h) * head_dim + d.
//   Q, dO, dQ:           [q rows][num_q_heads][head_dim]
//   K, V, dK, dV:        [kv rows][num_kv_heads][head_dim]
//   O partial (fp32):    [out rows][num_q_heads][head_dim]
//   LSE, Delta (fp32):   [rows][num_q_heads]
// GQA: q head h reads kv head h / (num_q_heads / num_kv_heads).
//
// Masks (tile-local coordinates: i = q row - q_begin, j = kv row - kv_begin):
//   Full            every (i, j) with i < q_len, j < kv_len.
//   CausalDiagonal  j <= i (top-left aligned; a diagonal block has q_len == kv_len).
//   Partial         j lies in one of row i's ranges: ranges[row_offsets[range_row_begin + i] ..
//                   row_offsets[range_row_begin + i + 1]), each an int2 {begin, end} half-open,
//                   kv-tile-local, sorted by begin, disjoint, any number per row (zero too).
//
// Forward math, per row i and q head h (scale = softmax_scale):
//   s_ij = scale * <q_i, k_j>,  LSE_i = log(sum_j exp(s_ij)) (natural log),
//   O_i = sum_j exp(s_ij - LSE_i) v_j; rows with no allowed key: O_i = 0, LSE_i = -inf.
// Tiles whose outputs are the same token (split over kv) are combined by attention_merge().
// Backward math (LSE = final merged LSE, Delta_i = <dO_i, O_i> with the final O):
//   p_ij = exp(s_ij - LSE_i), dv_j += p_ij dO_i, dp_ij = <dO_i, v_j>, ds_ij = p_ij (dp_ij - Delta_i),
//   dq_i += scale * ds_ij k_j, dk_j += scale * ds_ij q_i.
//
// Tiling (mma.sync m16n8k16 bf16 -> fp32, ldmatrix, cp.async double buffering; FA2 style):
//   forward: one CTA = 128 q rows x one q head, 4 warps x 32 rows; loops over 64-key sub-tiles.
//   forward on Hopper (route Wgmma): one CTA = the same 128 q rows x one q head, 2 warpgroups x
//   64 rows, wgmma m64n128k16 (S = Q K^T from shared memory, O += P V with P in registers),
//   128-key sub-tiles; same work items, masks and outputs. Two kernels (AttnKernelRoute): basic,
//   and warp-specialised (a producer warpgroup walks the sub-tiles and loads K / V by TMA; the
//   two MMA warpgroups take turns at the tensor cores, each overlapping the softmax of sub-tile j
//   with its P V product of sub-tile j - 1; with AttnForwardParams::work_counter, persistent:
//   one CTA per SM runs item after item).
//   backward: one CTA = 128 keys x one kv head (8 warps), loops over the group's q heads and 64-row q
//   sub-tiles; dK, dV stay in registers; dQ, dK, dV are atomically added (fp32) to the outputs.
//   backward on Hopper (route Wgmma): the same work items, 2 warpgroups x 64 keys, wgmma m64n64k16
//   for S^T, dP^T and dQ (dS^T through shared memory), m64nDk16 for dV, dK (A in registers).
//   Two kernels: basic, and warp-specialised (a producer warpgroup loads; the MMA warpgroups
//   meet at no CTA barrier).
//   Sub-tiles with no allowed (row, key) pair are skipped without loading or computing them.
// FLOPs (mask-area convention): forward 4 * area * head_dim * num_q_heads, backward 2.5x that,
//   area = number of allowed (i, j) pairs. Bytes (minimum): forward reads Q, K, V once
//   (2 bytes each element) and writes O (4 bytes) + LSE; the kernels re-read K/V once per
//   64-row q sub-tile and q head (served mostly by L2).
//
// Backward outputs are ACCUMULATED with fp32 atomicAdd: the caller zeroes dq/dk/dv (or passes
// buffers holding earlier partials). Summation order is therefore not deterministic (results
// vary in the last bits between runs) unless the deterministic backward (below) is asked for;
// forward and merge are deterministic.
//
// Preconditions (checked on the host where cheap, else undefined behaviour): head_dim is 64 or
// 128; num_q_heads % num_kv_heads == 0; tile ranges lie inside the buffers; for each tile and
// head group kv_head_end <= num_kv_heads; every pointer is 16-byte aligned device memory.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>
#include <vector>

namespace dcp::cuda {

enum class TileKind : int32_t { Full = 0, CausalDiagonal = 1, Partial = 2 };

struct AttnTile {
  int32_t q_begin = 0;          // first row in Q / dO / LSE / Delta / dQ
  int32_t q_len = 0;
  int32_t kv_begin = 0;         // first row in K / V / dK / dV
  int32_t kv_len = 0;
  int32_t out_begin = 0;        // forward: first row in the partial O / LSE output
  TileKind kind = TileKind::Full;
  int32_t kv_head_begin = 0;    // head group: kv heads [kv_head_begin, kv_head_end)
  int32_t kv_head_end = 0;      //   and the q heads that read them
  int32_t range_row_begin = 0;  // Partial: index of row 0 in row_offsets (q_len + 1 entries used)
  int32_t cells_begin = -1;     // Partial: its cell classes in AttnTileList::cells (-1: none, see below)
  // Rows of the other operands when they live elsewhere than q_begin / out_begin / kv_begin
  // (-1: the default). The executor's operands are rows of separate arrays (slots, local).
  int32_t lse_begin = -1;       // forward: LSE partial row (default out_begin); backward: LSE (q_begin)
  int32_t dout_begin = -1;      // backward: dO (default q_begin)
  int32_t delta_begin = -1;     // backward: Delta (default q_begin)
  int32_t dq_begin = -1;        // backward: dQ (default q_begin)
  int32_t dkv_begin = -1;       // backward: dK and dV (default kv_begin)
  int32_t spans_begin = -1;     // Partial: byte offset of its spans in AttnTileList::cells (-1: none, see below)
};

struct AttnShape {
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;         // 64 or 128
  float softmax_scale = 0.0F;   // usually 1 / sqrt(head_dim)
};

// One CTA's work; built on the host once per tile list (plans are reused across layers/steps).
struct AttnWorkItem {
  int32_t tile = 0;
  int32_t chunk = 0;            // forward: 128-row q sub-tile; backward: 128-key kv sub-tile
  int32_t head = 0;             // forward: q head; backward: kv head
  int32_t pad_ = 0;
  // Forward: the item covers tiles [tile, tile + num_tiles), which share q rows and outputs
  // (online softmax across them: one partial for all); accumulate: start from the partial
  // (O, LSE) already in the output rows instead of O = 0, LSE = -inf. Backward: the tiles of a
  // deterministic unit, or of a wide item's run (make_backward_runs), which share kv rows and
  // dK / dV rows.
  int32_t num_tiles = 1;
  int32_t accumulate = 0;
  // Deterministic backward: when several items add to the same dK / dV rows (the units of one
  // key block), the semaphore they take turns at (-1: this item alone writes its rows) and this
  // item's turn.
  int32_t dkv_sem = -1;
  int32_t dkv_rank = 0;
};

inline constexpr int kAttnForwardChunkRows = 128;
inline constexpr int kAttnBackwardChunkRows = 128;
// Backward items of a tile with at least this many q rows whose every key chunk walks from the
// tile's first row (Full tiles; Partial tiles by their cells) come kv head by kv head; the rest
// key chunk by key chunk (make_backward_work).
inline constexpr int kAttnHeadMajorRows = 4096;

// Work lists. Throws InvalidInput on a tile that breaks the preconditions above.
std::vector<AttnWorkItem> make_forward_work(std::span<const AttnTile> tiles, const AttnShape& shape);
std::vector<AttnWorkItem> make_backward_work(std::span<const AttnTile> tiles, const AttnShape& shape);

// Forward work over runs of tiles that share q rows and outputs: run r is tiles [first, first +
// count) of the list, walked by each of its items with one online softmax into one partial
// (accumulate: starting from the partial already in the outputs). One item per (run, 128-row q
// chunk, q head); runs heaviest first (keys, half of a causal diagonal tile's), ties in list
// order, so that a persistent launch ends on light items. Inside a run, chunk by chunk with every
// q head of a chunk together, unless the run's K and V over all kv heads exceed
// kAttnForwardHeadMajorBytes: then kv head by kv head (each chunk's q heads of that kv head
// together). Throws InvalidInput on a run outside the list, an empty run, or a run whose tiles
// read different q rows.
//
// Why the threshold: the running items (one per SM) all walk their run's keys from the first, so
// chunk by chunk they stream the K and V of every kv head at once; once that is more than L2 keeps
// (50 MB on H100 / H200), each new wave of items reads them from DRAM again, and the traffic costs
// clock at the power limit. Kv head by kv head, a wave streams one head's. Measured on an H100
// with every run so ordered (cuda_attention_h200.md, change table): lists of B 4096 full 1.03x,
// causal sequence 1.05x; but a list of lone 1024-row diagonal tiles (4 MB of K / V a run) 0.90x.
// With the threshold: B 4096 full and sequence 1.04x, B 2048 full 1.02x, the rest unchanged.
inline constexpr double kAttnForwardHeadMajorBytes = 40.0 * 1024 * 1024;
struct AttnRun {
  int32_t first = 0;
  int32_t count = 1;
  bool accumulate = false;
};
std::vector<AttnWorkItem> make_forward_run_work(std::span<const AttnTile> tiles, std::span<const AttnRun> runs,
                                                const AttnShape& shape);

// Mask-area FLOPs of a tile list (host; Partial tiles count their ranges clipped to the tile).
double attention_forward_flops(std::span<const AttnTile> tiles, const AttnShape& shape,
                               std::span<const int32_t> row_offsets, std::span<const int32_t> ranges);

// Device-side description of a tile list. All pointers are device pointers.
struct AttnTileList {
  const AttnTile* tiles = nullptr;
  const AttnWorkItem* work = nullptr;
  int32_t num_work = 0;
  const int32_t* row_offsets = nullptr;  // Partial tiles only (may be null otherwise)
  const int32_t* ranges = nullptr;       // pairs {begin, end}: 2 ints per range
  const uint8_t* cells = nullptr;        // cell classes of Partial tiles (make_partial_cells; may be null)
  // Backward, route Wgmma: items [0, num_wide) run in the wide kernel (partition_backward_work);
  // 0: the 64-row kernel runs every item.
  int32_t num_wide = 0;
};

// ---- Cell classes of Partial tiles ----------------------------------------------------------
// A Partial tile's mask is given row by row; the kernels need, per sub-tile they walk, only
// whether it has no allowed pair (skip it), every pair allowed (no mask), or some (build the
// bit masks of its rows). Working that out on the GPU costs the producer warpgroup a range walk
// per row and two block-wide votes for every sub-tile, and the backward repeats it for every q
// head of the group. make_partial_cells does it once on the host, per cell of kAttnCellRows q
// rows x kAttnCellKeys keys (row-major over the tile's cells, ceil(q_len / 64) x ceil(kv_len / 64)):
//   bit kAttnCellAny       some row of the cell has an allowed key among the cell's keys;
//   bit kAttnCellNotFull   some row of the cell misses one of the cell's keys (keys past kv_len
//                          are not the cell's: the last column is narrower).
// A sub-tile is empty when none of its cells has Any, and Full when none has NotFull and it spans
// a whole sub-tile of keys. The kernels that read cells (the warp-specialised Hopper ones) then
// compute row masks only for the sub-tiles in between; the others ignore them.
// After the classes (at a 4-byte boundary) come each Partial tile's spans, two int32 each: first
// the key spans of its 128-row q chunks (kAttnForwardChunkRows): the first and one past the last
// 128-key sub-tile with an allowed pair in the chunk's rows; then the row spans of its 128-key
// chunks (kAttnBackwardChunkRows): the first and one past the last 64-row q sub-tile with an
// allowed pair among the chunk's keys ((0, 0): none). The forward and the deterministic
// backward's dQ pass walk a q chunk's keys within its span, the backward's items a key chunk's
// rows within its span (and the deterministic dK / dV pass skips the tiles where it is empty), so
// the empty sub-tiles around a band (a sliding window, a causal diagonal) cost nothing.
// It sets cells_begin and spans_begin (byte offsets) of every Partial tile in `tiles` and returns
// the bytes for AttnTileList::cells (row_offsets / ranges: the list's masks, as AttnTileList, on
// the host; InvalidInput on a tile whose rows lie outside them).
inline constexpr int kAttnCellRows = 64;
inline constexpr int kAttnCellKeys = 64;
inline constexpr uint8_t kAttnCellAny = 1;
inline constexpr uint8_t kAttnCellNotFull = 2;
inline constexpr int kAttnSpanKeys = 128;  // keys of a span's sub-tiles (the forward's)
std::vector<uint8_t> make_partial_cells(std::span<AttnTile> tiles, std::span<const int32_t> row_offsets,
                                        std::span<const int32_t> ranges);
// Backward work as make_backward_work, without the items (128-key chunks) of Partial tiles that
// have no allowed pair (cells from make_partial_cells for these tiles; empty: every item).
std::vector<AttnWorkItem> make_backward_work(std::span<const AttnTile> tiles, const AttnShape& shape,
                                             std::span<const uint8_t> cells);

// The backward's wide kernel (route Wgmma, head dim 128, the default backward) walks a work
// item's q rows in steps of 80 instead of 64 (fewer shared-memory operand bytes per unit of work,
// src/exec/cuda/attention_backward_sm90_wide.cu) and takes only items that need no mask: a full
// 128-key chunk of a Full tile of at least min_q_rows q rows. partition_backward_work moves those
// items of make_backward_work's list to its front, each part in its order, and returns their
// number, which the caller passes as AttnTileList::num_wide; 0 (nothing moved) where the wide
// kernel does not apply. Every step costs an 80-row step, so a tile whose length 80 does not
// divide pays for rows it does not have: on one-GPU plans at B = 512 (7 steps for 512 rows) the
// wide kernel was measured 5-6 % slower on three of four masks, at B = 1024 and above faster,
// hence the default floor (bench/results/cuda_attention_h200.md); the kernel tests pass 0.
inline constexpr int kWideBackwardMinRows = 1024;
int32_t partition_backward_work(std::span<AttnWorkItem> work, std::span<const AttnTile> tiles, const AttnShape& shape,
                                int min_q_rows = kWideBackwardMinRows);

// Runs of the wide kernel: tiles that share a key block (kv rows, kv_len, dK / dV rows, head
// group) and q_len, walked one after the other by one item, which holds its 128-key chunk of K
// and V and its dK / dV in the CTA from the first tile to the last: K / V are loaded, dK / dV
// added and the step pipeline filled and drained once per run instead of once per tile. With 1024-row tiles a
// tile's item is 52 steps (4 q heads x 13), and those per-item costs held the full list at B 1024
// 7 % below its rate at B 4096 (208 steps an item) in the same kernel.
// make_backward_runs takes the wide items work[0, num_wide) (partition_backward_work's) and cuts
// each key block's tiles into runs at q rows that are multiples of max_rows (a tile belongs to the
// window of its q_begin), so the items in flight, whose runs share a window, read the same Q and
// dO rows from L2, as a tile's items do. Each run's tiles are appended to `tiles` as consecutive
// copies; one item per (run, key chunk, kv head) (AttnWorkItem::num_tiles: the run's length;
// chunk-major, or head-major from kAttnHeadMajorRows rows as make_backward_work), runs in window
// order. A tile whose wide items are not all of its chunks and heads stays a run of its own. The
// other items follow, unchanged. Returns the new num_wide; InvalidInput on a num_wide outside the
// list or a wide item that names no Full tile. Only the Wgmma route's wide kernel walks runs (the
// Mma and WgmmaBasic routes take an item as one tile): give such a list to that route alone.
inline constexpr int kWideBackwardRunRows = 4096;
int32_t make_backward_runs(std::vector<AttnTile>& tiles, std::vector<AttnWorkItem>& work, int32_t num_wide,
                           const AttnShape& shape, int max_rows = kWideBackwardRunRows);

#if defined(__CUDACC__)
#define DCP_WIDE_STEPS_FN __host__ __device__ inline
#else
#define DCP_WIDE_STEPS_FN inline
#endif
// The wide kernel's steps over one q head of a tile of q_len rows: the first n80 of 80 rows, the
// rest of 64. Both sizes are tensor-map boxes, so such a step is loaded by TMA and its dQ added by
// TMA reductions; a shorter step is loaded by cp.async with zero fill and its dQ added by atomics
// while no product is in flight. Where q_len is a multiple of 16 and at least 256, q_len = 80 n80
// + 64 b with b in [0, 4] (64 b and q_len equal mod 80) takes ceil(q_len / 80) steps, as many as
// 80-row steps would, and none is short. Other lengths take 80-row steps, the last one shorter.
struct WideBackwardSteps {
  int32_t per_head = 0;  // steps per q head: ceil(q_len / 80)
  int32_t n80 = 0;       // steps of 80 rows, first
  DCP_WIDE_STEPS_FN int32_t row0(int32_t s) const { return s < n80 ? 80 * s : 80 * n80 + 64 * (s - n80); }
  DCP_WIDE_STEPS_FN int32_t rows(int32_t s, int32_t q_len) const {
    const int32_t left = q_len - row0(s);
    const int32_t cap = s < n80 ? 80 : 64;
    return left < cap ? left : cap;
  }
};
DCP_WIDE_STEPS_FN WideBackwardSteps wide_backward_steps(int32_t q_len) {
  const int32_t r = q_len % 80;
  const int32_t b = r == 0 ? 0 : (80 - r) / 16;
  WideBackwardSteps w;
  if (r % 16 == 0 && q_len >= 64 * b) {
    w.n80 = (q_len - 64 * b) / 80;
    w.per_head = w.n80 + b;
  } else {
    w.per_head = (q_len + 79) / 80;
    w.n80 = w.per_head;
  }
  return w;
}
#undef DCP_WIDE_STEPS_FN

// Which kernel runs, forward and backward alike. Auto: Wgmma on an sm_90 device (Hopper;
// head_dim 64 or 128), else Mma. Callers choose per call (the CUDA backend from its options), so
// runs compare routes without rebuilding and a kernel that misbehaves on some GPU can be set
// aside. A wgmma route off sm_90 raises Unsupported.
// Every route gives the same outputs (the backward's up to summation order).
//   Mma         mma.sync m16n8k16, FA2 style (attention_forward.cu, attention_backward.cu): any
//               sm_80+ device the build has code for (its sm_80 machine code or PTX).
//   Wgmma       the fastest Hopper kernels measured (bench/results/cuda_attention_h200.md):
//               forward warp-specialised (attention_forward_sm90_ws.cu: a producer warpgroup
//               walks and classifies the kv sub-tiles and fills a 2-slot K / V ring by TMA; the
//               two MMA warpgroups take turns issuing S_j = Q K_j^T with O += P_{j-1} V_{j-1} and
//               run the softmax of S_j under the other's products);
//               backward warp-specialised (attention_backward_sm90_ws.cu: a producer warpgroup
//               walks and classifies the q sub-tiles and loads Q / dO / LSE / Delta into an
//               mbarrier-guarded 2-slot ring; the two MMA warpgroups (setmaxnreg) meet only at
//               one named barrier per sub-tile; dQ by TMA tensor reductions), its mask-free
//               items at head dim 128 with 80-row steps where the list puts them first
//               (attention_backward_sm90_wide.cu, AttnTileList::num_wide).
//   WgmmaBasic  the plain Hopper kernels those were built from, kept as the fallback
//               (attention_forward_sm90.cu: S, softmax, P V one after the other;
//               attention_backward_sm90.cu: the same products with loads by every thread and
//               CTA barriers; dQ by bulk asynchronous reductions, or with
//               AttnDqMode::Atomic by atomicAdd from registers).
// Every wgmma kernel needs the sm_90a build.
enum class AttnKernelRoute : int32_t { Auto = 0, Mma = 1, Wgmma = 2, WgmmaBasic = 3 };
// How the WgmmaBasic backward adds dQ to global memory (the other routes ignore it).
enum class AttnDqMode : int32_t { Bulk = 0, Atomic = 1 };

struct AttnForwardParams {
  AttnShape shape;
  AttnTileList list;                     // work from make_forward_work
  const void* q = nullptr;               // bf16
  const void* k = nullptr;               // bf16
  const void* v = nullptr;               // bf16
  float* o = nullptr;                    // fp32 partial O, rows out_begin.. of each tile
  float* lse = nullptr;                  // fp32 partial LSE
  // Rows of the K and V buffers (0: unknown; the smaller if they differ) and of the Q buffer.
  // When known, the warp-specialised Hopper kernel loads whole 128-row K / V sub-tiles and the Q
  // sub-tiles by TMA (else by cp.async); the results are the same.
  int64_t kv_rows = 0;
  int64_t q_rows = 0;
  AttnKernelRoute route = AttnKernelRoute::Auto;
  // Persistent launch (warp-specialised Hopper kernel only; the other routes ignore both): with a
  // counter, one CTA per SM (at most max_ctas, if > 0) takes work items in list order from it,
  // and a CTA's producer loads the next item's Q and first K / V while its consumers finish and
  // store the current one. The counter is two int32, zero before the first launch; the launch
  // leaves them zero again, so one counter serves every launch ordered after it (one stream; two
  // launches that may overlap need two counters). Without a counter: one CTA per item.
  int32_t* work_counter = nullptr;
  int max_ctas = 0;
};

// ---- Deterministic backward ----------------------------------------------------------------
// The default backward adds dQ, dK and dV with fp32 reductions in whatever order CTAs arrive, so
// the last bits vary run to run. The deterministic backward (route Wgmma only) gives every output
// element one writer and a fixed summation order, in two passes over the list:
//   dK / dV pass: the tiles sharing key rows (same kv rows and dK/dV rows: a "key block") form, per
//     kv head, one unit, or (unit_rows > 0) several units of consecutive tiles of at most
//     unit_rows q rows (at least one tile each), walked with the tiles whose key chunks see every
//     q row first (Full tiles; Partial tiles by their spans in `cells`, make_partial_cells), then
//     those whose chunks start on the first row, then the rest (a causal diagonal), each part in
//     list order; one work item per (unit, 128-key chunk, kv head) walks its unit's tiles with dK
//     and dV in registers and adds them once (the units of one key block in turns behind a
//     semaphore per chunk: AttnWorkItem::dkv_sem / dkv_rank). It computes no dQ. The items of a
//     (key block, kv head) run together, these groups heaviest first (the CTAs running at once
//     then share a few key blocks' Q and dO rows in L2); a key block of causal diagonals only
//     (whose chunks start on different rows) is one group, run chunk by chunk, every kv head's
//     chunk c together.
//   dQ pass: the tiles sharing dQ rows form a run (in list order); one work item per (run, 128-row
//     q chunk, q head) walks the run's tiles of its head group with dQ in registers, recomputing
//     S and dP, and adds scale * dQ to its rows once. Items run heaviest first.
// No item waits for another but for the dK / dV turns of a cut key block, which only items
// launched earlier hold. Preconditions (InvalidInput otherwise): tiles sharing dK/dV rows of a kv
// head share their kv rows exactly; tiles sharing dQ rows share their q, dO, LSE and Delta rows
// and their number; no two runs' dQ rows overlap.
struct DeterministicBackwardWork {
  std::vector<AttnTile> dkv_tiles;     // one tile per kv head, grouped by unit
  std::vector<AttnWorkItem> dkv_work;  // tile = first tile of its unit, num_tiles = its tiles
  std::vector<AttnTile> dq_tiles;      // the list's tiles grouped by run
  std::vector<AttnWorkItem> dq_work;   // tile = first tile of its run, num_tiles, chunk = q chunk, head = q head
  int32_t num_semaphores = 0;          // the dK / dV turns' int32 semaphores (zeroed by the launcher)
};
DeterministicBackwardWork make_deterministic_backward_work(std::span<const AttnTile> tiles, const AttnShape& shape,
                                                           int unit_rows = 0, std::span<const uint8_t> cells = {});

// The ordered deterministic backward (AttnBackwardParams::ordered): the default backward's work
// (make_backward_work, partition_backward_work) run as it is, each item adding its dK / dV in a
// fixed turn. order_backward_turns gives the items that add to the same dK / dV rows (one 128-key
// chunk of one key block and kv head) a semaphore each (dkv_sem) and their ranks in list order
// (dkv_rank); an item alone on its rows gets -1. Returns the number of semaphores. InvalidInput
// on an item naming no tile of the list, or tiles that share dK / dV rows of a kv head but not
// their kv rows.
int32_t order_backward_turns(std::span<AttnWorkItem> work, std::span<const AttnTile> tiles, const AttnShape& shape);

struct AttnBackwardParams {
  AttnShape shape;
  AttnTileList list;                     // work from make_backward_work
  const void* q = nullptr;               // bf16
  const void* k = nullptr;               // bf16
  const void* v = nullptr;               // bf16
  const void* dout = nullptr;            // bf16 dO, indexed like Q
  const float* lse = nullptr;            // final LSE, indexed like Q rows
  const float* delta = nullptr;          // rowsum(dO * O), indexed like Q rows
  // Rows of the Q and dO buffers (0: unknown). When both are known, the warp-specialised Hopper
  // kernel loads whole 64-row Q / dO sub-tiles by TMA (the last, shorter sub-tile of a tile by
  // cp.async with zero fill); the results are the same.
  int64_t q_rows = 0;
  int64_t dout_rows = 0;
  // Rows of the K and V buffers (0: unknown; the smaller if they differ): the dQ pass of the split
  // deterministic backward loads whole 128-row K / V sub-tiles by TMA when known.
  int64_t kv_rows = 0;
  float* dq = nullptr;                   // accumulated (atomicAdd)
  // Rows of the dq buffer (0: unknown). When known, the warp-specialised Hopper kernel adds each
  // full 64-row dQ sub-tile with tensor-memory-access reductions (two instructions per 64 x 64
  // block) instead of per-row or per-element atomics; the results are the same.
  int64_t dq_rows = 0;
  float* dk = nullptr;                   // accumulated (atomic adds or TMA reductions)
  float* dv = nullptr;                   // accumulated (atomic adds or TMA reductions)
  // Rows of the dk and dv buffers (0: unknown; the smaller if they differ). When known, the
  // warp-specialised Hopper kernel adds the dK / dV of a work item with a full 128-key chunk by
  // tensor-memory-access reductions (whole 128-byte lines) instead of 8-byte atomics; the results
  // are the same.
  int64_t dkv_rows = 0;
  // Which backward kernel runs (see AttnKernelRoute).
  AttnKernelRoute route = AttnKernelRoute::Auto;
  AttnDqMode dq_mode = AttnDqMode::Bulk;
  // Deterministic backward: `list` is make_deterministic_backward_work's dK / dV pass and dq_list its dQ
  // pass (tiles and work; the masks and cells are list's); `semaphores` holds at least its
  // num_semaphores int32 (device memory; the launch zeroes them on the stream first). Route Wgmma
  // only (Unsupported otherwise).
  bool deterministic = false;
  int32_t* semaphores = nullptr;
  int32_t num_semaphores = 0;
  AttnTileList dq_list;
  // The one-pass deterministic backward (dq_list is not read): when `dq_units` is given
  // (deterministic_dq_units, indexed like dO: [dO row][q head]), the default kernel's products
  // run over `list` (the dK / dV work above), and each dQ contribution scale * dS K of q row i,
  // head h is added to `dq` as an int32 count of its unit u = 2^(floor(log2 b) - 28),
  // b = 2 scale |dO_ih|_2 max_j |V_j|_2 max |K| (the contribution rounded to the nearest count).
  // Since a row's P-weighted mean absolute deviation of dP_ij = dO_i . V_j is at most
  // |dO_i| max |V_j|, every sum of a row's contributions is at most b / 2 < 2^28 u in magnitude,
  // well inside int32, and integer sums are the same in any order (dcp/detail/dq_units.h). `dq`
  // then holds counts, not floats (zero is zero in both), until deterministic_dq_from_units
  // turns them into fp32 after the last call adding into those rows; every call adding into a
  // dq row must use the same units. dK and dV have one writer per key chunk, as in the two-pass
  // method. dQ keeps 29 bits below the bound, which exceeds a row's values by 2^12-2^17 on inputs
  // with outlier features (tests/cuda/deterministic_units_test.cpp): 12-17 bits there, above
  // the bf16 gradient it becomes; the two-pass method keeps fp32's rounding of each sum.
  const int32_t* dq_units = nullptr;
  // The ordered one-pass deterministic backward (with dq_units; dq_list is not read): `list` is
  // the default backward's work with order_backward_turns' turns, and both kernels run it as the
  // default backward does (the wide kernel's items, then the 64-row kernel's, one launch after the
  // other on the stream, so that every turn an item waits for was taken by an item launched
  // before it), each dQ contribution added in units as above, each item's dK / dV added once its
  // turn comes. Every element then receives its additions in one order: dQ's integer sums are
  // exact in any order, dK / dV's come in list order.
  bool ordered = false;
};

// The one-pass deterministic backward's units (AttnBackwardParams::dq_units): units[r * hq + h]
// = the biased fp32 exponent of row r's unit for q head h, from dO rows [0, dout_rows)
// ([rows][num_q_heads][head_dim] bf16) and every K and V row that any call adding into these dq
// rows reads (k, v: [kv_rows][num_kv_heads][head_dim] bf16). `bound` is scratch for 2 x
// num_kv_heads floats. Exact maxima and fixed-order sums: the same rows give the same bits.
void deterministic_dq_units(const void* k, const void* v, int64_t kv_rows, const void* dout, int64_t dout_rows,
                            const AttnShape& shape, float* bound, int32_t* units, cudaStream_t stream);
// The same from |dO|_2^2 of each (row, q head) (dout_norm2, indexed like units: what the Delta
// kernels write beside Delta), which spares the pass over dO. Where those norms come from other
// values than the kernel's dO (an fp32 dO that the arrays hold in bf16), the bound's factor-2
// margin covers the difference. `dlse_abs` (optional, indexed like units): |d_lse| of each
// (row, q head) where the backward takes a gradient of lse, which widens the bound (dq_units.h).
void deterministic_dq_units_from_norms(const void* k, const void* v, int64_t kv_rows, const float* dout_norm2,
                                       int64_t rows, const AttnShape& shape, float* bound, int32_t* units,
                                       cudaStream_t stream, const float* dlse_abs = nullptr);

// dq rows [0, rows) ([rows][num_q_heads][head_dim], int32 counts of units as the one-pass
// deterministic backward left them) := their fp32 values, in place; units indexed like dq
// ([row][q head]).
void deterministic_dq_from_units(float* dq, const int32_t* units, int64_t rows, const AttnShape& shape,
                                 cudaStream_t stream);

void attention_forward(const AttnForwardParams& params, cudaStream_t stream);
// The kernel attention_forward() runs for `params` on the current device: Mma, Wgmma or
// WgmmaBasic (never Auto).
AttnKernelRoute attention_forward_route(const AttnForwardParams& params);
void attention_backward(const AttnBackwardParams& params, cudaStream_t stream);
// Likewise for attention_backward().
AttnKernelRoute attention_backward_route(const AttnBackwardParams& params);

// LSE merge: for each output row r and q head h, combine partial rows
// part_rows[part_offsets[r] .. part_offsets[r+1]) of (o_part, lse_part):
//   LSE = log(sum_i exp(lse_i)), O = sum_i exp(lse_i - LSE) o_i; no partial or all -inf:
//   O = 0, LSE = -inf. Writes out_f32 and/or out_bf16 (either may be null) and lse_out
//   (may be null). Rows are [rows][num_heads][head_dim]; head_dim % 4 == 0.
struct AttnMergeParams {
  int32_t num_rows = 0;
  int32_t num_heads = 0;
  int32_t head_dim = 0;
  const int32_t* part_offsets = nullptr;  // num_rows + 1
  const int32_t* part_rows = nullptr;
  const float* o_part = nullptr;
  const float* lse_part = nullptr;
  float* out_f32 = nullptr;
  void* out_bf16 = nullptr;
  float* lse_out = nullptr;
  // Row of each partial's LSE when it differs from its O row (null: part_rows). An output may
  // be one of its own partials (in place).
  const int32_t* part_lse_rows = nullptr;
};
void attention_merge(const AttnMergeParams& params, cudaStream_t stream);

// Sum of fp32 partials: out[r] = sum over part_rows[part_offsets[r] .. part_offsets[r+1]) of
// part[row], each row `row_elems` floats (row_elems % 4 == 0); optional bf16 copy.
struct SumPartialsParams {
  int32_t num_rows = 0;
  int32_t row_elems = 0;
  const int32_t* part_offsets = nullptr;
  const int32_t* part_rows = nullptr;
  const float* part = nullptr;
  float* out_f32 = nullptr;
  void* out_bf16 = nullptr;
};
void sum_partials(const SumPartialsParams& params, cudaStream_t stream);

// Batched merge: many output blocks in ONE launch (a run of independent Merge instructions).
// A segment is one output block of num_rows rows of row_elems floats, combined from its partials
// parts[part_begin .. part_end) in that order; each partial names row 0 of its rows (and of its
// LSE rows). Per segment:
//   head_dim > 0: LSE merge as attention_merge (row_elems = heads x head_dim, an LSE row holds
//                 `heads` floats); lse_out may be null;
//   head_dim == 0: plain sum as sum_partials (lse ignored).
// out_f32 and/or out_bf16 (either may be null) receive the result. A segment's output may be
// one of its own partials (the same rows: in place, as for an accumulating merge); otherwise no
// segment may write rows that another segment of the launch reads or writes. Deterministic: each
// output element reads its partials in order. Bytes: as attention_merge / sum_partials, plus one
// 48-byte segment and a binary search over the segments per CTA.
struct MergeSegment {
  float* out_f32 = nullptr;
  void* out_bf16 = nullptr;
  float* lse_out = nullptr;
  int32_t num_rows = 0;
  int32_t row_elems = 0;    // multiple of 4
  int32_t head_dim = 0;     // LSE merge: multiple of 4 dividing row_elems, head_dim / 4 dividing 256
  int32_t part_begin = 0;
  int32_t part_end = 0;
  int32_t block_begin = 0;  // first CTA of the segment (filled by prepare_merge_batch)
};
struct MergePart {
  const float* rows = nullptr;  // row 0 of the partial (row_elems floats a row)
  const float* lse = nullptr;   // LSE merge: row 0 of the partial's LSE
};
// Host: checks every segment (InvalidInput naming it), fills block_begin in order, and returns
// the number of CTAs of the launch (segments of zero rows get none).
int32_t prepare_merge_batch(std::span<MergeSegment> segments);
struct MergeBatchParams {
  const MergeSegment* segments = nullptr;  // device copy of prepared segments
  int32_t num_segments = 0;
  int32_t num_blocks = 0;                  // prepare_merge_batch's result
  const MergePart* parts = nullptr;        // device
};
void merge_batch(const MergeBatchParams& params, cudaStream_t stream);

// Delta[r][h] = sum_d dO[r][h][d] * O[r][h][d] (dO bf16, O bf16), num_rows x num_heads.
void attention_backward_delta(const void* dout_bf16, const void* out_bf16, float* delta,
                              int32_t num_rows, int32_t num_heads, int32_t head_dim,
                              cudaStream_t stream);

}  // namespace dcp::cuda
