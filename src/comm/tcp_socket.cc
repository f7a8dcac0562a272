#include "shardtrain/comm/tcp_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <memory>
#include <utility>

#include "shardtrain/core/errno_text.h"
#include "shardtrain/core/error.h"

namespace st {
namespace {

std::string lower_first(std::string s) {
  if (!s.empty()) s[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(s[0])));
  return s;
}

// Milliseconds left until `deadline` for poll(): 0 once it has passed, at most a day.
int ms_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 86'400'000));
}

// Waits for `events` on fd until the deadline; false when it passed first.
bool wait_for(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, ms_left(deadline));
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) ST_FAULT("poll failed: ", errno_text_lower());
  }
}

void set_flags(int fd, bool nonblocking) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd, F_SETFL, nonblocking ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK)) < 0)
    ST_FAULT("fcntl(O_NONBLOCK) failed: ", errno_text_lower());
}

void set_nodelay(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

}  // namespace

Socket tcp_listen(int port) {
  Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s) ST_FAULT("socket() failed: ", errno_text_lower());
  const int one = 1;
  ::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(s.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
    ST_FAULT("cannot listen on TCP port ", port, ": ", errno_text_lower());
  if (::listen(s.fd(), SOMAXCONN) != 0) ST_FAULT("listen() on TCP port ", port, " failed: ", errno_text_lower());
  return s;
}

int local_port(const Socket& s) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  if (::getsockname(s.fd(), reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    ST_FAULT("getsockname failed: ", errno_text_lower());
  return ntohs(addr.sin_port);
}

std::string peer_address(const Socket& s) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  if (::getpeername(s.fd(), reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    ST_FAULT("getpeername failed: ", errno_text_lower());
  char text[INET_ADDRSTRLEN] = {0};
  ::inet_ntop(AF_INET, &addr.sin_addr, text, sizeof(text));
  return text;
}

Socket tcp_connect(const std::string& host, int port, Clock::time_point deadline, std::string* why) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0) {
    *why = lower_first(::gai_strerror(rc));
    return Socket();
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard(found, &::freeaddrinfo);
  Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s) ST_FAULT("socket() failed: ", errno_text_lower());
  // Non-blocking connect, so that an address nobody answers (a wrong MASTER_ADDR) cannot outlast the deadline.
  set_flags(s.fd(), true);
  if (::connect(s.fd(), found->ai_addr, found->ai_addrlen) != 0) {
    if (errno != EINPROGRESS) {
      *why = errno_text_lower();
      return Socket();
    }
    if (!wait_for(s.fd(), POLLOUT, deadline)) {
      *why = "timed out";
      return Socket();
    }
    int err = 0;
    socklen_t len = sizeof(err);
    ::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      *why = errno_text_lower(err);
      return Socket();
    }
  }
  set_flags(s.fd(), false);
  set_nodelay(s.fd());
  return s;
}

Socket tcp_accept(const Socket& listener, Clock::time_point deadline) {
  for (;;) {
    if (!wait_for(listener.fd(), POLLIN, deadline)) return Socket();
    Socket s(::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC));
    if (s) {
      set_nodelay(s.fd());
      return s;
    }
    if (errno != EINTR && errno != ECONNABORTED && errno != EAGAIN) ST_FAULT("accept failed: ", errno_text_lower());
  }
}

void send_exact(const Socket& s, const void* buf, size_t n, Clock::time_point deadline, const std::string& what) {
  const auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    if (!wait_for(s.fd(), POLLOUT, deadline)) ST_FAULT(what, ": timed out sending");
    const ssize_t k = ::send(s.fd(), p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      ST_FAULT(what, ": ", errno_text_lower());
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
}

void recv_exact(const Socket& s, void* buf, size_t n, Clock::time_point deadline, const std::string& what) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    if (!wait_for(s.fd(), POLLIN, deadline)) ST_FAULT(what, ": timed out waiting for data");
    const ssize_t k = ::recv(s.fd(), p, n, MSG_DONTWAIT);
    if (k == 0) ST_FAULT(what, ": connection closed by the peer");
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      ST_FAULT(what, ": ", errno_text_lower());
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
}

void set_nonblocking(const Socket& s) { set_flags(s.fd(), true); }


std::string local_host_name() {
  char name[256] = {0};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "unknown-host";
  return name;
}

}  // namespace st
