// Preemption: SIGTERM or SIGINT (a Kubernetes eviction, a scheduler's preemption, Ctrl-C) asks the run to stop
// at the next step boundary. Every rank learns it there (the trainer all-reduces the flag after every step, so one
// signalled rank is enough), a checkpoint is committed, and the process exits with kExitPreempted. A second
// signal exits at once with the same code, without a checkpoint.
//
// SIGUSR1 does the same. launch/mpirun.sh turns its own SIGTERM or SIGINT into a SIGUSR1 to mpirun, because Open
// MPI's mpirun forwards SIGUSR1 to every rank at once, whereas on SIGTERM or SIGINT it kills the job: it waits
// odls_base_sigkill_timeout (1 s), sends the ranks SIGTERM, sends SIGKILL 1 s later, and exits 1.
//
// A command with nothing to save (generate, tokenize) installs the interrupt handlers instead: the same signals are only
// recorded, the command stops where it is (keeping its output) and exits 128 + the signal's number, as a Unix filter
// killed by it would be reported (130 for SIGINT, 143 for SIGTERM); a second signal exits at once with that code.
//
//   install_preemption_handlers();            // once, before training
//   if (preemption_requested()) ...           // this process has been signalled
//   install_interrupt_handlers();             // generate, tokenize
//   if (int sig = stop_signal()) return 128 + sig;
#pragma once

namespace st {

void install_preemption_handlers();
void install_interrupt_handlers();
bool preemption_requested();
// The first stop signal this process received (SIGTERM, SIGINT or SIGUSR1), 0 for none.
int stop_signal();
// "SIGINT", "SIGTERM" or "SIGUSR1": for messages.
const char* stop_signal_name(int sig);

}  // namespace st
