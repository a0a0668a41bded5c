// paper_setting.h — the DCP paper's attention micro-benchmark as the simulated benchmarks use it
// (bench_sim_paper, study/sim_breakdown): 4 nodes x 8 A100 (a100-p4d), 131072 tokens of ldc
// lengths scaled by `scale`, 8 query / 2 KV heads of dim 128, batches from seed 7.
#pragma once

#include <string>

#include "dcp/cluster.h"
#include "dcp/profiles.h"

namespace dcp::bench {

inline Cluster paper_cluster() { return cluster_preset("a100-p4d", 4); }

inline ProfileOptions paper_profile(double scale, const std::string& mask) {
  ProfileOptions po;
  po.profile = Profile::Ldc;
  po.token_budget = 131072;
  po.scale = scale;
  po.mask = mask;
  po.seed = 7;
  po.shape.q_heads = 8;
  po.shape.kv_heads = 2;
  po.shape.head_dim = 128;
  return po;
}

}  // namespace dcp::bench
