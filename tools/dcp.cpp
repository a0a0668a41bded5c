// dcp — the command-line driver of the library. Subcommands live in cmd_*.cpp; this file only
// parses, dispatches, and turns errors into exit codes (2: bad input, 1: anything else).
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include <CLI/CLI.hpp>

#include "commands.h"
#include "dcp/error.h"

int main(int argc, char** argv) {
  CLI::App app{
      "dcp — dynamic context parallelism: plan, simulate and run exact distributed attention over\n"
      "blocks of data and blocks of attention work placed by hypergraph partitioning."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "dcp 0.1.0");
  // NVLink multicast stays off unless the user's environment says otherwise: NCCL's NVLS
  // buffers fail on machines that share their GPUs (../shared/device.md). Before any NCCL call.
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  dcp::cli::Runner runner;
  dcp::cli::register_plan(app, runner);
  dcp::cli::register_validate(app, runner);
  dcp::cli::register_run(app, runner);
  dcp::cli::register_simulate(app, runner);
  dcp::cli::register_bench(app, runner);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  try {
    return runner ? runner() : 0;
  } catch (const dcp::Error& e) {
    std::cerr << "dcp: " << to_string(e.kind()) << ": " << e.what() << "\n";
    return e.kind() == dcp::ErrorKind::InvalidInput ? 2 : 1;
  } catch (const std::exception& e) {
    std::cerr << "dcp: error: " << e.what() << "\n";
    return 1;
  }
}
