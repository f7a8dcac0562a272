// FakeWorld: N ranks as threads of one process, for unit tests of distributed logic (gloo's
// BaseTest::spawn). Every rank gets its own FakeCommunicator over one shared FakeWorld.
//
// A collective publishes each rank's buffer pointers, meets the others at a barrier, reads its peers'
// buffers directly, and meets them again before returning (so nobody reuses a buffer a peer still
// reads). Sums run in rank order (rank 0's value + rank 1's + ...), so results are deterministic and
// equal, bit for bit, to a serial float sum in that order. In-place calls are safe: all_reduce sums into
// a temporary before anyone overwrites a buffer. Every rank checks that all ranks called the same
// collective with the same count (and root); a mismatch throws kInternal on every rank.
//
// Point-to-point: send copies the bytes into the world's mailbox for (sender, receiver) and returns at once; recv
// waits for the oldest message there and takes it (its size must equal recv's count: kInternal otherwise).
// dup() makes a new FakeWorld for the same ranks; a failure or a return in either world reaches the other's waits.
//
// Failure never hangs: when one rank's function throws, the world is marked failed and every rank that
// is, or later gets, blocked in a collective throws st::Error (kFault, "peer rank R failed: ..."). A rank
// whose function returns while a peer still waits for it in a collective fails that peer (kInternal).
//
//   st::fake::spawn(4, [](st::Communicator& comm) {
//     std::vector<float> mine(3, float(comm.rank())), all(3 * comm.world_size());
//     comm.all_gather(mine.data(), 3, all.data());
//   });
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "shardtrain/comm/communicator.h"

namespace st::fake {

struct WorldOptions {
  // Ranks [0, n) are node 0, [n, 2n) node 1, ...; 0 puts every rank on node 0.
  int ranks_per_node = 0;
};

// Runs fn(comm) on world_size threads, rank r with a communicator of rank r, and joins them all.
// If any rank's fn threw, rethrows the first failure's exception (the original, not a peer's
// "peer rank R failed") after every thread has ended.
void spawn(int world_size, const std::function<void(Communicator&)>& fn, const WorldOptions& options = {});

// The state the ranks of one fake world share. Thread-safe.
class FakeWorld {
 public:
  explicit FakeWorld(int world_size, const WorldOptions& options = {});
  int world_size() const { return world_size_; }
  const WorldOptions& options() const { return options_; }

  // Marks the world failed because of `rank`; wakes every rank blocked in a collective. Only the
  // first call counts. Reaches the worlds dup() made from this one.
  void fail(int rank, const std::string& what);
  // Records that rank's function has returned: a peer waiting for it in a collective then fails. Reaches the
  // worlds dup() made from this one.
  void finish(int rank);
  // The rank of the first failure, or -1.
  int failed_rank() const;

 private:
  friend class FakeCommunicator;

  // What a rank publishes for one collective.
  struct Slot {
    int op = 0;
    int64_t count = 0;
    int root = -1;
    const void* send = nullptr;
    void* recv = nullptr;
  };

  // The generation-counting barrier; throws kFault if the world has failed or kInternal if a peer
  // returned while this rank waits.
  void barrier(int rank, const char* what);
  // The mailbox: post never blocks; take waits for the oldest message from `from` to `to`, failing as barrier does
  // (and with kInternal when its size is not `bytes`).
  void post(int from, int to, const void* buf, int64_t bytes);
  void take(int from, int to, void* buf, int64_t bytes);

  const int world_size_;
  const WorldOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  int finished_ = 0;
  int first_finished_rank_ = -1;
  int failed_rank_ = -1;
  std::string failure_;
  std::vector<char> returned_;  // by rank: its function has returned
  std::vector<Slot> slots_;
  std::map<std::pair<int, int>, std::deque<std::vector<char>>> mail_;  // by (from, to)
  std::shared_ptr<FakeWorld> dup_;                                     // handed from rank 0 to the others by dup()
  std::vector<std::weak_ptr<FakeWorld>> children_;                     // the worlds dup() made
};

class FakeCommunicator final : public Communicator {
 public:
  FakeCommunicator(std::shared_ptr<FakeWorld> world, int rank);

  int rank() const override { return rank_; }
  int world_size() const override { return world_->world_size(); }
  int node_id() const override { return node_id_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  std::string kind() const override { return "fake"; }

  void all_gather(const float* send, int64_t count, float* recv) override;
  void reduce_scatter(const float* send, int64_t count, float* recv) override;
  void all_reduce(float* buf, int64_t count) override;
  void all_reduce(double* buf, int64_t count) override;
  void broadcast(void* buf, int64_t bytes, int root) override;
  void barrier() override;
  // Not supported: a fake world is one group of threads (kInternal). Hybrid sharding is tested over MPI.
  std::unique_ptr<Communicator> split(int color, int key) override;
  std::unique_ptr<Communicator> dup() override;
  void send(const void* buf, int64_t bytes, int dest) override;
  void recv(void* buf, int64_t bytes, int source) override;
  void send_recv(const void* send_buf, int64_t send_bytes, int dest, void* recv_buf, int64_t recv_bytes,
                 int source) override;

 private:
  // Publishes this rank's slot and waits for every rank's; then checks they all called the same thing.
  void enter(int op, int64_t count, int root, const void* send, void* recv);
  template <typename T>
  void all_reduce_impl(T* buf, int64_t count, int op);

  std::shared_ptr<FakeWorld> world_;
  int rank_;
  int node_id_ = 0;
  int local_rank_ = 0;
  int local_size_ = 1;
};

}  // namespace st::fake
