// How a shardtrain program joins its world: under mpirun (or another MPI launcher) it initialises MPI
// and talks through an MpiCommunicator; started plainly it is a world of one and never touches MPI.
//
//   std::optional<st::MpiSession> mpi;      // outside the try: the error path may need MPI_Abort
//   try {
//     auto comm = st::join_world(&argc, &argv, &mpi);
//     ...
//   } catch (const st::Error& e) { st::fail_world(mpi, e.kind()); }
#pragma once

#include <memory>
#include <optional>

#include "shardtrain/comm/communicator.h"
#include "shardtrain/comm/mpi_session.h"
#include "shardtrain/core/error.h"

namespace st {

// Starts the MPI session into *session when launched by MPI, and returns this process's communicator
// (MPI or solo). Sets the process identity used in error and log prefixes. The communicator must be
// destroyed before the session.
std::unique_ptr<Communicator> join_world(int* argc, char*** argv, std::optional<MpiSession>* session);

// The exit code for an error of `kind`. Under MPI it aborts the whole job with that code instead of
// returning, so that no other rank waits forever in a collective.
int fail_world(const std::optional<MpiSession>& session, ErrorKind kind);

}  // namespace st
