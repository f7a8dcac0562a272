// Point-to-point checks that every Communicator implementation must pass: the fake and TCP tests run them on their
// worlds, tests/tools/mpi_comm_check.cc under mpirun. Each returns "" or the first thing that was wrong, naming
// the ranks, sizes and byte.
#pragma once

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "shardtrain/comm/communicator.h"
#include "shardtrain/core/error.h"

namespace st::testing {

// The bytes rank `from` sends rank `to` in check `tag`: they depend on all four, so a byte that lands at another
// offset, from another rank or from another check shows.
inline unsigned char p2p_byte(int tag, int from, int to, int64_t i) {
  uint64_t x = (static_cast<uint64_t>(tag) << 40) ^ (static_cast<uint64_t>(from) << 24) ^
               (static_cast<uint64_t>(to) << 16) ^ static_cast<uint64_t>(i);
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 29;
  return static_cast<unsigned char>(x);
}

inline std::vector<unsigned char> p2p_message(int tag, int from, int to, int64_t bytes) {
  std::vector<unsigned char> m(static_cast<size_t>(bytes));
  for (int64_t i = 0; i < bytes; ++i) m[static_cast<size_t>(i)] = p2p_byte(tag, from, to, i);
  return m;
}

// "" if `got` is what `from` sends `to` in check `tag`, else the first differing byte.
inline std::string p2p_compare(const char* what, int tag, int from, int to, const std::vector<unsigned char>& got,
                               int64_t guard_at = -1) {
  for (size_t i = 0; i < got.size(); ++i) {
    if (static_cast<int64_t>(i) == guard_at) break;
    if (got[i] != p2p_byte(tag, from, to, static_cast<int64_t>(i)))
      return str_cat(what, ": rank ", to, " got byte ", i, " of ", got.size(), " from rank ", from, " wrong");
  }
  return "";
}

// Every rank sends to its left neighbour (rank - 1) and receives from its right (rank + 1) in one send_recv: the
// ring that blocks forever if the halves are not posted together. Rank r sends base + 37 r bytes (sizes differ, so
// the two halves of one call end at different times); a guard byte past each receive buffer must survive.
inline std::string check_ring_send_recv(Communicator& c, int64_t base) {
  const int n = c.world_size(), me = c.rank();
  if (n < 2) return "";
  const int left = (me + n - 1) % n, right = (me + 1) % n;
  const int64_t out_bytes = base + 37 * me, in_bytes = base + 37 * right;
  const std::vector<unsigned char> out = p2p_message(1, me, left, out_bytes);
  std::vector<unsigned char> in(static_cast<size_t>(in_bytes + 1), 0x5C);
  c.send_recv(out.data(), out_bytes, left, in.data(), in_bytes, right);
  if (in.back() != 0x5C) return str_cat("send_recv: rank ", me, " got more than ", in_bytes, " bytes");
  in.pop_back();
  return p2p_compare("send_recv", 1, right, me, in);
}

// Rank 0 sends every other rank a message with send(), which each takes with recv(), and each answers with a
// message of another size; then a send_recv with only the receive half on rank 0's side.
inline std::string check_send_then_recv(Communicator& c, int64_t base) {
  const int n = c.world_size(), me = c.rank();
  if (n < 2) return "";
  if (me == 0) {
    for (int r = 1; r < n; ++r) {
      const std::vector<unsigned char> out = p2p_message(2, 0, r, base + r);
      c.send(out.data(), base + r, r);
    }
    for (int r = 1; r < n; ++r) {
      std::vector<unsigned char> in(static_cast<size_t>(2 * base + 1));
      c.recv(in.data(), 2 * base + 1, r);
      const std::string bad = p2p_compare("send/recv", 3, r, 0, in);
      if (!bad.empty()) return bad;
    }
    std::vector<unsigned char> in(static_cast<size_t>(base));
    c.send_recv(nullptr, 0, -1, in.data(), base, n - 1);
    return p2p_compare("send_recv (receive half only)", 4, n - 1, 0, in);
  }
  std::vector<unsigned char> in(static_cast<size_t>(base + me));
  c.recv(in.data(), base + me, 0);
  const std::string bad = p2p_compare("send/recv", 2, 0, me, in);
  const std::vector<unsigned char> answer = p2p_message(3, me, 0, 2 * base + 1);
  c.send(answer.data(), 2 * base + 1, 0);
  if (me == n - 1) {
    const std::vector<unsigned char> out = p2p_message(4, me, 0, base);
    c.send_recv(out.data(), base, 0, nullptr, 0, -1);
  }
  return bad;
}

// dup(): the copy's collectives and ring transfers on a second thread while this thread all-reduces on the
// original, `rounds` times each. Traffic that crossed between the two would break a sum or a message.
inline std::string check_dup_beside(Communicator& c, int rounds) {
  std::unique_ptr<Communicator> copy = c.dup();
  if (copy->rank() != c.rank() || copy->world_size() != c.world_size() || copy->node_id() != c.node_id() ||
      copy->local_rank() != c.local_rank() || copy->local_size() != c.local_size())
    return str_cat("dup: rank ", c.rank(), " has rank ", copy->rank(), " of ", copy->world_size(), ", node ",
                   copy->node_id(), " local ", copy->local_rank(), " of ", copy->local_size(), " in the copy");
  const int n = c.world_size();
  const double expect = n * (n + 1) / 2.0;
  std::string side_error;
  std::thread side([&] {
    try {
      for (int i = 0; i < rounds; ++i) {  // every round on every rank, whatever it found: peers wait for it
        const std::string bad = check_ring_send_recv(*copy, 1000 + i);
        if (side_error.empty()) side_error = bad;
        double x = c.rank() + 1.0 + i;
        copy->all_reduce(&x, 1);
        if (side_error.empty() && x != expect + n * i)
          side_error = str_cat("dup: all_reduce on the copy gave ", x, ", expected ", expect + n * i);
      }
    } catch (const std::exception& e) {
      side_error = str_cat("dup: the copy threw: ", e.what());
    }
  });
  std::string error;
  for (int i = 0; i < rounds; ++i) {
    double x = 2.0 * (c.rank() + 1);
    c.all_reduce(&x, 1);
    if (error.empty() && x != 2 * expect) error = str_cat("dup: all_reduce on the original gave ", x);
  }
  side.join();
  return side_error.empty() ? error : side_error;
}

}  // namespace st::testing
