#include "shardtrain/comm/communicator.h"

#include <cstring>

#include "collective_args.h"

namespace st {

std::unique_ptr<Communicator> Communicator::dup() {
  ST_CHECK(false, "the ", kind(), " communicator cannot duplicate itself");
  return nullptr;
}

void Communicator::send(const void*, int64_t bytes, int dest) {
  ST_CHECK(false, "the ", kind(), " communicator has no point-to-point send (", bytes, " bytes to rank ", dest, ")");
}

void Communicator::recv(void*, int64_t bytes, int source) {
  ST_CHECK(false, "the ", kind(), " communicator has no point-to-point recv (", bytes, " bytes from rank ", source,
           ")");
}

void Communicator::send_recv(const void*, int64_t send_bytes, int dest, void*, int64_t recv_bytes, int source) {
  ST_CHECK(false, "the ", kind(), " communicator has no point-to-point send_recv (", send_bytes, " bytes to rank ",
           dest, ", ", recv_bytes, " from rank ", source, ")");
}

void SoloCommunicator::all_gather(const float* send, int64_t count, float* recv) {
  const bool in_place = detail::check_all_gather(send, count, recv, 0, 1);
  if (!in_place && count > 0) std::memcpy(recv, send, sizeof(float) * static_cast<size_t>(count));
}

void SoloCommunicator::reduce_scatter(const float* send, int64_t count, float* recv) {
  detail::check_reduce_scatter(send, count, recv, 1);
  if (count > 0) std::memcpy(recv, send, sizeof(float) * static_cast<size_t>(count));
}

void SoloCommunicator::all_reduce(float* buf, int64_t count) { detail::check_count(buf, count, "all_reduce"); }

void SoloCommunicator::all_reduce(double* buf, int64_t count) { detail::check_count(buf, count, "all_reduce"); }

void SoloCommunicator::broadcast(void* buf, int64_t bytes, int root) {
  detail::check_count(buf, bytes, "broadcast");
  detail::check_root(root, 1);
}

}  // namespace st
