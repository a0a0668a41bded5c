// Zoltan PHG backend (optional at build time): a true hypergraph partitioner as a reference.
#include "dcp/error.h"
#include "placement/kway.h"

namespace dcp::placement {

#ifndef DCP_HAVE_ZOLTAN
std::unique_ptr<Partitioner> make_zoltan_partitioner() {
  raise(ErrorKind::Unsupported,
        "placement: this build has no Zoltan (install libtrilinos-zoltan-dev and MPI)");
}
#endif

}  // namespace dcp::placement
