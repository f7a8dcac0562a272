// Runs the built shardtrain binary (SHARDTRAIN_BINARY, defined by CMake for every test binary) as a user
// would and returns its exit code and combined output.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace st::testing {

struct CliResult {
  int code = -1;       // exit status, -1 if it did not exit normally
  std::string output;  // stdout and stderr together
};

// Runs a shell command line (`sh -c`) and returns its exit code and its stdout and stderr together.
inline CliResult run_command(const std::string& command) {
  const std::string cmd = "(" + command + ") 2>&1";
  CliResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// `shell_prefix` runs before the binary in the same shell, e.g. "ulimit -v 4000000; exec".
inline CliResult run_shardtrain(const std::string& args, const std::string& shell_prefix = "") {
  return run_command(shell_prefix + " " + std::string(SHARDTRAIN_BINARY) + " " + args);
}

// Runs shardtrain `args` under timeout(1) and with 4 GiB of address space, stdout and stderr together, so that a run
// that blocks (a FIFO with no writer) or reads without end (/dev/zero, a huge file) fails the test instead of hanging
// or filling the memory: such a run exits 124 (timeout) or fails to allocate.
inline CliResult run_bounded(const std::string& args) {
  return run_command("ulimit -v 4194304; exec timeout 60 " + std::string(SHARDTRAIN_BINARY) + " " + args);
}

}  // namespace st::testing
