// Preemption: SIGTERM or SIGINT (a Kubernetes eviction, a scheduler's preemption, Ctrl-C) asks the run to stop
// at the next step boundary. Every rank learns it there (the trainer all-reduces the flag after every step, so one
// signalled rank is enough), a checkpoint is committed, and the process exits with kExitPreempted. A second
// signal exits at once with the same code, without a checkpoint.
//
// SIGUSR1 does the same. launch/mpirun.sh turns its own SIGTERM or SIGINT into a SIGUSR1 to mpirun, because Open
// MPI's mpirun forwards SIGUSR1 to every rank at once, whereas on SIGTERM or SIGINT it kills the job: it waits
// odls_base_sigkill_timeout (1 s), sends the ranks SIGTERM, sends SIGKILL 1 s later, and exits 1.
//
//   install_preemption_handlers();            // once, before training
//   if (preemption_requested()) ...           // this process has been signalled
#pragma once

namespace st {

void install_preemption_handlers();
bool preemption_requested();

// For a command that stops rather than checkpoints (tokenize): SIGTERM and SIGINT are only recorded; the command
// polls stop_signal() (the first signal's number, 0 before any), stops, removes what it wrote and exits with 128 +
// that number (130 for SIGINT, 143 for SIGTERM), as a shell reports a process the signal killed. A second signal
// exits at once with 128 + its number, without cleaning up.
void install_stop_handlers();
int stop_signal();

}  // namespace st
