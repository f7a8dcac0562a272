// TcpCommunicator and the env rendezvous with N ranks as threads of this process, over 127.0.0.1: exact results
// (integers in floats, so every sum is exact), the rank-order sum, uneven and large counts, split and topology,
// a peer that leaves, and the rendezvous's errors. Process-level runs (shardtrain itself, pod_launch.sh, exit
// codes) are tests/comm/env_bootstrap_test.py.
#include "shardtrain/comm/tcp_communicator.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "env_guard.h"
#include "point_to_point_checks.h"
#include "shardtrain/comm/rendezvous.h"
#include "shardtrain/core/error.h"

namespace st {
namespace {

// A port nobody listens on right now (the kernel's pick for port 0, released at once).
int free_port() {
  Socket s = tcp_listen(0);
  return local_port(s);
}

RendezvousOptions options(int rank, int world, int port, double timeout_s = 30) {
  RendezvousOptions o;
  o.rank = rank;
  o.world_size = world;
  o.master_addr = "127.0.0.1";
  o.master_port = port;
  o.timeout_s = timeout_s;
  o.host_name = "test-host";
  return o;
}

// What each rank's thread threw (empty: nothing), with the error kind.
struct Outcome {
  std::string error;
  ErrorKind kind = ErrorKind::kInternal;
};

// Runs `body` on ranks 0..n-1 (those in `ranks`, default all), each with its own options and communicator.
std::vector<Outcome> run_ranks(int n, const std::function<RendezvousOptions(int)>& make,
                               const std::function<void(TcpCommunicator&)>& body, std::vector<int> ranks = {}) {
  if (ranks.empty())
    for (int r = 0; r < n; ++r) ranks.push_back(r);
  std::vector<Outcome> out(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r : ranks) {
    threads.emplace_back([&, r] {
      try {
        TcpCommunicator comm(rendezvous(make(r)));
        body(comm);
      } catch (const Error& e) {
        out[r] = Outcome{e.what(), e.kind()};
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

void run_world(int n, const std::function<void(TcpCommunicator&)>& body) {
  const int port = free_port();
  const auto out = run_ranks(n, [&](int r) { return options(r, n, port); }, body);
  for (int r = 0; r < n; ++r) EXPECT_EQ(out[r].error, "") << "rank " << r;
}

TEST(TcpCommunicatorTest, AllGatherExactForWorldSizesAndCounts) {
  for (int n : {1, 2, 3, 4}) {
    run_world(n, [n](TcpCommunicator& c) {
      EXPECT_EQ(c.world_size(), n);
      EXPECT_EQ(c.kind(), "tcp");
      for (int64_t count : {0, 1, 5, 1000}) {
        std::vector<float> send(count), recv(n * count, -1.0f);
        for (int64_t i = 0; i < count; ++i) send[i] = static_cast<float>(c.rank() * 10000 + i);
        c.all_gather(send.data(), count, recv.data());
        for (int r = 0; r < n; ++r)
          for (int64_t i = 0; i < count; ++i) ASSERT_EQ(recv[r * count + i], r * 10000 + i) << n << " " << count;
        // In place: this rank's block already sits in recv.
        std::vector<float> inplace(n * count, -1.0f);
        std::copy(send.begin(), send.end(), inplace.begin() + c.rank() * count);
        c.all_gather(inplace.data() + c.rank() * count, count, inplace.data());
        EXPECT_EQ(inplace, recv);
      }
    });
  }
}

TEST(TcpCommunicatorTest, ReduceScatterExactForUnevenCounts) {
  for (int n : {2, 3, 4}) {
    run_world(n, [n](TcpCommunicator& c) {
      for (int64_t count : {1, 7, 1001}) {
        std::vector<float> send(n * count), recv(count, -1.0f);
        for (int r = 0; r < n; ++r)
          for (int64_t i = 0; i < count; ++i) send[r * count + i] = static_cast<float>((c.rank() + 1) * (i + r));
        c.reduce_scatter(send.data(), count, recv.data());
        const int64_t ranks_sum = n * (n + 1) / 2;  // sum over k of (k + 1)
        for (int64_t i = 0; i < count; ++i) ASSERT_EQ(recv[i], ranks_sum * (i + c.rank())) << n << " " << count;
      }
    });
  }
}

TEST(TcpCommunicatorTest, AllReduceFloatAndDoubleWithCountsThatDoNotDivide) {
  run_world(3, [](TcpCommunicator& c) {
    for (int64_t count : {1, 2, 4, 1001}) {
      std::vector<float> f(count);
      std::vector<double> d(count);
      for (int64_t i = 0; i < count; ++i) {
        f[i] = static_cast<float>(c.rank() + i);
        d[i] = 0.5 * c.rank() + 3.0 * i;
      }
      c.all_reduce(f.data(), count);
      c.all_reduce(d.data(), count);
      for (int64_t i = 0; i < count; ++i) {
        ASSERT_EQ(f[i], 3 * i + 3) << count;  // 0 + 1 + 2 = 3
        ASSERT_EQ(d[i], 1.5 + 9.0 * i) << count;
      }
    }
  });
}

// Values whose float sum depends on the order: the result must be the rank-order sum ((x0 + x1) + x2) + x3,
// bit for bit on every rank, for reduce_scatter and all_reduce alike.
TEST(TcpCommunicatorTest, SumsInRankOrder) {
  const float x[4] = {1e8f, 1.0f, -1e8f, 1.0f};
  const float serial = ((x[0] + x[1]) + x[2]) + x[3];
  ASSERT_EQ(serial, 1.0f);  // 1e8 + 1 rounds to 1e8; another order would give 0 or 2
  std::vector<float> results(4 * 2);
  run_world(4, [&](TcpCommunicator& c) {
    std::vector<float> send(4, x[c.rank()]), slice(1);
    c.reduce_scatter(send.data(), 1, slice.data());
    float v = x[c.rank()];
    c.all_reduce(&v, 1);
    results[2 * c.rank()] = slice[0];
    results[2 * c.rank() + 1] = v;
  });
  for (float r : results) EXPECT_EQ(r, serial);
}

TEST(TcpCommunicatorTest, BroadcastFromEveryRootAndBarrier) {
  std::atomic<int> arrived{0};
  run_world(3, [&](TcpCommunicator& c) {
    for (int root = 0; root < 3; ++root) {
      char text[13] = {0};
      if (c.rank() == root) std::snprintf(text, sizeof(text), "from root %d", root);
      c.broadcast(text, sizeof(text), root);
      EXPECT_EQ(std::string(text), "from root " + std::to_string(root));
    }
    // Nobody passes the barrier before all three have incremented.
    arrived.fetch_add(1);
    c.barrier();
    EXPECT_EQ(arrived.load(), 3);
    c.barrier();
  });
}

// 8M elements: all_gather and all_reduce move 32 MiB per rank in one call, reduce_scatter goes in several
// rounds; both directions at once between every pair (a blocking send would deadlock here).
TEST(TcpCommunicatorTest, LargeCountsExact) {
  constexpr int64_t kCount = int64_t{8} << 20;
  run_world(3, [](TcpCommunicator& c) {
    std::vector<float> buf(kCount);
    for (int64_t i = 0; i < kCount; ++i) buf[i] = static_cast<float>(i % 1000 + c.rank());
    c.all_reduce(buf.data(), kCount);
    for (int64_t i = 0; i < kCount; ++i)
      if (buf[i] != 3 * (i % 1000) + 3) FAIL() << "all_reduce element " << i << " = " << buf[i];
    const int64_t per = kCount / 2;
    std::vector<float> send(3 * per), slice(per);
    for (int64_t i = 0; i < 3 * per; ++i) send[i] = static_cast<float>(i % 4096);
    c.reduce_scatter(send.data(), per, slice.data());
    for (int64_t i = 0; i < per; ++i)
      if (slice[i] != 3 * ((c.rank() * per + i) % 4096)) FAIL() << "reduce_scatter element " << i;
    std::vector<float> all(3 * kCount);
    std::vector<float> mine(kCount, static_cast<float>(c.rank() + 1));
    c.all_gather(mine.data(), kCount, all.data());
    for (int64_t i = 0; i < 3 * kCount; ++i)
      if (all[i] != i / kCount + 1) FAIL() << "all_gather element " << i;
  });
}

// Two "machines" of two ranks each (host names a, a, b, b): node topology, then hybrid sharding's two splits.
TEST(TcpCommunicatorTest, TopologyFromHostNamesAndSplit) {
  const int port = free_port();
  const char* hosts[4] = {"a", "b", "a", "b"};
  const auto out = run_ranks(
      4,
      [&](int r) {
        RendezvousOptions o = options(r, 4, port);
        o.host_name = hosts[r];
        return o;
      },
      [&](TcpCommunicator& c) {
        const int r = c.rank();
        EXPECT_EQ(c.num_nodes(), 2);
        EXPECT_EQ(c.node_id(), r % 2);
        EXPECT_EQ(c.local_rank(), r / 2);
        EXPECT_EQ(c.local_size(), 2);
        EXPECT_EQ(c.device_rank(), r / 2);
        EXPECT_EQ(c.device_ranks(), 2);
        // Node groups, ranked in reverse by key.
        auto node = c.split(c.node_id(), -r);
        EXPECT_EQ(node->world_size(), 2);
        EXPECT_EQ(node->rank(), 1 - r / 2);
        EXPECT_EQ(node->local_size(), 2);
        EXPECT_EQ(node->node_id(), 0);
        float v = static_cast<float>(r);
        node->all_reduce(&v, 1);
        EXPECT_EQ(v, r % 2 == 0 ? 0 + 2 : 1 + 3);
        std::vector<float> g(2);
        const float mine = static_cast<float>(10 * r);
        node->all_gather(&mine, 1, g.data());
        EXPECT_EQ(g[node->rank()], 10 * r);
        EXPECT_EQ(g[1 - node->rank()], 10 * (r % 2 == 0 ? 2 - r : 4 - r));
        // Replica groups (same local rank, one rank per node), and a collective of the world in between.
        auto replica = c.split(c.local_rank(), r);
        EXPECT_EQ(replica->world_size(), 2);
        EXPECT_EQ(replica->local_size(), 1);
        EXPECT_EQ(replica->node_id(), replica->rank());
        c.barrier();
        double d = r;
        replica->all_reduce(&d, 1);
        EXPECT_EQ(d, r < 2 ? 0 + 1 : 2 + 3);
      });
  for (int r = 0; r < 4; ++r) EXPECT_EQ(out[r].error, "") << "rank " << r;
}

// send, recv and send_recv around a ring; 3 MiB + 37 r bytes a message, past the 1 MiB of one socket call, so that
// a blocking send on both sides of a pair would hang.
TEST(TcpCommunicatorTest, PointToPointDeliversEveryByte) {
  for (int n : {2, 3, 4}) {
    run_world(n, [](TcpCommunicator& c) {
      EXPECT_EQ(testing::check_ring_send_recv(c, 0), "");
      EXPECT_EQ(testing::check_ring_send_recv(c, int64_t{3} << 20), "");
      EXPECT_EQ(testing::check_send_then_recv(c, 100), "");
    });
  }
}

// dup() over a split's members too: the copy has its own connections, used from a second thread while the
// original all-reduces.
TEST(TcpCommunicatorTest, DupHasItsOwnConnections) {
  run_world(4, [](TcpCommunicator& c) {
    EXPECT_EQ(testing::check_dup_beside(c, 20), "");
    std::unique_ptr<Communicator> half = c.split(c.rank() % 2, c.rank());
    EXPECT_EQ(testing::check_dup_beside(*half, 5), "");
  });
}

TEST(TcpCommunicatorTest, NodeIdOverrideAndMixedOverrideIsBadInput) {
  int port = free_port();
  auto out = run_ranks(
      3,
      [&](int r) {
        RendezvousOptions o = options(r, 3, port);
        o.node_id = r == 2 ? 7 : 5;
        return o;
      },
      [](TcpCommunicator& c) {
        EXPECT_EQ(c.num_nodes(), 2);
        EXPECT_EQ(c.node_id(), c.rank() == 2 ? 1 : 0);
        EXPECT_EQ(c.device_rank(), c.rank());  // one host name: the device index ignores the override
        EXPECT_EQ(c.device_ranks(), 3);
        EXPECT_EQ(c.split(0, c.rank())->device_ranks(), 3);
      });
  for (int r = 0; r < 3; ++r) EXPECT_EQ(out[r].error, "") << "rank " << r;
  port = free_port();
  out = run_ranks(
      2,
      [&](int r) {
        RendezvousOptions o = options(r, 2, port);
        if (r == 1) o.node_id = 1;
        return o;
      },
      [](TcpCommunicator&) {});
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(out[r].kind, ErrorKind::kBadInput);
    EXPECT_NE(out[r].error.find("SHARDTRAIN_NODE_ID is set on rank 1 but not on rank 0"), std::string::npos)
        << out[r].error;
  }
}

// A peer that leaves (its connections close) fails the next collective with kFault naming it and the op, on
// the receiving side (all_reduce) and on the sending side (a 64 MiB broadcast into a closed connection).
TEST(TcpCommunicatorTest, PeerThatLeavesIsAFaultNamingIt) {
  for (const char* op : {"all_reduce", "broadcast"}) {
    const int port = free_port();
    const auto out = run_ranks(
        2, [&](int r) { return options(r, 2, port); },
        [&](TcpCommunicator& c) {
          if (c.rank() == 1) return;  // leaves: its communicator closes its connections
          std::vector<float> buf(int64_t{16} << 20, 1.0f);
          if (std::string(op) == "all_reduce") {
            c.all_reduce(buf.data(), 1000);
          } else {
            c.broadcast(buf.data(), static_cast<int64_t>(buf.size() * sizeof(float)), 0);
          }
        });
    EXPECT_EQ(out[1].error, "");
    EXPECT_EQ(out[0].kind, ErrorKind::kFault) << op;
    EXPECT_NE(out[0].error.find(std::string(op) + ": lost peer rank 1 on test-host"), std::string::npos)
        << out[0].error;
  }
}

TEST(RendezvousTest, MissingRankTimesOutNamingIt) {
  const int port = free_port();
  const auto out = run_ranks(3, [&](int r) { return options(r, 3, port, 1.0); }, [](TcpCommunicator&) {}, {0, 1});
  const std::string want = "rendezvous on port " + std::to_string(port) +
                           ": 2 of 3 ranks arrived within 1 s (missing ranks: 2)";
  for (int r : {0, 1}) {
    EXPECT_EQ(out[r].kind, ErrorKind::kFault);
    EXPECT_NE(out[r].error.find(want), std::string::npos) << out[r].error;
  }
  EXPECT_NE(out[1].error.find("rank 0 reports: "), std::string::npos) << out[1].error;
}

TEST(RendezvousTest, UnreachableMasterTimesOut) {
  const int port = free_port();
  const auto out = run_ranks(2, [&](int r) { return options(r, 2, port, 1.0); }, [](TcpCommunicator&) {}, {1});
  EXPECT_EQ(out[1].kind, ErrorKind::kFault);
  EXPECT_NE(out[1].error.find("could not reach MASTER_ADDR=127.0.0.1:" + std::to_string(port) +
                              " within 1 s (connection refused)"),
            std::string::npos)
      << out[1].error;
}

TEST(RendezvousTest, DuplicateRankAndWorldSizeMismatchAreBadInputOnEveryRank) {
  int port = free_port();
  // Ranks 0, 1 and a second 1 (thread index 2 reports rank 1).
  auto out = run_ranks(3, [&](int r) { return options(r == 2 ? 1 : r, 3, port, 5.0); }, [](TcpCommunicator&) {});
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(out[r].kind, ErrorKind::kBadInput) << r << ": " << out[r].error;
    EXPECT_NE(out[r].error.find("rank 1 arrived twice"), std::string::npos) << out[r].error;
  }
  port = free_port();
  out = run_ranks(2, [&](int r) { return options(r, r == 0 ? 2 : 3, port, 5.0); }, [](TcpCommunicator&) {});
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(out[r].kind, ErrorKind::kBadInput) << r << ": " << out[r].error;
    EXPECT_NE(out[r].error.find("WORLD_SIZE=3 on rank 1 (test-host) but WORLD_SIZE=2 on rank 0"), std::string::npos)
        << out[r].error;
  }
}

class RendezvousEnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : {"WORLD_SIZE", "RANK", "JOB_COMPLETION_INDEX", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                          "MASTER_ADDR", "MASTER_PORT", "SHARDTRAIN_NODE_ID"})
      env_.clear(v);
  }
  std::string bad_input() {
    try {
      rendezvous_options_from_env(5);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kBadInput) << e.what();
      return e.what();
    }
    return "no error";
  }
  testing::EnvGuard env_;
};

TEST_F(RendezvousEnvTest, TorchrunVariables) {
  env_.set("WORLD_SIZE", "4");
  env_.set("RANK", "3");
  env_.set("LOCAL_RANK", "1");
  env_.set("LOCAL_WORLD_SIZE", "2");
  env_.set("MASTER_ADDR", "trainer-0");
  const RendezvousOptions o = rendezvous_options_from_env(7);
  EXPECT_EQ(o.rank, 3);
  EXPECT_EQ(o.world_size, 4);
  EXPECT_EQ(o.local_rank, 1);
  EXPECT_EQ(o.master_addr, "trainer-0");
  EXPECT_EQ(o.master_port, 29500);
  EXPECT_EQ(o.timeout_s, 7);
  EXPECT_FALSE(o.node_id.has_value());
}

TEST_F(RendezvousEnvTest, IndexedJobRankIsIndexTimesLocalWorldSizePlusLocalRank) {
  env_.set("WORLD_SIZE", "6");
  env_.set("JOB_COMPLETION_INDEX", "2");
  env_.set("LOCAL_WORLD_SIZE", "2");
  env_.set("LOCAL_RANK", "1");
  env_.set("MASTER_ADDR", "shardtrain-0.shardtrain");
  env_.set("MASTER_PORT", "23456");
  const RendezvousOptions o = rendezvous_options_from_env(5);
  EXPECT_EQ(o.rank, 5);
  EXPECT_EQ(o.master_port, 23456);
  env_.clear("LOCAL_RANK");
  EXPECT_EQ(rendezvous_options_from_env(5).rank, 4);  // LOCAL_RANK defaults to 0
}

TEST_F(RendezvousEnvTest, InconsistentVariablesAreBadInputNamingThem) {
  EXPECT_NE(bad_input().find("needs environment variable WORLD_SIZE"), std::string::npos);
  env_.set("WORLD_SIZE", "four");
  EXPECT_NE(bad_input().find("WORLD_SIZE='four' is not an integer"), std::string::npos);
  env_.set("WORLD_SIZE", "4");
  env_.set("MASTER_ADDR", "127.0.0.1");
  EXPECT_NE(bad_input().find("needs environment variable RANK, or JOB_COMPLETION_INDEX"), std::string::npos);
  env_.set("RANK", "4");
  EXPECT_NE(bad_input().find("RANK=4 is outside [0, 3]"), std::string::npos);
  env_.clear("RANK");
  env_.set("JOB_COMPLETION_INDEX", "2");
  env_.set("LOCAL_WORLD_SIZE", "2");
  EXPECT_NE(bad_input().find("= 2 x 2 + 0 = 4 is outside [0, WORLD_SIZE=4)"), std::string::npos);
  env_.set("JOB_COMPLETION_INDEX", "1");
  env_.set("LOCAL_RANK", "2");
  EXPECT_NE(bad_input().find("LOCAL_RANK=2 is outside [0, 1]"), std::string::npos);
  env_.set("LOCAL_RANK", "1");
  env_.set("MASTER_PORT", "70000");
  EXPECT_NE(bad_input().find("MASTER_PORT=70000 is outside [1, 65535]"), std::string::npos);
  env_.clear("MASTER_PORT");
  env_.clear("MASTER_ADDR");
  EXPECT_NE(bad_input().find("needs environment variable MASTER_ADDR"), std::string::npos);
}

}  // namespace
}  // namespace st
