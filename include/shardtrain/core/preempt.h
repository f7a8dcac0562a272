// Preemption: SIGTERM or SIGINT (a Kubernetes eviction, a scheduler's preemption, Ctrl-C) asks the run to stop
// at the next step boundary. Every rank learns it there (the trainer all-reduces the flag each step, so one
// signalled rank is enough), a checkpoint is committed, and the process exits with kExitPreempted. A second
// signal exits at once with the same code, without a checkpoint.
//
//   install_preemption_handlers();            // once, before training
//   if (preemption_requested()) ...           // this process has been signalled
#pragma once

namespace st {

void install_preemption_handlers();
bool preemption_requested();

}  // namespace st
