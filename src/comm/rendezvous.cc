#include "shardtrain/comm/rendezvous.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <thread>
#include <utility>

#include "shardtrain/comm/node_topology.h"
#include "shardtrain/core/env.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/log.h"

namespace st {
namespace {

constexpr uint32_t kMagic = 0x53545256;  // "STRV": guards against strays on the ports (a port scanner, a typo)
constexpr uint32_t kMaxMessage = 16u << 20;

// The little wire format of the rendezvous: native-endian integers and length-prefixed strings (every rank runs
// the same build on the same architecture), in messages framed by a 32-bit length.
class Writer {
 public:
  Writer() { put(kMagic); }
  template <typename T>
  void put(T v) {
    const auto* p = reinterpret_cast<const char*>(&v);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
  }
  void put_str(const std::string& s) {
    put(static_cast<uint32_t>(s.size()));
    bytes_.insert(bytes_.end(), s.begin(), s.end());
  }
  void put_node(const std::optional<int64_t>& id) {
    put<int64_t>(id ? 1 : 0);
    put<int64_t>(id.value_or(0));
  }
  void send(const Socket& s, Clock::time_point deadline, const std::string& what) const {
    const auto n = static_cast<uint32_t>(bytes_.size());
    send_exact(s, &n, sizeof(n), deadline, what);
    send_exact(s, bytes_.data(), bytes_.size(), deadline, what);
  }

 private:
  std::vector<char> bytes_;
};

class Reader {
 public:
  Reader(const Socket& s, Clock::time_point deadline, const std::string& what) : what_(what) {
    uint32_t n = 0;
    recv_exact(s, &n, sizeof(n), deadline, what);
    if (n > kMaxMessage) ST_FAULT(what, ": not a shardtrain rendezvous message (length ", n, ")");
    bytes_.resize(n);
    recv_exact(s, bytes_.data(), n, deadline, what);
    if (get<uint32_t>() != kMagic) ST_FAULT(what, ": not a shardtrain rendezvous message (bad magic)");
  }
  template <typename T>
  T get() {
    T v{};
    need(sizeof(T));
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string get_str() {
    const auto n = get<uint32_t>();
    need(n);
    std::string s(bytes_.data() + pos_, n);
    pos_ += n;
    return s;
  }
  std::optional<int64_t> get_node() {
    const bool has = get<int64_t>() != 0;
    const int64_t id = get<int64_t>();
    return has ? std::optional<int64_t>(id) : std::nullopt;
  }

 private:
  void need(size_t n) const {
    if (pos_ + n > bytes_.size()) ST_FAULT(what_, ": truncated rendezvous message");
  }
  std::vector<char> bytes_;
  size_t pos_ = 0;
  std::string what_;
};

enum class Status : int64_t { kOk = 0, kBadInput = 1, kFault = 2 };

Clock::time_point after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

int64_t env_int(const char* name, int64_t min, int64_t max) {
  const std::string value = env_get(name);
  int64_t v = 0;
  const char* end = value.data() + value.size();
  const auto [ptr, ec] = std::from_chars(value.data(), end, v);
  if (value.empty() || ec != std::errc() || ptr != end)
    ST_BAD_INPUT("dist.bootstrap=env: environment variable ", name, "='", value, "' is not an integer");
  if (v < min || v > max)
    ST_BAD_INPUT("dist.bootstrap=env: environment variable ", name, "=", v, " is outside [", min, ", ", max, "]");
  return v;
}

bool env_set(const char* name) { return !env_get(name).empty(); }

std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size() && i < 16; ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > 16) out += ", ...";
  return out;
}

// Rank 0 tells every connected rank why the rendezvous failed, so that they fail alike instead of waiting;
// best effort (a rank that is gone is no reason to hide the error).
void broadcast_failure(const std::vector<Socket>& links, Status status, const std::string& message) {
  Writer w;
  w.put(static_cast<int64_t>(status));
  w.put_str(message);
  for (const Socket& s : links) {
    if (!s) continue;
    try {
      w.send(s, after(2), "rendezvous: error notice");
    } catch (const Error&) {
    }
  }
}

struct Hello {
  int rank = 0;
  int64_t world = 0;
  PeerInfo info;
};

// Rank 0: collects every other rank's hello on MASTER_PORT, checks them, sends the table.
void gather_at_rank0(const RendezvousOptions& o, int mesh_port, TcpMesh* mesh) {
  Socket listener = [&] {
    try {
      return tcp_listen(o.master_port);
    } catch (const Error& e) {
      ST_FAULT("rendezvous: rank 0 cannot listen on MASTER_PORT=", o.master_port, ": ", e.what());
    }
  }();
  const auto deadline = after(o.timeout_s);
  std::vector<Socket> extra;  // connections of ranks refused (duplicates), still told why
  int arrived = 1;
  auto fail = [&](Status status, const std::string& message) {
    for (Socket& s : extra) mesh->links.push_back(std::move(s));
    broadcast_failure(mesh->links, status, message);
    if (status == Status::kBadInput) ST_BAD_INPUT(message);
    ST_FAULT(message);
  };
  while (arrived < o.world_size) {
    Socket s = tcp_accept(listener, deadline);
    if (!s) {
      std::vector<int> missing;
      for (int r = 1; r < o.world_size; ++r)
        if (!mesh->links[r]) missing.push_back(r);
      fail(Status::kFault, str_cat("rendezvous on port ", o.master_port, ": ", arrived, " of ", o.world_size,
                                   " ranks arrived within ", o.timeout_s, " s (missing ranks: ", rank_list(missing),
                                   ")"));
    }
    Hello h;
    const std::string from = peer_address(s);
    try {
      Reader r(s, std::min(deadline, after(10)), "rendezvous: hello from " + from);
      h.rank = static_cast<int>(r.get<int64_t>());
      h.world = r.get<int64_t>();
      h.info.port = static_cast<int>(r.get<int64_t>());
      h.info.host_name = r.get_str();
      h.info.node_id = r.get_node();
      h.info.address = from;
    } catch (const Error& e) {
      ST_LOG_WARN("rendezvous: ignoring a connection on port ", o.master_port, ": ", e.what());
      continue;
    }
    if (h.world != o.world_size) {
      extra.push_back(std::move(s));
      fail(Status::kBadInput, str_cat("rendezvous: environment variable WORLD_SIZE=", h.world, " on rank ", h.rank,
                                      " (", h.info.host_name, ") but WORLD_SIZE=", o.world_size, " on rank 0 (",
                                      o.host_name, ")"));
    }
    if (h.rank <= 0 || h.rank >= o.world_size || mesh->links[h.rank]) {
      const bool in_range = h.rank > 0 && h.rank < o.world_size;
      const std::string first = in_range ? mesh->peers[h.rank].host_name : o.host_name;
      extra.push_back(std::move(s));
      fail(Status::kBadInput, str_cat("rendezvous: rank ", h.rank, " arrived twice (from ", first, " and from ",
                                      h.info.host_name, " at ", from, "): environment variable RANK (or ",
                                      "JOB_COMPLETION_INDEX x LOCAL_WORLD_SIZE + LOCAL_RANK) must differ per process"));
    }
    mesh->peers[h.rank] = h.info;
    mesh->links[h.rank] = std::move(s);
    ++arrived;
  }
  mesh->peers[0] = PeerInfo{o.host_name, o.master_addr, mesh_port, o.node_id};
  Writer table;
  table.put(static_cast<int64_t>(Status::kOk));
  table.put_str("");
  for (const PeerInfo& p : mesh->peers) {
    table.put_str(p.host_name);
    table.put_str(p.address);
    table.put(static_cast<int64_t>(p.port));
    table.put_node(p.node_id);
  }
  for (int r = 1; r < o.world_size; ++r)
    table.send(mesh->links[r], after(o.timeout_s), str_cat("rendezvous: sending the table to rank ", r));
}

// Ranks > 0: reach rank 0, say who we are, receive the table (or rank 0's error).
void join_at_rank0(const RendezvousOptions& o, int mesh_port, TcpMesh* mesh) {
  const auto deadline = after(o.timeout_s);
  Socket s;
  std::string why;
  for (;;) {
    s = tcp_connect(o.master_addr, o.master_port, deadline, &why);
    if (s) break;
    if (Clock::now() >= deadline)
      ST_FAULT("rendezvous: could not reach MASTER_ADDR=", o.master_addr, ":", o.master_port, " within ",
               o.timeout_s, " s (", why, ")");
    std::this_thread::sleep_for(std::min<Clock::duration>(std::chrono::milliseconds(200), deadline - Clock::now()));
  }
  const std::string to0 = str_cat("rendezvous with rank 0 at ", o.master_addr, ":", o.master_port);
  Writer hello;
  hello.put(static_cast<int64_t>(o.rank));
  hello.put(static_cast<int64_t>(o.world_size));
  hello.put(static_cast<int64_t>(mesh_port));
  hello.put_str(o.host_name);
  hello.put_node(o.node_id);
  hello.send(s, deadline, to0);
  // Rank 0 was listening when we connected, so it answers within its own timeout (plus a margin for slow hosts).
  Reader r(s, after(o.timeout_s + 10), to0 + " (waiting for the other ranks)");
  const auto status = static_cast<Status>(r.get<int64_t>());
  const std::string message = r.get_str();
  if (status == Status::kBadInput) ST_BAD_INPUT("rank 0 reports: ", message);
  if (status != Status::kOk) ST_FAULT("rank 0 reports: ", message);
  for (PeerInfo& p : mesh->peers) {
    p.host_name = r.get_str();
    p.address = r.get_str();
    p.port = static_cast<int>(r.get<int64_t>());
    p.node_id = r.get_node();
  }
  mesh->links[0] = std::move(s);
}

}  // namespace

void connect_mesh(int rank, const std::vector<PeerInfo>& peers, const std::vector<int>& members, int first,
                  const Socket& listener, double timeout_s, std::vector<Socket>* links) {
  const auto deadline = after(timeout_s);
  const auto me = static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
  ST_CHECK(me < static_cast<int>(members.size()), "connect_mesh: rank ", rank, " is not a member");
  for (int i = first; i < me; ++i) {
    const int r = members[static_cast<size_t>(i)];
    const PeerInfo& p = peers[static_cast<size_t>(r)];
    std::string why;
    Socket s;
    while (!(s = tcp_connect(p.address, p.port, deadline, &why))) {
      if (Clock::now() >= deadline)
        ST_FAULT("rendezvous: could not connect to rank ", r, " at ", p.address, ":", p.port, " within ", timeout_s,
                 " s (", why, ")");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    Writer w;
    w.put(static_cast<int64_t>(rank));
    w.send(s, deadline, str_cat("rendezvous: connecting to rank ", r));
    (*links)[static_cast<size_t>(r)] = std::move(s);
  }
  auto is_later_member = [&](int r) {
    const auto at = std::find(members.begin(), members.end(), r) - members.begin();
    return at > me && at < static_cast<std::ptrdiff_t>(members.size());
  };
  for (int expected = me < first ? 0 : static_cast<int>(members.size()) - 1 - me; expected > 0;) {
    Socket s = tcp_accept(listener, deadline);
    if (!s) {
      std::vector<int> missing;
      for (int r : members)
        if (is_later_member(r) && !(*links)[static_cast<size_t>(r)]) missing.push_back(r);
      ST_FAULT("rendezvous: rank(s) ", rank_list(missing), " did not connect to rank ", rank, " within ", timeout_s,
               " s");
    }
    Reader hello(s, deadline, "rendezvous: mesh hello from " + peer_address(s));
    const auto r = static_cast<int>(hello.get<int64_t>());
    if (!is_later_member(r) || (*links)[static_cast<size_t>(r)])
      ST_FAULT("rendezvous: unexpected mesh connection claiming rank ", r, " (to rank ", rank, ")");
    (*links)[static_cast<size_t>(r)] = std::move(s);
    --expected;
  }
}

RendezvousOptions rendezvous_options_from_env(double timeout_s) {
  RendezvousOptions o;
  o.timeout_s = timeout_s;
  if (!env_set("WORLD_SIZE"))
    ST_BAD_INPUT("dist.bootstrap=env needs environment variable WORLD_SIZE (the number of ranks); it is not set");
  o.world_size = static_cast<int>(env_int("WORLD_SIZE", 1, 1 << 20));
  const int64_t local_size = env_int("LOCAL_WORLD_SIZE", 1, 1 << 20);
  if (env_set("LOCAL_RANK")) o.local_rank = static_cast<int>(env_int("LOCAL_RANK", 0, local_size - 1));
  if (env_set("RANK")) {
    o.rank = static_cast<int>(env_int("RANK", 0, o.world_size - 1));
  } else if (env_set("JOB_COMPLETION_INDEX") || o.world_size == 1) {
    const int64_t index = env_set("JOB_COMPLETION_INDEX") ? env_int("JOB_COMPLETION_INDEX", 0, 1 << 20) : 0;
    const int64_t local = std::max(o.local_rank, 0);
    const int64_t rank = index * local_size + local;
    if (rank >= o.world_size)
      ST_BAD_INPUT("dist.bootstrap=env: rank = JOB_COMPLETION_INDEX x LOCAL_WORLD_SIZE + LOCAL_RANK = ", index, " x ",
                   local_size, " + ", local, " = ", rank, " is outside [0, WORLD_SIZE=", o.world_size, ")");
    o.rank = static_cast<int>(rank);
  } else {
    ST_BAD_INPUT("dist.bootstrap=env with WORLD_SIZE=", o.world_size,
                 " needs environment variable RANK, or JOB_COMPLETION_INDEX (a Kubernetes Indexed Job's pod index); "
                 "neither is set");
  }
  o.master_addr = env_get("MASTER_ADDR");
  if (o.world_size > 1 && o.master_addr.empty())
    ST_BAD_INPUT("dist.bootstrap=env with WORLD_SIZE=", o.world_size,
                 " needs environment variable MASTER_ADDR (rank 0's host name or address); it is not set");
  o.master_port = static_cast<int>(env_int("MASTER_PORT", 1, 65535));
  o.host_name = local_host_name();
  int64_t id = 0;
  if (node_id_override(&id)) o.node_id = id;
  return o;
}

TcpMesh rendezvous(const RendezvousOptions& o) {
  ST_CHECK(o.world_size >= 1 && o.rank >= 0 && o.rank < o.world_size, "rendezvous: rank ", o.rank, " of ",
           o.world_size);
  ST_CHECK(o.timeout_s > 0, "rendezvous: timeout ", o.timeout_s, " s");
  TcpMesh mesh;
  mesh.rank = o.rank;
  mesh.peers.resize(static_cast<size_t>(o.world_size));
  mesh.links.resize(static_cast<size_t>(o.world_size));
  if (o.world_size == 1) {
    mesh.peers[0] = PeerInfo{o.host_name, o.master_addr, 0, o.node_id};
    return mesh;
  }
  Socket listener = tcp_listen(0);  // this rank's mesh port, open before anyone can learn it
  if (o.rank == 0) {
    gather_at_rank0(o, local_port(listener), &mesh);
  } else {
    join_at_rank0(o, local_port(listener), &mesh);
  }
  // Rank 0's links all came through MASTER_PORT already: the others connect to ranks 1.. below them.
  std::vector<int> all(static_cast<size_t>(o.world_size));
  for (int r = 0; r < o.world_size; ++r) all[static_cast<size_t>(r)] = r;
  connect_mesh(o.rank, mesh.peers, all, 1, listener, o.timeout_s, &mesh.links);
  return mesh;
}

}  // namespace st
