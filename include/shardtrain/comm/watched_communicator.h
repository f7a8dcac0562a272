// WatchedCommunicator: a Communicator that puts every collective of another one under a Watchdog's deadline
// (watchdog.h). It forwards each call unchanged, bracketed by Watchdog::begin/end on its own channel, so a
// collective that never returns (a peer stopped, dead or hung) ends the job after dist.timeout_s with a message
// naming the op and its sequence number. It does not own the inner communicator or the watchdog; both must
// outlive it. split() and dup() return a watched communicator too (owning the inner one), on a channel of its own.
// Point-to-point calls are watched like the collectives: a peer that never posts the other half ends the job.
//
//   Watchdog wd(cfg.dist.timeout_s, comm.rank());
//   WatchedCommunicator world(comm, wd, "world");
//   run(world);                                       // everything below talks through `world`
#pragma once

#include <memory>
#include <string>

#include "shardtrain/comm/communicator.h"
#include "shardtrain/comm/watchdog.h"

namespace st {

class WatchedCommunicator final : public Communicator {
 public:
  WatchedCommunicator(Communicator& inner, Watchdog& watchdog, const std::string& name);
  // Owns `inner` (what split() returns).
  WatchedCommunicator(std::unique_ptr<Communicator> inner, Watchdog& watchdog, const std::string& name);

  int rank() const override { return inner_.rank(); }
  int world_size() const override { return inner_.world_size(); }
  int node_id() const override { return inner_.node_id(); }
  int local_rank() const override { return inner_.local_rank(); }
  int local_size() const override { return inner_.local_size(); }
  int device_rank() const override { return inner_.device_rank(); }
  int device_ranks() const override { return inner_.device_ranks(); }
  std::string kind() const override { return inner_.kind(); }
  Watchdog* watchdog() const override { return &watchdog_; }
  std::string name() const override { return name_; }

  void all_gather(const float* send, int64_t count, float* recv) override;
  void reduce_scatter(const float* send, int64_t count, float* recv) override;
  void all_reduce(float* buf, int64_t count) override;
  void all_reduce(double* buf, int64_t count) override;
  void broadcast(void* buf, int64_t bytes, int root) override;
  void barrier() override;
  // Named "<name>/<color>".
  std::unique_ptr<Communicator> split(int color, int key) override;
  // Named "<name>/dup".
  std::unique_ptr<Communicator> dup() override;
  void send(const void* buf, int64_t bytes, int dest) override;
  void recv(void* buf, int64_t bytes, int source) override;
  void send_recv(const void* send_buf, int64_t send_bytes, int dest, void* recv_buf, int64_t recv_bytes,
                 int source) override;

 private:
  template <typename F>
  void watched(const char* op, int64_t count, F&& call);

  std::unique_ptr<Communicator> owned_;
  Communicator& inner_;
  Watchdog& watchdog_;
  const std::string name_;
  const int channel_;
};

}  // namespace st
