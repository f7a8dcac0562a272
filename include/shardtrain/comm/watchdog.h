// Watchdog: a deadline on every collective (dist.timeout_s), so that a dead, stopped or hung rank ends the job
// with a fault instead of leaving the others waiting forever.
//
// Each communicator reports its operations to a channel of the watchdog (one channel a communicator, with its
// own sequence numbers, as NCCL and c10d number the ops of one communicator):
//   * blocking ops (MPI, TCP, the host side) bracket the call: begin() ... end();
//   * asynchronous ops (NCCL on a stream) report how to ask whether they finished: begin_async(), whose probe
//     the watchdog polls (a CUDA event query); the probe is dropped once it says done.
// Two threads wake every poll_s: one asks the async ops' probes (without holding anything, since a CUDA query can
// block behind a stuck call of another thread), the other checks deadlines. When the oldest unfinished op of any channel is older than timeout_s (counted
// from begin, as c10d counts from enqueue), it:
//   1. logs the rank, the channel, the op, its sequence number and size, and the last op that completed there;
//   2. runs the abort hooks (NcclCommunicator registers ncclCommAbort), each bounded: a hook that hangs too is
//      abandoned after abort_grace_s (10 s);
//   3. calls the expiry action with that message. The default ends the job with the fault exit code (75):
//      MPI_Abort under MPI, so that mpirun kills every rank and exits non-zero; the process's exit otherwise.
//
// timeout_s <= 0 disables the deadline: ops are still numbered (cheap), no thread runs.
// Thread-safe: ops may be reported from any thread.
//
//   Watchdog wd(cfg.dist.timeout_s, comm.rank());
//   WatchedCommunicator world(comm, wd, "world");       // watched_communicator.h
//   world.all_reduce(&x, 1);                             // a deadline on it
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace st {

class Watchdog {
 public:
  using ExpiryAction = std::function<void(const std::string& message)>;

  // rank: this process's rank, for the message. on_expiry: null means the default (log, then end the job with
  // exit code 75). poll_s <= 0: min(1 s, timeout_s / 10).
  Watchdog(double timeout_s, int rank, ExpiryAction on_expiry = nullptr, double poll_s = 0);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  double timeout_s() const { return timeout_s_; }
  bool enabled() const { return timeout_s_ > 0; }

  // A channel for one communicator; its ops are numbered 1, 2, ... Names need not be unique.
  // The watchdog owns the channel; the id stays valid for the watchdog's life.
  int channel(const std::string& name);

  // A blocking op starts; returns its sequence number. end() with that number when it returns (or throws).
  uint64_t begin(int channel, const char* op, int64_t count);
  void end(int channel, uint64_t seq);
  // An asynchronous op was enqueued; `done` returns true once it completed. It is called from the watchdog's probe
  // thread (or check_now), one call at a time, never after it returned true, and destroyed (with what it holds) on
  // that thread or in ~Watchdog.
  uint64_t begin_async(int channel, const char* op, int64_t count, std::function<bool()> done);

  // Run on expiry before the expiry action (ncclCommAbort). Returns an id for remove_abort_hook, which must be
  // called before what the hook touches is destroyed.
  int add_abort_hook(std::function<void()> hook);
  void remove_abort_hook(int id);
  // How long one abort hook may run before it is abandoned (default 10 s).
  void set_abort_grace(double seconds) { abort_grace_s_ = seconds; }

  // The last op of a channel that completed, as "#12 all_reduce", or "none".
  std::string last_completed(int channel) const;
  // Ops begun but not seen completed, over all channels (for tests).
  size_t outstanding() const;

  // One pass of both threads' work: ask the probes, then check the deadlines (and fire). For tests; thread-safe.
  void check_now();

 private:
  using Clock = std::chrono::steady_clock;
  struct Op {
    uint64_t seq;
    const char* op;
    int64_t count;
    Clock::time_point start;
    std::shared_ptr<std::function<bool()>> done;  // null for blocking ops; shared: called outside the lock
  };
  struct Channel {
    std::string name;
    uint64_t next_seq = 1;
    std::map<uint64_t, Op> open;  // by sequence number
    uint64_t last_done_seq = 0;
    const char* last_done_op = nullptr;
  };

  void poll_async();
  void check_deadline();
  void every_poll(void (Watchdog::*pass)());
  void expire(const std::string& message);
  void mark_done(Channel& c, const Op& op);

  const double timeout_s_;
  const int rank_;
  const ExpiryAction on_expiry_;
  const double poll_s_;
  double abort_grace_s_ = 10;
  mutable std::mutex mu_;
  std::deque<Channel> channels_;  // deque: ids are indices, and growing never moves a channel
  std::map<int, std::function<void()>> hooks_;
  int next_hook_ = 0;
  bool fired_ = false;
  bool stop_ = false;
  std::condition_variable wake_;
  std::thread deadline_thread_, probe_thread_;
};

}  // namespace st
