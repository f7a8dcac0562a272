// Argument checks every Communicator implementation applies, so that a misuse caught by the fake in a
// unit test is caught the same way by MPI in production (private to src/comm).
#pragma once

#include <cstdint>
#include <functional>

#include "shardtrain/core/error.h"

namespace st::detail {

// Whether [a, a + a_bytes) and [b, b + b_bytes) share a byte.
inline bool bytes_overlap(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes) {
  if (a_bytes <= 0 || b_bytes <= 0) return false;
  const auto pa = reinterpret_cast<uintptr_t>(a);
  const auto pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + static_cast<uintptr_t>(b_bytes) && pb < pa + static_cast<uintptr_t>(a_bytes);
}

// all_gather: send may be exactly recv + rank * count (in place) and must not overlap recv otherwise.
// Returns whether the call is in place.
inline bool check_all_gather(const float* send, int64_t count, const float* recv, int rank, int world) {
  ST_CHECK(count >= 0, "all_gather: count ", count, " < 0");
  if (count == 0) return false;
  ST_CHECK(send != nullptr && recv != nullptr, "all_gather: null buffer for count ", count);
  const bool in_place = send == recv + static_cast<int64_t>(rank) * count;
  ST_CHECK(in_place || !bytes_overlap(send, count * 4, recv, world * count * 4),
           "all_gather: send overlaps recv but is not recv + rank * count (in place)");
  return in_place;
}

// reduce_scatter: send holds world * count elements and must not overlap recv.
inline void check_reduce_scatter(const float* send, int64_t count, const float* recv, int world) {
  ST_CHECK(count >= 0, "reduce_scatter: count ", count, " < 0");
  if (count == 0) return;
  ST_CHECK(send != nullptr && recv != nullptr, "reduce_scatter: null buffer for count ", count);
  ST_CHECK(!bytes_overlap(send, world * count * 4, recv, count * 4), "reduce_scatter: send overlaps recv");
}

inline void check_count(const void* buf, int64_t count, const char* what) {
  ST_CHECK(count >= 0, what, ": count ", count, " < 0");
  ST_CHECK(count == 0 || buf != nullptr, what, ": null buffer for count ", count);
}

// A point-to-point call's peer: another rank of the communicator.
inline void check_peer(int peer, int rank, int world, const char* what) {
  ST_CHECK(peer >= 0 && peer < world, what, ": peer rank ", peer, " outside [0, ", world, ")");
  ST_CHECK(peer != rank, what, ": rank ", rank, " cannot exchange with itself");
}

// send_recv's arguments: counts, peers (checked only for a half that moves bytes) and non-overlapping buffers.
inline void check_send_recv(const void* send_buf, int64_t send_bytes, int dest, const void* recv_buf,
                            int64_t recv_bytes, int source, int rank, int world) {
  check_count(send_buf, send_bytes, "send_recv (send)");
  check_count(recv_buf, recv_bytes, "send_recv (recv)");
  if (send_bytes > 0) check_peer(dest, rank, world, "send_recv (send)");
  if (recv_bytes > 0) check_peer(source, rank, world, "send_recv (recv)");
  ST_CHECK(!bytes_overlap(send_buf, send_bytes, recv_buf, recv_bytes), "send_recv: the send and recv buffers overlap");
}

inline void check_root(int root, int world) {
  ST_CHECK(root >= 0 && root < world, "broadcast: root ", root, " outside [0, ", world, ")");
}

}  // namespace st::detail
