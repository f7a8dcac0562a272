// MpiCommunicator: the Communicator of the CPU backend, one process per rank, over MPI.
//
// It works on its own duplicate of MPI_COMM_WORLD (MPI_Comm_dup), so its collectives never match
// messages of other MPI users, and sets MPI_ERRORS_RETURN on it, so failures throw st::Error (kFault,
// ST_MPI_CHECK) instead of killing the job from inside MPI. It owns that handle: it moves, does not
// copy, and frees it in the destructor. It needs a live MpiSession (mpi_session.h) for its whole life.
//
// Counts are 64-bit; MPI's are int. Each collective is split into calls of at most max_chunk elements:
//   * all_reduce and broadcast (bytes) chunk the buffer directly;
//   * all_gather and reduce_scatter move one rank-major block per rank per call. While count fits one
//     call (count <= min(max_chunk, INT_MAX / world_size)) MPI reads and writes the caller's buffers
//     directly (in-place all_gather through MPI_IN_PLACE); beyond that each call goes through a staging
//     buffer of world_size * chunk elements (at most 64 MiB, allocated per call).
// Sums are MPI_SUM: their order is MPI's, so results may differ from a serial sum in the last bits.
// Point-to-point calls (send, recv, send_recv: MPI_Send, MPI_Recv, MPI_Sendrecv) move at most max_chunk bytes a
// message: a transfer is ceil(bytes / max_chunk) messages, which both sides count alike from the byte count.
// dup() is MPI_Comm_dup: a separate context, safe to use from another thread under MPI_THREAD_MULTIPLE.
//
// Threads: one thread at a time per communicator (collectives are ordered per communicator). Separate
// MpiCommunicators may be used from separate threads when MPI provides MPI_THREAD_MULTIPLE.
//
// Topology (node_id, local_rank, local_size) is computed once, collectively, in the constructor:
//   * default: ranks that share memory (MPI_Comm_split_type MPI_COMM_TYPE_SHARED) form a node. If the
//     launcher says otherwise through OMPI_COMM_WORLD_LOCAL_RANK, its value wins with a warning.
//   * SHARDTRAIN_NODE_ID=<integer> on every rank: ranks with equal ids form a node (tests stand in for
//     several machines on one host). Set on some ranks only, or not an integer: kBadInput.
//   Node ids are numbered 0.. in order of each node's lowest rank (node_topology.h).
//
//   st::MpiSession mpi(&argc, &argv);
//   st::MpiCommunicator comm;                  // collective: every rank constructs it
//   comm.all_gather(shard, n, full);
#pragma once

#include <climits>
#include <cstdint>
#include <string>

#include "shardtrain/comm/communicator.h"
#include "shardtrain/comm/mpi_include.h"
#include "shardtrain/comm/node_topology.h"

namespace st {

struct MpiCommunicatorOptions {
  // The most elements (bytes for broadcast) one MPI call moves per rank; 1 <= max_chunk <= INT_MAX.
  // Tests set it small to exercise the chunking.
  int64_t max_chunk = INT_MAX;
};

class MpiCommunicator final : public Communicator {
 public:
  // Collective over MPI_COMM_WORLD. Throws kInternal without an MpiSession, kBadInput for a bad
  // SHARDTRAIN_NODE_ID, kFault when MPI fails.
  explicit MpiCommunicator(const MpiCommunicatorOptions& options = {});
  ~MpiCommunicator() override;
  MpiCommunicator(MpiCommunicator&& other) noexcept;
  MpiCommunicator& operator=(MpiCommunicator&& other) noexcept;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  int node_id() const override { return topology_.node_id; }
  int local_rank() const override { return topology_.local_rank; }
  int local_size() const override { return topology_.local_size; }
  int device_rank() const override { return device_rank_; }
  int device_ranks() const override { return device_ranks_; }
  std::string kind() const override { return "mpi"; }

  void all_gather(const float* send, int64_t count, float* recv) override;
  void reduce_scatter(const float* send, int64_t count, float* recv) override;
  void all_reduce(float* buf, int64_t count) override;
  void all_reduce(double* buf, int64_t count) override;
  void broadcast(void* buf, int64_t bytes, int root) override;
  void barrier() override;
  // MPI_Comm_split; the group's topology comes from its members' node ids (no new shared-memory split).
  std::unique_ptr<Communicator> split(int color, int key) override;
  std::unique_ptr<Communicator> dup() override;
  void send(const void* buf, int64_t bytes, int dest) override;
  void recv(void* buf, int64_t bytes, int source) override;
  void send_recv(const void* send_buf, int64_t send_bytes, int dest, void* recv_buf, int64_t recv_bytes,
                 int source) override;

  // How many nodes the world spans.
  int num_nodes() const { return topology_.num_nodes; }
  int64_t max_chunk() const { return max_chunk_; }
  // The duplicated communicator, still owned by this object (MPI_COMM_NULL after a move).
  MPI_Comm handle() const { return comm_; }

 private:
  // Takes ownership of `sub` (from MPI_Comm_split or MPI_Comm_dup); `node_id` is this rank's node in the parent's
  // numbering.
  MpiCommunicator(MPI_Comm sub, int node_id, int device_rank, int device_ranks, int64_t max_chunk);
  void free_handle() noexcept;

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int world_size_ = 1;
  int64_t max_chunk_ = INT_MAX;
  NodeTopology topology_;
  int device_rank_ = 0;   // the shared-memory local rank (device_rank())
  int device_ranks_ = 1;  // the shared-memory local size (device_ranks())
};

}  // namespace st
