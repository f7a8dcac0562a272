// Communicator: the collectives that sharded training needs, behind one interface.
//
// Implementations: MpiCommunicator (CPU backend, one process per rank, mpi_communicator.h), TcpCommunicator
// (dist.bootstrap=env: the same over TCP sockets without MPI, tcp_communicator.h), the
// in-process FakeWorld (N ranks as threads, for unit tests, fake_communicator.h), and a SoloCommunicator
// (world size 1, no MPI at all). The CUDA backend's device-side collectives are NcclCommunicator
// (nccl_communicator.h), which bootstraps through one of these.
//
// Contract, for every implementation:
//   * Collective calls are made by every rank of the communicator, in the same order, with the same
//     counts. Counts are element counts, 64-bit; an implementation whose library takes `int` counts
//     chunks internally.
//   * Buffers are typed (float for parameters/gradients, double for norms and losses); a send and a
//     receive buffer of one call must not overlap unless the call says so.
//   * Reductions are sums; the caller scales (the gradient of a mean passes its 1/N in dloss).
//   * Failures throw st::Error (kFault for a broken peer or library failure).
//   * Point-to-point calls (send, recv, send_recv) are made by the two ranks concerned only. Messages from one
//     rank to another arrive in the order sent, and a recv takes exactly the bytes of the matching send (the
//     callers agree on sizes first, e.g. with a header message of fixed size).
//
//   std::vector<float> full(comm.world_size() * shard);
//   comm.all_gather(shard_buf, shard, full.data());             // full = [rank 0's | rank 1's | ...]
//   comm.reduce_scatter(full_grad, shard, grad_shard);           // grad_shard = sum over ranks of my slice
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace st {

class Watchdog;

// The collectives, by name (bandwidth probes, sharding choices).
enum class CollectiveOp { kAllGather, kReduceScatter, kAllReduce };

// nccl-tests' bus bandwidth in GB/s of one `op` over `ranks` ranks that took `seconds`, with `bytes` per rank (the
// shard of an all-gather or reduce-scatter, the buffer of an all-reduce): all-gather and reduce-scatter move
// (n-1)/n of the n x bytes gathered buffer, all-reduce 2 (n-1)/n of its bytes. 0 for a group of one.
inline double bus_bandwidth(CollectiveOp op, int ranks, double bytes, double seconds) {
  if (ranks <= 1) return 0.0;
  const double factor = op == CollectiveOp::kAllReduce ? 2.0 * (ranks - 1) / ranks : ranks - 1.0;
  return factor * bytes / seconds / 1e9;
}

class Communicator {
 public:
  virtual ~Communicator() = default;

  // Position in this communicator, 0 <= rank() < world_size().
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // The machine this rank runs on (0-based, numbered in order of each node's lowest rank), this rank's
  // index among the ranks of its node, and how many ranks that node has. SHARDTRAIN_NODE_ID overrides
  // the node id (tests stand in for several machines on one host).
  virtual int node_id() const = 0;
  virtual int local_rank() const = 0;
  virtual int local_size() const = 0;
  // This process's index among the processes of its machine: which GPU it drives. The shared-memory local
  // rank, which SHARDTRAIN_NODE_ID does not change (stand-in nodes on one host still use different GPUs).
  virtual int device_rank() const { return local_rank(); }
  // How many processes run on this machine (device_rank()'s range), whatever SHARDTRAIN_NODE_ID says: the host
  // AdamW threads of optimizer offload split the machine's CPUs by it.
  virtual int device_ranks() const { return local_size(); }
  // "mpi", "tcp", "fake", "solo".
  virtual std::string kind() const = 0;
  // The watchdog that puts this communicator's collectives under a deadline (watched_communicator.h), or null.
  // Device communicators built over this one (NCCL) report to the same watchdog.
  virtual Watchdog* watchdog() const { return nullptr; }
  // A name for messages: "world", or the parent's name and the split's color ("world/1").
  virtual std::string name() const { return "world"; }

  // recv[r * count + i] = rank r's send[i], for i < count. recv holds world_size() * count elements.
  // send may alias recv + rank() * count (in place).
  virtual void all_gather(const float* send, int64_t count, float* recv) = 0;
  // recv[i] = sum over ranks r of r's send[rank() * count + i], for i < count. send holds
  // world_size() * count elements.
  virtual void reduce_scatter(const float* send, int64_t count, float* recv) = 0;
  // buf[i] = sum over ranks of buf[i], in place.
  virtual void all_reduce(float* buf, int64_t count) = 0;
  virtual void all_reduce(double* buf, int64_t count) = 0;
  // Root's bytes to every rank, in place.
  virtual void broadcast(void* buf, int64_t bytes, int root) = 0;
  virtual void barrier() = 0;
  // A new communicator of the ranks that pass the same `color`, ranked by `key` (ties by rank). Collective
  // over this communicator. Its node_id/local_rank/local_size describe the members' machines again, numbered
  // within the group. Hybrid sharding splits the world into node groups and into replica groups.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  // A communicator of the same ranks, in the same order and topology, whose traffic never mixes with this
  // one's: it may be used from another thread while this one is in use (the checkpoint saver's background
  // transfers beside the training step's collectives). Collective over this communicator. The default refuses
  // (kInternal).
  virtual std::unique_ptr<Communicator> dup();

  // `bytes` bytes to rank `dest` (!= rank()), blocking until the buffer may be reused; the receiver calls
  // recv(..., bytes, rank()). 0 bytes move nothing and need no matching call. The defaults refuse (kInternal): a
  // communicator without point-to-point support.
  virtual void send(const void* buf, int64_t bytes, int dest);
  virtual void recv(void* buf, int64_t bytes, int source);
  // send(send_buf, send_bytes, dest) and recv(recv_buf, recv_bytes, source) at once, so that ranks sending
  // around a ring (each to its left neighbour, each from its right) cannot block each other. dest and source may
  // be the same rank; either count may be 0 (that half is skipped: the peer makes no matching call). The buffers
  // must not overlap.
  virtual void send_recv(const void* send_buf, int64_t send_bytes, int dest, void* recv_buf, int64_t recv_bytes,
                         int source);
};

// The communicator of a single process: every collective is a copy (or nothing). It checks its arguments
// as the other implementations do (counts >= 0, root 0, no overlap except in place).
class SoloCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  int node_id() const override { return 0; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  std::string kind() const override { return "solo"; }
  void all_gather(const float* send, int64_t count, float* recv) override;
  void reduce_scatter(const float* send, int64_t count, float* recv) override;
  void all_reduce(float* buf, int64_t count) override;
  void all_reduce(double* buf, int64_t count) override;
  void broadcast(void* buf, int64_t bytes, int root) override;
  void barrier() override {}
  std::unique_ptr<Communicator> split(int color, int key) override { return std::make_unique<SoloCommunicator>(); }
  std::unique_ptr<Communicator> dup() override { return std::make_unique<SoloCommunicator>(); }
  // send, recv and send_recv refuse (kInternal): a world of one process has no peer.
};

}  // namespace st
