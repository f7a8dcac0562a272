// MpiSession: MPI's lifetime in this process (MPI_Init_thread ... MPI_Finalize), RAII.
//
// A process that was not started by mpirun or another PMI launcher never initialises MPI: the launcher
// asks launched_by_mpi() first, and a plain `./shardtrain train` runs with a SoloCommunicator.
//
// At most one session per process, created on the main thread before any MpiCommunicator and destroyed
// after the last one (MPI cannot be initialised again after MPI_Finalize). It neither moves nor copies.
//
//   std::optional<st::MpiSession> mpi;
//   if (st::MpiSession::launched_by_mpi()) mpi.emplace(&argc, &argv);
#pragma once

namespace st {

class MpiSession {
 public:
  // MPI_Init_thread asking for MPI_THREAD_MULTIPLE. A lower level is accepted and logged (ST_LOG_INFO):
  // the communicators then must be called from one thread at a time. argc/argv may be null.
  // Throws st::Error (kFault) if MPI fails, kInternal if MPI is already initialised or finalised.
  MpiSession(int* argc, char*** argv);
  MpiSession() : MpiSession(nullptr, nullptr) {}
  // MPI_Finalize. Every MpiCommunicator must be gone by now.
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  MpiSession(MpiSession&&) = delete;
  MpiSession& operator=(MpiSession&&) = delete;

  // The thread level MPI provided (MPI_THREAD_SINGLE ... MPI_THREAD_MULTIPLE).
  int thread_level() const { return thread_level_; }

  // Whether the environment says this process was started by an MPI launcher: Open MPI's mpirun
  // (OMPI_COMM_WORLD_SIZE), a PMIx launcher (PMIX_RANK) or a PMI-1/2 one such as MPICH's hydra or
  // Slurm's srun --mpi=pmi2 (PMI_SIZE). Reads core/env.h's table only; does not touch MPI.
  static bool launched_by_mpi();

  // Ends the whole job: MPI_Abort(MPI_COMM_WORLD, exit_code) when MPI is initialised, so that the
  // launcher kills every rank (none waits forever in a collective) and exits non-zero; without MPI it
  // ends this process with exit_code. Flushes stdout and stderr first. For main()'s error path only.
  [[noreturn]] static void abort(int exit_code);

 private:
  int thread_level_ = 0;
};

}  // namespace st
