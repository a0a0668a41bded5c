// Uses the installed library as an application would: describe a batch, plan it for one device,
// run its attention on the CPU backend, check that every row saw its keys (a causal row i of a
// sequence whose values are all 1 has output 1), and print the plan's figures.
#include <cmath>
#include <cstdio>
#include <vector>

#include "dcp/attention.h"
#include "dcp/comm.h"
#include "dcp/planner.h"

int main() {
  dcp::Batch batch;
  batch.shape = dcp::AttentionShape{4, 2, 64, dcp::DType::FP32};
  batch.sequences = {{300, dcp::Mask::causal(), ""}, {200, dcp::Mask::lambda(8, 32), ""}};
  dcp::StepPlanOptions options;
  options.blocks.block_size = 64;
  dcp::Cluster one = dcp::cluster_preset("h200-nvl", 1);
  one.devices_per_node = 1;
  const dcp::Plan p = dcp::plan_step(batch, one, options);
  auto backend = dcp::make_cpu_backend();
  auto comm = dcp::make_self_comm(true);
  dcp::Attention attention(p, *backend, *comm);
  const int64_t n = attention.num_tokens();
  std::vector<float> q(n * 4 * 64, 0.1f), k(n * 2 * 64, 0.2f), v(n * 2 * 64, 1.0f), o(n * 4 * 64), lse(n * 4);
  auto view = [&](std::vector<float>& t, int64_t heads, int64_t dim) {
    return dcp::TensorView{t.data(), dcp::ElemType::F32, n, heads, dim, 0, 0};
  };
  attention.forward({view(q, 4, 64), view(k, 2, 64), view(v, 2, 64), view(o, 4, 64), view(lse, 4, 1)});
  for (float x : o)
    if (std::abs(x - 1.0f) > 1e-5f) {
      std::printf("consumer: wrong output %g\n", x);
      return 1;
    }
  std::printf("consumer: %lld tokens, plan hash %llx, scratch %lld bytes: ok\n", static_cast<long long>(n),
              static_cast<unsigned long long>(dcp::plan_hash(p)), static_cast<long long>(attention.scratch_bytes()));
  return 0;
}
