#include "shardtrain/comm/mpi_communicator.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "collective_args.h"
#include "shardtrain/comm/mpi_check.h"
#include "shardtrain/core/env.h"
#include "shardtrain/core/log.h"

namespace st {
namespace {

// Beyond one call's worth, all_gather and reduce_scatter stage world_size * chunk elements; chunks of
// this many elements in total keep that buffer at 64 MiB while each call still moves tens of MiB.
constexpr int64_t kStageElements = int64_t{1} << 24;

bool mpi_alive() {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

// A communicator made only for the constructor (the shared-memory split), freed on every path.
class ScopedComm {
 public:
  ScopedComm() = default;
  ~ScopedComm() {
    if (comm_ != MPI_COMM_NULL && mpi_alive()) MPI_Comm_free(&comm_);
  }
  ScopedComm(const ScopedComm&) = delete;
  ScopedComm& operator=(const ScopedComm&) = delete;
  MPI_Comm* out() { return &comm_; }
  MPI_Comm get() const { return comm_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
};

template <typename T>
MPI_Datatype mpi_type();
template <>
MPI_Datatype mpi_type<float>() {
  return MPI_FLOAT;
}
template <>
MPI_Datatype mpi_type<double>() {
  return MPI_DOUBLE;
}

// Per-rank elements of one staged all_gather/reduce_scatter call, given the per-call cap.
int64_t staged_chunk(int64_t cap, int world) { return std::max<int64_t>(1, std::min(cap, kStageElements / world)); }

bool parse_int(const std::string& s, int* out) {
  const char* end = s.data() + s.size();
  const auto [ptr, ec] = std::from_chars(s.data(), end, *out);
  return !s.empty() && ec == std::errc() && ptr == end;
}

// Node membership, computed collectively over `comm` (see mpi_communicator.h). *device_rank is the
// shared-memory local rank (the launcher's, where it says otherwise) and *device_ranks the shared-memory local size,
// whatever SHARDTRAIN_NODE_ID says.
NodeTopology discover_topology(MPI_Comm comm, int rank, int world, int* device_rank, int* device_ranks) {
  // Parsed before any collective: every rank normally sees the same environment, so a bad value stops
  // them all here; a lone bad rank is turned into a job abort by the launcher.
  int64_t override_id = 0;
  const bool has_override = node_id_override(&override_id);

  // Always split by shared memory (it is collective, so every rank must take part whatever it decides).
  // With the world rank as the key, the node's lowest world rank is its local rank 0's.
  ScopedComm node;
  ST_MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, node.out()));
  int lowest = rank;
  ST_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &lowest, 1, MPI_INT, MPI_MIN, node.get()));

  const int64_t mine[3] = {has_override ? 1 : 0, override_id, lowest};
  std::vector<int64_t> all(3 * static_cast<size_t>(world));
  ST_MPI_CHECK(MPI_Allgather(mine, 3, MPI_INT64_T, all.data(), 3, MPI_INT64_T, comm));

  int with = -1;
  int without = -1;
  std::vector<int64_t> override_keys(world);
  std::vector<int64_t> shared_keys(world);
  for (int r = 0; r < world; ++r) {
    (all[3 * r] ? with : without) = r;
    override_keys[r] = all[3 * r + 1];
    shared_keys[r] = all[3 * r + 2];
  }
  if (with >= 0 && without >= 0) {
    ST_BAD_INPUT("environment variable SHARDTRAIN_NODE_ID is set on rank ", with, " but not on rank ", without,
                 ": set it on every rank or on none");
  }
  NodeTopology t = node_topology_from_keys(shared_keys, rank);
  const std::string env_local = env_get("OMPI_COMM_WORLD_LOCAL_RANK");
  int launcher_local = -1;
  if (!env_local.empty()) {
    if (!parse_int(env_local, &launcher_local)) {
      ST_LOG_WARN("ignoring OMPI_COMM_WORLD_LOCAL_RANK='", env_local, "': not an integer");
    } else if (launcher_local != t.local_rank) {
      ST_LOG_WARN("the launcher's OMPI_COMM_WORLD_LOCAL_RANK=", launcher_local,
                  " differs from the local rank computed from shared memory (", t.local_rank, " of ", t.local_size,
                  "); using the launcher's");
      t.local_rank = launcher_local;
    }
  }
  *device_rank = t.local_rank;
  *device_ranks = std::max(t.local_size, t.local_rank + 1);
  if (has_override) return node_topology_from_keys(override_keys, rank);
  return t;
}

template <typename T>
void all_reduce_chunks(MPI_Comm comm, T* buf, int64_t count, int64_t max_chunk) {
  detail::check_count(buf, count, "all_reduce");
  if (count == 0) return;
  ST_CHECK(comm != MPI_COMM_NULL, "all_reduce on a moved-from MpiCommunicator");
  for (int64_t off = 0; off < count; off += max_chunk) {
    const int n = static_cast<int>(std::min(max_chunk, count - off));
    ST_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf + off, n, mpi_type<T>(), MPI_SUM, comm));
  }
}

}  // namespace

MpiCommunicator::MpiCommunicator(const MpiCommunicatorOptions& options) : max_chunk_(options.max_chunk) {
  ST_CHECK(mpi_alive(), "MpiCommunicator needs MPI initialised: create an st::MpiSession first");
  ST_CHECK(max_chunk_ >= 1 && max_chunk_ <= INT_MAX, "MpiCommunicatorOptions::max_chunk = ", max_chunk_,
           " outside [1, INT_MAX]");
  ST_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
  try {
    ST_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    ST_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    ST_MPI_CHECK(MPI_Comm_size(comm_, &world_size_));
    topology_ = discover_topology(comm_, rank_, world_size_, &device_rank_, &device_ranks_);
  } catch (...) {
    free_handle();  // the destructor does not run for a constructor that throws
    throw;
  }
}

MpiCommunicator::MpiCommunicator(MPI_Comm sub, int node_id, int device_rank, int device_ranks, int64_t max_chunk)
    : comm_(sub), max_chunk_(max_chunk), device_rank_(device_rank), device_ranks_(device_ranks) {
  try {
    ST_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    ST_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    ST_MPI_CHECK(MPI_Comm_size(comm_, &world_size_));
    std::vector<int> ids(static_cast<size_t>(world_size_));
    ST_MPI_CHECK(MPI_Allgather(&node_id, 1, MPI_INT, ids.data(), 1, MPI_INT, comm_));
    topology_ = node_topology_from_keys(std::vector<int64_t>(ids.begin(), ids.end()), rank_);
  } catch (...) {
    free_handle();
    throw;
  }
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key) {
  ST_CHECK(comm_ != MPI_COMM_NULL, "split of a moved-from MpiCommunicator");
  ST_CHECK(color >= 0, "MpiCommunicator::split: color ", color, " must be >= 0");
  MPI_Comm sub = MPI_COMM_NULL;
  ST_MPI_CHECK(MPI_Comm_split(comm_, color, key, &sub));
  return std::unique_ptr<Communicator>(new MpiCommunicator(sub, topology_.node_id, device_rank_, device_ranks_, max_chunk_));
}

std::unique_ptr<Communicator> MpiCommunicator::dup() {
  ST_CHECK(comm_ != MPI_COMM_NULL, "dup of a moved-from MpiCommunicator");
  MPI_Comm copy = MPI_COMM_NULL;
  ST_MPI_CHECK(MPI_Comm_dup(comm_, &copy));
  return std::unique_ptr<Communicator>(
      new MpiCommunicator(copy, topology_.node_id, device_rank_, device_ranks_, max_chunk_));
}

MpiCommunicator::~MpiCommunicator() { free_handle(); }

MpiCommunicator::MpiCommunicator(MpiCommunicator&& other) noexcept
    : comm_(std::exchange(other.comm_, MPI_COMM_NULL)),
      rank_(other.rank_),
      world_size_(other.world_size_),
      max_chunk_(other.max_chunk_),
      topology_(other.topology_),
      device_rank_(other.device_rank_),
      device_ranks_(other.device_ranks_) {}

MpiCommunicator& MpiCommunicator::operator=(MpiCommunicator&& other) noexcept {
  if (this != &other) {
    free_handle();
    comm_ = std::exchange(other.comm_, MPI_COMM_NULL);
    rank_ = other.rank_;
    world_size_ = other.world_size_;
    max_chunk_ = other.max_chunk_;
    topology_ = other.topology_;
    device_rank_ = other.device_rank_;
    device_ranks_ = other.device_ranks_;
  }
  return *this;
}

void MpiCommunicator::free_handle() noexcept {
  // After MPI_Finalize the handle is gone with MPI itself; freeing it then would be an error.
  if (comm_ != MPI_COMM_NULL && mpi_alive()) MPI_Comm_free(&comm_);
  comm_ = MPI_COMM_NULL;
}

void MpiCommunicator::all_gather(const float* send, int64_t count, float* recv) {
  const bool in_place = detail::check_all_gather(send, count, recv, rank_, world_size_);
  if (count == 0) return;
  ST_CHECK(comm_ != MPI_COMM_NULL, "all_gather on a moved-from MpiCommunicator");
  const int64_t cap = std::min<int64_t>(max_chunk_, INT_MAX / world_size_);
  if (count <= cap) {
    const int n = static_cast<int>(count);
    ST_MPI_CHECK(MPI_Allgather(in_place ? MPI_IN_PLACE : send, in_place ? 0 : n, MPI_FLOAT, recv, n, MPI_FLOAT, comm_));
    return;
  }
  // recv is rank-major ([r][count]) but one call can only place rank r's piece at r * n: gather each
  // chunk into [r][n] and spread it out. In place needs no special case: the chunk this rank sends is
  // read by MPI before the spread writes the same values back over it.
  const int64_t chunk = staged_chunk(cap, world_size_);
  std::vector<float> stage(static_cast<size_t>(world_size_ * chunk));
  for (int64_t off = 0; off < count; off += chunk) {
    const int64_t n = std::min(chunk, count - off);
    ST_MPI_CHECK(
        MPI_Allgather(send + off, static_cast<int>(n), MPI_FLOAT, stage.data(), static_cast<int>(n), MPI_FLOAT, comm_));
    for (int r = 0; r < world_size_; ++r) {
      std::memcpy(recv + r * count + off, stage.data() + r * n, sizeof(float) * static_cast<size_t>(n));
    }
  }
}

void MpiCommunicator::reduce_scatter(const float* send, int64_t count, float* recv) {
  detail::check_reduce_scatter(send, count, recv, world_size_);
  if (count == 0) return;
  ST_CHECK(comm_ != MPI_COMM_NULL, "reduce_scatter on a moved-from MpiCommunicator");
  const int64_t cap = std::min<int64_t>(max_chunk_, INT_MAX / world_size_);
  if (count <= cap) {
    ST_MPI_CHECK(MPI_Reduce_scatter_block(send, recv, static_cast<int>(count), MPI_FLOAT, MPI_SUM, comm_));
    return;
  }
  // The mirror of all_gather's staging: pack chunk [off, off + n) of every rank's slice as [r][n].
  const int64_t chunk = staged_chunk(cap, world_size_);
  std::vector<float> stage(static_cast<size_t>(world_size_ * chunk));
  for (int64_t off = 0; off < count; off += chunk) {
    const int64_t n = std::min(chunk, count - off);
    for (int r = 0; r < world_size_; ++r) {
      std::memcpy(stage.data() + r * n, send + r * count + off, sizeof(float) * static_cast<size_t>(n));
    }
    ST_MPI_CHECK(MPI_Reduce_scatter_block(stage.data(), recv + off, static_cast<int>(n), MPI_FLOAT, MPI_SUM, comm_));
  }
}

void MpiCommunicator::all_reduce(float* buf, int64_t count) { all_reduce_chunks(comm_, buf, count, max_chunk_); }

void MpiCommunicator::all_reduce(double* buf, int64_t count) { all_reduce_chunks(comm_, buf, count, max_chunk_); }

void MpiCommunicator::broadcast(void* buf, int64_t bytes, int root) {
  detail::check_count(buf, bytes, "broadcast");
  detail::check_root(root, world_size_);
  if (bytes == 0) return;
  ST_CHECK(comm_ != MPI_COMM_NULL, "broadcast on a moved-from MpiCommunicator");
  auto* p = static_cast<unsigned char*>(buf);
  for (int64_t off = 0; off < bytes; off += max_chunk_) {
    const int n = static_cast<int>(std::min(max_chunk_, bytes - off));
    ST_MPI_CHECK(MPI_Bcast(p + off, n, MPI_BYTE, root, comm_));
  }
}

namespace {

// Every point-to-point message carries this tag; the communicator's own context keeps it apart from other traffic.
constexpr int kP2pTag = 7301;

}  // namespace

void MpiCommunicator::send(const void* buf, int64_t bytes, int dest) { send_recv(buf, bytes, dest, nullptr, 0, -1); }

void MpiCommunicator::recv(void* buf, int64_t bytes, int source) { send_recv(nullptr, 0, -1, buf, bytes, source); }

void MpiCommunicator::send_recv(const void* send_buf, int64_t send_bytes, int dest, void* recv_buf, int64_t recv_bytes,
                                int source) {
  detail::check_send_recv(send_buf, send_bytes, dest, recv_buf, recv_bytes, source, rank_, world_size_);
  ST_CHECK(comm_ != MPI_COMM_NULL, "send_recv on a moved-from MpiCommunicator");
  const auto* out = static_cast<const unsigned char*>(send_buf);
  auto* in = static_cast<unsigned char*>(recv_buf);
  // Message i of each direction goes in round i: the peer's round i posts the matching half, so a ring of ranks
  // that each send left and receive right always has a round whose both halves are posted.
  for (int64_t off = 0; off < send_bytes || off < recv_bytes; off += max_chunk_) {
    const int s = static_cast<int>(std::clamp<int64_t>(send_bytes - off, 0, max_chunk_));
    const int r = static_cast<int>(std::clamp<int64_t>(recv_bytes - off, 0, max_chunk_));
    if (s > 0 && r > 0) {
      MPI_Status status;
      ST_MPI_CHECK(
          MPI_Sendrecv(out + off, s, MPI_BYTE, dest, kP2pTag, in + off, r, MPI_BYTE, source, kP2pTag, comm_, &status));
      int got = 0;
      ST_MPI_CHECK(MPI_Get_count(&status, MPI_BYTE, &got));
      ST_CHECK(got == r, "send_recv: rank ", source, " sent ", got, " bytes where ", r, " were expected");
    } else if (s > 0) {
      ST_MPI_CHECK(MPI_Send(out + off, s, MPI_BYTE, dest, kP2pTag, comm_));
    } else {
      MPI_Status status;
      ST_MPI_CHECK(MPI_Recv(in + off, r, MPI_BYTE, source, kP2pTag, comm_, &status));
      int got = 0;
      ST_MPI_CHECK(MPI_Get_count(&status, MPI_BYTE, &got));
      ST_CHECK(got == r, "recv: rank ", source, " sent ", got, " bytes where ", r, " were expected");
    }
  }
}

void MpiCommunicator::barrier() {
  ST_CHECK(comm_ != MPI_COMM_NULL, "barrier on a moved-from MpiCommunicator");
  ST_MPI_CHECK(MPI_Barrier(comm_));
}

}  // namespace st
