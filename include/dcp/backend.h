// dcp/backend.h — what a backend implements for the executor (executor.h): memory, Attend over
// a tile list, Merge, Copy, Delta, and moves between its arrays and host or caller tensors. Every
// call names rows of the executor's arrays; a backend never sees plan structures.
//
// Storage. One array per tensor (Array below): Q, K, V, O, LSE, dO, Delta, dQ, dK, dV, each
// allocated once through the backend, of rows of one head group (or KV set):
//   Q, O, dO, dQ: q_heads_per_group x head_dim elements; K, V, dK, dV: kv_heads_per_group x
//   head_dim; LSE, Delta: q_heads_per_group.
// An array holds, in this order: the local tensors of each layer (layer-major, then head group
// (or KV set), then the owned tokens in dispatch order: "group-major", so one data block of one
// group is a dense run of rows), the forward slots, the backward slots (slot s of a kind is
// max_block_tokens rows). A KV data block is the same rows of K and V (dKV: dK and dV).
// Element types: Q, K, V and dO in backend.storage_type() (CPU: fp32; CUDA: bf16, so messages
// match plan_block_bytes of bf16 batches); every other array fp32 (partials, LSE, Delta and the
// final O, dQ, dK, dV).
//
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dcp/plan.h"

namespace dcp {

enum class ElemType : uint8_t { F32, BF16 };
inline int64_t elem_bytes(ElemType t) { return t == ElemType::F32 ? 4 : 2; }
const char* to_string(ElemType t);  // "fp32", "bf16"

// Where a backend takes the memory of executors from: the backend's own allocator by default,
// or the caller's (a training framework's caching allocator, an arena). Blocks are returned in
// the order of the backend's compute stream: a block given back may be handed out again for
// work queued after everything already queued, which is what stream-ordered allocators (CUDA's
// and PyTorch's) promise.
class Allocator {
 public:
  virtual ~Allocator() = default;
  // At least `bytes` bytes, 256-byte aligned, in the backend's memory. Throws on failure.
  virtual void* allocate(int64_t bytes) = 0;
  virtual void deallocate(void* p) noexcept = 0;
};

// A caller's tensor of tokens x heads x head_dim (LSE and Delta: head_dim 1). Element
// (t, h, d) lives at data + t * row_stride + h * head_stride + d, in elements of `type`.
struct TensorView {
  void* data = nullptr;
  ElemType type = ElemType::BF16;
  int64_t rows = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;
  int64_t row_stride = 0;   // 0: heads * head_dim (dense)
  int64_t head_stride = 0;  // 0: head_dim
  // The strides with 0 replaced by the dense values.
  TensorView resolved() const;
};

enum class Array : uint8_t { Q, K, V, O, LSE, dO, Delta, dQ, dK, dV };
inline constexpr int kNumArrays = 10;
const char* to_string(Array a);

// Where the arrays of one executor live (backend memory) and their row geometry.
struct ArraySet {
  std::array<void*, kNumArrays> base{};
  std::array<ElemType, kNumArrays> type{};
  std::array<int64_t, kNumArrays> row_elems{};
  std::array<int64_t, kNumArrays> rows{};
  // Heads of one head group (a row of Q holds q_heads x head_dim elements; of K, kv_heads x
  // head_dim).
  int q_heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  void* at(Array a, int64_t row) const {
    const auto i = static_cast<size_t>(a);
    return static_cast<char*>(base[i]) + row * row_elems[i] * elem_bytes(type[i]);
  }
};

// A layer's rows as its backward program starts: rows [dout_row, + rows) of dO, [delta_row,
// + rows) of Delta and [dq_row, + rows) of dQ, row i of each the same token (the Delta of
// compute_delta or delta_from). When one_device (no transfers bring other rows), every K and V
// row its Attend calls read is in rows [kv_row, + kv_rows). When dq_in_place, the program's
// Attend calls add every dQ contribution into those dQ rows directly (row i from the tiles of dO
// row i), nothing else reads them before the program ends (no dQ slot, Copy or summing Merge;
// only the empty merges that zero a block no tile reaches), and the program writes every one of
// them (the plan's owned outputs).
struct BackwardRows {
  int64_t kv_row = 0;
  int64_t kv_rows = 0;
  int64_t dout_row = 0;
  int64_t delta_row = 0;
  int64_t dq_row = 0;
  int64_t rows = 0;
  bool one_device = false;
  bool dq_in_place = false;
};

// One tile of an Attend instruction, resolved to array rows (first row of each operand).
struct AttendTile {
  int32_t tile = 0;  // index into table.tiles
  TileKind kind = TileKind::Full;
  int64_t num_q = 0, num_kv = 0;
  int64_t q = 0, kv = 0;                // Q; K and V
  int64_t o = 0, lse = 0;               // forward: O, LSE partials
  int64_t d_o = 0, lse_in = 0, delta = 0, dq = 0, dkv = 0;  // backward (dkv: dK and dV)
  bool accumulate_q = false, accumulate_kv = false;
  // Partial: row r's ranges are ranges[ranges_begin + row_offsets[mask + r] .. + [mask + r + 1])
  // (the tile's offsets start at 0).
  int64_t mask = -1;
  int64_t ranges_begin = 0;
};

// One Attend instruction. `key` identifies (executor, layer, pass, instruction) for the life of
// the backend, so a backend may cache what it derives from the call (work lists on the device).
struct AttendCall {
  Pass pass = Pass::Forward;
  uint64_t key = 0;
  std::span<const AttendTile> tiles;
  std::span<const int64_t> row_offsets;  // Partial masks, tile-local key coordinates
  std::span<const Range> ranges;
  // A transfer round of this device is started and not yet waited for: its communication kernels
  // need processors while this call runs (the CUDA backend then leaves its forward to the
  // hardware's block scheduler instead of holding every SM with a persistent launch).
  bool comm_in_flight = false;
};

// One Merge instruction (fp32 rows). Forward: O and LSE rows; backward: rows of dQ or of dK and
// dV (`second` true: the dV part as well). The destination is always overwritten; when
// `accumulate`, its old content is one of the inputs (the first).
struct MergeCall {
  uint64_t key = 0;
  DataKind kind = DataKind::O;
  int64_t num_rows = 0;            // tokens
  int64_t dst = 0, dst_lse = 0;    // first rows
  std::span<const int64_t> src;     // first row of each partial (O / dQ / dK)
  std::span<const int64_t> src_lse; // forward: LSE row of each partial
  bool accumulate = false;
};

// A run of consecutive Merge instructions with no dependency between them: no call reads or
// writes rows that another call of the batch writes (a call may read its own destination), so
// they may run in any order or all at once. `key` identifies the batch like a call key (that of
// its first instruction: a batch always starts at the same instruction and covers the same ones).
struct MergeBatchCall {
  uint64_t key = 0;
  std::span<const MergeCall> calls;  // program order
};

// One move between the group-major local rows of an array and a caller's tensor of all heads:
// rows [first_row + g * num_rows, + num_rows) of `array` hold heads [g * h, (g + 1) * h) of the
// tensor's rows [0, num_rows), for every group g < num_groups (h: the array's heads per group).
// Import: tensor -> array; export: array -> tensor. Elements convert between the two types.
struct LocalExchange {
  Array array = Array::Q;
  bool import = true;
  int64_t first_row = 0;
  int64_t num_rows = 0;
  int num_groups = 1;
  TensorView tensor;
};

// The compute side of a device. Pointers are backend memory (host memory for the CPU backend).
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // Element type of Q, K, V and dO storage (the others are always fp32).
  virtual ElemType storage_type() const = 0;
  // True when arrays live in host memory (comms then move host buffers).
  virtual bool host_memory() const = 0;
  // `bytes` zeroed bytes, valid until the backend is destroyed. Counted (num_allocations).
  virtual void* allocate(int64_t bytes) = 0;
  virtual int64_t num_allocations() const = 0;
  // Returns what allocate() gave (the executor, when destroyed). Default: kept until the end.
  virtual void deallocate(void* p) { (void)p; }
  // True when deallocate() may run before queued work that uses the block has finished (the
  // memory comes back in stream order); false: executors synchronize() before deallocating.
  virtual bool stream_ordered_memory() const { return false; }
  // Drops what was cached for call keys k with (k & mask) == base (an executor's keys).
  virtual void forget(uint64_t base, uint64_t mask) { (void)base; (void)mask; }
  // Builds, ahead of the first call, what the backend derives from every Attend and Merge run of
  // an executor (CUDA: tile and work lists, merge segments, uploaded in one copy). Optional: a
  // backend that builds on first use ignores it.
  virtual void prepare(const ArraySet& arrays, std::span<const AttendCall> attends,
                       std::span<const MergeBatchCall> merges) {
    (void)arrays, (void)attends, (void)merges;
  }
  // The stream that orders compute (CUDA: a cudaStream_t), null for synchronous backends.
  virtual void* compute_stream() { return nullptr; }
  // Orders later compute on `stream` instead (CUDA: the caller's current cudaStream_t; 0 is the
  // legacy default stream). Synchronous backends ignore it.
  virtual void set_compute_stream(void* stream) { (void)stream; }
  virtual void synchronize() {}
  // Timing markers (ExecOptions::timeline): mark(i) records marker i in compute order (CUDA: an
  // event on the compute stream; synchronous backends: the host clock now); marker_seconds(n)
  // waits for markers 0..n-1 and returns their times in seconds relative to marker 0. Markers
  // are reused from index 0 at each pass, so steady-state timing allocates nothing.
  virtual void mark(int index);
  virtual std::vector<double> marker_seconds(int count);

  // Before a layer's backward program, with its dO and Delta rows in place (BackwardRows). The
  // CUDA backend's one-pass deterministic backward derives its dQ units from them
  // (CudaKernelOptions::deterministic_one_pass).
  virtual void begin_backward(const ArraySet& arrays, const BackwardRows& rows) { (void)arrays, (void)rows; }
  // After the layer's backward program, the same rows. The CUDA backend's one-pass deterministic
  // backward leaves its dQ rows as integer counts of units until they are read: their export
  // (exchange) converts them as it copies, anything else that reads or writes dQ converts them
  // first, and the layer's next backward drops them unread.
  virtual void end_backward(const ArraySet& arrays, const BackwardRows& rows) { (void)arrays, (void)rows; }
  virtual void attend(const ArraySet& arrays, const AttendCall& call) = 0;
  virtual void merge(const ArraySet& arrays, const MergeCall& call) = 0;
  // Every call of `batch` (the result of merge() on each, in order). Default: exactly that; the
  // CUDA backend runs the whole batch in one launch.
  virtual void merge_batch(const ArraySet& arrays, const MergeBatchCall& batch);
  // rows [dst, dst + num_rows) := rows [src, ...) of array a.
  virtual void copy_rows(const ArraySet& arrays, Array a, int64_t dst, int64_t src, int64_t num_rows) = 0;
  virtual void zero_rows(const ArraySet& arrays, Array a, int64_t row, int64_t num_rows) = 0;
  // Delta rows [delta, +num_rows) = rowsum(dO * O) per head (q_heads_per_group heads).
  virtual void compute_delta(const ArraySet& arrays, int64_t d_o, int64_t o, int64_t delta, int64_t num_rows) = 0;
  // Every exchange, in order (the CUDA backend: one launch). Pre: each tensor has num_rows rows
  // and num_groups x the array's heads per group heads of the array's head_dim (LSE, Delta: 1).
  virtual void exchange(const ArraySet& arrays, std::span<const LocalExchange> moves) = 0;
  // Delta rows [delta_row + g * num_rows, + num_rows) of group g = rowsum(dO * O) over head_dim,
  // read from the caller's dO and O (all heads) directly, minus d_lse (fp32, all heads, head_dim
  // 1) where given (AttentionBackwardArgs::d_lse).
  virtual void delta_from(const ArraySet& arrays, int64_t delta_row, int64_t num_rows, int num_groups,
                          const TensorView& d_o, const TensorView& o, const TensorView* d_lse) = 0;
  // Host fp32 rows (host_ld floats apart, row_elems used) <-> array rows (converted).
  virtual void upload(const ArraySet& arrays, Array a, int64_t row, const float* host, int64_t host_ld,
                      int64_t num_rows) = 0;
  virtual void download(const ArraySet& arrays, Array a, int64_t row, float* host, int64_t host_ld,
                        int64_t num_rows) = 0;
  // Rows := uniform values in [-amplitude, amplitude] from a hash of (seed, element index), made
  // where the rows live (benchmarks: no host data to generate or copy).
  virtual void fill_random(const ArraySet& arrays, Array a, int64_t row, int64_t num_rows, uint64_t seed,
                           float amplitude) = 0;

 private:
  std::vector<std::chrono::steady_clock::time_point> host_marks_;  // default mark()/marker_seconds()
};

// The CPU backend: host memory and the kernels of attention_cpu.h. With an allocator, executors'
// memory comes from it (it must outlive the backend).
std::unique_ptr<Backend> make_cpu_backend(Allocator* allocator = nullptr);

}  // namespace dcp
