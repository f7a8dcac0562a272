#include "shardtrain/comm/launcher.h"

#include "shardtrain/comm/mpi_communicator.h"

namespace st {

std::unique_ptr<Communicator> join_world(int* argc, char*** argv, std::optional<MpiSession>* session) {
  if (!MpiSession::launched_by_mpi()) return std::make_unique<SoloCommunicator>();
  session->emplace(argc, argv);
  auto comm = std::make_unique<MpiCommunicator>();
  set_process_identity(comm->rank(), comm->world_size());
  return comm;
}

int fail_world(const std::optional<MpiSession>& session, ErrorKind kind) {
  if (session) MpiSession::abort(exit_code_for(kind));
  return exit_code_for(kind);
}

}  // namespace st
