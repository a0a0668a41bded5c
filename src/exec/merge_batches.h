// merge_batches.h — which consecutive Merge calls may run as one batch (executor-internal).
//
// Calls of one batch run in any order or all at once (one kernel launch on the GPU), so no call
// of a batch may read or write rows that another call of the batch writes (read-after-write,
// write-after-read and write-after-write are all refused; two calls may read the same rows).
// A call may read what it writes itself (an accumulating merge, an in-place output): the
// backend's per-call semantics already cover that.
#pragma once

#include <array>
#include <cstdint>
#include <map>

#include "dcp/executor.h"

namespace dcp::exec_detail {

// A union of half-open row intervals of one array, kept disjoint and sorted.
class RowSet {
 public:
  void add(int64_t begin, int64_t end);
  bool overlaps(int64_t begin, int64_t end) const;
  bool empty() const { return runs_.empty(); }
  void clear() { runs_.clear(); }

 private:
  std::map<int64_t, int64_t> runs_;  // begin -> end
};

// Rows of each array one Merge call reads and writes (see MergeCall in dcp/executor.h).
struct MergeFootprint {
  struct Span {
    Array array = Array::O;
    int64_t begin = 0, end = 0;
  };
  std::array<Span, 4> writes{};  // O + LSE, dQ, or dK + dV
  int num_writes = 0;
  std::vector<Span> reads;
};
MergeFootprint merge_footprint(const MergeCall& call);

// Grows a batch one call at a time, in program order.
class MergeBatcher {
 public:
  // Adds `call` and returns true when it is independent of every call added since the last
  // clear(); otherwise returns false and leaves the batch unchanged.
  bool try_add(const MergeCall& call);
  void clear();
  int size() const { return size_; }

 private:
  std::array<RowSet, kNumArrays> read_{}, written_{};
  int size_ = 0;
};

}  // namespace dcp::exec_detail
