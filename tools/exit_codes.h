// tools/exit_codes.h — the one exit-code convention of every dcp command and launcher mode
// (in-process ranks, mpirun, one process), and how an error becomes one.
#pragma once

#include <exception>
#include <string>

namespace dcp::cli {

inline constexpr int kExitOk = 0;            // success (validate: VALID; run: PASS)
inline constexpr int kExitCheckFailed = 1;   // a check failed (validate: INVALID; run/bench: tolerance missed)
inline constexpr int kExitBadInput = 2;      // bad input or usage (options, files, plans, unsupported requests)
inline constexpr int kExitPeerFailure = 3;   // a peer rank failed, aborted or timed out
inline constexpr int kExitSystem = 4;        // the system failed (out of memory, I/O, CUDA/NCCL/MPI) or a dcp bug

// The convention as --help prints it (and the README repeats).
extern const char* const kExitCodesHelp;

// The exit code for an error: dcp::Error by kind (InvalidInput, InvalidPlan, Unsupported: 2;
// Timeout or a peer's abort: 3; the rest: 4), std::bad_alloc and anything else: 4.
int exit_code_of(const std::exception& e);

// "invalid input: <message>", "out of memory (<what>)", ...: what the user reads after "dcp: ".
std::string error_text(const std::exception& e);

}  // namespace dcp::cli
