// Dependency check for batching consecutive Merge calls (see merge_batches.h).
#include "exec/merge_batches.h"

#include <algorithm>
#include <iterator>

namespace dcp::exec_detail {

void RowSet::add(int64_t begin, int64_t end) {
  if (begin >= end) return;
  // Absorb every run that touches [begin, end): the predecessor if it reaches begin, then all
  // runs starting at or before end.
  auto it = runs_.upper_bound(begin);
  if (it != runs_.begin()) {
    auto prev = std::prev(it);
    if (prev->second >= begin) {
      begin = prev->first;
      end = std::max(end, prev->second);
      it = runs_.erase(prev);
    }
  }
  while (it != runs_.end() && it->first <= end) {
    end = std::max(end, it->second);
    it = runs_.erase(it);
  }
  runs_.emplace(begin, end);
}

bool RowSet::overlaps(int64_t begin, int64_t end) const {
  if (begin >= end) return false;
  auto it = runs_.upper_bound(begin);  // first run starting after begin
  if (it != runs_.end() && it->first < end) return true;
  if (it == runs_.begin()) return false;
  return std::prev(it)->second > begin;  // the run starting at or before begin
}

MergeFootprint merge_footprint(const MergeCall& call) {
  MergeFootprint f;
  const int64_t n = call.num_rows;
  auto write = [&](Array a, int64_t row) { f.writes[static_cast<size_t>(f.num_writes++)] = {a, row, row + n}; };
  auto read = [&](Array a, int64_t row) { f.reads.push_back({a, row, row + n}); };
  switch (call.kind) {
    case DataKind::O:
      write(Array::O, call.dst);
      write(Array::LSE, call.dst_lse);
      if (call.accumulate) {
        read(Array::O, call.dst);
        read(Array::LSE, call.dst_lse);
      }
      for (int64_t r : call.src) read(Array::O, r);
      for (int64_t r : call.src_lse) read(Array::LSE, r);
      break;
    case DataKind::dQ:
      write(Array::dQ, call.dst);
      if (call.accumulate) read(Array::dQ, call.dst);
      for (int64_t r : call.src) read(Array::dQ, r);
      break;
    default:  // dKV: the same rows of dK and dV
      for (Array a : {Array::dK, Array::dV}) {
        write(a, call.dst);
        if (call.accumulate) read(a, call.dst);
        for (int64_t r : call.src) read(a, r);
      }
      break;
  }
  return f;
}

bool MergeBatcher::try_add(const MergeCall& call) {
  const MergeFootprint f = merge_footprint(call);
  auto at = [](std::array<RowSet, kNumArrays>& sets, Array a) -> RowSet& { return sets[static_cast<size_t>(a)]; };
  for (int i = 0; i < f.num_writes; ++i) {
    const auto& w = f.writes[static_cast<size_t>(i)];
    if (at(written_, w.array).overlaps(w.begin, w.end) || at(read_, w.array).overlaps(w.begin, w.end)) return false;
  }
  for (const auto& r : f.reads)
    if (at(written_, r.array).overlaps(r.begin, r.end)) return false;
  for (int i = 0; i < f.num_writes; ++i) {
    const auto& w = f.writes[static_cast<size_t>(i)];
    at(written_, w.array).add(w.begin, w.end);
  }
  for (const auto& r : f.reads) at(read_, r.array).add(r.begin, r.end);
  ++size_;
  return true;
}

void MergeBatcher::clear() {
  for (RowSet& s : read_) s.clear();
  for (RowSet& s : written_) s.clear();
  size_ = 0;
}

}  // namespace dcp::exec_detail
