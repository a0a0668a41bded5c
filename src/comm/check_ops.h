// Internal: argument checks shared by the comm implementations (before anything is posted).
#pragma once

#include <span>
#include <string>

#include "dcp/comm.h"
#include "dcp/error.h"

namespace dcp::comm_detail {

inline void check_ops(const Comm& comm, int32_t round, std::span<const CommOp> ops, bool round_pending) {
  const std::string where = comm.name() + " comm rank " + std::to_string(comm.rank()) + ": round " + std::to_string(round);
  if (round < 0) raise(ErrorKind::InvalidInput, where + ": round ids must be >= 0");
  if (round_pending) raise(ErrorKind::InvalidInput, where + ": started twice without a wait");
  for (const CommOp& op : ops) {
    if (op.peer < 0 || op.peer >= comm.world_size() || op.peer == comm.rank())
      raise(ErrorKind::InvalidInput, where + ": peer " + std::to_string(op.peer) + " is not another rank of [0, " +
                                         std::to_string(comm.world_size()) + ")");
    if (op.bytes < 0 || (op.bytes > 0 && op.data == nullptr))
      raise(ErrorKind::InvalidInput, where + ": op with " + std::to_string(op.bytes) + " bytes and " +
                                         (op.data ? "a" : "no") + " buffer");
  }
}

}  // namespace dcp::comm_detail
