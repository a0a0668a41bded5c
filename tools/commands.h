// tools/commands.h — one registration function per dcp subcommand (one file each).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace dcp::cli {

// A subcommand's body; returns the process exit code. Registered callbacks run after parsing.
using Runner = std::function<int()>;

void register_plan(CLI::App& app, Runner& runner);
void register_validate(CLI::App& app, Runner& runner);
void register_simulate(CLI::App& app, Runner& runner);
void register_run(CLI::App& app, Runner& runner);
void register_bench(CLI::App& app, Runner& runner);

}  // namespace dcp::cli
