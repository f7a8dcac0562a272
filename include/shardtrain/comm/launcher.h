// How a shardtrain program joins its world (config key dist.bootstrap):
//   * mpi: initialise MPI and talk through an MpiCommunicator (mpirun, srun);
//   * env: read WORLD_SIZE, RANK (or JOB_COMPLETION_INDEX x LOCAL_WORLD_SIZE + LOCAL_RANK), MASTER_ADDR and
//     MASTER_PORT, meet at rank 0 over TCP (rendezvous.h) and talk through a TcpCommunicator (torchrun, a
//     PyTorchJob, a Kubernetes Indexed Job, launch/pod_launch.sh);
//   * auto: mpi when launched by an MPI launcher, else env when WORLD_SIZE is set, else a world of one
//     (SoloCommunicator, no MPI, no sockets).
// The world is joined before any command runs, so the bootstrap is read early from the command line
// (world_options_from_args): --config FILE (train without one: its default config) and --dist.* overrides.
//
//   std::optional<st::MpiSession> mpi;      // outside the try: the error path may need MPI_Abort
//   try {
//     auto comm = st::join_world(&argc, &argv, st::world_options_from_args(argc, argv, default_ini), &mpi);
//     ...
//   } catch (const st::Error& e) { return st::fail_world(mpi, e.kind()); }
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "shardtrain/comm/communicator.h"
#include "shardtrain/comm/mpi_session.h"
#include "shardtrain/core/config.h"
#include "shardtrain/core/error.h"

namespace st {

struct WorldOptions {
  Bootstrap bootstrap = Bootstrap::kAuto;
  double rendezvous_timeout_s = 300;
  // The command does not communicate (ckpt, --help): env gives a world of one without a rendezvous, so that
  // `kubectl exec POD -- shardtrain ckpt inspect DIR` works in a pod whose WORLD_SIZE says 4. (MPI is still
  // initialised under mpirun, as before.)
  bool single_process = false;
};

// dist.bootstrap and dist.rendezvous_timeout_s as `shardtrain COMMAND ARGS...` will load them: from the file of
// --config FILE / --config=FILE (else `default_config`, when given) with the command line's --dist.* overrides.
// Never throws: a config that does not load gives the defaults here, and the command's own load reports it.
WorldOptions world_options_from_args(int argc, char** argv, const std::optional<std::string>& default_config);

// Joins the world that `options` and the environment select (see above) and returns this process's
// communicator; starts the MPI session into *session under mpi. Sets the process identity used in error and
// log prefixes. The communicator must be destroyed before the session. env: kBadInput for inconsistent
// variables (rendezvous.h), kFault when the rendezvous times out.
std::unique_ptr<Communicator> join_world(int* argc, char*** argv, const WorldOptions& options,
                                         std::optional<MpiSession>* session);

// The exit code for an error of `kind`. Under MPI it aborts the whole job with that code instead of
// returning, so that no other rank waits forever in a collective. Without MPI (env) the caller returns it and
// exits; its closed connections make every peer's next collective fail with kFault naming this rank.
int fail_world(const std::optional<MpiSession>& session, ErrorKind kind);

}  // namespace st
