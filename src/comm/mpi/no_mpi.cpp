// Built instead of mpi_comm.cpp when no MPI library was found: the MPI entry points say so.
#include "dcp/comm.h"
#include "dcp/error.h"

namespace dcp {

bool mpi_available() { return false; }

MpiSession::MpiSession(int*, char***) {
  raise(ErrorKind::Unsupported, "MPI: this build of dcp has no MPI (configure with an MPI library installed)");
}
MpiSession::~MpiSession() = default;

int mpi_local_rank() {
  raise(ErrorKind::Unsupported, "MPI: this build of dcp has no MPI (configure with an MPI library installed)");
}

NodeLayout mpi_node_layout() {
  raise(ErrorKind::Unsupported, "MPI: this build of dcp has no MPI (configure with an MPI library installed)");
}

void mpi_abort_world(int) noexcept {}

std::unique_ptr<Comm> make_mpi_comm_world() {
  raise(ErrorKind::Unsupported, "MPI: this build of dcp has no MPI (configure with an MPI library installed)");
}

}  // namespace dcp
