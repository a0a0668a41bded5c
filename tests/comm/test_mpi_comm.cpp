// MPI comm under mpirun (ctest runs it with 2 ranks): tagged payloads over several rounds, then a
// receive that no rank sends must time out (no hang), and the node layout of ranks on one machine.
// Exit code 0 on every rank means success.
#include <cstdio>
#include <string>

#include "dcp/comm.h"
#include "dcp/error.h"
#include "comm/tagged_exchange.h"

int main(int argc, char** argv) {
  try {
    dcp::MpiSession session(&argc, &argv);
    auto comm = dcp::make_mpi_comm_world();
    dcp::test::tagged_exchange(*comm, 5, 3, 30.0);
    comm->barrier(30.0);
    // Rank 0 waits for a message rank 1 has not sent: Timeout, not a hang. Then rank 1 sends it
    // and the same round completes (a timed-out round stays pending).
    if (comm->world_size() > 1) {
      int x = 0;
      if (comm->rank() == 0) {
        const dcp::CommOp op{1, false, &x, sizeof(x)};
        comm->start(99, {&op, 1});
        bool timed_out = false;
        try {
          comm->wait(99, 0.3);
        } catch (const dcp::Error& e) {
          timed_out = e.kind() == dcp::ErrorKind::Timeout;
        }
        if (!timed_out) {
          std::fprintf(stderr, "rank 0: expected a Timeout error\n");
          return 1;
        }
      }
      comm->barrier(30.0);
      if (comm->rank() == 1) {
        x = 42;
        const dcp::CommOp op{0, true, &x, sizeof(x)};
        comm->start(99, {&op, 1});
      }
      if (comm->rank() <= 1) comm->wait(99, 30.0);
      if (comm->rank() == 0 && x != 42) {
        std::fprintf(stderr, "rank 0: late message holds %d, expected 42\n", x);
        return 1;
      }
    }
    // ctest starts every rank on this machine: one node of world_size ranks.
    const dcp::NodeLayout layout = dcp::mpi_node_layout();
    if (layout.nodes != 1 || layout.devices_per_node != comm->world_size()) {
      std::fprintf(stderr, "rank %d: node layout %d x %d, expected 1 x %d\n", comm->rank(), layout.nodes,
                   layout.devices_per_node, comm->world_size());
      return 1;
    }
    comm->barrier(30.0);
    std::printf("rank %d of %d: OK\n", comm->rank(), comm->world_size());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
