// Runs part of a test in a forked child process, for what is process-wide: resource limits (RLIMIT_FSIZE),
// signal dispositions. Header-only.
//
//   const int status = st::testing::exit_status_in_child([&] {
//     std::signal(SIGXFSZ, SIG_IGN);
//     ...
//     return ok ? 0 : 11;
//   });
//   EXPECT_EQ(status, 0);
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>

namespace st::testing {

// Forks; the child runs body and ends through exit() with its result (99 if it threw), so that the process's
// exit handlers run as they would after the code under test; the parent waits. Returns the child's exit status,
// 128 + the signal that ended it, or -1 if fork or waitpid failed.
inline int exit_status_in_child(const std::function<int()>& body) {
  std::fflush(nullptr);  // what is buffered now is written once, by the parent
  const pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    int code = 99;
    try {
      code = body();
    } catch (...) {
    }
    std::exit(code);
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace st::testing
