// tests/common/rng.h — the test suites use the library's generator (dcp/detail/rng.h): explicitly seeded,
// so every random test case is reproducible from its seed on any platform.
#pragma once

#include "dcp/detail/rng.h"

namespace dcp::test {

using SplitMix64 = dcp::SplitMix64;
using Rng = SplitMix64;

}  // namespace dcp::test
