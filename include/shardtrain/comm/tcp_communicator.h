// TcpCommunicator: the Communicator of dist.bootstrap=env (no MPI), over the full mesh of TCP connections that
// the rendezvous built (rendezvous.h). One process per rank.
//
// Algorithms (every rank talks to every other rank directly; poll()-driven non-blocking I/O sends and receives
// to all peers at once, so no message size can deadlock):
//   * all_gather: each rank sends its block to every peer.
//   * reduce_scatter: each rank sends slice r to rank r, which sums the contributions for its slice in rank order
//     0, 1, ..., N-1. Results are deterministic and independent of timing.
//   * all_reduce: reduce_scatter + all_gather over the count padded to a multiple of N, so every rank ends with the
//     same bits.
//   * broadcast: the root sends to every peer. barrier: one byte to and from every peer.
//   Large counts go in rounds of at most 4M elements per peer, so the staging memory stays bounded.
//
// Failures: a peer whose connection closes or resets (it died, or failed and exited) makes the collective throw
// kFault naming the op and the peer ("all_reduce: lost rank 2 (host-b): connection closed by the peer"). There
// are no timeouts in the collectives: a hung (not dead) peer blocks them (the watchdog's business).
//
// Point-to-point (send, recv, send_recv) moves the bytes over the one connection between the two ranks, through
// the same poll() loop, so a send_recv around a ring never blocks.
//
// dup() connects a second full mesh (each rank listens on a new port, the ports go round over the first mesh, and
// connect_mesh() of rendezvous.h links them): its own connections, so it may be used from another thread while
// the world's communicators are in use.
//
// split() reuses the world's connections (shared by all communicators of one world), so the communicators of a
// world must be used from one thread at a time, every rank calling their collectives in the same order (as SPMD
// training does): the connections are ordered byte streams shared between them.
//
// Topology: ranks with the same host name form a node; SHARDTRAIN_NODE_ID (sent in the rendezvous), set on every
// rank, overrides it, as for MpiCommunicator. device_rank() is the rank's index among the processes of its host
// name, or LOCAL_RANK where the launcher says otherwise (with a warning).
//
//   st::TcpCommunicator comm(st::rendezvous(st::rendezvous_options_from_env(300)));
//   comm.all_reduce(buf, n);
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardtrain/comm/communicator.h"
#include "shardtrain/comm/node_topology.h"
#include "shardtrain/comm/rendezvous.h"

namespace st {

struct TcpCommunicatorOptions {
  // The launcher's local rank (LOCAL_RANK), or -1: device_rank() then comes from the host names alone.
  int launcher_local_rank = -1;
};

class TcpCommunicator final : public Communicator {
 public:
  // Takes over the mesh's connections. kBadInput when SHARDTRAIN_NODE_ID is set on some ranks but not all.
  explicit TcpCommunicator(TcpMesh mesh, const TcpCommunicatorOptions& options = {});
  ~TcpCommunicator() override;
  TcpCommunicator(const TcpCommunicator&) = delete;
  TcpCommunicator& operator=(const TcpCommunicator&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return static_cast<int>(members_.size()); }
  int node_id() const override { return topology_.node_id; }
  int local_rank() const override { return topology_.local_rank; }
  int local_size() const override { return topology_.local_size; }
  int device_rank() const override { return device_rank_; }
  int device_ranks() const override { return device_ranks_; }
  std::string kind() const override { return "tcp"; }
  int num_nodes() const { return topology_.num_nodes; }

  void all_gather(const float* send, int64_t count, float* recv) override;
  void reduce_scatter(const float* send, int64_t count, float* recv) override;
  void all_reduce(float* buf, int64_t count) override;
  void all_reduce(double* buf, int64_t count) override;
  void broadcast(void* buf, int64_t bytes, int root) override;
  void barrier() override;
  std::unique_ptr<Communicator> split(int color, int key) override;
  std::unique_ptr<Communicator> dup() override;
  void send(const void* buf, int64_t bytes, int dest) override;
  void recv(void* buf, int64_t bytes, int source) override;
  void send_recv(const void* send_buf, int64_t send_bytes, int dest, void* recv_buf, int64_t recv_bytes,
                 int source) override;

  // The world's connections and what every world rank reported (private to tcp_communicator.cc).
  struct World;

 private:
  TcpCommunicator(std::shared_ptr<World> world, std::vector<int> members, int rank, int device_rank,
                  int device_ranks);

  template <typename T>
  void all_gather_impl(const T* send, int64_t count, T* recv, const char* op);
  template <typename T>
  void reduce_scatter_impl(const T* send, int64_t count, T* recv, const char* op);
  template <typename T>
  void all_reduce_impl(T* buf, int64_t count);

  std::shared_ptr<World> world_;
  std::vector<int> members_;  // members_[r] = world rank of this communicator's rank r
  int rank_ = 0;
  NodeTopology topology_;
  int device_rank_ = 0;
  int device_ranks_ = 1;  // ranks on this host (device_ranks())
};

}  // namespace st
