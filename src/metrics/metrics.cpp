// compute_metrics — exact per-device costs of a placement (see dcp/metrics.h for the model).
//
// Every remote use of a data block is a (block, head group or KV set, device) triple counted
// once. Tiles come ordered by (seq, head_group, ...), so all tiles reading the Q side of
// (seq, group) and the KV side of (seq, KV set) form one contiguous run; a stamp array indexed
// by (block inside the sequence, device) and holding the run id dedupes each run without hashing.
// Partials are sized by BlockTable::partial_bytes (fp32), the one formula the planner and the
// executor share.
#include "dcp/metrics.h"

#include <algorithm>
#include <string>

#include "dcp/error.h"
#include "dcp/limits.h"

namespace dcp {

double PlacementMetrics::bytes_per_token() const {
  if (total_tokens == 0) return 0.0;
  return static_cast<double>(intra_bytes() + inter_bytes()) / static_cast<double>(total_tokens);
}

namespace {

class Accumulator {
 public:
  Accumulator(PlacementMetrics& m, const Cluster& cluster) : m_(m), cluster_(cluster) {}

  // `bytes` move from `src` to `dst` (different devices) in the forward or backward pass.
  // Totals over all transfers are not bounded by the input limits: their sums are checked.
  void transfer(int src, int dst, int64_t bytes, bool forward) {
    add(m_.devices[src].send_bytes, bytes);
    add(m_.devices[dst].recv_bytes, bytes);
    const bool intra = cluster_.node_of(src) == cluster_.node_of(dst);
    int64_t& total = forward ? (intra ? m_.intra_bytes_fwd : m_.inter_bytes_fwd)
                             : (intra ? m_.intra_bytes_bwd : m_.inter_bytes_bwd);
    add(total, bytes);
  }
  static void add(int64_t& total, int64_t bytes) { total = checked_add(total, bytes, "metrics: bytes moved"); }

 private:
  PlacementMetrics& m_;
  const Cluster& cluster_;
};

double max_over_mean(const std::vector<double>& values) {
  if (values.empty()) return 1.0;
  double sum = 0, max = 0;
  for (double v : values) {
    sum += v;
    max = std::max(max, v);
  }
  const double mean = sum / static_cast<double>(values.size());
  return mean > 0 ? max / mean : 1.0;
}

}  // namespace

PlacementMetrics compute_metrics(const BlockTable& table, const Placement& placement,
                                 const Cluster& cluster) {
  placement.validate(table);
  if (placement.num_devices != cluster.num_devices()) {
    raise(ErrorKind::InvalidInput,
          "compute_metrics: placement '" + placement.method + "' is for " +
              std::to_string(placement.num_devices) + " device(s) but the cluster has " +
              std::to_string(cluster.num_devices()));
  }
  const int num_devices = placement.num_devices;
  const HeadGroups& groups = table.groups;
  const int num_kv_sets = groups.num_kv_sets();
  DCP_ASSERT(num_kv_sets > 0);

  PlacementMetrics m;
  m.devices.resize(num_devices);
  m.total_tokens = table.total_tokens();
  Accumulator acc(m, cluster);
  const auto& home = placement.block_home;

  // Owned data: every tensor of the pipeline for all head groups of a home block.
  for (int b = 0; b < table.num_token_blocks(); ++b) {
    const int64_t n = table.token_blocks[b].length;
    DeviceLoad& dev = m.devices[home[b]];
    dev.tokens += n;
    const int64_t q_side = table.data_bytes(DataKind::Q, n) + table.data_bytes(DataKind::O, n) +
                           table.data_bytes(DataKind::LSE, n) + table.data_bytes(DataKind::dO, n) +
                           table.data_bytes(DataKind::dQ, n) + table.data_bytes(DataKind::Delta, n);
    const int64_t kv_side = table.data_bytes(DataKind::KV, n) + table.data_bytes(DataKind::dKV, n);
    Accumulator::add(dev.owned_bytes, groups.num_groups * q_side + num_kv_sets * kv_side);
  }

  // Stamps: (block inside its sequence) x device -> id of the last run that marked it.
  int max_blocks_per_seq = 0;
  for (int s = 0; s < table.num_sequences(); ++s) {
    max_blocks_per_seq =
        std::max(max_blocks_per_seq, table.seq_first_block[s + 1] - table.seq_first_block[s]);
  }
  const size_t num_stamps = static_cast<size_t>(max_blocks_per_seq) * num_devices;
  std::vector<int64_t> q_stamp(num_stamps, -1), kv_stamp(num_stamps, -1);
  int64_t q_run = -1, kv_run = -1;
  int prev_seq = -1, prev_group = -1, prev_set = -1;

  for (size_t i = 0; i < table.tiles.size(); ++i) {
    const Tile& t = table.tiles[i];
    const int d = placement.tile_device[i];
    DeviceLoad& dev = m.devices[d];
    ++dev.num_tiles;
    dev.fwd_flops += table.tile_flops_fwd(t);
    dev.bwd_flops += table.tile_flops_bwd(t);

    const int set = groups.kv_set(t.head_group);
    if (t.seq != prev_seq || t.head_group != prev_group) {
      DCP_ASSERT_MSG(t.seq > prev_seq || (t.seq == prev_seq && t.head_group > prev_group),
                     "tiles not ordered by (seq, head_group)");
      ++q_run;
      if (t.seq != prev_seq || set != prev_set) ++kv_run;
      prev_seq = t.seq;
      prev_group = t.head_group;
      prev_set = set;
    }
    const int32_t first = table.seq_first_block[t.seq];

    const int q_home = home[t.q_block];
    if (q_home != d) {
      int64_t& stamp = q_stamp[static_cast<size_t>(t.q_block - first) * num_devices + d];
      if (stamp != q_run) {
        stamp = q_run;
        const int64_t n = table.token_blocks[t.q_block].length;
        const int64_t copy_fwd = table.data_bytes(DataKind::Q, n);
        const int64_t copy_bwd = table.data_bytes(DataKind::Q, n) +
                                 table.data_bytes(DataKind::dO, n) +
                                 table.data_bytes(DataKind::LSE, n) +
                                 table.data_bytes(DataKind::Delta, n);
        const int64_t part_fwd =
            table.partial_bytes(DataKind::O, n) + table.partial_bytes(DataKind::LSE, n);
        const int64_t part_bwd = table.partial_bytes(DataKind::dQ, n);
        Accumulator::add(dev.recv_copy_bytes_fwd, copy_fwd);
        Accumulator::add(dev.recv_copy_bytes_bwd, copy_bwd);
        Accumulator::add(dev.partial_bytes_fwd, part_fwd);
        Accumulator::add(dev.partial_bytes_bwd, part_bwd);
        acc.transfer(q_home, d, copy_fwd, true);
        acc.transfer(d, q_home, part_fwd, true);
        acc.transfer(q_home, d, copy_bwd, false);
        acc.transfer(d, q_home, part_bwd, false);
      }
    }

    const int kv_home = home[t.kv_block];
    if (kv_home != d) {
      int64_t& stamp = kv_stamp[static_cast<size_t>(t.kv_block - first) * num_devices + d];
      if (stamp != kv_run) {
        stamp = kv_run;
        const int64_t n = table.token_blocks[t.kv_block].length;
        const int64_t copy = table.data_bytes(DataKind::KV, n);
        const int64_t part_bwd = table.partial_bytes(DataKind::dKV, n);
        Accumulator::add(dev.recv_copy_bytes_fwd, copy);
        Accumulator::add(dev.recv_copy_bytes_bwd, copy);
        Accumulator::add(dev.partial_bytes_bwd, part_bwd);
        acc.transfer(kv_home, d, copy, true);
        acc.transfer(kv_home, d, copy, false);
        acc.transfer(d, kv_home, part_bwd, false);
      }
    }
  }

  std::vector<double> compute(num_devices), memory(num_devices);
  for (int d = 0; d < num_devices; ++d) {
    DeviceLoad& dev = m.devices[d];
    dev.memory_fwd_bytes = dev.owned_bytes + dev.recv_copy_bytes_fwd + dev.partial_bytes_fwd;
    dev.memory_bwd_bytes = dev.owned_bytes + dev.recv_copy_bytes_bwd + dev.partial_bytes_bwd;
    dev.memory_bytes = std::max(dev.memory_fwd_bytes, dev.memory_bwd_bytes);
    compute[d] = dev.fwd_flops + dev.bwd_flops;
    memory[d] = static_cast<double>(dev.memory_bytes);
  }
  m.compute_imbalance = max_over_mean(compute);
  m.memory_imbalance = max_over_mean(memory);
  return m;
}

}  // namespace dcp
