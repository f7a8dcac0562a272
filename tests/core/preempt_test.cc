#include "shardtrain/core/preempt.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include "shardtrain/core/error.h"

namespace st {
namespace {

// In a child process (the handlers are process-wide): the first signal only sets the flag, the second exits at
// once with kExitPreempted. raise() runs the handler before it returns, so the order is exact.
void expect_two_signals_exit(int sig) {
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    install_preemption_handlers();
    if (preemption_requested()) _exit(10);  // flag set before any signal
    raise(sig);
    if (!preemption_requested()) _exit(11);  // the first signal did not set it
    raise(sig);
    _exit(12);  // the second signal did not exit
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "child ended by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), kExitPreempted);
}

TEST(Preempt, FirstSignalAsksSecondExitsAtOnce) {
  expect_two_signals_exit(SIGTERM);
  expect_two_signals_exit(SIGINT);
  expect_two_signals_exit(SIGUSR1);
}

}  // namespace
}  // namespace st
