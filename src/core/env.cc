#include "shardtrain/core/env.h"

#include <cstdlib>

#include "shardtrain/core/error.h"

namespace st {

const std::vector<EnvVar>& env_table() {
  static const std::vector<EnvVar> table = {
      {"SHARDTRAIN_LOG_LEVEL", "info", "log verbosity on stderr: debug | info | warn | error"},
      {"SHARDTRAIN_FORTUNES_DIR", "/usr/share/games/fortunes",
       "where the built-in corpus (Debian package 'fortunes') is read from"},
      {"SHARDTRAIN_CONFIG_DIR", SHARDTRAIN_DEFAULT_CONFIG_DIR,
       "where `shardtrain train` without --config finds default.ini"},
      {"SHARDTRAIN_NODE_ID", "",
       "override the node id of this rank (tests stand in for several machines on one host); an integer, "
       "set on every rank or none: ranks with equal ids form one node"},
      // Set by MPI launchers, only read: whether to initialise MPI at all, and the launcher's view of
      // the local rank (comm/mpi_session.h, comm/mpi_communicator.h).
      {"HDF5_USE_FILE_LOCKING", "",
       "read by HDF5 itself: FALSE turns off its file locks (needed on some NFS mounts); the log says which"},
      {"SHARDTRAIN_PROFILE_OPS", "",
       "1: time every GPU op with CUDA events and print the per-op table (ms per training step, evaluations left "
       "out) at the end of train"},
      {"SHARDTRAIN_FAULT", "",
       "test-only fault injection, POINT:RANK[@STEP] (at that step only) with POINT one of ckpt_mid_write (SIGKILL "
       "halfway through writing the shard), ckpt_before_rename (rank 0: SIGKILL after the manifest fsync, before the "
       "rename), ckpt_enospc (the shard write fails with ENOSPC), grad_inf (this rank's gradients of 1-based step "
       "STEP become non-finite, as an fp16 overflow would make them), p2p_broken (this rank's start-up "
       "peer-to-peer copy check fails, as on a machine whose GPUs report peer access they cannot do), sigstop (this "
       "rank stops itself with SIGSTOP before step STEP: a hung rank, for the watchdog), sigterm (this rank sends "
       "itself SIGTERM after step STEP, at the step boundary where the stop signal is read; in generate: once it has "
       "sampled token STEP of a sequence, counted from 1), sigint (generate: this rank sends itself SIGINT once it has "
       "sampled token STEP of a sequence), tokenize_sigstop (rank 0: tokenize stops itself with SIGSTOP once it has "
       "written STEP shards of a series, for a signal to land mid-run)"},
      {"NCCL_P2P_DISABLE", "",
       "read by NCCL; shardtrain reads it too: unset, it first checks that the GPUs which report peer access can "
       "copy to each other, and sets it to 1 for the run if they cannot (the log says so)"},
      {"NCCL_SOCKET_IFNAME", "",
       "read by NCCL: the network interface(s) between nodes; shardtrain reads it only to report it (topo, the train "
       "log); launch/mpirun.sh --iface sets it"},
      {"NCCL_IB_DISABLE", "", "read by NCCL: 1 keeps it off InfiniBand/RoCE; shardtrain reports it beside NCCL_SOCKET_IFNAME"},
      {"OMPI_COMM_WORLD_SIZE", "", "set by Open MPI's mpirun (read only): shardtrain then initialises MPI"},
      {"OMPI_COMM_WORLD_LOCAL_RANK", "",
       "set by Open MPI's mpirun (read only): this rank's index on its node, checked against shared memory"},
      {"PMIX_RANK", "", "set by PMIx launchers such as srun --mpi=pmix (read only): shardtrain then initialises MPI"},
      // dist.bootstrap=env (comm/rendezvous.h): torchrun / PyTorchJob names, and Kubernetes' Indexed Job index.
      {"WORLD_SIZE", "", "dist.bootstrap=env: the number of ranks; set, it also makes dist.bootstrap=auto pick env"},
      {"RANK", "", "dist.bootstrap=env: this process's rank (unset: JOB_COMPLETION_INDEX x LOCAL_WORLD_SIZE + LOCAL_RANK)"},
      {"JOB_COMPLETION_INDEX", "",
       "set by a Kubernetes Indexed Job per pod (read only): the pod's index, for the rank when RANK is unset"},
      {"LOCAL_RANK", "",
       "dist.bootstrap=env: this process's index in its pod or machine, 0 when unset (launch/pod_launch.sh sets it); "
       "also the GPU it drives"},
      {"LOCAL_WORLD_SIZE", "1", "dist.bootstrap=env: processes per pod or machine (GPUs per pod)"},
      {"MASTER_ADDR", "",
       "dist.bootstrap=env: rank 0's host name or address (Kubernetes: the headless Service name of pod 0)"},
      {"MASTER_PORT", "29500", "dist.bootstrap=env: the TCP port rank 0 listens on for the rendezvous"},
      {"PMI_SIZE", "", "set by PMI-1/2 launchers such as MPICH's mpiexec (read only): shardtrain then initialises MPI"},
  };
  return table;
}

std::string env_get(std::string_view name) {
  for (const EnvVar& v : env_table()) {
    if (name == v.name) {
      const char* value = std::getenv(v.name);
      return (value != nullptr && value[0] != '\0') ? std::string(value) : std::string(v.default_value);
    }
  }
  ST_CHECK(false, "environment variable ", name, " is not declared in env_table()");
}

}  // namespace st
