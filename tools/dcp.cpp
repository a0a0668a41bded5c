// dcp — the command-line driver of the library. Subcommands live in cmd_*.cpp; this file only
// parses, dispatches, and turns errors into exit codes (exit_codes.h).
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include <CLI/CLI.hpp>

#include "commands.h"
#include "exit_codes.h"

int main(int argc, char** argv) {
  using namespace dcp::cli;
  CLI::App app{
      "dcp — dynamic context parallelism: plan, simulate and run exact distributed attention over\n"
      "blocks of data and blocks of attention work placed by hypergraph partitioning."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "dcp 0.1.0");
  // NVLink multicast stays off unless the user's environment says otherwise: NCCL's NVLS
  // buffers fail on machines that share their GPUs (../shared/device.md). Before any NCCL call.
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  app.footer(kExitCodesHelp);
  Runner runner;
  register_plan(app, runner);
  register_validate(app, runner);
  register_run(app, runner);
  register_simulate(app, runner);
  register_bench(app, runner);
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) sub->footer(kExitCodesHelp);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitBadInput;
  }
  try {
    return runner ? runner() : kExitOk;
  } catch (const std::exception& e) {
    std::cerr << "dcp: " << error_text(e) << "\n";
    return exit_code_of(e);
  }
}
