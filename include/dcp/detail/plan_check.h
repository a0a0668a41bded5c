// dcp/plan_check.h — what a plan from outside (a file, another rank) must satisfy before any
// code indexes into it.
//
// check_plan_structure proves that every number in the plan means something: the header agrees
// with the block table (shape, head groups, block size, longest block) and with the cluster
// (world size = nodes x devices per node); the block table covers its sequences, its tiles are
// exactly those the masks make, and every size stays within dcp/limits.h; the placement and the
// owned blocks of every device agree; every instruction names a tile, token block, head group,
// peer, local block or slot that exists, and every transfer has its block's size. It does not
// prove the plan computes the right thing: that is validate_plan (validate.h), which runs it
// first and may then rely on these facts, as do the executor and the simulator.
//
// load_plan and deserialize_plan (plan.h) call it; the *_unchecked variants only check the file
// format, for tools that report on broken plans rather than refuse them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dcp/plan.h"

namespace dcp {

// Throws InvalidPlan "<source>: <what is wrong, where>" at the first problem found.
// O(size of the plan + work of rebuilding its tiles).
void check_plan_structure(const Plan& plan, const std::string& source);

// File format only (magic, version, size, checksum, field encodings); contents unchecked.
Plan deserialize_plan_unchecked(const std::vector<uint8_t>& bytes, const std::string& source);
Plan load_plan_unchecked(const std::string& path);

}  // namespace dcp
