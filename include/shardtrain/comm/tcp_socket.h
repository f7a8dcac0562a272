// TCP sockets for the env bootstrap (rendezvous.h) and TcpCommunicator: an owning handle and the few blocking,
// deadline-bounded operations the start-up needs. The collectives' non-blocking I/O lives in
// tcp_communicator.cc.
//
//   st::Socket listener = st::tcp_listen(0);                 // any free port
//   int port = st::local_port(listener);
//   std::string why;
//   st::Socket s = st::tcp_connect("127.0.0.1", port, deadline, &why);   // empty on failure, `why` says why
//   st::send_exact(s, buf, n, deadline, "rendezvous hello");
//
// Failures: tcp_listen throws kFault naming the port (in use, no permission); send_exact/recv_exact throw kFault
// naming `what` and the reason (timed out, closed by the peer, the system's error text). No SIGPIPE: sends use
// MSG_NOSIGNAL.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

#include "shardtrain/core/unique_fd.h"

namespace st {

using Clock = std::chrono::steady_clock;

// An open socket file descriptor; closes it on destruction. Moves, does not copy.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}

  int fd() const { return fd_.get(); }
  explicit operator bool() const { return static_cast<bool>(fd_); }
  void reset() noexcept { fd_.reset(); }

 private:
  UniqueFd fd_;
};

// A socket listening on all IPv4 interfaces at `port` (0: a free port the system picks), SO_REUSEADDR.
Socket tcp_listen(int port);
// The port a socket is bound to.
int local_port(const Socket& s);
// The peer's numeric IPv4 address ("10.1.2.3").
std::string peer_address(const Socket& s);

// One connection attempt to host:port (name or address), waiting at most until `deadline`. Returns an empty
// Socket on failure with *why set to the reason in lower case ("connection refused", "timed out", the resolver's
// text). The returned socket is blocking, with TCP_NODELAY.
Socket tcp_connect(const std::string& host, int port, Clock::time_point deadline, std::string* why);
// Waits for one connection on a listening socket until `deadline`; empty Socket when the deadline passes.
Socket tcp_accept(const Socket& listener, Clock::time_point deadline);

// Exactly n bytes, waiting at most until `deadline` (kFault naming `what` otherwise).
void send_exact(const Socket& s, const void* buf, size_t n, Clock::time_point deadline, const std::string& what);
void recv_exact(const Socket& s, void* buf, size_t n, Clock::time_point deadline, const std::string& what);

// Switches a connected socket to non-blocking mode (for the collectives' poll loop).
void set_nonblocking(const Socket& s);

// This machine's host name (gethostname).
std::string local_host_name();

}  // namespace st
