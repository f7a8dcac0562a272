#include "shardtrain/core/preempt.h"

#include <unistd.h>

#include <csignal>
#include <utility>

#include "shardtrain/core/error.h"

namespace st {
namespace {

volatile std::sig_atomic_t g_signal = 0;     // the first stop signal's number; 0: none yet
volatile std::sig_atomic_t g_interrupt = 0;  // install_interrupt_handlers(): stop where it is, no checkpoint

// Only async-signal-safe calls here: write(2) and _exit(2).
extern "C" void on_stop_signal(int sig) {
  if (g_signal != 0) {
    if (g_interrupt) {
      constexpr char kMsg[] = "shardtrain: second stop signal: exiting now\n";
      (void)!write(STDERR_FILENO, kMsg, sizeof(kMsg) - 1);
      _exit(128 + sig);
    }
    constexpr char kMsg[] = "shardtrain: second stop signal: exiting now, without a checkpoint\n";
    (void)!write(STDERR_FILENO, kMsg, sizeof(kMsg) - 1);
    _exit(kExitPreempted);
  }
  g_signal = sig;
  if (g_interrupt) return;  // the command says how it stopped, once it has
  constexpr char kMsg[] = "shardtrain: stop signal: checkpoint at the next step boundary, then exit (again: now)\n";
  (void)!write(STDERR_FILENO, kMsg, sizeof(kMsg) - 1);
}

void install(bool interrupt) {
  g_interrupt = interrupt ? 1 : 0;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // blocking calls (MPI, file I/O) resume instead of failing with EINTR
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);  // what launch/mpirun.sh sends: mpirun forwards it at once (preempt.h)
}

}  // namespace

void install_preemption_handlers() { install(false); }

void install_interrupt_handlers() { install(true); }

bool preemption_requested() { return g_signal != 0; }

int stop_signal() { return g_signal; }

const char* stop_signal_name(int sig) {
  static constexpr std::pair<int, const char*> kNames[] = {
      {SIGINT, "SIGINT"}, {SIGTERM, "SIGTERM"}, {SIGUSR1, "SIGUSR1"}};
  for (const auto& [number, name] : kNames)
    if (number == sig) return name;
  return "a stop signal";
}

}  // namespace st
