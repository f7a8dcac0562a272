#include "shardtrain/core/preempt.h"

#include <unistd.h>

#include <csignal>

#include "shardtrain/core/error.h"

namespace st {
namespace {

volatile std::sig_atomic_t g_signals = 0;

// Only async-signal-safe calls here: write(2) and _exit(2).
extern "C" void on_stop_signal(int) {
  if (g_signals >= 1) {
    constexpr char kMsg[] = "shardtrain: second stop signal: exiting now, without a checkpoint\n";
    (void)!write(STDERR_FILENO, kMsg, sizeof(kMsg) - 1);
    _exit(kExitPreempted);
  }
  g_signals = 1;
  constexpr char kMsg[] = "shardtrain: stop signal: checkpoint at the next step boundary, then exit (again: now)\n";
  (void)!write(STDERR_FILENO, kMsg, sizeof(kMsg) - 1);
}

volatile std::sig_atomic_t g_stop_signal = 0;

// For commands that stop rather than checkpoint: the first signal is recorded; a second one exits at once.
extern "C" void on_command_stop_signal(int sig) {
  if (g_stop_signal != 0) {
    constexpr char kMsg[] = "shardtrain: second stop signal: exiting now, without cleaning up\n";
    (void)!write(STDERR_FILENO, kMsg, sizeof(kMsg) - 1);
    _exit(128 + sig);
  }
  g_stop_signal = sig;
}

}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_command_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

int stop_signal() { return g_stop_signal; }

void install_preemption_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // blocking calls (MPI, file I/O) resume instead of failing with EINTR
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);  // what launch/mpirun.sh sends: mpirun forwards it at once (preempt.h)
}

bool preemption_requested() { return g_signals != 0; }

}  // namespace st
