// Stand-ins for the CPU attention kernels in builds that cannot compile them: clang rejects
// their 64-byte vector arguments unless the whole build targets AVX-512. Only the instrumented
// fuzzing build (DCP_FUZZ_BUILD) uses this file; its targets never compute attention.
#include "dcp/detail/attention_cpu.h"
#include "dcp/error.h"

namespace dcp::cpu {

void attend_forward(const HeadLayout&, std::span<const ForwardTile>) {
  raise(ErrorKind::Unsupported, "CPU attention: not in this build (fuzzing build without the kernels)");
}

void attend_backward(const HeadLayout&, std::span<const BackwardTile>) {
  raise(ErrorKind::Unsupported, "CPU attention: not in this build (fuzzing build without the kernels)");
}

}  // namespace dcp::cpu
