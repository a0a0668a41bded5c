// dcp/error.h — the one exception type of the library and the assertion macros.
//
// Library code throws dcp::Error; only tools/ chooses an exit code. Every message says what is
// wrong, where (input field / file:line) and, where it helps, what was expected vs found.
#pragma once

#include <stdexcept>
#include <string>

namespace dcp {

// InvalidInput: the caller's input (files, options, shapes) is wrong. InvalidPlan: a plan is
// malformed or inconsistent. Unsupported: this build or machine cannot serve the request.
// System, Cuda, Nccl, Mpi: the environment failed. Timeout: a peer did not answer in time (or
// aborted). Internal: an invariant of dcp itself broke (a bug, never the caller's input).
enum class ErrorKind { InvalidInput, InvalidPlan, Unsupported, System, Cuda, Nccl, Mpi, Timeout, Internal };

const char* to_string(ErrorKind kind);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message);
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

// Throws Error(kind, message). Out of line so that call sites stay small.
[[noreturn]] void raise(ErrorKind kind, const std::string& message);

// Internal invariant failed: a bug in dcp, not in the caller's input.
[[noreturn]] void assertion_failed(const char* expr, const char* file, int line, const std::string& detail);

}  // namespace dcp

#define DCP_ASSERT(cond)                                                          \
  do {                                                                            \
    if (!(cond)) ::dcp::assertion_failed(#cond, __FILE__, __LINE__, std::string()); \
  } while (0)

#define DCP_ASSERT_MSG(cond, msg)                                       \
  do {                                                                  \
    if (!(cond)) ::dcp::assertion_failed(#cond, __FILE__, __LINE__, (msg)); \
  } while (0)

// Checks that change complexity (re-validating whole structures) compile in only when
// DCP_HEAVY_ASSERTS is defined (CMake option DCP_ENABLE_HEAVY_ASSERTS).
#ifdef DCP_HEAVY_ASSERTS
#define DCP_HEAVY_ASSERT(cond) DCP_ASSERT(cond)
#else
#define DCP_HEAVY_ASSERT(cond) \
  do {                         \
  } while (0)
#endif
