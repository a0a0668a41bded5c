// attention_work.cpp — host side of the CUDA attention kernels: validation of tile lists, the
// per-CTA work lists, and mask-area FLOPs.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "dcp/detail/attention_cuda.h"
#include "dcp/error.h"

namespace dcp::cuda {

namespace detail {
void allow_shared_memory_on_device(const char* name, const void* kernel, int smem_bytes) {
  static std::mutex mutex;
  static std::set<std::pair<const void*, int>> done;  // (kernel, device) pairs already opted in
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess)
    raise(ErrorKind::Cuda, std::string(name) + ": cudaGetDevice: " + cudaGetErrorString(e));
  const std::lock_guard<std::mutex> lock(mutex);
  if (done.count({kernel, device}) != 0) return;
  const cudaError_t attr = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (attr != cudaSuccess) raise(ErrorKind::Cuda, std::string(name) + ": cudaFuncSetAttribute: " + cudaGetErrorString(attr));
  done.insert({kernel, device});
}
}  // namespace detail

namespace {

void validate(std::span<const AttnTile> tiles, const AttnShape& shape, const char* where) {
  if (shape.head_dim != 64 && shape.head_dim != 128) {
    raise(ErrorKind::Unsupported, std::string(where) + ": head_dim must be 64 or 128 (got " +
                                      std::to_string(shape.head_dim) + ")");
  }
  if (shape.num_kv_heads <= 0 || shape.num_q_heads <= 0 || shape.num_q_heads % shape.num_kv_heads != 0) {
    raise(ErrorKind::InvalidInput, std::string(where) + ": num_q_heads (" + std::to_string(shape.num_q_heads) +
                                       ") must be a positive multiple of num_kv_heads (" +
                                       std::to_string(shape.num_kv_heads) + ")");
  }
  for (std::size_t i = 0; i < tiles.size(); ++i) {
    const AttnTile& t = tiles[i];
    const bool ok = t.q_begin >= 0 && t.q_len >= 0 && t.kv_begin >= 0 && t.kv_len >= 0 && t.out_begin >= 0 &&
                    t.kv_head_begin >= 0 && t.kv_head_begin <= t.kv_head_end && t.kv_head_end <= shape.num_kv_heads &&
                    (t.kind == TileKind::Full || t.kind == TileKind::CausalDiagonal || t.kind == TileKind::Partial);
    if (!ok) {
      raise(ErrorKind::InvalidInput, std::string(where) + ": tile " + std::to_string(i) +
                                         " has a negative range, a bad kind or a head group outside [0, " +
                                         std::to_string(shape.num_kv_heads) + ")");
    }
  }
}

}  // namespace

std::vector<AttnWorkItem> make_forward_work(std::span<const AttnTile> tiles, const AttnShape& shape) {
  validate(tiles, shape, "make_forward_work");
  const int group = shape.num_q_heads / shape.num_kv_heads;
  std::vector<AttnWorkItem> work;
  for (std::size_t i = 0; i < tiles.size(); ++i) {
    const AttnTile& t = tiles[i];
    const int chunks = (t.q_len + kAttnForwardChunkRows - 1) / kAttnForwardChunkRows;
    // Causal chunks late in the tile carry the most keys: issue them first (longest first).
    for (int c = 0; c < chunks; ++c) {
      const int chunk = t.kind == TileKind::CausalDiagonal ? chunks - 1 - c : c;
      for (int h = t.kv_head_begin * group; h < t.kv_head_end * group; ++h) {
        work.push_back(AttnWorkItem{static_cast<int32_t>(i), chunk, h, 0});
      }
    }
  }
  return work;
}

std::vector<AttnWorkItem> make_backward_work(std::span<const AttnTile> tiles, const AttnShape& shape) {
  validate(tiles, shape, "make_backward_work");
  std::vector<AttnWorkItem> work;
  for (std::size_t i = 0; i < tiles.size(); ++i) {
    const AttnTile& t = tiles[i];
    if (t.q_len == 0) continue;
    const int chunks = (t.kv_len + kAttnBackwardChunkRows - 1) / kAttnBackwardChunkRows;
    // Causal: early key chunks see the most query rows.
    for (int c = 0; c < chunks; ++c) {
      for (int h = t.kv_head_begin; h < t.kv_head_end; ++h) {
        work.push_back(AttnWorkItem{static_cast<int32_t>(i), c, h, 0});
      }
    }
  }
  return work;
}

double attention_forward_flops(std::span<const AttnTile> tiles, const AttnShape& shape,
                               std::span<const int32_t> row_offsets, std::span<const int32_t> ranges) {
  const int group = shape.num_kv_heads > 0 ? shape.num_q_heads / shape.num_kv_heads : 0;
  double flops = 0.0;
  for (const AttnTile& t : tiles) {
    double area = 0.0;
    if (t.kind == TileKind::Full) {
      area = static_cast<double>(t.q_len) * t.kv_len;
    } else if (t.kind == TileKind::CausalDiagonal) {
      for (int i = 0; i < t.q_len; ++i) area += std::min(i + 1, t.kv_len);
    } else {
      for (int i = 0; i < t.q_len; ++i) {
        const auto ri = static_cast<std::size_t>(t.range_row_begin + i);
        for (int r = row_offsets[ri]; r < row_offsets[ri + 1]; ++r) {
          const int b = std::max(ranges[2 * static_cast<std::size_t>(r)], 0);
          const int e = std::min(ranges[2 * static_cast<std::size_t>(r) + 1], t.kv_len);
          if (e > b) area += e - b;
        }
      }
    }
    const double heads = static_cast<double>(t.kv_head_end - t.kv_head_begin) * group;
    flops += 4.0 * area * shape.head_dim * heads;
  }
  return flops;
}

}  // namespace dcp::cuda
