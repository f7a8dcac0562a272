#include "shardtrain/comm/tcp_communicator.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>
#include <utility>

#include "collective_args.h"
#include "shardtrain/core/errno_text.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/log.h"

namespace st {

struct TcpCommunicator::World {
  std::vector<PeerInfo> peers;     // by world rank
  std::vector<Socket> links;       // by world rank; non-blocking
  std::vector<int64_t> node_keys;  // by world rank: equal keys share a node
};

namespace {

// Elements per peer per round of reduce_scatter: bounds its staging buffer to (N - 1) x 8 MiB of floats.
constexpr int64_t kRoundElements = int64_t{1} << 21;
// Bytes per send()/recv() call, so that one peer's big message does not starve the others' progress.
constexpr size_t kIoBytes = size_t{1} << 20;
// dup(): every member is already connected and calls it at once, so a connection that takes longer than this is a
// network that changed under the job.
constexpr double kDupTimeoutS = 60;

// One peer's part of a collective: bytes to send to it and bytes to receive from it (either may be empty).
struct Transfer {
  int peer = 0;  // rank in the communicator
  const char* send = nullptr;
  size_t send_bytes = 0;
  char* recv = nullptr;
  size_t recv_bytes = 0;
};

bool would_block(int err) { return err == EAGAIN || err == EWOULDBLOCK || err == EINTR; }

// Lowest rank with each rank's key: equal values share a node.
std::vector<int64_t> first_rank_of_equal(const std::vector<std::string>& names) {
  std::vector<int64_t> keys(names.size());
  for (size_t r = 0; r < names.size(); ++r)
    keys[r] = std::find(names.begin(), names.end(), names[r]) - names.begin();
  return keys;
}

}  // namespace

TcpCommunicator::TcpCommunicator(TcpMesh mesh, const TcpCommunicatorOptions& options)
    : world_(std::make_shared<World>()), rank_(mesh.rank) {
  const int n = mesh.world_size();
  world_->peers = std::move(mesh.peers);
  world_->links = std::move(mesh.links);
  for (const Socket& s : world_->links)
    if (s) set_nonblocking(s);
  members_.resize(static_cast<size_t>(n));
  std::iota(members_.begin(), members_.end(), 0);

  int with = -1;
  int without = -1;
  std::vector<std::string> hosts;
  for (int r = 0; r < n; ++r) {
    (world_->peers[r].node_id ? with : without) = r;
    hosts.push_back(world_->peers[r].host_name);
  }
  if (with >= 0 && without >= 0) {
    ST_BAD_INPUT("environment variable SHARDTRAIN_NODE_ID is set on rank ", with, " but not on rank ", without,
                 ": set it on every rank or on none");
  }
  const std::vector<int64_t> host_keys = first_rank_of_equal(hosts);
  world_->node_keys = host_keys;
  if (with >= 0)
    for (int r = 0; r < n; ++r) world_->node_keys[r] = *world_->peers[r].node_id;
  topology_ = node_topology_from_keys(world_->node_keys, rank_);
  const NodeTopology host = node_topology_from_keys(host_keys, rank_);
  device_rank_ = host.local_rank;
  device_ranks_ = host.local_size;
  if (options.launcher_local_rank >= 0 && options.launcher_local_rank != device_rank_) {
    ST_LOG_WARN("the launcher's LOCAL_RANK=", options.launcher_local_rank, " differs from this rank's index among the ",
                "ranks of host ", hosts[rank_], " (", device_rank_, "); using the launcher's for the device");
    device_rank_ = options.launcher_local_rank;
    device_ranks_ = std::max(device_ranks_, device_rank_ + 1);
  }
}

TcpCommunicator::TcpCommunicator(std::shared_ptr<World> world, std::vector<int> members, int rank, int device_rank,
                                 int device_ranks)
    : world_(std::move(world)),
      members_(std::move(members)),
      rank_(rank),
      device_rank_(device_rank),
      device_ranks_(device_ranks) {
  std::vector<int64_t> keys;
  for (int w : members_) keys.push_back(world_->node_keys[w]);
  topology_ = node_topology_from_keys(keys, rank_);
}

TcpCommunicator::~TcpCommunicator() = default;

namespace {

// Moves every transfer to completion at once: poll() on all peers' connections, reading whatever arrived and
// writing whatever fits, so that two ranks sending each other large messages never both block in send().
void exchange(TcpCommunicator::World& world, const std::vector<int>& members, int my_world_rank,
              std::vector<Transfer>& transfers, const char* op) {
  auto name = [&](int peer) {
    const int w = members[peer];
    return str_cat("rank ", peer, w == peer ? "" : str_cat(" (world rank ", w, ")"), " on ", world.peers[w].host_name);
  };
  // Names every peer of this op whose connection is gone, not only the first one seen: when one rank dies, the
  // others that noticed first exit too, and their closes may be read before the dead rank's.
  auto lost = [&](const Transfer& t, const std::string& why) {
    std::string also;
    for (const Transfer& o : transfers) {
      if (&o == &t || o.peer == t.peer) continue;
      pollfd p{world.links[members[o.peer]].fd(), POLLIN, 0};
      char byte = 0;
      if (::poll(&p, 1, 0) == 1 && ::recv(p.fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) <= 0)
        also += str_cat(", and ", name(o.peer), " (closed too)");
    }
    ST_FAULT(op, ": lost peer ", name(t.peer), " (", why, ")", also, ": it failed or was killed; see its own error");
  };
  std::vector<pollfd> fds;
  std::vector<Transfer*> pending;
  for (;;) {
    fds.clear();
    pending.clear();
    for (Transfer& t : transfers) {
      if (t.send_bytes == 0 && t.recv_bytes == 0) continue;
      const int w = members[t.peer];
      ST_CHECK(w != my_world_rank && world.links[w], op, ": no connection to rank ", t.peer);
      const short events = static_cast<short>((t.recv_bytes ? POLLIN : 0) | (t.send_bytes ? POLLOUT : 0));
      fds.push_back(pollfd{world.links[w].fd(), events, 0});
      pending.push_back(&t);
    }
    if (fds.empty()) return;
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      ST_FAULT(op, ": poll failed: ", errno_text_lower());
    }
    for (size_t k = 0; k < fds.size(); ++k) {
      Transfer& t = *pending[k];
      const short re = fds[k].revents;
      if (re & POLLNVAL) ST_CHECK(false, op, ": invalid socket for rank ", t.peer);
      if ((re & (POLLIN | POLLHUP | POLLERR)) && t.recv_bytes) {
        const ssize_t n = ::recv(fds[k].fd, t.recv, std::min(t.recv_bytes, kIoBytes), MSG_DONTWAIT);
        if (n == 0) lost(t, "connection closed by the peer");
        if (n < 0 && !would_block(errno)) lost(t, errno_text_lower());
        if (n > 0) {
          t.recv += n;
          t.recv_bytes -= static_cast<size_t>(n);
        }
      }
      if ((re & (POLLOUT | POLLHUP | POLLERR)) && t.send_bytes) {
        const ssize_t n = ::send(fds[k].fd, t.send, std::min(t.send_bytes, kIoBytes), MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && !would_block(errno)) lost(t, errno_text_lower());
        if (n > 0) {
          t.send += n;
          t.send_bytes -= static_cast<size_t>(n);
        }
      }
    }
  }
}

}  // namespace

template <typename T>
void TcpCommunicator::all_gather_impl(const T* send, int64_t count, T* recv, const char* op) {
  const int n = world_size();
  const size_t bytes = sizeof(T) * static_cast<size_t>(count);
  if (send != recv + rank_ * count) std::memcpy(recv + rank_ * count, send, bytes);
  std::vector<Transfer> t;
  for (int p = 0; p < n; ++p) {
    if (p == rank_) continue;
    t.push_back(Transfer{p, reinterpret_cast<const char*>(send), bytes, reinterpret_cast<char*>(recv + p * count),
                         bytes});
  }
  exchange(*world_, members_, members_[rank_], t, op);
}

template <typename T>
void TcpCommunicator::reduce_scatter_impl(const T* send, int64_t count, T* recv, const char* op) {
  const int n = world_size();
  const int64_t round = std::min(count, kRoundElements);
  std::vector<T> stage(static_cast<size_t>((n - 1) * round));
  auto slot = [&](int p) { return p < rank_ ? p : p - 1; };
  for (int64_t off = 0; off < count; off += round) {
    const int64_t m = std::min(round, count - off);
    const size_t bytes = sizeof(T) * static_cast<size_t>(m);
    std::vector<Transfer> t;
    for (int p = 0; p < n; ++p) {
      if (p == rank_) continue;
      t.push_back(Transfer{p, reinterpret_cast<const char*>(send + p * count + off), bytes,
                           reinterpret_cast<char*>(stage.data() + slot(p) * m), bytes});
    }
    exchange(*world_, members_, members_[rank_], t, op);
    // Rank order, element by element: ((c0 + c1) + c2) + ..., the same sum whichever peer answered first.
    T* out = recv + off;
    for (int p = 0; p < n; ++p) {
      const T* c = p == rank_ ? send + rank_ * count + off : stage.data() + slot(p) * m;
      if (p == 0) {
        std::memcpy(out, c, bytes);
      } else {
        for (int64_t i = 0; i < m; ++i) out[i] += c[i];
      }
    }
  }
}

template <typename T>
void TcpCommunicator::all_reduce_impl(T* buf, int64_t count) {
  detail::check_count(buf, count, "all_reduce");
  const int n = world_size();
  if (count == 0 || n == 1) return;
  // Each rank reduces one slice (count padded to a multiple of N) and gathers the others' results: every rank
  // ends with the same bits.
  const int64_t per = (count + n - 1) / n;
  std::vector<T> padded(static_cast<size_t>(per * n), T(0));
  std::copy(buf, buf + count, padded.begin());
  std::vector<T> mine(static_cast<size_t>(per));
  reduce_scatter_impl(padded.data(), per, mine.data(), "all_reduce");
  all_gather_impl(mine.data(), per, padded.data(), "all_reduce");
  std::copy(padded.begin(), padded.begin() + count, buf);
}

void TcpCommunicator::all_gather(const float* send, int64_t count, float* recv) {
  detail::check_all_gather(send, count, recv, rank_, world_size());
  if (count == 0) return;
  all_gather_impl(send, count, recv, "all_gather");
}

void TcpCommunicator::reduce_scatter(const float* send, int64_t count, float* recv) {
  detail::check_reduce_scatter(send, count, recv, world_size());
  if (count == 0) return;
  reduce_scatter_impl(send, count, recv, "reduce_scatter");
}

void TcpCommunicator::all_reduce(float* buf, int64_t count) { all_reduce_impl(buf, count); }

void TcpCommunicator::all_reduce(double* buf, int64_t count) { all_reduce_impl(buf, count); }

void TcpCommunicator::broadcast(void* buf, int64_t bytes, int root) {
  detail::check_count(buf, bytes, "broadcast");
  detail::check_root(root, world_size());
  if (bytes == 0) return;
  std::vector<Transfer> t;
  const auto n = static_cast<size_t>(bytes);
  for (int p = 0; p < world_size(); ++p) {
    if (p == rank_) continue;
    if (rank_ == root) t.push_back(Transfer{p, static_cast<const char*>(buf), n, nullptr, 0});
    if (p == root) t.push_back(Transfer{p, nullptr, 0, static_cast<char*>(buf), n});
  }
  exchange(*world_, members_, members_[rank_], t, "broadcast");
}

void TcpCommunicator::barrier() {
  // Nobody leaves before everybody has arrived: each rank waits for a byte from every other rank.
  const char token = 1;
  std::vector<char> got(static_cast<size_t>(world_size()));
  std::vector<Transfer> t;
  for (int p = 0; p < world_size(); ++p)
    if (p != rank_) t.push_back(Transfer{p, &token, 1, &got[static_cast<size_t>(p)], 1});
  exchange(*world_, members_, members_[rank_], t, "barrier");
}

void TcpCommunicator::send(const void* buf, int64_t bytes, int dest) { send_recv(buf, bytes, dest, nullptr, 0, -1); }

void TcpCommunicator::recv(void* buf, int64_t bytes, int source) { send_recv(nullptr, 0, -1, buf, bytes, source); }

void TcpCommunicator::send_recv(const void* send_buf, int64_t send_bytes, int dest, void* recv_buf, int64_t recv_bytes,
                                int source) {
  detail::check_send_recv(send_buf, send_bytes, dest, recv_buf, recv_bytes, source, rank_, world_size());
  std::vector<Transfer> t;
  if (send_bytes > 0)
    t.push_back(Transfer{dest, static_cast<const char*>(send_buf), static_cast<size_t>(send_bytes), nullptr, 0});
  if (recv_bytes > 0) {
    if (!t.empty() && dest == source) {  // one connection carries both directions
      t.back().recv = static_cast<char*>(recv_buf);
      t.back().recv_bytes = static_cast<size_t>(recv_bytes);
    } else {
      t.push_back(Transfer{source, nullptr, 0, static_cast<char*>(recv_buf), static_cast<size_t>(recv_bytes)});
    }
  }
  exchange(*world_, members_, members_[rank_], t,
           send_bytes > 0 && recv_bytes > 0 ? "send_recv"
           : send_bytes > 0                 ? "send"
                                            : "recv");
}

std::unique_ptr<Communicator> TcpCommunicator::dup() {
  // A listener on a new port for every member, the ports exchanged over this mesh, then step 4 of the rendezvous.
  Socket listener = tcp_listen(0);
  const int64_t mine = local_port(listener);
  std::vector<int64_t> ports(members_.size());
  all_gather_impl(&mine, 1, ports.data(), "dup");
  auto copy = std::make_shared<World>();
  copy->peers = world_->peers;
  copy->node_keys = world_->node_keys;
  copy->links.resize(world_->links.size());
  for (size_t i = 0; i < members_.size(); ++i)
    copy->peers[static_cast<size_t>(members_[i])].port = static_cast<int>(ports[i]);
  connect_mesh(members_[rank_], copy->peers, members_, 0, listener, kDupTimeoutS, &copy->links);
  for (const Socket& s : copy->links)
    if (s) set_nonblocking(s);
  return std::unique_ptr<Communicator>(new TcpCommunicator(copy, members_, rank_, device_rank_, device_ranks_));
}

std::unique_ptr<Communicator> TcpCommunicator::split(int color, int key) {
  ST_CHECK(color >= 0, "TcpCommunicator::split: color ", color, " must be >= 0");
  const int n = world_size();
  const int64_t mine[2] = {color, key};
  std::vector<int64_t> all(static_cast<size_t>(2 * n));
  all_gather_impl(mine, 2, all.data(), "split");
  std::vector<int> group;  // ranks of this communicator with my color, ordered by (key, rank)
  for (int p = 0; p < n; ++p)
    if (all[2 * p] == color) group.push_back(p);
  std::stable_sort(group.begin(), group.end(), [&](int a, int b) { return all[2 * a + 1] < all[2 * b + 1]; });
  std::vector<int> members;
  int new_rank = 0;
  for (size_t i = 0; i < group.size(); ++i) {
    if (group[i] == rank_) new_rank = static_cast<int>(i);
    members.push_back(members_[group[i]]);
  }
  return std::unique_ptr<Communicator>(new TcpCommunicator(world_, std::move(members), new_rank, device_rank_, device_ranks_));
}

}  // namespace st
