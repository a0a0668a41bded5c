// The attention of a training loop through the C++ library, as a framework written in C++ calls
// it (docs/cpp.md walks through it):
//
//   1. batches are planned ahead on threads (PlanQueue): step s + lookahead is submitted while
//      step s trains, so get(s) rarely waits;
//   2. each rank takes its tokens of the packed batch in the plan's dispatch order
//      (local_tokens + gather_rows); the layers between attentions then see whole tokens;
//   3. one Attention per step serves every layer: forward 0..L-1, then backward L-1..0;
//   4. layer 0's outputs and gradients are checked against the dense fp64 reference.
//
// Ranks: under mpirun one process per rank over MPI; otherwise --ranks threads in this process
// (the in-process comm). CPU backend, fp32. On GPUs the loop is the same with make_cuda_backend
// (bound to the framework's stream and allocator) and make_nccl_comm, the tensors in device
// memory.
//
//   dcp_train_step [--steps N] [--layers L] [--tokens T] [--ranks R]
//   mpirun -np 4 dcp_train_step
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "dcp/attention.h"
#include "dcp/comm.h"
#include "dcp/dispatch.h"
#include "dcp/error.h"
#include "dcp/planner.h"
#include "dcp/reference.h"

namespace {

struct Args {
  int steps = 4;
  int layers = 3;
  int64_t tokens = 3000;
  int ranks = 2;
  int lookahead = 2;
};

constexpr dcp::AttentionShape kShape{4, 2, 32, dcp::DType::FP32};

// The step's documents: heavy-tailed lengths that fill `tokens`, each with its own mask.
dcp::Batch make_batch(int64_t step, int64_t tokens) {
  std::mt19937_64 rng(1000 + static_cast<uint64_t>(step));
  std::lognormal_distribution<double> length(5.5, 1.0);
  dcp::Batch batch;
  batch.shape = kShape;
  for (int64_t left = tokens; left > 0;) {
    const int64_t n = std::min<int64_t>(left, std::max<int64_t>(1, static_cast<int64_t>(length(rng))));
    const size_t i = batch.sequences.size();
    const dcp::Mask mask = i % 3 == 0   ? dcp::Mask::causal()
                           : i % 3 == 1 ? dcp::Mask::lambda(4, 96)
                           : n >= 5     ? dcp::Mask::shared_question_for(n)
                                        : dcp::Mask::causal();
    batch.sequences.push_back({n, mask, "doc" + std::to_string(i)});
    left -= n;
  }
  return batch;
}

// The packed batch's tensors of one layer, the same on every rank (a data loader's output).
struct Global {
  std::vector<float> q, k, v, d_o;  // [T][heads][D]
};
Global make_global(int64_t step, int layer, int64_t total) {
  std::mt19937_64 rng(static_cast<uint64_t>(step) * 131 + static_cast<uint64_t>(layer));
  std::normal_distribution<float> normal(0.0F, 1.0F);
  const auto fill = [&](int heads) {
    std::vector<float> t(static_cast<size_t>(total * heads * kShape.head_dim));
    for (float& x : t) x = normal(rng);
    return t;
  };
  Global g;
  g.q = fill(kShape.q_heads);
  g.k = fill(kShape.kv_heads);
  g.v = fill(kShape.kv_heads);
  g.d_o = fill(kShape.q_heads);
  return g;
}

struct Local {
  std::vector<float> q, k, v, d_o, o, lse, dq, dk, dv;
};
dcp::TensorView view(std::vector<float>& t, int64_t rows, int heads, int dim) {
  return dcp::TensorView{t.data(), dcp::ElemType::F32, rows, heads, dim, 0, 0};
}

// ||got - want|| / ||want|| over this rank's rows of one tensor (want: the whole batch's).
double rel_error(const std::vector<float>& got, const std::vector<double>& want, const dcp::LocalTokens& tokens,
                 int64_t row_elems) {
  double diff = 0, norm = 0;
  for (int64_t r = 0; r < tokens.num_rows(); ++r)
    for (int64_t e = 0; e < row_elems; ++e) {
      const double w = want[static_cast<size_t>(tokens.global_row[r] * row_elems + e)];
      const double d = got[static_cast<size_t>(r * row_elems + e)] - w;
      diff += d * d;
      norm += w * w;
    }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// Layer 0 of the whole batch in fp64: every document attends within itself, by its mask.
dcp::ReferenceResult reference(const dcp::Batch& batch, const Global& g) {
  std::vector<int64_t> start{0};
  for (const dcp::Sequence& s : batch.sequences) start.push_back(start.back() + s.length);
  dcp::ReferenceProblem p;
  p.num_q = p.num_kv = batch.total_tokens();
  p.q_heads = kShape.q_heads;
  p.kv_heads = kShape.kv_heads;
  p.head_dim = kShape.head_dim;
  p.q = g.q.data();
  p.k = g.k.data();
  p.v = g.v.data();
  p.d_o = g.d_o.data();
  size_t seq = 0;
  p.row_keys = [&](int64_t row, std::vector<dcp::Range>& out) {
    while (row >= start[seq + 1]) ++seq;  // rows come in order
    const dcp::Sequence& s = batch.sequences[seq];
    s.mask.row_ranges(row - start[seq], s.length, out);
    for (dcp::Range& r : out) r = {r.begin + start[seq], r.end + start[seq]};
  };
  return dcp::reference_attention(p);
}

// One rank's training loop. Returns the largest relative error of layer 0 over the steps.
// `layout`: how the ranks sit on machines (mpi_node_layout under mpirun; in-process ranks share one).
double train(dcp::Comm& comm, const Args& args, dcp::NodeLayout layout) {
  const int rank = comm.rank();
  dcp::Cluster cluster = dcp::cluster_preset("h200-nvl", layout.nodes);
  cluster.devices_per_node = layout.devices_per_node;
  dcp::StepPlanOptions options;
  options.blocks.block_size = 128;
  // Every rank plans every step itself: plans are deterministic, so all ranks hold the same one
  // (a framework may instead plan on one rank and send serialize_plan bytes).
  dcp::PlanQueue queue(cluster, options, 2);
  for (int s = 0; s < std::min(args.lookahead, args.steps); ++s) queue.submit(s, make_batch(s, args.tokens));
  auto backend = dcp::make_cpu_backend();
  double worst = 0;
  for (int s = 0; s < args.steps; ++s) {
    const std::shared_ptr<const dcp::Plan> plan = queue.get(s);
    if (s + args.lookahead < args.steps) queue.submit(s + args.lookahead, make_batch(s + args.lookahead, args.tokens));
    const dcp::Batch batch = make_batch(s, args.tokens);  // the loader's copy (ids, labels, ...)

    // Dispatch: this rank's tokens, in the plan's order.
    const dcp::LocalTokens tokens = dcp::local_tokens(plan->table, plan->devices[rank].owned_blocks);
    const int64_t n = tokens.num_rows();
    const int64_t q_row = int64_t{kShape.q_heads} * kShape.head_dim;
    const int64_t kv_row = int64_t{kShape.kv_heads} * kShape.head_dim;
    std::vector<Global> global;
    std::vector<Local> local(static_cast<size_t>(args.layers));
    for (int l = 0; l < args.layers; ++l) {
      global.push_back(make_global(s, l, batch.total_tokens()));
      Local& t = local[static_cast<size_t>(l)];
      const auto take = [&](const std::vector<float>& from, std::vector<float>& to, int64_t row) {
        to.resize(static_cast<size_t>(n * row));
        dcp::gather_rows<float>(from, to, row, tokens);
      };
      take(global.back().q, t.q, q_row);
      take(global.back().k, t.k, kv_row);
      take(global.back().v, t.v, kv_row);
      take(global.back().d_o, t.d_o, q_row);
      t.o.resize(t.q.size());
      t.dq.resize(t.q.size());
      t.dk.resize(t.k.size());
      t.dv.resize(t.v.size());
      t.lse.resize(static_cast<size_t>(n * kShape.q_heads));
    }

    // One Attention serves every layer of the step, in the order autograd runs them.
    const auto t0 = std::chrono::steady_clock::now();
    dcp::Attention attention(*plan, *backend, comm);
    const int H = kShape.q_heads, G = kShape.kv_heads, D = kShape.head_dim;
    for (int l = 0; l < args.layers; ++l) {
      Local& t = local[static_cast<size_t>(l)];
      attention.forward({view(t.q, n, H, D), view(t.k, n, G, D), view(t.v, n, G, D), view(t.o, n, H, D),
                         view(t.lse, n, H, 1)});
    }
    const auto t1 = std::chrono::steady_clock::now();
    for (int l = args.layers - 1; l >= 0; --l) {
      Local& t = local[static_cast<size_t>(l)];
      attention.backward({view(t.q, n, H, D), view(t.k, n, G, D), view(t.v, n, G, D), view(t.o, n, H, D),
                          view(t.lse, n, H, 1), view(t.d_o, n, H, D), view(t.dq, n, H, D), view(t.dk, n, G, D),
                          view(t.dv, n, G, D)});
    }
    const auto t2 = std::chrono::steady_clock::now();

    const dcp::ReferenceResult want = reference(batch, global[0]);
    const Local& t = local[0];
    const double err = std::max({rel_error(t.o, want.o, tokens, q_row), rel_error(t.dq, want.dq, tokens, q_row),
                                 rel_error(t.dk, want.dk, tokens, kv_row), rel_error(t.dv, want.dv, tokens, kv_row)});
    worst = std::max(worst, err);
    const dcp::PlanQueue::StepStats st = queue.stats(s);
    const auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
    if (rank == 0)
      std::printf("step %d: %lld tokens in %zu documents, %lld here; planned in %.1f ms, waited %.2f ms; "
                  "forward %.1f ms, backward %.1f ms (%d layers); layer 0 error %.1e\n",
                  s, static_cast<long long>(batch.total_tokens()), batch.sequences.size(), static_cast<long long>(n),
                  st.planning_ms, st.waited_ms, ms(t0, t1), ms(t1, t2), args.layers, err);
  }
  return worst;
}

bool launched_by_mpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(var) != nullptr) return true;
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const long long value = std::atoll(argv[i + 1]);
    if (flag == "--steps") args.steps = static_cast<int>(value);
    else if (flag == "--layers") args.layers = static_cast<int>(value);
    else if (flag == "--tokens") args.tokens = value;
    else if (flag == "--ranks") args.ranks = static_cast<int>(value);
    else {
      std::fprintf(stderr, "usage: %s [--steps N] [--layers L] [--tokens T] [--ranks R]\n", argv[0]);
      return 2;
    }
  }
  if (args.steps < 1 || args.layers < 1 || args.tokens < 1 || args.ranks < 1) {
    std::fprintf(stderr, "dcp_train_step: --steps, --layers, --tokens and --ranks must be >= 1\n");
    return 2;
  }
  constexpr double kTolerance = 1e-4;  // fp32 against fp64
  try {
    double worst = 0;
    if (launched_by_mpi() && dcp::mpi_available()) {
      dcp::MpiSession session(&argc, &argv);
      auto comm = dcp::make_mpi_comm_world();
      worst = train(*comm, args, dcp::mpi_node_layout());
    } else {
      std::vector<double> per_rank(static_cast<size_t>(args.ranks), 0.0);
      dcp::run_local_ranks(args.ranks, [&](dcp::Comm& comm) { per_rank[static_cast<size_t>(comm.rank())] = train(comm, args, {1, args.ranks}); });
      worst = *std::max_element(per_rank.begin(), per_rank.end());
    }
    if (worst > kTolerance) {
      std::fprintf(stderr, "dcp_train_step: layer 0 differs from the fp64 reference by %.2e (tolerance %.0e)\n", worst,
                   kTolerance);
      return 1;
    }
    return 0;
  } catch (const dcp::Error& e) {
    std::fprintf(stderr, "dcp_train_step: %s\n", e.what());
    return 1;
  }
}
