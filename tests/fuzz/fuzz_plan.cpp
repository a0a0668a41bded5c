// Fuzz target: the plan loader, then the validator, then the executor's dry run.
//
// The file format ends in a checksum that almost every mutation breaks, which would stop the
// fuzzer at the first check. So an input that does not start with the plan magic is taken as a
// payload and framed here (magic, version, size, checksum), so that mutations reach the
// contents: a plan whose checksum is right but whose numbers are wrong. Inputs that start with
// the magic are read as whole files, which exercises the framing checks.
//
// Invariants: a loaded plan writes back to the same bytes; the format-only loader, the checked
// loader and the validator agree (a plan the validator finds valid loads checked); and a valid
// plan runs through the dry run (refused at most for its memory or an unserved head size, never
// for an operand).
#include <cstring>
#include <string>
#include <vector>

#include "dcp/detail/exec_dry_run.h"
#include "dcp/plan.h"
#include "dcp/detail/plan_check.h"
#include "dcp/validate.h"
#include "fuzz/fuzz_common.h"

using namespace dcp;

namespace {

constexpr char kMagic[8] = {'D', 'C', 'P', 'P', 'L', 'A', 'N', '\0'};

uint64_t fnv1a(const uint8_t* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

template <class T>
void put(std::vector<uint8_t>& out, T v) {
  uint8_t b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  for (uint8_t x : b) out.push_back(x);
}

std::vector<uint8_t> frame(const uint8_t* payload, size_t size) {
  std::vector<uint8_t> out;
  for (char c : kMagic) out.push_back(static_cast<uint8_t>(c));
  put<uint32_t>(out, kPlanFormatVersion);
  put<uint64_t>(out, size);
  for (size_t i = 0; i < size; ++i) out.push_back(payload[i]);
  put<uint64_t>(out, fnv1a(payload, size));
  return out;
}

}  // namespace

fuzz::Outcome dcp_fuzz_one(const uint8_t* data, size_t size) {
  const bool whole_file = size >= 8 && std::memcmp(data, kMagic, 8) == 0;
  const std::vector<uint8_t> bytes = whole_file ? std::vector<uint8_t>(data, data + size) : frame(data, size);
  return fuzz::guarded([&] {
    const Plan plan = deserialize_plan_unchecked(bytes, "fuzz.plan");
    fuzz::require(serialize_plan(plan) == bytes, "plan changed by a round trip");
    bool structure_ok = true;
    try {
      check_plan_structure(plan, "fuzz.plan");
    } catch (const Error& e) {
      fuzz::require(e.kind() == ErrorKind::InvalidPlan, std::string("structure check: ") + e.what());
      structure_ok = false;
    }
    bool loads = true;
    try {
      (void)deserialize_plan(bytes, "fuzz.plan");
    } catch (const Error& e) {
      fuzz::require(e.kind() == ErrorKind::InvalidPlan, std::string("checked loader: ") + e.what());
      loads = false;
    }
    fuzz::require(loads == structure_ok, "the checked loader and the structure check disagree");
    const std::vector<PlanViolation> violations = validate_plan(plan, 8);
    fuzz::require(structure_ok || !violations.empty(), "the validator accepts a plan the structure check refuses");
    if (!violations.empty()) raise(ErrorKind::InvalidPlan, violations.front().to_string());
    const Plan checked = deserialize_plan(bytes, "fuzz.plan");  // must not throw: the validator accepted
    try {
      (void)dry_run_plan(checked, DryRunOptions{.max_device_bytes = int64_t{1} << 28});
    } catch (const Error& e) {
      // Refused for its memory (InvalidInput) or for a shape the kernels do not serve
      // (Unsupported), never for what it asks of the executor.
      fuzz::require(e.kind() == ErrorKind::InvalidInput || e.kind() == ErrorKind::Unsupported,
                    std::string("dry run of a valid plan: ") + e.what());
      throw;
    }
  });
}
