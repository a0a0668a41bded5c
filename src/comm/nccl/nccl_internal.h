// The NCCL comm with a hook run after ncclCommAbort in abort() (the MPI bootstrap uses it to
// call MPI_Abort). Not part of the public interface.
#pragma once

#include <functional>
#include <memory>

#include "dcp/nccl_comm.h"

namespace dcp::comm_detail {

std::unique_ptr<Comm> make_nccl_comm_with_abort(const NcclUniqueId& id, int rank, int world_size,
                                                const NcclCommOptions& options, std::function<void()> on_abort);

}  // namespace dcp::comm_detail
