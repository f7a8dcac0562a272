#include "shardtrain/comm/fake_communicator.h"

#include <cstring>
#include <exception>
#include <thread>
#include <utility>

#include "collective_args.h"
#include "shardtrain/comm/node_topology.h"
#include "shardtrain/core/error.h"

namespace st::fake {
namespace {

enum Op : int { kBarrier = 1, kAllGather, kReduceScatter, kAllReduceFloat, kAllReduceDouble, kBroadcast, kDup };

const char* op_name(int op) {
  switch (op) {
    case kBarrier:
      return "barrier";
    case kAllGather:
      return "all_gather";
    case kReduceScatter:
      return "reduce_scatter";
    case kAllReduceFloat:
      return "all_reduce(float)";
    case kAllReduceDouble:
      return "all_reduce(double)";
    case kBroadcast:
      return "broadcast";
    case kDup:
      return "dup";
  }
  return "?";
}

}  // namespace

FakeWorld::FakeWorld(int world_size, const WorldOptions& options) : world_size_(world_size), options_(options) {
  ST_CHECK(world_size >= 1, "fake world of ", world_size, " ranks");
  ST_CHECK(options.ranks_per_node >= 0, "ranks_per_node = ", options.ranks_per_node, " < 0");
  slots_.resize(static_cast<size_t>(world_size));
  returned_.resize(static_cast<size_t>(world_size), 0);
}

void FakeWorld::fail(int rank, const std::string& what) {
  std::vector<std::weak_ptr<FakeWorld>> children;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_rank_ >= 0) return;
    failed_rank_ = rank;
    failure_ = what;
    children = children_;
    cv_.notify_all();
  }
  for (const std::weak_ptr<FakeWorld>& c : children)
    if (std::shared_ptr<FakeWorld> w = c.lock()) w->fail(rank, what);
}

void FakeWorld::finish(int rank) {
  std::vector<std::weak_ptr<FakeWorld>> children;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_++ == 0) first_finished_rank_ = rank;
    returned_[static_cast<size_t>(rank)] = 1;
    children = children_;
    cv_.notify_all();
  }
  for (const std::weak_ptr<FakeWorld>& c : children)
    if (std::shared_ptr<FakeWorld> w = c.lock()) w->finish(rank);
}

void FakeWorld::post(int from, int to, const void* buf, int64_t bytes) {
  const auto* p = static_cast<const char*>(buf);
  std::lock_guard<std::mutex> lock(mu_);
  mail_[{from, to}].emplace_back(p, p + bytes);
  cv_.notify_all();
}

void FakeWorld::take(int from, int to, void* buf, int64_t bytes) {
  std::unique_lock<std::mutex> lock(mu_);
  std::deque<std::vector<char>>& box = mail_[{from, to}];
  cv_.wait(lock, [&] { return !box.empty() || failed_rank_ >= 0 || returned_[static_cast<size_t>(from)]; });
  if (box.empty()) {
    if (failed_rank_ >= 0)
      ST_FAULT("rank ", to, " in recv from rank ", from, ": peer rank ", failed_rank_, " failed: ", failure_);
    ST_CHECK(false, "rank ", to, " waits in recv for rank ", from,
             ", which has returned from its function without sending");
  }
  std::vector<char> msg = std::move(box.front());
  box.pop_front();
  ST_CHECK(static_cast<int64_t>(msg.size()) == bytes, "point-to-point mismatch: rank ", to, " receives ", bytes,
           " bytes from rank ", from, ", which sent ", msg.size());
  if (bytes > 0) std::memcpy(buf, msg.data(), static_cast<size_t>(bytes));
}

int FakeWorld::failed_rank() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_rank_;
}

void FakeWorld::barrier(int rank, const char* what) {
  std::unique_lock<std::mutex> lock(mu_);
  if (failed_rank_ < 0) {
    const uint64_t generation = generation_;
    if (++arrived_ == world_size_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    // A finished peer will never arrive, so waiting for it would hang: that counts as a failure too.
    cv_.wait(lock, [&] { return generation_ != generation || failed_rank_ >= 0 || finished_ > 0; });
    if (generation_ != generation) return;
    --arrived_;
  }
  if (failed_rank_ >= 0) ST_FAULT("rank ", rank, " in ", what, ": peer rank ", failed_rank_, " failed: ", failure_);
  ST_CHECK(false, "rank ", rank, " waits in ", what, " but rank ", first_finished_rank_,
           " has returned from its function (the ranks made different collective calls)");
}

FakeCommunicator::FakeCommunicator(std::shared_ptr<FakeWorld> world, int rank) : world_(std::move(world)), rank_(rank) {
  ST_CHECK(world_ != nullptr, "null fake world");
  const int n = world_->world_size();
  ST_CHECK(rank >= 0 && rank < n, "rank ", rank, " outside [0, ", n, ")");
  const int per_node = world_->options().ranks_per_node;
  std::vector<int64_t> keys(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) keys[r] = per_node > 0 ? r / per_node : 0;
  const NodeTopology t = node_topology_from_keys(keys, rank);
  node_id_ = t.node_id;
  local_rank_ = t.local_rank;
  local_size_ = t.local_size;
}

void FakeCommunicator::enter(int op, int64_t count, int root, const void* send, void* recv) {
  FakeWorld& w = *world_;
  {
    std::lock_guard<std::mutex> lock(w.mu_);
    w.slots_[rank_] = FakeWorld::Slot{op, count, root, send, recv};
  }
  w.barrier(rank_, op_name(op));
  // Every rank reads the same slots, so a mismatch throws on all of them and none is left waiting.
  // Nobody writes a slot again before the collective's closing barrier.
  for (int r = 0; r < w.world_size_; ++r) {
    const FakeWorld::Slot& s = w.slots_[r];
    ST_CHECK(s.op == op && s.count == count && s.root == root, "collective mismatch: rank ", rank_, " called ",
             op_name(op), "(count ", count, ", root ", root, ") but rank ", r, " called ", op_name(s.op), "(count ",
             s.count, ", root ", s.root, ")");
  }
}

void FakeCommunicator::all_gather(const float* send, int64_t count, float* recv) {
  detail::check_all_gather(send, count, recv, rank_, world_size());
  enter(kAllGather, count, -1, send, recv);
  // Writing straight into recv is safe: peers read only this rank's send, which recv does not overlap
  // except, in place, at this rank's own block, which is left as it is.
  for (int r = 0; r < world_size() && count > 0; ++r) {
    const auto* src = static_cast<const float*>(world_->slots_[r].send);
    float* dst = recv + r * count;
    if (src != dst) std::memcpy(dst, src, sizeof(float) * static_cast<size_t>(count));
  }
  world_->barrier(rank_, "all_gather (leaving)");
}

void FakeCommunicator::reduce_scatter(const float* send, int64_t count, float* recv) {
  detail::check_reduce_scatter(send, count, recv, world_size());
  enter(kReduceScatter, count, -1, send, recv);
  if (count > 0) {
    const int64_t base = static_cast<int64_t>(rank_) * count;
    std::memcpy(recv, static_cast<const float*>(world_->slots_[0].send) + base, sizeof(float) * count);
    for (int r = 1; r < world_size(); ++r) {
      const float* src = static_cast<const float*>(world_->slots_[r].send) + base;
      for (int64_t i = 0; i < count; ++i) recv[i] += src[i];
    }
  }
  world_->barrier(rank_, "reduce_scatter (leaving)");
}

template <typename T>
void FakeCommunicator::all_reduce_impl(T* buf, int64_t count, int op) {
  detail::check_count(buf, count, "all_reduce");
  enter(op, count, -1, buf, buf);
  // Peers read buf until the barrier below: sum into a temporary, copy after.
  std::vector<T> sum(static_cast<size_t>(count));
  if (count > 0) {
    std::memcpy(sum.data(), world_->slots_[0].send, sizeof(T) * count);
    for (int r = 1; r < world_size(); ++r) {
      const T* src = static_cast<const T*>(world_->slots_[r].send);
      for (int64_t i = 0; i < count; ++i) sum[i] += src[i];
    }
  }
  world_->barrier(rank_, op_name(op));
  if (count > 0) std::memcpy(buf, sum.data(), sizeof(T) * count);
}

void FakeCommunicator::all_reduce(float* buf, int64_t count) { all_reduce_impl(buf, count, kAllReduceFloat); }

void FakeCommunicator::all_reduce(double* buf, int64_t count) { all_reduce_impl(buf, count, kAllReduceDouble); }

void FakeCommunicator::broadcast(void* buf, int64_t bytes, int root) {
  detail::check_count(buf, bytes, "broadcast");
  detail::check_root(root, world_size());
  enter(kBroadcast, bytes, root, buf, buf);
  const void* src = world_->slots_[root].send;
  if (rank_ != root && bytes > 0 && src != buf) std::memcpy(buf, src, static_cast<size_t>(bytes));
  world_->barrier(rank_, "broadcast (leaving)");
}

void FakeCommunicator::barrier() {
  enter(kBarrier, 0, -1, nullptr, nullptr);
  world_->barrier(rank_, "barrier (leaving)");  // the slots were read: nobody may publish before all did
}

void spawn(int world_size, const std::function<void(Communicator&)>& fn, const WorldOptions& options) {
  auto world = std::make_shared<FakeWorld>(world_size, options);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world_size));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(world_size));
  auto run_rank = [&](int r) {
    try {
      FakeCommunicator comm(world, r);
      fn(comm);
      world->finish(r);
    } catch (const std::exception& e) {
      errors[r] = std::current_exception();
      world->fail(r, e.what());
    } catch (...) {
      errors[r] = std::current_exception();
      world->fail(r, "a non-std exception");
    }
  };
  std::exception_ptr start_error;
  for (int r = 0; r < world_size; ++r) {
    try {
      threads.emplace_back(run_rank, r);
    } catch (...) {  // the ranks already running would wait for this one forever
      start_error = std::current_exception();
      world->fail(r, "spawn could not start this rank's thread");
      break;
    }
  }
  for (std::thread& t : threads) t.join();
  if (start_error) std::rethrow_exception(start_error);
  const int failed = world->failed_rank();
  if (failed >= 0 && errors[failed]) std::rethrow_exception(errors[failed]);
}

void FakeCommunicator::send(const void* buf, int64_t bytes, int dest) { send_recv(buf, bytes, dest, nullptr, 0, -1); }

void FakeCommunicator::recv(void* buf, int64_t bytes, int source) { send_recv(nullptr, 0, -1, buf, bytes, source); }

void FakeCommunicator::send_recv(const void* send_buf, int64_t send_bytes, int dest, void* recv_buf, int64_t recv_bytes,
                                 int source) {
  detail::check_send_recv(send_buf, send_bytes, dest, recv_buf, recv_bytes, source, rank_, world_size());
  if (send_bytes > 0) world_->post(rank_, dest, send_buf, send_bytes);  // never blocks: no ring can wait on itself
  if (recv_bytes > 0) world_->take(source, rank_, recv_buf, recv_bytes);
}

std::unique_ptr<Communicator> FakeCommunicator::dup() {
  FakeWorld& w = *world_;
  enter(kDup, 0, -1, nullptr, nullptr);
  if (rank_ == 0) {
    auto copy = std::make_shared<FakeWorld>(w.world_size_, w.options_);
    std::lock_guard<std::mutex> lock(w.mu_);
    w.dup_ = copy;
    w.children_.push_back(copy);
  }
  w.barrier(rank_, "dup (made)");
  std::shared_ptr<FakeWorld> copy;
  {
    std::lock_guard<std::mutex> lock(w.mu_);
    copy = w.dup_;
  }
  w.barrier(rank_, "dup (leaving)");  // rank 0 replaces dup_ only in a later dup, after everybody read this one
  return std::make_unique<FakeCommunicator>(copy, rank_);
}

std::unique_ptr<Communicator> FakeCommunicator::split(int color, int key) {
  ST_CHECK(false, "FakeCommunicator cannot split (color ", color, ", key ", key, "): use MPI for hybrid sharding");
  return nullptr;
}

}  // namespace st::fake
