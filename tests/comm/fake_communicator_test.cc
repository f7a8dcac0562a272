// The fake communicator: N ranks as threads. Its sums run in rank order, so every reduction is compared
// bit for bit with a serial float sum in that order.
#include "shardtrain/comm/fake_communicator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "point_to_point_checks.h"
#include "shardtrain/core/elapsed.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/rng.h"

namespace st {
namespace {

constexpr uint64_t kSeed = 1234;

float value(int tag, int rank, int64_t i) {
  return static_cast<float>(normal_at(kSeed, static_cast<uint64_t>(tag) * 1000 + rank, static_cast<uint64_t>(i)));
}

// Runs fake::spawn on another thread and fails the test binary if it does not return within `seconds`:
// a hang must not pass for a slow success. Returns what spawn threw, or nullptr.
std::exception_ptr spawn_with_deadline(double seconds, int world, const std::function<void(Communicator&)>& fn,
                                       const fake::WorldOptions& options = {}) {
  auto done = std::make_shared<std::promise<std::exception_ptr>>();
  std::future<std::exception_ptr> result = done->get_future();
  std::thread([=] {
    try {
      fake::spawn(world, fn, options);
      done->set_value(nullptr);
    } catch (...) {
      done->set_value(std::current_exception());
    }
  }).detach();
  if (result.wait_for(std::chrono::duration<double>(seconds)) != std::future_status::ready) {
    std::fprintf(stderr, "fake::spawn(%d ranks) did not return within %.1f s: a collective hangs\n", world, seconds);
    std::abort();
  }
  return result.get();
}

// The first index where got differs from want (bit for bit), or -1.
int64_t first_mismatch(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) return static_cast<int64_t>(i);
  return -1;
}

class FakeCollectiveTest : public ::testing::TestWithParam<std::tuple<int, int64_t>> {
 protected:
  int world() const { return std::get<0>(GetParam()); }
  int64_t count() const { return std::get<1>(GetParam()); }
};

TEST_P(FakeCollectiveTest, AllGatherPlacesRankRAtROffset) {
  const int64_t n = count();
  fake::spawn(world(), [n](Communicator& c) {
    std::vector<float> send(n);
    for (int64_t i = 0; i < n; ++i) send[i] = value(1, c.rank(), i);
    std::vector<float> recv(c.world_size() * n, -999.0f), want(c.world_size() * n);
    for (int r = 0; r < c.world_size(); ++r)
      for (int64_t i = 0; i < n; ++i) want[r * n + i] = value(1, r, i);
    c.all_gather(send.data(), n, recv.data());
    EXPECT_EQ(first_mismatch(recv, want), -1) << "rank " << c.rank();
  });
}

TEST_P(FakeCollectiveTest, AllGatherInPlace) {
  const int64_t n = count();
  fake::spawn(world(), [n](Communicator& c) {
    std::vector<float> recv(c.world_size() * n, std::nanf("")), want(c.world_size() * n);
    for (int64_t i = 0; i < n; ++i) recv[c.rank() * n + i] = value(2, c.rank(), i);
    for (int r = 0; r < c.world_size(); ++r)
      for (int64_t i = 0; i < n; ++i) want[r * n + i] = value(2, r, i);
    c.all_gather(recv.data() + c.rank() * n, n, recv.data());
    EXPECT_EQ(first_mismatch(recv, want), -1) << "rank " << c.rank();
  });
}

TEST_P(FakeCollectiveTest, ReduceScatterSumsMySliceInRankOrder) {
  const int64_t n = count();
  fake::spawn(world(), [n](Communicator& c) {
    const int w = c.world_size();
    std::vector<float> send(w * n);
    for (int64_t j = 0; j < w * n; ++j) send[j] = value(3, c.rank(), j);
    std::vector<float> recv(n, -999.0f), want(n);
    for (int64_t i = 0; i < n; ++i) {
      float acc = value(3, 0, c.rank() * n + i);
      for (int r = 1; r < w; ++r) acc += value(3, r, c.rank() * n + i);
      want[i] = acc;
    }
    c.reduce_scatter(send.data(), n, recv.data());
    EXPECT_EQ(first_mismatch(recv, want), -1) << "rank " << c.rank();
  });
}

TEST_P(FakeCollectiveTest, AllReduceFloatAndDouble) {
  const int64_t n = count();
  fake::spawn(world(), [n](Communicator& c) {
    std::vector<float> f(n), want_f(n);
    std::vector<double> d(n), want_d(n);
    for (int64_t i = 0; i < n; ++i) {
      f[i] = value(4, c.rank(), i);
      d[i] = normal_at(kSeed, 5000 + c.rank(), i);
      float acc_f = value(4, 0, i);
      double acc_d = normal_at(kSeed, 5000, i);
      for (int r = 1; r < c.world_size(); ++r) {
        acc_f += value(4, r, i);
        acc_d += normal_at(kSeed, 5000 + r, i);
      }
      want_f[i] = acc_f;
      want_d[i] = acc_d;
    }
    c.all_reduce(f.data(), n);
    c.all_reduce(d.data(), n);
    EXPECT_EQ(first_mismatch(f, want_f), -1) << "rank " << c.rank();
    int64_t bad_d = -1;
    for (int64_t i = 0; i < n && bad_d < 0; ++i)
      if (std::memcmp(&d[i], &want_d[i], sizeof(double)) != 0) bad_d = i;
    EXPECT_EQ(bad_d, -1) << "rank " << c.rank();
  });
}

TEST_P(FakeCollectiveTest, BroadcastFromEveryRoot) {
  const int64_t bytes = count() == 0 ? 0 : 4 * count() + 3;  // odd: bytes, not floats
  fake::spawn(world(), [bytes](Communicator& c) {
    for (int root = 0; root < c.world_size(); ++root) {
      std::vector<unsigned char> buf(bytes, 0xAB), want(bytes);
      for (int64_t i = 0; i < bytes; ++i) want[i] = static_cast<unsigned char>(random_bits_at(kSeed, 77 + root, i));
      if (c.rank() == root) buf = want;
      c.broadcast(buf.data(), bytes, root);
      EXPECT_TRUE(buf == want) << "rank " << c.rank() << " root " << root;
    }
  });
}

// The FSDP pattern: gather the shards, make a full-size gradient, reduce-scatter it back to the owners.
TEST_P(FakeCollectiveTest, GatherThenReduceScatterRoundTrip) {
  const int64_t n = count();
  fake::spawn(world(), [n](Communicator& c) {
    const int w = c.world_size();
    std::vector<float> shard(n), full(w * n), grad(w * n), grad_shard(n, -1.0f);
    for (int64_t i = 0; i < n; ++i) shard[i] = value(6, c.rank(), i);
    c.all_gather(shard.data(), n, full.data());
    for (int64_t j = 0; j < w * n; ++j) grad[j] = full[j] * static_cast<float>(c.rank() + 1);
    c.reduce_scatter(grad.data(), n, grad_shard.data());
    std::vector<float> want(n);
    for (int64_t i = 0; i < n; ++i) {
      float acc = shard[i] * 1.0f;
      for (int r = 1; r < w; ++r) acc += shard[i] * static_cast<float>(r + 1);
      want[i] = acc;
    }
    EXPECT_EQ(first_mismatch(grad_shard, want), -1) << "rank " << c.rank();
  });
}

INSTANTIATE_TEST_SUITE_P(WorldsAndCounts, FakeCollectiveTest,
                         ::testing::Combine(::testing::Range(1, 9),
                                            ::testing::Values(int64_t{0}, int64_t{1}, int64_t{13}, int64_t{100003})),
                         [](const ::testing::TestParamInfo<std::tuple<int, int64_t>>& info) {
                           return "world" + std::to_string(std::get<0>(info.param)) + "_count" +
                                  std::to_string(std::get<1>(info.param));
                         });

TEST(FakeCommunicatorTest, IdentityAndDefaultTopology) {
  std::mutex mu;
  std::vector<int> ranks;
  fake::spawn(5, [&](Communicator& c) {
    EXPECT_EQ(c.kind(), "fake");
    EXPECT_EQ(c.world_size(), 5);
    EXPECT_EQ(c.node_id(), 0);
    EXPECT_EQ(c.local_rank(), c.rank());
    EXPECT_EQ(c.local_size(), 5);
    std::lock_guard<std::mutex> lock(mu);
    ranks.push_back(c.rank());
  });
  std::sort(ranks.begin(), ranks.end());
  EXPECT_EQ(ranks, (std::vector<int>{0, 1, 2, 3, 4}));
}

TEST(FakeCommunicatorTest, RanksPerNodeFakesSeveralNodes) {
  // 7 ranks, 3 per node: nodes {0,1,2} {3,4,5} {6}; the last node is short.
  const std::vector<int> want_node = {0, 0, 0, 1, 1, 1, 2};
  const std::vector<int> want_local = {0, 1, 2, 0, 1, 2, 0};
  const std::vector<int> want_size = {3, 3, 3, 3, 3, 3, 1};
  std::vector<int> node(7, -1), local(7, -1), size(7, -1);
  fake::spawn(
      7,
      [&](Communicator& c) {
        node[c.rank()] = c.node_id();
        local[c.rank()] = c.local_rank();
        size[c.rank()] = c.local_size();
      },
      fake::WorldOptions{3});
  EXPECT_EQ(node, want_node);
  EXPECT_EQ(local, want_local);
  EXPECT_EQ(size, want_size);
}

TEST(FakeCommunicatorTest, BarrierOrdersWritesAcrossRanks) {
  // Each rank writes its slot, meets the others, and then reads every slot: a barrier that let a rank
  // through early would show a zero. Repeated to give a broken barrier the chance to show it.
  constexpr int kWorld = 6;
  constexpr int kRounds = 200;
  std::vector<std::atomic<int>> slots(kWorld);
  std::atomic<int> bad{0};
  fake::spawn(kWorld, [&](Communicator& c) {
    for (int round = 1; round <= kRounds; ++round) {
      slots[c.rank()].store(round);
      c.barrier();
      for (int r = 0; r < kWorld; ++r)
        if (slots[r].load() < round) bad.fetch_add(1);
      c.barrier();
    }
  });
  EXPECT_EQ(bad.load(), 0);
}

TEST(FakeCommunicatorTest, RankFailingWhileOthersWaitFailsTheWorld) {
  // Ranks 0, 1 and 3 enter an all_reduce; rank 2 throws instead. Everyone must be released with an
  // error naming rank 2, and spawn must rethrow rank 2's own error.
  std::mutex mu;
  std::vector<std::string> peer_errors;
  const auto start = std::chrono::steady_clock::now();
  std::exception_ptr error = spawn_with_deadline(10.0, 4, [&](Communicator& c) {
    std::vector<float> x(8, 1.0f);
    c.all_reduce(x.data(), 8);  // one that succeeds
    if (c.rank() == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let the others block first
      throw Error(ErrorKind::kBadInput, "rank 2 read a broken shard");
    }
    try {
      c.all_reduce(x.data(), 8);
    } catch (const Error& e) {
      std::lock_guard<std::mutex> lock(mu);
      peer_errors.push_back(std::to_string(static_cast<int>(e.kind())) + "|" + e.what());
      throw;
    }
    ADD_FAILURE() << "rank " << c.rank() << " returned from an all_reduce that rank 2 never entered";
  });
  const double seconds = seconds_since(start);
  EXPECT_LT(seconds, 5.0);
  ASSERT_TRUE(error != nullptr);
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);  // the original, not a peer's fault
    EXPECT_STREQ(e.what(), "rank 2 read a broken shard");
  }
  ASSERT_EQ(peer_errors.size(), 3u);
  for (const std::string& m : peer_errors) {
    EXPECT_EQ(m.substr(0, 2), std::to_string(static_cast<int>(ErrorKind::kFault)) + "|") << m;
    EXPECT_NE(m.find("peer rank 2 failed: rank 2 read a broken shard"), std::string::npos) << m;
  }
}

TEST(FakeCommunicatorTest, FailureBeforeAnyCollectiveStopsLaterCollectives) {
  std::atomic<int> completed{0};
  std::exception_ptr error = spawn_with_deadline(10.0, 3, [&](Communicator& c) {
    if (c.rank() == 0) throw std::runtime_error("rank 0 gave up");
    std::vector<float> x(4, 1.0f);
    c.all_reduce(x.data(), 4);
    completed.fetch_add(1);
  });
  ASSERT_TRUE(error != nullptr);
  EXPECT_THROW(std::rethrow_exception(error), std::runtime_error);
  EXPECT_EQ(completed.load(), 0);
}

TEST(FakeCommunicatorTest, RankReturningEarlyFailsItsWaitingPeers) {
  // Rank 3 skips the last barrier: the others would wait forever on MPI; the fake tells them instead.
  std::exception_ptr error = spawn_with_deadline(10.0, 4, [](Communicator& c) {
    c.barrier();
    if (c.rank() != 3) c.barrier();
  });
  ASSERT_TRUE(error != nullptr);
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInternal);
    EXPECT_NE(std::string(e.what()).find("rank 3 has returned"), std::string::npos) << e.what();
  }
}

TEST(FakeCommunicatorTest, MismatchedCollectivesThrowOnEveryRank) {
  std::atomic<int> threw{0};
  std::exception_ptr error = spawn_with_deadline(10.0, 3, [&](Communicator& c) {
    std::vector<float> send(5, 1.0f), recv(15);
    try {
      c.all_gather(send.data(), c.rank() == 1 ? 5 : 4, recv.data());  // rank 1 disagrees on the count
    } catch (const Error& e) {
      if (std::string(e.what()).find("collective mismatch") != std::string::npos) threw.fetch_add(1);
      throw;
    }
  });
  ASSERT_TRUE(error != nullptr);
  EXPECT_EQ(threw.load(), 3);
}

TEST(FakeCommunicatorTest, ArgumentsAreChecked) {
  auto expect_internal = [](const std::function<void(Communicator&)>& fn, const std::string& needle) {
    std::exception_ptr error = spawn_with_deadline(10.0, 2, fn);
    ASSERT_TRUE(error != nullptr) << needle;
    try {
      std::rethrow_exception(error);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInternal);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  // send overlapping recv anywhere but at rank * count
  expect_internal(
      [](Communicator& c) {
        std::vector<float> recv(8);
        c.all_gather(recv.data() + 1, 4, recv.data());
      },
      "overlaps");
  expect_internal(
      [](Communicator& c) {
        std::vector<float> buf(8);
        c.reduce_scatter(buf.data(), 4, buf.data() + 4);
      },
      "overlaps");
  expect_internal(
      [](Communicator& c) {
        char b = 0;
        c.broadcast(&b, 1, 2);
      },
      "root 2");
  expect_internal([](Communicator& c) { c.all_reduce(static_cast<float*>(nullptr), -1); }, "count -1");
}

TEST(FakeCommunicatorTest, CountZeroAcceptsNullBuffers) {
  fake::spawn(3, [](Communicator& c) {
    c.all_gather(nullptr, 0, nullptr);
    c.reduce_scatter(nullptr, 0, nullptr);
    c.all_reduce(static_cast<float*>(nullptr), 0);
    c.all_reduce(static_cast<double*>(nullptr), 0);
    c.broadcast(nullptr, 0, 2);
  });
}

TEST(FakeCommunicatorTest, PointToPointDeliversEveryByteInOrder) {
  for (int n : {2, 3, 5}) {
    std::mutex mu;
    std::vector<std::string> errors;
    fake::spawn(n, [&](Communicator& c) {
      std::vector<std::string> mine = {testing::check_ring_send_recv(c, 0), testing::check_ring_send_recv(c, 4096),
                                       testing::check_send_then_recv(c, 100)};
      std::lock_guard<std::mutex> lock(mu);
      for (const std::string& e : mine)
        if (!e.empty()) errors.push_back(e);
    });
    EXPECT_EQ(errors, std::vector<std::string>{}) << "world " << n;
  }
}

TEST(FakeCommunicatorTest, DupRunsBesideTheOriginalWithTheSameTopology) {
  std::mutex mu;
  std::vector<std::string> errors;
  fake::spawn(
      4,
      [&](Communicator& c) {
        const std::string e = testing::check_dup_beside(c, 50);
        std::lock_guard<std::mutex> lock(mu);
        if (!e.empty()) errors.push_back(e);
      },
      fake::WorldOptions{2});
  EXPECT_EQ(errors, std::vector<std::string>{});
}

// What spawn rethrew: its kind and message, or "none".
std::string outcome(const std::exception_ptr& error) {
  if (!error) return "none";
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    return std::to_string(static_cast<int>(e.kind())) + "|" + e.what();
  }
}

TEST(FakeCommunicatorTest, PointToPointMismatchesAndMissingSendsFailNamingTheRanks) {
  const std::string internal = std::to_string(static_cast<int>(ErrorKind::kInternal)) + "|";
  // A receive of another size than the send: kInternal naming both sizes.
  std::string got = outcome(spawn_with_deadline(10.0, 2, [](Communicator& c) {
    char buf[8] = {};
    if (c.rank() == 0) c.send(buf, 8, 1);
    if (c.rank() == 1) c.recv(buf, 4, 0);
  }));
  EXPECT_EQ(got.rfind(internal, 0), 0u) << got;
  EXPECT_NE(got.find("rank 1 receives 4 bytes from rank 0, which sent 8"), std::string::npos) << got;
  // A sender that returns without sending: the receiver is told instead of waiting forever.
  got = outcome(spawn_with_deadline(10.0, 2, [](Communicator& c) {
    char buf[8] = {};
    if (c.rank() == 1) c.recv(buf, 8, 0);
  }));
  EXPECT_EQ(got.rfind(internal, 0), 0u) << got;
  EXPECT_NE(got.find("rank 1 waits in recv for rank 0, which has returned"), std::string::npos) << got;
  // A failing rank releases a receiver blocked in the dup's mailbox too: spawn rethrows the original.
  got = outcome(spawn_with_deadline(10.0, 2, [](Communicator& c) {
    std::unique_ptr<Communicator> copy = c.dup();
    char buf[8] = {};
    if (c.rank() == 0) throw Error(ErrorKind::kBadInput, "rank 0 gave up");
    copy->recv(buf, 8, 0);
  }));
  EXPECT_EQ(got, std::to_string(static_cast<int>(ErrorKind::kBadInput)) + "|rank 0 gave up");
  // A rank sending to itself.
  got = outcome(spawn_with_deadline(10.0, 2, [](Communicator& c) {
    char buf[1] = {};
    c.send(buf, 1, c.rank());
  }));
  EXPECT_EQ(got.rfind(internal, 0), 0u) << got;
  EXPECT_NE(got.find("cannot exchange with itself"), std::string::npos) << got;
}

TEST(FakeCommunicatorTest, SpawnRejectsEmptyWorld) {
  EXPECT_THROW(fake::spawn(0, [](Communicator&) {}), Error);
}

}  // namespace
}  // namespace st
