#include "exit_codes.h"

#include <new>

#include "dcp/error.h"

namespace dcp::cli {

const char* const kExitCodesHelp =
    "Exit codes (every command, in-process ranks and mpirun alike):\n"
    "  0  success (validate: VALID, run: PASS)\n"
    "  1  a check failed (validate: INVALID plan, run/bench: outputs beyond tolerance)\n"
    "  2  bad input or usage (options, batch/cluster/plan files, requests this build cannot serve)\n"
    "  3  a peer rank failed, aborted or timed out (--timeout)\n"
    "  4  system failure (out of memory, I/O, CUDA, NCCL, MPI) or an internal error of dcp";

namespace {

// A comm reports that a peer stopped the world as a System error saying "aborted".
bool peer_abort(const Error& e) {
  return e.kind() == ErrorKind::System && std::string(e.what()).find("aborted") != std::string::npos;
}

}  // namespace

int exit_code_of(const std::exception& e) {
  if (const auto* err = dynamic_cast<const Error*>(&e)) {
    switch (err->kind()) {
      case ErrorKind::InvalidInput:
      case ErrorKind::InvalidPlan:
      case ErrorKind::Unsupported: return kExitBadInput;
      case ErrorKind::Timeout: return kExitPeerFailure;
      case ErrorKind::System: return peer_abort(*err) ? kExitPeerFailure : kExitSystem;
      case ErrorKind::Cuda:
      case ErrorKind::Nccl:
      case ErrorKind::Mpi:
      case ErrorKind::Internal: return kExitSystem;
    }
  }
  return kExitSystem;
}

std::string error_text(const std::exception& e) {
  if (const auto* err = dynamic_cast<const Error*>(&e)) return std::string(to_string(err->kind())) + ": " + err->what();
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr)
    return "out of memory (the batch or plan is too large for this machine; try fewer tokens, more devices or a "
           "larger --block)";
  return std::string("error: ") + e.what();
}

}  // namespace dcp::cli
