// tests/fuzz/fuzz_common.h — what every fuzz target checks, and its two entry points.
//
// A target reads one input with a dcp reader (and, when it is accepted, runs what uses it). The
// input is either accepted, or refused with a dcp::Error of an input kind (InvalidInput,
// InvalidPlan, Unsupported). Anything else is a finding: a crash, a sanitizer report, a hang
// (the fuzzer's -timeout), another exception, an Internal error, or a broken invariant such as
// a round trip that changes the value. Findings abort, so libFuzzer records the input.
//
// Each target defines dcp_fuzz_one(data, size) -> Outcome. Under libFuzzer (clang) the entry
// point is LLVMFuzzerTestOneInput; in the normal build corpus_main.cpp runs every file of a
// corpus through the same function and checks the expected outcome (bad/ refused, good/
// accepted), so the regression corpus needs no clang.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "dcp/error.h"

namespace dcp::fuzz {

enum class Outcome { Accepted, Refused };

[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "FUZZ FINDING: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

inline void require(bool ok, const std::string& what) {
  if (!ok) finding(what);
}

// Runs `body`; Accepted if it returns, Refused on an input error, a finding otherwise.
template <class F>
Outcome guarded(F&& body) {
  try {
    body();
    return Outcome::Accepted;
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::InvalidInput || e.kind() == ErrorKind::InvalidPlan || e.kind() == ErrorKind::Unsupported)
      return Outcome::Refused;
    finding(std::string("error of kind ") + to_string(e.kind()) + ": " + e.what());
  } catch (const std::exception& e) {
    finding(std::string("exception outside dcp::Error: ") + e.what());
  }
}

}  // namespace dcp::fuzz

// Defined by each target.
dcp::fuzz::Outcome dcp_fuzz_one(const uint8_t* data, size_t size);

#ifdef DCP_LIBFUZZER
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)dcp_fuzz_one(data, size);
  return 0;
}
#endif
