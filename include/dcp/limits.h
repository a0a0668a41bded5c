// dcp/limits.h — the largest problems dcp accepts, and overflow-checked size arithmetic.
//
// Every size and byte count in dcp is an int64. The limits below keep the products the
// pipeline forms (tokens x heads x head dim x bytes per element x tensors) far below 2^63, so
// that sizes computed from accepted inputs never overflow; inputs beyond a limit are refused
// with an InvalidInput error naming the field, the value and the limit. Sums over devices or
// transfers, which the limits alone do not bound, go through checked_add / checked_mul.
//
//   what                       limit         why
//   batch tokens (all seqs)    2^31 - 1      kMaxBatchTokens (batch.h): mask areas below 2^62
//   sequences per batch        2^22          token blocks and tiles are indexed by int32
//   query / KV heads           1024          heads x head dim x tokens x 32 bytes < 2^63
//   head dim                   1024          same; attention kernels go far lower
//   nodes                      1024          DCP placement time grows with the square of the nodes
//                                            (measured: 128 nodes 9 s, 256 nodes 37 s)
//   devices per node           1024
//   devices in all             8192          nodes x devices per node; programs are per device
#pragma once

#include <cstdint>
#include <limits>
#include <string>

namespace dcp {

inline constexpr int64_t kMaxSequences = int64_t{1} << 22;
inline constexpr int kMaxHeads = 1024;
inline constexpr int kMaxHeadDim = 1024;
inline constexpr int kMaxNodes = 1024;
inline constexpr int kMaxDevicesPerNode = 1024;
inline constexpr int kMaxDevices = 8192;

// Throws InvalidInput "<what>: size overflow (a x b does not fit in 64 bits)".
[[noreturn]] void size_overflow(const std::string& what, int64_t a, int64_t b, char op);

// a * b and a + b for sizes (non-negative in every caller); overflow throws InvalidInput naming
// `what`, the operands and the operation.
inline int64_t checked_mul(int64_t a, int64_t b, const char* what) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) size_overflow(what, a, b, '*');
  return r;
}
inline int64_t checked_add(int64_t a, int64_t b, const char* what) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) size_overflow(what, a, b, '+');
  return r;
}

}  // namespace dcp
