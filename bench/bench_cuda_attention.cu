// bench_cuda_attention — TFLOP/s of the tile-list attention kernels on one GPU.
//
// Tile lists equivalent to one causal sequence of S tokens cut into blocks of B tokens:
//   full      the off-diagonal tiles (i, j < i), kind Full
//   causal    the diagonal tiles (i, i), kind CausalDiagonal
//   sequence  both (the whole causal sequence in one launch)
//   partial   the diagonal tiles as Partial tiles (one range [0, i + 1) per row): the cost of the
//             general mask path against `causal`
//   window    causal sliding window of 4096 keys, every tile that meets the band as a Partial
//             tile: time should follow the unmasked area (sub-tiles outside the band are skipped)
// 32 q heads / 8 kv heads, head dim 128, bf16. FLOPs: mask area x 4 x D x Hq forward, 2.5x
// backward. Time: CUDA events, median of the timed runs after warm-up. Forward and backward are
// timed per route side by side (dcp::cuda::AttnKernelRoute): mma, and on sm_90 wgmma-basic,
// wgmma (the default Hopper kernels), wgmma-cells (the same with the host's cell classes of
// Partial tiles, make_partial_cells) and wgmma-persistent (cells and the persistent forward, one CTA
// per SM taking items from a counter; its backward is wgmma-cells') and wgmma-runs (the same
// forward over runs: the tiles that share q rows walked by one item into one output, online
// softmax across them, runs heaviest first: what the CUDA backend runs on a list whose outputs
// accumulate in place, the plans' default; its backward is wgmma-cells' with the wide kernel's
// items in runs of the tiles that share a key block, make_backward_runs, as the backend issues it).
// On sm_90 the deterministic backward (route wgmma over make_deterministic_backward_work) is
// timed too: column wgmma-det, the two-pass method (a dK / dV pass, then a dQ pass) with its
// dK / dV pass's share, the one-pass method (AttnBackwardParams::dq_units and the dq conversion
// after it; the units' set-up not timed) and the ordered one-pass method (AttnBackwardParams::
// ordered: the default work in turns, both kernels). DCP_BENCH_ROUTES selects them by the name wgmma-det.
// Each timed pass first runs back to back for DCP_BENCH_SETTLE_MS (default 500; 0: two warm-up
// launches only), so that it is timed at its own sustained clock, not the one the previous list
// left (see median_ms).
// Usage: bench_cuda_attention [out_prefix]   (writes out_prefix.json and out_prefix.md)
// Environment (to profile one case, e.g. under Nsight Compute): DCP_BENCH_SEQ, DCP_BENCH_BLOCK,
// DCP_BENCH_LIST and DCP_BENCH_ROUTES (comma-separated values) keep only the matching cases.
// DCP_ATTN_WIDE_BACKWARD, as for the dcp command: on by default, the backward's full chunks of
// Full tiles run in the wide kernel (80-row steps; cuda::partition_backward_work); 0 turns it off.
// DCP_ATTN_BACKWARD_RUN_ROWS, as for the dcp command: the wide kernel's runs under wgmma-runs
// (cuda::make_backward_runs; 0: one item per tile).
// DCP_BENCH_ENERGY_S=N: after its timing, each pass of each route runs again, launch after launch,
// until it fills N seconds, with the GPU's energy counter read around them (NVML, as `dcp bench
// --energy-iters`): TFLOP per kJ, mean watts and the median SM clock, printed under the row and in
// the JSON. At the H200's 700 W limit a long list's rate follows its energy per FLOP: these say
// whether a kernel is slower than another per clock or per joule.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dcp/cuda_backend.h"
#include "dcp/detail/attention_cuda.h"
#include "gpu_energy.h"

using namespace dcp::cuda;

namespace {

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "CUDA error at %s: %s\n", what, cudaGetErrorString(e));
    std::exit(2);
  }
}

__global__ void init_bf16(__nv_bfloat16* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint64_t z = (i + 1) * 0x9E3779B97F4A7C15ULL + seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    p[i] = __float2bfloat16(static_cast<float>(z >> 40) * (2.0F / 16777216.0F) - 1.0F);
  }
}

__global__ void init_f32(float* p, size_t n, float v) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x) p[i] = v;
}

struct ListCase {
  std::string name;
  std::vector<AttnTile> tiles;
  std::vector<int32_t> row_offsets{0};
  std::vector<int32_t> ranges{0, 0};
  int out_rows = 0;
};

ListCase make_case(const std::string& name, int seq, int block, int num_kv_heads) {
  ListCase c;
  c.name = name;
  c.row_offsets.clear();
  c.ranges.clear();
  const int n = seq / block;
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j <= i; ++j) {
      const bool diag = i == j;
      if (name == "full" && diag) continue;
      if ((name == "causal" || name == "partial") && !diag) continue;
      constexpr int kWindow = 4096;
      if (name == "window" && (j + 1) * block <= i * block - kWindow + 1) continue;  // below the band
      AttnTile t;
      t.q_begin = i * block;
      t.q_len = block;
      t.kv_begin = j * block;
      t.kv_len = block;
      t.out_begin = c.out_rows;
      c.out_rows += block;
      t.kind = diag ? TileKind::CausalDiagonal : TileKind::Full;
      t.kv_head_begin = 0;
      t.kv_head_end = num_kv_heads;
      if (name == "partial" || name == "window") {
        t.kind = TileKind::Partial;
        t.range_row_begin = static_cast<int32_t>(c.row_offsets.size());
        for (int r = 0; r < block; ++r) {
          c.row_offsets.push_back(static_cast<int32_t>(c.ranges.size() / 2));
          const int q_pos = t.q_begin + r;
          const int lo = name == "window" ? std::max(q_pos - kWindow + 1, t.kv_begin) : t.kv_begin;
          const int hi = std::min(q_pos + 1, t.kv_begin + block);
          if (hi > lo) {
            c.ranges.push_back(lo - t.kv_begin);
            c.ranges.push_back(hi - t.kv_begin);
          }
        }
        c.row_offsets.push_back(static_cast<int32_t>(c.ranges.size() / 2));
      }
      c.tiles.push_back(t);
    }
  }
  if (c.row_offsets.empty()) c.row_offsets.push_back(0);
  if (c.ranges.empty()) c.ranges = {0, 0};
  return c;
}

// The case's forward as the CUDA backend issues it when outputs accumulate in place: tiles with
// the same q rows (consecutive in make_case's order) form a run with one output, written by the
// items of make_forward_run_work, which walk every tile of their run.
struct RunsWork {
  std::vector<AttnTile> tiles;
  std::vector<AttnWorkItem> work;
};
RunsWork make_runs_work(const ListCase& c, const AttnShape& shape) {
  RunsWork r{c.tiles, {}};
  std::vector<AttnRun> runs;
  for (int i = 0; i < static_cast<int>(r.tiles.size()); ++i) {
    AttnTile& t = r.tiles[static_cast<size_t>(i)];
    if (!runs.empty() && r.tiles[static_cast<size_t>(runs.back().first)].q_begin == t.q_begin) {
      t.out_begin = r.tiles[static_cast<size_t>(runs.back().first)].out_begin;
      ++runs.back().count;
    } else {
      runs.push_back(AttnRun{i, 1, false});
    }
  }
  r.work = make_forward_run_work(r.tiles, runs, shape);
  return r;
}

// True when the environment variable `name` is unset or lists `value` among its comma-separated items.
bool selected(const char* name, const std::string& value) {
  const char* env = std::getenv(name);
  if (env == nullptr || *env == '\0') return true;
  const std::string list = std::string(",") + env + ",";
  return list.find("," + value + ",") != std::string::npos;
}

// How long a pass runs back to back before its timed runs (DCP_BENCH_SETTLE_MS, default 500).
// At the power limit the SM clock a list runs at depends on what ran just before: a list timed
// right after a low-power one starts at a high clock that the power controller then pulls down,
// and one timed after a high-power one the other way, for a few hundred milliseconds. A
// few warm-up launches leave the timed runs inside that swing (the same forward code read 0.85x
// to 1.0x of cuDNN depending on the list before it); settling first times the pass in its own
// sustained state, which is also the state a training step runs in.
double g_settle_s = 0.5;

template <typename F>
float median_ms(F&& launch, int warmup, int reps) {
  cudaEvent_t a, b;
  ck(cudaEventCreate(&a), "event");
  ck(cudaEventCreate(&b), "event");
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < warmup; ++i) launch();
  ck(cudaDeviceSynchronize(), "warmup");
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < g_settle_s) {
    launch();
    ck(cudaDeviceSynchronize(), "settle");
  }
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    ck(cudaEventRecord(a), "record");
    launch();
    ck(cudaEventRecord(b), "record");
    ck(cudaEventSynchronize(b), "sync");
    float t = 0;
    ck(cudaEventElapsedTime(&t, a, b), "elapsed");
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// A pass run back to back until it fills `seconds`, with the energy counter read around the runs.
struct Energy {
  double tflop_per_kj = 0, watts = 0, mhz = 0;
};
template <typename F>
Energy measure_energy(const dcp::cli::GpuEnergyMeter& meter, F&& launch, double flops, double seconds) {
  launch();
  ck(cudaDeviceSynchronize(), "energy warm-up");
  const auto t0 = std::chrono::steady_clock::now();
  const std::optional<uint64_t> e0 = meter.energy_mj();
  std::vector<unsigned> mhz;
  int runs = 0;
  double elapsed = 0;
  do {
    launch();
    ck(cudaDeviceSynchronize(), "energy run");
    ++runs;
    if (const auto c = meter.sm_clock_mhz()) mhz.push_back(*c);
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (elapsed < seconds);
  const std::optional<uint64_t> e1 = meter.energy_mj();
  Energy e;
  if (e0 && e1 && *e1 > *e0) {
    const double joules = static_cast<double>(*e1 - *e0) / 1e3;
    e.tflop_per_kj = flops * runs / 1e12 / (joules / 1e3);
    e.watts = joules / elapsed;
  }
  std::sort(mhz.begin(), mhz.end());
  if (!mhz.empty()) e.mhz = mhz[mhz.size() / 2];
  return e;
}

template <typename T>
T* upload(const std::vector<T>& h) {
  T* d = nullptr;
  ck(cudaMalloc(&d, h.size() * sizeof(T)), "malloc");
  ck(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "memcpy");
  return d;
}

}  // namespace

int main(int argc, char** argv) {
  int num_gpus = 0;
  if (cudaGetDeviceCount(&num_gpus) != cudaSuccess || num_gpus == 0) {
    std::printf("SKIP: no CUDA GPU on this machine\n");
    return 0;
  }
  cudaDeviceProp prop{};
  ck(cudaGetDeviceProperties(&prop, 0), "props");
  const int hq = 32, hkv = 8, dim = 128, max_seq = 32768;
  const AttnShape shape{hq, hkv, dim, 1.0F / 11.313708498984761F};
  const size_t q_elems = static_cast<size_t>(max_seq) * hq * dim, kv_elems = static_cast<size_t>(max_seq) * hkv * dim;
  __nv_bfloat16 *q, *k, *v, *dout;
  ck(cudaMalloc(&q, q_elems * 2), "malloc");
  ck(cudaMalloc(&dout, q_elems * 2), "malloc");
  ck(cudaMalloc(&k, kv_elems * 2), "malloc");
  ck(cudaMalloc(&v, kv_elems * 2), "malloc");
  init_bf16<<<1024, 256>>>(q, q_elems, 1);
  init_bf16<<<1024, 256>>>(dout, q_elems, 2);
  init_bf16<<<1024, 256>>>(k, kv_elems, 3);
  init_bf16<<<1024, 256>>>(v, kv_elems, 4);
  float *lse, *delta, *dq, *dk, *dv;
  ck(cudaMalloc(&lse, static_cast<size_t>(max_seq) * hq * 4), "malloc");
  ck(cudaMalloc(&delta, static_cast<size_t>(max_seq) * hq * 4), "malloc");
  ck(cudaMalloc(&dq, q_elems * 4), "malloc");
  ck(cudaMalloc(&dk, kv_elems * 4), "malloc");
  ck(cudaMalloc(&dv, kv_elems * 4), "malloc");
  // A plausible final LSE (log of ~S/2 keys of weight ~1) keeps P in range for the backward.
  init_f32<<<1024, 256>>>(lse, static_cast<size_t>(max_seq) * hq, 9.0F);
  init_f32<<<1024, 256>>>(delta, static_cast<size_t>(max_seq) * hq, 0.01F);
  ck(cudaMemset(dq, 0, q_elems * 4), "memset");
  ck(cudaMemset(dk, 0, kv_elems * 4), "memset");
  ck(cudaMemset(dv, 0, kv_elems * 4), "memset");
  ck(cudaDeviceSynchronize(), "init");

  // Routes timed on this device, in column order.
  int major = 0, minor = 0;
  ck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), "cc");
  ck(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0), "cc");
  struct Route {
    AttnKernelRoute route;
    const char* name;
    bool cells = false;       // the list carries make_partial_cells' classes
    bool persistent = false;  // the forward takes items from a work counter, one CTA per SM
    bool runs = false;        // the forward walks runs of tiles sharing q rows (make_runs_work), the
                              // backward's wide items runs of tiles sharing a key block (make_backward_runs)
  };
  std::vector<Route> routes{{AttnKernelRoute::Mma, "mma"}};
  if (major == 9 && minor == 0) {
    routes.push_back({AttnKernelRoute::WgmmaBasic, "wgmma-basic"});
    routes.push_back({AttnKernelRoute::Wgmma, "wgmma"});
    routes.push_back({AttnKernelRoute::Wgmma, "wgmma-cells", true});
    routes.push_back({AttnKernelRoute::Wgmma, "wgmma-persistent", true, true});
    routes.push_back({AttnKernelRoute::Wgmma, "wgmma-runs", true, true, true});  // as the CUDA backend runs it
  }
  std::erase_if(routes, [](const Route& r) { return !selected("DCP_BENCH_ROUTES", r.name); });
  // The deterministic backward (wgmma only) is timed beside the default one.
  const bool with_det = major == 9 && minor == 0 && selected("DCP_BENCH_ROUTES", "wgmma-det");
  if (const char* settle = std::getenv("DCP_BENCH_SETTLE_MS"); settle != nullptr && *settle != '\0')
    g_settle_s = std::max(0.0, std::atof(settle) / 1e3);
  const char* energy_env = std::getenv("DCP_BENCH_ENERGY_S");
  const double energy_s = energy_env != nullptr ? std::atof(energy_env) : 0.0;
  std::unique_ptr<dcp::cli::GpuEnergyMeter> meter;
  if (energy_s > 0) {
    std::string why;
    meter = dcp::cli::GpuEnergyMeter::open(0, why);
    if (!meter) std::fprintf(stderr, "DCP_BENCH_ENERGY_S: no energy meter (%s); energy not measured\n", why.c_str());
  }
  const char* wide_env = std::getenv("DCP_ATTN_WIDE_BACKWARD");
  const bool wide_backward = wide_env == nullptr || dcp::parse_switch(wide_env, "DCP_ATTN_WIDE_BACKWARD");
  const char* run_rows_env = std::getenv("DCP_ATTN_BACKWARD_RUN_ROWS");
  const int run_rows = run_rows_env != nullptr && *run_rows_env != '\0'
                           ? dcp::parse_row_count(run_rows_env, "DCP_ATTN_BACKWARD_RUN_ROWS")
                           : kWideBackwardRunRows;
  struct Row {
    int seq, block;
    std::string list;
    int tiles;
    double flops;                       // forward mask-area FLOPs (backward: 2.5x)
    std::vector<double> fwd_ms, bwd_ms;  // per route
    double det_ms = 0;                   // deterministic backward (with_det)
    double det_one_ms = 0;               // its one-pass method (AttnBackwardParams::dq_units)
    double det_dkv_ms = 0;               // its dK / dV pass alone (the dQ pass is the rest)
    std::vector<Energy> fwd_energy, bwd_energy;  // per route (DCP_BENCH_ENERGY_S)
    double det_ordered_ms = 0;           // the ordered one-pass method (AttnBackwardParams::ordered)
  };
  std::vector<Row> rows;
  std::printf("GPU: %s (%d SMs)\n%-6s %-5s %-9s %6s", prop.name, prop.multiProcessorCount, "S", "B", "list", "tiles");
  for (const char* pass : {"fwd", "bwd"})
    for (const Route& r : routes) std::printf(" %18s", (std::string(pass) + " " + r.name + " TF/s").c_str());
  if (with_det) std::printf(" %18s %9s %14s %14s", "bwd wgmma-det TF/s", "dK/dV %", "one-pass TF/s", "ordered TF/s");
  std::printf("\n");
  int32_t* semaphores = nullptr;
  int32_t semaphore_capacity = 0;
  float* dq_bound = nullptr;    // the one-pass deterministic backward's scratch (2 x hkv floats)
  int32_t* dq_units = nullptr;  // and units ([row][q head])
  if (with_det) {
    ck(cudaMalloc(&dq_bound, 2 * hkv * sizeof(float)), "malloc dq bound");
    ck(cudaMalloc(&dq_units, static_cast<size_t>(max_seq) * hq * sizeof(int32_t)), "malloc dq units");
  }
  int32_t* work_counter = nullptr;  // the persistent forward's (two int32, left zero by each launch)
  ck(cudaMalloc(&work_counter, 2 * sizeof(int32_t)), "malloc work counter");
  ck(cudaMemset(work_counter, 0, 2 * sizeof(int32_t)), "zero work counter");
  for (int seq : {16384, 32768}) {
    for (int block : {1024, 2048, 4096}) {
      for (const char* name : {"full", "causal", "sequence", "partial", "window"}) {
        if (!selected("DCP_BENCH_SEQ", std::to_string(seq)) || !selected("DCP_BENCH_BLOCK", std::to_string(block)) ||
            !selected("DCP_BENCH_LIST", name)) {
          continue;
        }
        ListCase c = make_case(name, seq, block, hkv);
        const double flops = attention_forward_flops(c.tiles, shape, c.row_offsets, c.ranges);
        const std::vector<uint8_t> cells = make_partial_cells(c.tiles, c.row_offsets, c.ranges);
        uint8_t* d_cells = upload(cells.empty() ? std::vector<uint8_t>{0} : cells);
        AttnTile* d_tiles = upload(c.tiles);
        int32_t* d_off = upload(c.row_offsets);
        int32_t* d_rng = upload(c.ranges);
        const auto fw = make_forward_work(c.tiles, shape);
        auto bw = make_backward_work(c.tiles, shape);
        auto bw_cells = make_backward_work(c.tiles, shape, cells);
        const int32_t bw_wide = wide_backward ? partition_backward_work(bw, c.tiles, shape) : 0;
        const int32_t bw_cells_wide = wide_backward ? partition_backward_work(bw_cells, c.tiles, shape) : 0;
        // wgmma-runs' backward: the wide items in runs of the tiles that share a key block.
        std::vector<AttnTile> bw_run_tiles = c.tiles;
        std::vector<AttnWorkItem> bw_runs = bw_cells;
        const int32_t bw_runs_wide =
            run_rows > 0 ? make_backward_runs(bw_run_tiles, bw_runs, bw_cells_wide, shape, run_rows) : bw_cells_wide;
        AttnTile* d_bw_run_tiles = upload(bw_run_tiles);
        AttnWorkItem* d_bw_runs = upload(bw_runs.empty() ? std::vector<AttnWorkItem>{AttnWorkItem{}} : bw_runs);
        const RunsWork runs = make_runs_work(c, shape);
        AttnTile* d_run_tiles = upload(runs.tiles);
        AttnWorkItem* d_run_work = upload(runs.work);
        AttnWorkItem* d_fw = upload(fw);
        AttnWorkItem* d_bw = upload(bw);
        AttnWorkItem* d_bw_cells = upload(bw_cells.empty() ? std::vector<AttnWorkItem>{AttnWorkItem{}} : bw_cells);
        float *o = nullptr, *lse_part = nullptr;
        ck(cudaMalloc(&o, static_cast<size_t>(c.out_rows) * hq * dim * 4), "malloc o");
        ck(cudaMalloc(&lse_part, static_cast<size_t>(c.out_rows) * hq * 4), "malloc lse");
        AttnForwardParams fp;
        fp.shape = shape;
        fp.list = AttnTileList{d_tiles, d_fw, static_cast<int32_t>(fw.size()), d_off, d_rng};
        fp.q = q;
        fp.k = k;
        fp.v = v;
        fp.kv_rows = max_seq;
        fp.q_rows = max_seq;
        fp.o = o;
        fp.lse = lse_part;
        AttnBackwardParams bp;
        bp.shape = shape;
        bp.list = AttnTileList{d_tiles, d_bw, static_cast<int32_t>(bw.size()), d_off, d_rng};
        bp.q = q;
        bp.k = k;
        bp.v = v;
        bp.dout = dout;
        bp.lse = lse;
        bp.delta = delta;
        bp.dq = dq;
        bp.dq_rows = max_seq;
        bp.dkv_rows = max_seq;
        bp.q_rows = max_seq;
        bp.dout_rows = max_seq;
        bp.dk = dk;
        bp.dv = dv;
        Row row{seq, block, name, static_cast<int>(c.tiles.size()), flops, {}, {}, 0, 0, 0, {}, {}, 0};
        for (const Route& r : routes) {
          fp.route = r.route;
          fp.list.cells = r.cells ? d_cells : nullptr;
          fp.work_counter = r.persistent ? work_counter : nullptr;
          fp.list.tiles = r.runs ? d_run_tiles : d_tiles;
          fp.list.work = r.runs ? d_run_work : d_fw;
          fp.list.num_work = static_cast<int32_t>(r.runs ? runs.work.size() : fw.size());
          row.fwd_ms.push_back(median_ms([&] { attention_forward(fp, nullptr); }, 2, 7));
          if (meter) row.fwd_energy.push_back(measure_energy(*meter, [&] { attention_forward(fp, nullptr); }, flops, energy_s));
        }
        fp.list.tiles = d_tiles;
        fp.list.work = d_fw;
        fp.list.num_work = static_cast<int32_t>(fw.size());
        fp.list.cells = nullptr;
        fp.work_counter = nullptr;
        for (const Route& r : routes) {
          bp.route = r.route;
          bp.list.cells = r.cells ? d_cells : nullptr;
          bp.list.tiles = r.runs ? d_bw_run_tiles : d_tiles;
          bp.list.work = r.runs ? d_bw_runs : r.cells ? d_bw_cells : d_bw;
          bp.list.num_work = static_cast<int32_t>(r.runs ? bw_runs.size() : r.cells ? bw_cells.size() : bw.size());
          bp.list.num_wide = r.runs ? bw_runs_wide : r.cells ? bw_cells_wide : bw_wide;
          row.bwd_ms.push_back(median_ms([&] { attention_backward(bp, nullptr); }, 1, 5));
          if (meter) {
            row.bwd_energy.push_back(measure_energy(*meter, [&] { attention_backward(bp, nullptr); }, 2.5 * flops, energy_s));
          }
        }
        bp.list.cells = nullptr;
        bp.list.tiles = d_tiles;
        bp.list.work = d_bw;
        bp.list.num_work = static_cast<int32_t>(bw.size());
        bp.list.num_wide = 0;
        if (with_det) {
          const DeterministicBackwardWork det = make_deterministic_backward_work(c.tiles, shape, 0, cells);
          auto reserve_semaphores = [&](int32_t n) {
            if (n <= semaphore_capacity) return;
            cudaFree(semaphores);
            ck(cudaMalloc(&semaphores, static_cast<size_t>(n) * 4), "malloc semaphores");
            semaphore_capacity = n;
          };
          reserve_semaphores(det.num_semaphores);
          AttnTile* d_dkv_tiles = upload(det.dkv_tiles);
          AttnWorkItem* d_dkv_work = upload(det.dkv_work);
          AttnTile* d_dq_tiles = upload(det.dq_tiles);
          AttnWorkItem* d_dq_work = upload(det.dq_work);
          AttnBackwardParams dp = bp;
          dp.list = AttnTileList{d_dkv_tiles, d_dkv_work, static_cast<int32_t>(det.dkv_work.size()), d_off, d_rng};
          dp.list.cells = d_cells;
          dp.dq_list = dp.list;
          dp.dq_list.tiles = d_dq_tiles;
          dp.dq_list.work = d_dq_work;
          dp.dq_list.num_work = static_cast<int32_t>(det.dq_work.size());
          dp.kv_rows = max_seq;
          dp.route = AttnKernelRoute::Wgmma;
          dp.deterministic = true;
          dp.semaphores = semaphores;
          dp.num_semaphores = det.num_semaphores;
          row.det_ms = median_ms([&] { attention_backward(dp, nullptr); }, 1, 5);
          // The one-pass method (units over every K, V and dO row of the list).
          deterministic_dq_units(k, v, max_seq, dout, max_seq, shape, dq_bound, dq_units, nullptr);
          dp.dq_units = dq_units;
          auto one_pass_ms = [&](const AttnBackwardParams& params) {  // the backward and dq's conversion
            return median_ms(
                [&] {
                  attention_backward(params, nullptr);
                  deterministic_dq_from_units(dq, dq_units, max_seq, shape, nullptr);
                },
                1, 5);
          };
          row.det_one_ms = one_pass_ms(dp);
          // The ordered one-pass method: the default work (cells, the wide kernel's items first) in turns.
          std::vector<AttnWorkItem> ordered = bw_cells;
          const int32_t ordered_sems = order_backward_turns(ordered, c.tiles, shape);
          reserve_semaphores(ordered_sems);
          AttnWorkItem* d_ordered = upload(ordered.empty() ? std::vector<AttnWorkItem>{AttnWorkItem{}} : ordered);
          AttnBackwardParams op = dp;
          op.list = AttnTileList{d_tiles, d_ordered, static_cast<int32_t>(ordered.size()), d_off, d_rng};
          op.list.cells = d_cells;
          op.list.num_wide = bw_cells_wide;
          op.semaphores = semaphores;
          op.num_semaphores = ordered_sems;
          op.ordered = true;
          row.det_ordered_ms = one_pass_ms(op);
          cudaFree(d_ordered);
          dp.dq_units = nullptr;
          dp.dq_list.num_work = 0;  // the two-pass method's dK / dV pass alone
          row.det_dkv_ms = median_ms([&] { attention_backward(dp, nullptr); }, 1, 5);
          cudaFree(d_dkv_tiles);
          cudaFree(d_dkv_work);
          cudaFree(d_dq_tiles);
          cudaFree(d_dq_work);
        }
        ck(cudaGetLastError(), "kernels");
        std::printf("%-6d %-5d %-9s %6d", seq, block, name, row.tiles);
        for (double ms : row.fwd_ms) std::printf(" %18.1f", flops / (ms * 1e9));
        for (double ms : row.bwd_ms) std::printf(" %18.1f", 2.5 * flops / (ms * 1e9));
        if (with_det)
          std::printf(" %18.1f %9.0f %14.1f %14.1f", 2.5 * flops / (row.det_ms * 1e9), 100.0 * row.det_dkv_ms / row.det_ms,
                      2.5 * flops / (row.det_one_ms * 1e9), 2.5 * flops / (row.det_ordered_ms * 1e9));
        std::printf("\n");
        for (size_t ri = 0; ri < row.bwd_energy.size(); ++ri) {
          const Energy& f = row.fwd_energy[ri];
          const Energy& b = row.bwd_energy[ri];
          std::printf("  energy %s: fwd %.0f TFLOP/kJ at %.0f W, %.0f MHz; bwd %.0f TFLOP/kJ at %.0f W, %.0f MHz\n", routes[ri].name,
                      f.tflop_per_kj, f.watts, f.mhz, b.tflop_per_kj, b.watts, b.mhz);
        }
        rows.push_back(row);
        std::fflush(stdout);
        cudaFree(o);
        cudaFree(lse_part);
        cudaFree(d_tiles);
        cudaFree(d_off);
        cudaFree(d_rng);
        cudaFree(d_fw);
        cudaFree(d_run_tiles);
        cudaFree(d_bw_run_tiles);
        cudaFree(d_bw_runs);
        cudaFree(d_run_work);
        cudaFree(d_bw);
        cudaFree(d_bw_cells);
        cudaFree(d_cells);
      }
    }
  }
  cudaFree(semaphores);
  cudaFree(dq_bound);
  cudaFree(dq_units);
  cudaFree(work_counter);
  if (argc > 1) {
    const std::string prefix = argv[1];
    FILE* j = std::fopen((prefix + ".json").c_str(), "w");
    FILE* m = std::fopen((prefix + ".md").c_str(), "w");
    if (j == nullptr || m == nullptr) {
      std::fprintf(stderr, "cannot write %s.{json,md}\n", prefix.c_str());
      return 1;
    }
    std::fprintf(j, "{\"gpu\": \"%s\", \"q_heads\": %d, \"kv_heads\": %d, \"head_dim\": %d, \"rows\": [\n", prop.name, hq,
                 hkv, dim);
    std::fprintf(m, "GPU: %s; 32 q / 8 kv heads, head dim 128, bf16; mask-area TFLOP/s (bwd = 2.5x fwd FLOPs)\n\n",
                 prop.name);
    std::fprintf(m, "| S | B | list | tiles |");
    std::string rule = "|---|---|---|---|";
    for (const char* pass : {"fwd", "bwd"})
      for (const Route& r : routes) {
        std::fprintf(m, " %s %s ms | %s %s TFLOP/s |", pass, r.name, pass, r.name);
        rule += "---|---|";
      }
    if (with_det) {
      std::fprintf(m, " bwd wgmma-det ms | bwd wgmma-det TFLOP/s | det / wgmma | det dK / dV pass ms | one-pass ms | ordered ms |");
      rule += "---|---|---|---|---|---|";
    }
    std::fprintf(m, "\n%s\n", rule.c_str());
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::fprintf(j, "  {\"seq\": %d, \"block\": %d, \"list\": \"%s\", \"tiles\": %d", r.seq, r.block, r.list.c_str(),
                   r.tiles);
      std::fprintf(m, "| %d | %d | %s | %d |", r.seq, r.block, r.list.c_str(), r.tiles);
      for (int pass = 0; pass < 2; ++pass)
        for (size_t ri = 0; ri < routes.size(); ++ri) {
          const double ms = pass == 0 ? r.fwd_ms[ri] : r.bwd_ms[ri];
          const double tflops = (pass == 0 ? 1.0 : 2.5) * r.flops / (ms * 1e9);
          const char* p = pass == 0 ? "fwd" : "bwd";
          std::fprintf(j, ", \"%s_%s_ms\": %.4f, \"%s_%s_tflops\": %.1f", p, routes[ri].name, ms, p, routes[ri].name, tflops);
          const std::vector<Energy>& energy = pass == 0 ? r.fwd_energy : r.bwd_energy;
          if (ri < energy.size()) {
            std::fprintf(j, ", \"%s_%s_tflop_per_kj\": %.1f, \"%s_%s_watts\": %.1f, \"%s_%s_mhz\": %.0f", p, routes[ri].name,
                         energy[ri].tflop_per_kj, p, routes[ri].name, energy[ri].watts, p, routes[ri].name, energy[ri].mhz);
          }
          std::fprintf(m, " %.3f | %.1f |", ms, tflops);
        }
      if (with_det) {
        const double tflops = 2.5 * r.flops / (r.det_ms * 1e9);
        std::fprintf(j,
                     ", \"bwd_wgmma-det_ms\": %.4f, \"bwd_wgmma-det_tflops\": %.1f, \"bwd_wgmma-det-dkv_ms\": %.4f, "
                     "\"bwd_wgmma-det-one-pass_ms\": %.4f, \"bwd_wgmma-det-one-pass_tflops\": %.1f, "
                     "\"bwd_wgmma-det-ordered_ms\": %.4f, \"bwd_wgmma-det-ordered_tflops\": %.1f",
                     r.det_ms, tflops, r.det_dkv_ms, r.det_one_ms, 2.5 * r.flops / (r.det_one_ms * 1e9), r.det_ordered_ms,
                     2.5 * r.flops / (r.det_ordered_ms * 1e9));
        double base_ms = 0;
        for (size_t ri = 0; ri < routes.size(); ++ri)
          if (routes[ri].route == AttnKernelRoute::Wgmma) base_ms = r.bwd_ms[ri];
        std::fprintf(m, " %.3f | %.1f | %s | %.3f | %.3f | %.3f |", r.det_ms, tflops,
                     base_ms > 0 ? (std::to_string(base_ms / r.det_ms).substr(0, 5) + "x").c_str() : "-", r.det_dkv_ms,
                     r.det_one_ms, r.det_ordered_ms);
      }
      std::fprintf(j, "}%s\n", i + 1 < rows.size() ? "," : "");
      std::fprintf(m, "\n");
    }
    std::fprintf(j, "]}\n");
    std::fclose(j);
    std::fclose(m);
  }
  return 0;
}
