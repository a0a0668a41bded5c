// Names of the CUDA backend's kernel options (built with or without CUDA: the command line
// parses them either way).
#include <charconv>
#include <string>

#include "dcp/cuda_backend.h"
#include "dcp/error.h"

namespace dcp {

const char* to_string(KernelRoute route) {
  switch (route) {
    case KernelRoute::Mma: return "mma";
    case KernelRoute::Wgmma: return "wgmma";
    case KernelRoute::WgmmaBasic: return "wgmma-basic";
    case KernelRoute::Auto: break;
  }
  return "auto";
}

const char* to_string(DqReduction dq) { return dq == DqReduction::Atomic ? "atomic" : "bulk"; }

const char* to_string(DeterministicMethod m) { return m == DeterministicMethod::Split ? "split" : "ordered"; }

KernelRoute parse_kernel_route(const std::string& s, const std::string& where) {
  for (KernelRoute r : {KernelRoute::Auto, KernelRoute::Mma, KernelRoute::Wgmma, KernelRoute::WgmmaBasic})
    if (s == to_string(r)) return r;
  if (s.empty()) return KernelRoute::Auto;
  raise(ErrorKind::InvalidInput, where + ": expected auto, mma, wgmma or wgmma-basic, got '" + s + "'");
}

bool parse_switch(const std::string& s, const std::string& where) {
  if (s.empty() || s == "0" || s == "off" || s == "false") return false;
  if (s == "1" || s == "on" || s == "true") return true;
  raise(ErrorKind::InvalidInput, where + ": expected 0, 1, on, off, true or false, got '" + s + "'");
}

int parse_row_count(const std::string& s, const std::string& where) {
  if (s.empty()) return 0;
  int v = -1;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v < 0)
    raise(ErrorKind::InvalidInput, where + ": expected a count of rows >= 0, got '" + s + "'");
  return v;
}

void parse_deterministic(const std::string& s, const std::string& where, CudaKernelOptions& k) {
  for (DeterministicMethod m : {DeterministicMethod::Ordered, DeterministicMethod::Split}) {
    if (s == to_string(m)) {
      k.deterministic_backward = true;
      k.deterministic_method = m;
      return;
    }
  }
  if (s.empty() || s == "0" || s == "off" || s == "false" || s == "1" || s == "on" || s == "true") {
    k.deterministic_backward = parse_switch(s, where);
    return;
  }
  raise(ErrorKind::InvalidInput, where + ": expected 0, 1, on, off, true, false, ordered or split, got '" + s + "'");
}

DqReduction parse_dq_reduction(const std::string& s, const std::string& where) {
  if (s.empty() || s == "bulk") return DqReduction::Bulk;
  if (s == "atomic") return DqReduction::Atomic;
  raise(ErrorKind::InvalidInput, where + ": expected bulk or atomic, got '" + s + "'");
}

}  // namespace dcp
