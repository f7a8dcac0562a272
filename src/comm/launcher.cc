#include "shardtrain/comm/launcher.h"

#include <cstring>
#include <vector>

#include "shardtrain/comm/mpi_communicator.h"
#include "shardtrain/comm/rendezvous.h"
#include "shardtrain/comm/tcp_communicator.h"
#include "shardtrain/core/env.h"

namespace st {

WorldOptions world_options_from_args(int argc, char** argv, const std::optional<std::string>& default_config) {
  std::optional<std::string> config = default_config;
  std::vector<std::string> dist;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--config" && i + 1 < argc) {
      config = argv[++i];
    } else if (a.rfind("--config=", 0) == 0) {
      config = a.substr(std::strlen("--config="));
    } else if (a.rfind("--dist.", 0) == 0) {
      dist.push_back(a);
    }
  }
  for (const auto& path : {config, std::optional<std::string>()}) {
    try {
      const Config cfg = load_config(path, dist);
      return WorldOptions{cfg.dist.bootstrap, cfg.dist.rendezvous_timeout_s};
    } catch (const Error&) {
      // The file or an override is wrong: the command's own load_config reports it, with the world joined.
    }
  }
  return WorldOptions{};
}

std::unique_ptr<Communicator> join_world(int* argc, char*** argv, const WorldOptions& options,
                                         std::optional<MpiSession>* session) {
  Bootstrap how = options.bootstrap;
  if (how == Bootstrap::kAuto) {
    how = MpiSession::launched_by_mpi() ? Bootstrap::kMpi
          : env_get("WORLD_SIZE").empty() ? Bootstrap::kAuto
                                          : Bootstrap::kEnv;
  }
  if (how == Bootstrap::kMpi) {
    session->emplace(argc, argv);
    auto comm = std::make_unique<MpiCommunicator>();
    set_process_identity(comm->rank(), comm->world_size());
    return comm;
  }
  if (how == Bootstrap::kEnv && !options.single_process) {
    const RendezvousOptions o = rendezvous_options_from_env(options.rendezvous_timeout_s);
    set_process_identity(o.rank, o.world_size);  // before the rendezvous, so that its errors name the rank
    TcpCommunicatorOptions tcp;
    tcp.launcher_local_rank = o.local_rank;
    return std::make_unique<TcpCommunicator>(rendezvous(o), tcp);
  }
  return std::make_unique<SoloCommunicator>();
}

int fail_world(const std::optional<MpiSession>& session, ErrorKind kind) {
  if (session) MpiSession::abort(exit_code_for(kind));
  return exit_code_for(kind);
}

}  // namespace st
