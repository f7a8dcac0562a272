// The env bootstrap's rendezvous: how N processes started without mpirun (torchrun, a PyTorchJob, a Kubernetes
// Indexed Job, launch/pod_launch.sh) find each other and connect into a full mesh of TCP connections.
//
// Protocol:
//   1. Every rank opens a listening socket on a free port (its mesh port).
//   2. Rank 0 listens on MASTER_PORT. Every other rank connects to MASTER_ADDR:MASTER_PORT (retrying until the
//      timeout: rank 0 may start later, its DNS name may not resolve yet) and sends a hello: rank, world size,
//      host name, mesh port, SHARDTRAIN_NODE_ID if set. That connection stays as its link to rank 0.
//   3. Rank 0 waits for all N - 1 hellos, checks that every WORLD_SIZE agrees and no rank appears twice, and
//      sends every rank the table (each rank's address as rank 0 saw it, mesh port, host name, node id) -- or
//      the error, which every rank then throws as rank 0 did.
//   4. Rank i connects to ranks 1..i-1 at their mesh ports and accepts ranks i+1..N-1.
//
// Errors: timeouts are kFault (retry), naming what was waited for:
//   rank 0:  "rendezvous on port 29500: 2 of 3 ranks arrived within 5 s (missing ranks: 2)"
//   others:  "could not reach MASTER_ADDR=host:29500 within 5 s (connection refused)"
// Inconsistent input (WORLD_SIZE disagrees, a rank twice, RANK >= WORLD_SIZE, non-numbers) is kBadInput naming
// the variable and the value.
//
//   st::RendezvousOptions o = st::rendezvous_options_from_env(300);   // WORLD_SIZE, RANK, ... (core/env.h)
//   st::TcpMesh mesh = st::rendezvous(o);
//   st::TcpCommunicator comm(std::move(mesh));                        // tcp_communicator.h
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "shardtrain/comm/tcp_socket.h"

namespace st {

struct RendezvousOptions {
  int rank = 0;
  int world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  double timeout_s = 300;
  // What this rank reports about itself: its machine (ranks with equal host names share a node) and the
  // SHARDTRAIN_NODE_ID override. rendezvous_options_from_env() fills them from gethostname() and the env; tests
  // set them to stand in for several machines.
  std::string host_name;
  std::optional<int64_t> node_id;
  // LOCAL_RANK, -1 when unset: not used by the rendezvous; the launcher hands it to TcpCommunicator (device_rank).
  int local_rank = -1;
};

// Reads WORLD_SIZE, RANK (else JOB_COMPLETION_INDEX x LOCAL_WORLD_SIZE + LOCAL_RANK), LOCAL_RANK, MASTER_ADDR,
// MASTER_PORT and SHARDTRAIN_NODE_ID through core/env.h. kBadInput naming the variable and value for a missing WORLD_SIZE or
// MASTER_ADDR (when WORLD_SIZE > 1), a non-number, RANK >= WORLD_SIZE, LOCAL_RANK >= LOCAL_WORLD_SIZE, or a port
// outside [1, 65535].
RendezvousOptions rendezvous_options_from_env(double timeout_s);

// What every rank knows about rank r after the rendezvous.
struct PeerInfo {
  std::string host_name;
  std::string address;  // as rank 0 saw it (rank 0's own: MASTER_ADDR)
  int port = 0;         // its mesh port
  std::optional<int64_t> node_id;
};

// The connected world: links[r] is the connection to rank r (empty for rank itself), blocking mode.
struct TcpMesh {
  int rank = 0;
  std::vector<PeerInfo> peers;
  std::vector<Socket> links;
  int world_size() const { return static_cast<int>(peers.size()); }
};

// Runs the protocol above; collective over all world_size processes. world_size 1 returns at once.
TcpMesh rendezvous(const RendezvousOptions& options);

// Step 4 of the protocol over `members` (world ranks, `rank` among them; the members from `first` on take part
// in connecting): the member at index i connects to the members at indices first..i-1 (their peers[] address and
// port), saying who it is, and accepts the members after it on `listener` (none when i < first). Sets (*links)[r]
// for each member r it connected. kFault naming the rank that could not be reached, or that did not connect,
// within timeout_s. TcpCommunicator::dup builds its second mesh with it (first = 0).
void connect_mesh(int rank, const std::vector<PeerInfo>& peers, const std::vector<int>& members, int first,
                  const Socket& listener, double timeout_s, std::vector<Socket>* links);

}  // namespace st
