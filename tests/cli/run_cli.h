// Runs the dcp command (stdout and stderr together) and returns its exit code and output.
#pragma once

#include <array>
#include <cstdio>
#include <string>

#include <sys/wait.h>

namespace dcp::test {

struct CliResult {
  int exit_code = -1;
  std::string out;  // stdout and stderr together
};

inline CliResult run_cli(const std::string& args, bool merge_stderr = true) {
  const std::string cmd = std::string(DCP_CLI_PATH) + " " + args + (merge_stderr ? " 2>&1" : " 2>/dev/null");
  CliResult r;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return r;
  std::array<char, 4096> buf{};
  size_t n = 0;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace dcp::test
