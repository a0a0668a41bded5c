#include "dcp/error.h"

#include <string>

namespace dcp {

const char* to_string(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::InvalidInput: return "invalid input";
    case ErrorKind::InvalidPlan: return "invalid plan";
    case ErrorKind::Unsupported: return "unsupported";
    case ErrorKind::System: return "system error";
    case ErrorKind::Cuda: return "CUDA error";
    case ErrorKind::Nccl: return "NCCL error";
    case ErrorKind::Mpi: return "MPI error";
    case ErrorKind::Timeout: return "timeout";
    case ErrorKind::Internal: return "internal error";
  }
  return "error";
}

Error::Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}

void raise(ErrorKind kind, const std::string& message) { throw Error(kind, message); }

void assertion_failed(const char* expr, const char* file, int line, const std::string& detail) {
  std::string msg = std::string("internal check failed: ") + expr + " at " + file + ":" + std::to_string(line);
  if (!detail.empty()) msg += ": " + detail;
  throw Error(ErrorKind::Internal, msg);
}

}  // namespace dcp
