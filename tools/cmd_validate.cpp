// dcp validate — load a binary plan and prove it correct by symbolic execution (validate.h).
// Exit codes: 0 valid, 1 violations found, 2 the file cannot be read as a plan.
#include <iostream>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"
#include "dcp/error.h"
#include "dcp/plan.h"
#include "dcp/detail/plan_check.h"
#include "dcp/validate.h"
#include "exit_codes.h"
#include "table.h"

namespace dcp::cli {
namespace {

struct ValidateArgs {
  std::string file;
  bool json = false;
  int max_violations = 64;
};

size_t num_instructions(const Plan& plan) {
  size_t n = 0;
  for (const auto& d : plan.devices) n += d.fwd.code.size() + d.bwd.code.size();
  return n;
}

int run_validate(const ValidateArgs& args) {
  Plan plan;
  try {
    // Format only: a plan whose contents are inconsistent is reported INVALID below (validate_plan
    // checks its structure first), not refused as unreadable.
    plan = load_plan_unchecked(args.file);
  } catch (const Error& e) {
    // A file that is not a plan of this build is bad input, whatever the loader's error kind.
    if (args.json) {
      std::cout << nlohmann::json{{"file", args.file}, {"valid", false}, {"error", e.what()}}.dump(2) << "\n";
    }
    std::cerr << "dcp validate: not a readable plan: " << e.what() << "\n";
    return kExitBadInput;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<PlanViolation> violations = validate_plan(plan, static_cast<size_t>(args.max_violations));
  const double ms = ms_since(t0);
  const PlanHeader& h = plan.header;
  const bool valid = violations.empty();

  if (args.json) {
    nlohmann::json v = nlohmann::json::array();
    for (const auto& x : violations)
      v.push_back({{"device", x.device}, {"pass", to_string(x.pass)}, {"instruction", x.instruction}, {"what", x.what}});
    nlohmann::json out{{"file", args.file},
                       {"valid", valid},
                       {"method", h.method},
                       {"world_size", h.world_size},
                       {"stages", h.options.schedule.num_comm_stages + 1},
                       {"block_size", h.block_size},
                       {"tiles", plan.table.tiles.size()},
                       {"token_blocks", plan.table.num_token_blocks()},
                       {"instructions", num_instructions(plan)},
                       {"validate_ms", ms},
                       {"violations", v}};
    std::cout << out.dump(2) << "\n";
    return valid ? kExitOk : kExitCheckFailed;
  }

  std::cout << fmt::format("plan: {} ({} placement), {} devices on {} ({} x {}), {} stages, B={}\n", args.file,
                           h.method, h.world_size, h.cluster.name, h.cluster.nodes, h.cluster.devices_per_node,
                           h.options.schedule.num_comm_stages + 1, h.block_size);
  std::cout << fmt::format("      {} tiles, {} token blocks, {} instructions; validated in {:.1f} ms\n\n",
                           plan.table.tiles.size(), plan.table.num_token_blocks(), num_instructions(plan), ms);
  if (valid) {
    std::cout << "VALID: every tile computed once, every output merged from exactly its tiles, "
                 "every transfer matched, no deadlock, no live slot overwritten.\n";
    return kExitOk;
  }
  std::cout << fmt::format("INVALID: {} violation(s){}\n", violations.size(),
                           violations.size() >= static_cast<size_t>(args.max_violations) ? " (stopped collecting)" : "");
  for (const auto& v : violations) std::cout << "  " << v.to_string() << "\n";
  return kExitCheckFailed;
}

}  // namespace

void register_validate(CLI::App& app, Runner& runner) {
  auto args = std::make_shared<ValidateArgs>();
  CLI::App* sub = app.add_subcommand("validate", "Check a saved plan by symbolic execution (exit 0 valid, 1 invalid, 2 unreadable)");
  sub->add_option("plan", args->file, "Binary plan file (dcp plan --save-plan)")->required();
  sub->add_flag("--json", args->json, "Print one JSON object instead of text");
  sub->add_option("--max-violations", args->max_violations, "Stop after this many violations")
      ->capture_default_str()
      ->check(int_range(1, 1 << 20));
  sub->callback([args, &runner] { runner = [args] { return run_validate(*args); }; });
}

}  // namespace dcp::cli
