#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "shardtrain/comm/communicator.h"
#include "shardtrain/core/error.h"

namespace st {
namespace {

TEST(SoloCommunicatorTest, IsRankZeroOfOne) {
  SoloCommunicator c;
  EXPECT_EQ(c.rank(), 0);
  EXPECT_EQ(c.world_size(), 1);
  EXPECT_EQ(c.node_id(), 0);
  EXPECT_EQ(c.local_rank(), 0);
  EXPECT_EQ(c.local_size(), 1);
  EXPECT_EQ(c.kind(), "solo");
}

TEST(SoloCommunicatorTest, GatherAndReduceScatterCopy) {
  SoloCommunicator c;
  const std::vector<float> send = {1.5f, -2.0f, 3.25f};
  std::vector<float> recv(3, 0.0f);
  c.all_gather(send.data(), 3, recv.data());
  EXPECT_EQ(recv, send);
  std::vector<float> recv2(3, 0.0f);
  c.reduce_scatter(send.data(), 3, recv2.data());
  EXPECT_EQ(recv2, send);
  std::vector<float> in_place = send;
  c.all_gather(in_place.data(), 3, in_place.data());
  EXPECT_EQ(in_place, send);
}

TEST(SoloCommunicatorTest, AllReduceAndBroadcastLeaveDataAlone) {
  SoloCommunicator c;
  std::vector<float> f = {1.0f, 2.0f};
  std::vector<double> d = {3.0, -4.0};
  c.all_reduce(f.data(), 2);
  c.all_reduce(d.data(), 2);
  EXPECT_EQ(f, (std::vector<float>{1.0f, 2.0f}));
  EXPECT_EQ(d, (std::vector<double>{3.0, -4.0}));
  char bytes[3] = {'a', 'b', 'c'};
  c.broadcast(bytes, 3, 0);
  EXPECT_EQ(std::string(bytes, 3), "abc");
  c.barrier();
}

TEST(SoloCommunicatorTest, CountZeroAndBadArguments) {
  SoloCommunicator c;
  c.all_gather(nullptr, 0, nullptr);
  c.reduce_scatter(nullptr, 0, nullptr);
  c.all_reduce(static_cast<float*>(nullptr), 0);
  char b = 0;
  EXPECT_THROW(c.broadcast(&b, 1, 1), Error);  // there is no rank 1
  float x[4] = {};
  EXPECT_THROW(c.all_gather(x + 1, 2, x), Error);  // overlapping, not in place
  EXPECT_THROW(c.all_reduce(x, -1), Error);
}

TEST(SoloCommunicatorTest, PointToPointIsRefusedAndDupIsAnotherSolo) {
  SoloCommunicator c;
  char b[2] = {};
  for (const auto& call : std::vector<std::function<void()>>{[&] { c.send(b, 1, 0); }, [&] { c.recv(b, 1, 0); },
                                                             [&] { c.send_recv(b, 1, 0, b + 1, 1, 0); }}) {
    try {
      call();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInternal);
      EXPECT_NE(std::string(e.what()).find("the solo communicator has no point-to-point"), std::string::npos)
          << e.what();
    }
  }
  const std::unique_ptr<Communicator> copy = c.dup();
  EXPECT_EQ(copy->kind(), "solo");
  EXPECT_EQ(copy->world_size(), 1);
}

}  // namespace
}  // namespace st
