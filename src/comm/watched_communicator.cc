#include "shardtrain/comm/watched_communicator.h"

#include <utility>

#include "shardtrain/core/error.h"

namespace st {

WatchedCommunicator::WatchedCommunicator(Communicator& inner, Watchdog& watchdog, const std::string& name)
    : inner_(inner), watchdog_(watchdog), name_(name), channel_(watchdog.channel(name)) {}

WatchedCommunicator::WatchedCommunicator(std::unique_ptr<Communicator> inner, Watchdog& watchdog,
                                         const std::string& name)
    : owned_(std::move(inner)), inner_(*owned_), watchdog_(watchdog), name_(name), channel_(watchdog.channel(name)) {}

template <typename F>
void WatchedCommunicator::watched(const char* op, int64_t count, F&& call) {
  const uint64_t seq = watchdog_.begin(channel_, op, count);
  try {
    call();
  } catch (...) {
    watchdog_.end(channel_, seq);  // failed, but no longer waiting: the error travels on
    throw;
  }
  watchdog_.end(channel_, seq);
}

void WatchedCommunicator::all_gather(const float* send, int64_t count, float* recv) {
  watched("all_gather", count, [&] { inner_.all_gather(send, count, recv); });
}

void WatchedCommunicator::reduce_scatter(const float* send, int64_t count, float* recv) {
  watched("reduce_scatter", count, [&] { inner_.reduce_scatter(send, count, recv); });
}

void WatchedCommunicator::all_reduce(float* buf, int64_t count) {
  watched("all_reduce", count, [&] { inner_.all_reduce(buf, count); });
}

void WatchedCommunicator::all_reduce(double* buf, int64_t count) {
  watched("all_reduce", count, [&] { inner_.all_reduce(buf, count); });
}

void WatchedCommunicator::broadcast(void* buf, int64_t bytes, int root) {
  watched("broadcast", bytes, [&] { inner_.broadcast(buf, bytes, root); });
}

void WatchedCommunicator::barrier() {
  watched("barrier", 0, [&] { inner_.barrier(); });
}

std::unique_ptr<Communicator> WatchedCommunicator::split(int color, int key) {
  std::unique_ptr<Communicator> sub;
  watched("split", 0, [&] { sub = inner_.split(color, key); });
  return std::make_unique<WatchedCommunicator>(std::move(sub), watchdog_, str_cat(name_, "/", color));
}

std::unique_ptr<Communicator> WatchedCommunicator::dup() {
  std::unique_ptr<Communicator> copy;
  watched("dup", 0, [&] { copy = inner_.dup(); });
  return std::make_unique<WatchedCommunicator>(std::move(copy), watchdog_, name_ + "/dup");
}

void WatchedCommunicator::send(const void* buf, int64_t bytes, int dest) {
  watched("send", bytes, [&] { inner_.send(buf, bytes, dest); });
}

void WatchedCommunicator::recv(void* buf, int64_t bytes, int source) {
  watched("recv", bytes, [&] { inner_.recv(buf, bytes, source); });
}

void WatchedCommunicator::send_recv(const void* send_buf, int64_t send_bytes, int dest, void* recv_buf,
                                    int64_t recv_bytes, int source) {
  watched("send_recv", send_bytes + recv_bytes,
          [&] { inner_.send_recv(send_buf, send_bytes, dest, recv_buf, recv_bytes, source); });
}

}  // namespace st
