#include "dcp/limits.h"

#include "dcp/error.h"

namespace dcp {

void size_overflow(const std::string& what, int64_t a, int64_t b, char op) {
  raise(ErrorKind::InvalidInput, what + ": size overflow (" + std::to_string(a) + " " + op + " " + std::to_string(b) +
                                     " does not fit in 64 bits; the input is beyond dcp's limits, see dcp/limits.h)");
}

}  // namespace dcp
