// Executor under mpirun with MpiComm. Every rank plans the same batch (deterministic), gathers
// its tokens, runs forward and backward, and checks its own rows against the dense fp64
// reference. Mode "die": rank 1 exits before communicating; the others must stop with an error
// (Timeout) instead of hanging, and mpirun must return non-zero.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "dcp/baselines.h"
#include "dcp/batch.h"
#include "dcp/comm.h"
#include "dcp/dispatch.h"
#include "dcp/error.h"
#include "dcp/executor.h"
#include "dcp/partition.h"
#include "dcp/plan.h"
#include "dcp/validate.h"
#include "exec/reference_attention.h"

namespace {

using namespace dcp;

// Per-row relative check of a rank's local rows against the reference.
double max_rel(const std::vector<float>& got, const std::vector<double>& want, const LocalTokens& tok, int64_t width,
               double floor) {
  double err = 0.0, ref = floor;
  for (int64_t r = 0; r < tok.num_rows(); ++r)
    for (int64_t x = 0; x < width; ++x) {
      const double w = want[static_cast<size_t>(tok.global_row[static_cast<size_t>(r)] * width + x)];
      const float g = got[static_cast<size_t>(r * width + x)];
      if (std::isnan(g)) return 1e30;
      if (std::isinf(w)) {
        if (!(std::isinf(g) && g < 0)) return 1e30;
        continue;
      }
      err = std::max(err, std::abs(g - w));
      ref = std::max(ref, std::abs(w));
    }
  return err / ref;
}

int run(Comm& comm, bool die) {
  Batch batch;
  batch.shape = AttentionShape{4, 2, 64, DType::FP32};
  for (auto [len, mask] : {std::pair{170L, Mask::causal()}, {90L, Mask::lambda(8, 40)}, {120L, Mask::full()}}) {
    Sequence s;
    s.length = len;
    s.mask = mask;
    batch.sequences.push_back(s);
  }
  Cluster cluster;
  cluster.nodes = 1;
  cluster.devices_per_node = comm.world_size();
  BlockOptions opts;
  opts.block_size = 32;
  const BlockTable table = build_block_table(batch, opts);
  const Placement placement = place_dcp(table, cluster).placement;
  PlanOptions popts;
  popts.schedule.num_comm_stages = 2;
  const Plan plan = build_plan(table, placement, cluster, popts);
  check_plan(plan);  // the validator proves the plan before it runs

  const AttentionShape& s = batch.shape;
  const int64_t total = batch.total_tokens();
  const int64_t qw = int64_t{s.q_heads} * s.head_dim, kw = int64_t{s.kv_heads} * s.head_dim;
  test::SplitMix64 rng(5);  // same data on every rank
  test::DenseProblem g;
  const std::vector<float> q = test::random_tensor(rng, static_cast<size_t>(total * qw), 2.0f);
  const std::vector<float> k = test::random_tensor(rng, static_cast<size_t>(total * kw), 2.0f);
  const std::vector<float> v = test::random_tensor(rng, static_cast<size_t>(total * kw));
  const std::vector<float> d_o = test::random_tensor(rng, static_cast<size_t>(total * qw));

  const DeviceProgram& dev = plan.devices[static_cast<size_t>(comm.rank())];
  const LocalTokens tok = local_tokens(plan.table, dev.owned_blocks);
  LocalTensors t = LocalTensors::allocate(s, tok.num_rows());
  gather_rows<float>(q, t.q, qw, tok);
  gather_rows<float>(k, t.k, kw, tok);
  gather_rows<float>(v, t.v, kw, tok);
  gather_rows<float>(d_o, t.d_o, qw, tok);
  auto backend = make_cpu_backend();
  Executor exec(plan, *backend, comm, ExecOptions{.comm_timeout_s = die ? 3.0 : 60.0});
  if (die && comm.rank() == 1) std::_Exit(3);  // a rank that crashes before communicating
  exec.forward(t);
  exec.backward(t);

  // Dense reference over the packed batch (block-diagonal by sequence), checked on own rows.
  test::DenseProblem p;
  p.num_q = p.num_kv = total;
  p.q_heads = s.q_heads;
  p.kv_heads = s.kv_heads;
  p.head_dim = s.head_dim;
  p.allowed.assign(static_cast<size_t>(total * total), 0);
  std::vector<Range> row;
  int64_t start = 0;
  for (const Sequence& seq : batch.sequences) {
    for (int64_t i = 0; i < seq.length; ++i) {
      seq.mask.row_ranges(i, seq.length, row);
      for (const Range& r : row)
        for (int64_t j = r.begin; j < r.end; ++j) p.allowed[static_cast<size_t>((start + i) * total + start + j)] = 1;
    }
    start += seq.length;
  }
  p.q = q;
  p.k = k;
  p.v = v;
  p.d_o = d_o;
  const test::DenseResult want = test::dense_reference(p);
  const double errs[] = {max_rel(t.o, want.o, tok, qw, 1e-30), max_rel(t.lse, want.lse, tok, s.q_heads, 1.0),
                         max_rel(t.dq, want.dq, tok, qw, 1.0)};
  // dK/dV rows of a rank are its owned KV rows: same LocalTokens.
  const double kv_errs[] = {max_rel(t.dk, want.dk, tok, kw, 1.0), max_rel(t.dv, want.dv, tok, kw, 1.0)};
  double worst = 0.0;
  for (double e : errs) worst = std::max(worst, e);
  for (double e : kv_errs) worst = std::max(worst, e);
  comm.barrier(60.0);
  std::printf("rank %d of %d: %lld rows, max relative error %.3g\n", comm.rank(), comm.world_size(),
              static_cast<long long>(tok.num_rows()), worst);
  return worst < 1e-5 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const bool die = argc > 1 && std::string(argv[1]) == "die";
  try {
    dcp::MpiSession session(&argc, &argv);
    auto comm = dcp::make_mpi_comm_world();
    return run(*comm, die);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
