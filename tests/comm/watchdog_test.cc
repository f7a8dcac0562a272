#include "shardtrain/comm/watchdog.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <memory>
#include <string>
#include <thread>

#include "shardtrain/comm/fake_communicator.h"
#include "shardtrain/comm/watched_communicator.h"

namespace st {
namespace {

// The thread polls every 100 s: the tests drive the check themselves (check_now), so nothing depends on timing
// except "an op begun 50 ms ago is older than a 10 ms deadline".
constexpr double kNoPoll = 100;

struct Recorder {
  std::vector<std::string> events;  // hooks and the expiry, in the order they ran
  Watchdog::ExpiryAction action() {
    return [this](const std::string& m) { events.push_back("expired: " + m); };
  }
};

void wait_past(double seconds) { std::this_thread::sleep_for(std::chrono::duration<double>(seconds * 5)); }

TEST(Watchdog, CompletedOpsNeverExpireAndAreNumberedPerChannel) {
  Recorder rec;
  Watchdog wd(0.01, 0, rec.action(), kNoPoll);
  const int a = wd.channel("world");
  const int b = wd.channel("world/1");
  EXPECT_EQ(wd.last_completed(a), "none");
  wd.end(a, wd.begin(a, "all_gather", 8));
  wd.end(a, wd.begin(a, "barrier", 0));
  wd.end(b, wd.begin(b, "all_reduce", 1));
  wait_past(0.01);
  wd.check_now();
  EXPECT_TRUE(rec.events.empty());
  EXPECT_EQ(wd.outstanding(), 0u);
  EXPECT_EQ(wd.last_completed(a), "#2 barrier");
  EXPECT_EQ(wd.last_completed(b), "#1 all_reduce");
}

TEST(Watchdog, AnOpPastItsDeadlineRunsTheHooksThenTheExpiryOnceNamingOpSequenceAndLastCompleted) {
  Recorder rec;
  Watchdog wd(0.01, 3, rec.action(), kNoPoll);
  const int world = wd.channel("world");
  wd.end(world, wd.begin(world, "barrier", 0));
  const uint64_t seq = wd.begin(world, "all_reduce", 4096);
  EXPECT_EQ(seq, 2u);
  wd.add_abort_hook([&] { rec.events.push_back("hook 1"); });
  const int removed = wd.add_abort_hook([&] { rec.events.push_back("removed hook"); });
  wd.remove_abort_hook(removed);
  wait_past(0.01);
  wd.check_now();
  wd.check_now();  // fires once
  ASSERT_EQ(rec.events.size(), 2u);
  EXPECT_EQ(rec.events[0], "hook 1");
  EXPECT_NE(rec.events[1].find("expired: watchdog: rank 3: all_reduce #2 on communicator 'world' (count 4096) has "
                               "not completed after 0 s (dist.timeout_s = 0.01); last completed there: #1 barrier."),
            std::string::npos)
      << rec.events[1];
  EXPECT_NE(rec.events[1].find("exiting with code 75"), std::string::npos) << rec.events[1];
}

TEST(Watchdog, TheOldestOpOfAllChannelsIsTheOneNamed) {
  Recorder rec;
  Watchdog wd(0.01, 0, rec.action(), kNoPoll);
  const int world = wd.channel("world");
  const int nccl = wd.channel("nccl world");
  wd.begin_async(nccl, "reduce_scatter", 10, [] { return false; });
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  wd.begin(world, "all_reduce", 1);
  wait_past(0.01);
  wd.check_now();
  ASSERT_EQ(rec.events.size(), 1u);
  EXPECT_NE(rec.events[0].find("reduce_scatter #1 on communicator 'nccl world' (count 10)"), std::string::npos)
      << rec.events[0];
}

TEST(Watchdog, AsyncOpsAreDoneWhenTheirProbeSaysSoAndTheProbeIsNotAskedAgain) {
  Recorder rec;
  Watchdog wd(0.01, 0, rec.action(), kNoPoll);
  const int c = wd.channel("nccl world");
  int asked = 0;
  bool finished = false;
  wd.begin_async(c, "all_gather", 100, [&] {
    ++asked;
    return finished;
  });
  wd.check_now();  // not yet late, not yet done
  EXPECT_EQ(asked, 1);
  EXPECT_EQ(wd.outstanding(), 1u);
  finished = true;
  wait_past(0.01);
  wd.check_now();
  wd.check_now();
  EXPECT_EQ(asked, 2);
  EXPECT_EQ(wd.outstanding(), 0u);
  EXPECT_EQ(wd.last_completed(c), "#1 all_gather");
  EXPECT_TRUE(rec.events.empty());
}

TEST(Watchdog, ZeroTimeoutNumbersOpsButNeverExpires) {
  Recorder rec;
  Watchdog wd(0, 0, rec.action());
  EXPECT_FALSE(wd.enabled());
  const int c = wd.channel("world");
  wd.begin(c, "barrier", 0);
  wd.begin(c, "all_reduce", 1);
  wd.check_now();
  EXPECT_EQ(wd.outstanding(), 0u);
  EXPECT_EQ(wd.last_completed(c), "#2 all_reduce");
  EXPECT_TRUE(rec.events.empty());
}

TEST(Watchdog, ItsOwnThreadFiresWithoutHelp) {
  std::promise<std::string> fired;
  Watchdog wd(0.05, 1, [&](const std::string& m) { fired.set_value(m); }, 0.01);
  const int c = wd.channel("world");
  wd.begin(c, "broadcast", 128);
  std::future<std::string> f = fired.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_NE(f.get().find("rank 1: broadcast #1 on communicator 'world' (count 128)"), std::string::npos);
}

TEST(Watchdog, AHookThatHangsIsAbandonedAfterItsGraceAndTheExpiryStillRuns) {
  Recorder rec;
  Watchdog wd(0.01, 0, rec.action(), kNoPoll);
  wd.set_abort_grace(0.05);
  auto never = std::make_shared<std::promise<void>>();  // kept alive by the abandoned hook's thread
  wd.add_abort_hook([never] { never->get_future().wait(); });
  wd.add_abort_hook([&] { rec.events.push_back("second hook"); });
  const int c = wd.channel("world");
  wd.begin(c, "barrier", 0);
  wait_past(0.01);
  wd.check_now();
  ASSERT_EQ(rec.events.size(), 2u);
  EXPECT_EQ(rec.events[0], "second hook");
  EXPECT_EQ(rec.events[1].rfind("expired: watchdog: rank 0: barrier #1", 0), 0u) << rec.events[1];
  never->set_value();
}

// A communicator whose barrier blocks until released: a peer that never arrives.
class StuckBarrier final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  int node_id() const override { return 0; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  std::string kind() const override { return "stuck"; }
  void all_gather(const float* send, int64_t count, float* recv) override { solo_.all_gather(send, count, recv); }
  void reduce_scatter(const float* send, int64_t count, float* recv) override { solo_.reduce_scatter(send, count, recv); }
  void all_reduce(float* buf, int64_t count) override {}
  void all_reduce(double* buf, int64_t count) override {}
  void broadcast(void* buf, int64_t bytes, int root) override {}
  void barrier() override { release.get_future().wait(); }
  void recv(void*, int64_t, int) override { release.get_future().wait(); }  // a peer that never sends
  std::unique_ptr<Communicator> split(int, int) override { return std::make_unique<SoloCommunicator>(); }
  std::promise<void> release;

 private:
  SoloCommunicator solo_;
};

TEST(WatchedCommunicator, ForwardsEveryCollectiveAndNamesItsSplits) {
  Recorder rec;
  Watchdog wd(0.01, 0, rec.action(), kNoPoll);
  SoloCommunicator solo;
  WatchedCommunicator w(solo, wd, "world");
  EXPECT_EQ(w.watchdog(), &wd);
  EXPECT_EQ(w.name(), "world");
  EXPECT_EQ(w.kind(), "solo");
  float x[3] = {1, 2, 3};
  float y[3] = {};
  w.all_gather(x, 3, y);
  EXPECT_EQ(y[2], 3.0f);
  w.reduce_scatter(x, 3, y);
  double d = 2.5;
  w.all_reduce(&d, 1);
  EXPECT_EQ(d, 2.5);
  w.barrier();
  std::unique_ptr<Communicator> sub = w.split(1, 0);
  EXPECT_EQ(sub->name(), "world/1");
  EXPECT_EQ(sub->watchdog(), &wd);
  sub->barrier();
  wait_past(0.01);
  wd.check_now();
  EXPECT_TRUE(rec.events.empty());
  EXPECT_EQ(wd.outstanding(), 0u);
}

TEST(WatchedCommunicator, ACollectiveThatNeverReturnsExpiresNamingIt) {
  Recorder rec;
  Watchdog wd(0.01, 0, rec.action(), kNoPoll);
  StuckBarrier stuck;
  WatchedCommunicator w(stuck, wd, "world");
  double d = 1;
  w.all_reduce(&d, 1);
  std::thread waiter([&] { w.barrier(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  wd.check_now();
  stuck.release.set_value();
  waiter.join();
  ASSERT_EQ(rec.events.size(), 1u);
  EXPECT_NE(rec.events[0].find("barrier #2 on communicator 'world' (count 0) has not completed"), std::string::npos)
      << rec.events[0];
  EXPECT_NE(rec.events[0].find("last completed there: #1 all_reduce"), std::string::npos) << rec.events[0];
}

// Point-to-point calls and dup() go through the watchdog like the collectives: numbered on their channel, the dup on
// a channel of its own named after the original.
TEST(WatchedCommunicator, ForwardsPointToPointAndNamesItsDup) {
  std::vector<std::string> last(2), dup_last(2), names(2);
  std::vector<char> got(2);
  fake::spawn(2, [&](Communicator& inner) {
    Watchdog wd(0, inner.rank());
    WatchedCommunicator w(inner, wd, "world");
    const int me = w.rank(), peer = 1 - me;
    const char mine = static_cast<char>('a' + me);
    w.send_recv(&mine, 1, peer, &got[static_cast<size_t>(me)], 1, peer);
    if (me == 0) w.send(&mine, 1, 1);
    if (me == 1) w.recv(&got[1], 1, 0);
    std::unique_ptr<Communicator> copy = w.dup();
    names[static_cast<size_t>(me)] = copy->name();
    copy->barrier();
    last[static_cast<size_t>(me)] = wd.last_completed(0);
    dup_last[static_cast<size_t>(me)] = wd.last_completed(1);
  });
  EXPECT_EQ(got, (std::vector<char>{'b', 'a'}));
  EXPECT_EQ(last, (std::vector<std::string>{"#3 dup", "#3 dup"}));
  EXPECT_EQ(dup_last, (std::vector<std::string>{"#1 barrier", "#1 barrier"}));
  EXPECT_EQ(names, (std::vector<std::string>{"world/dup", "world/dup"}));
}

TEST(WatchedCommunicator, ARecvThatNeverCompletesExpiresNamingIt) {
  Recorder rec;
  Watchdog wd(0.01, 0, rec.action(), kNoPoll);
  StuckBarrier stuck;
  WatchedCommunicator w(stuck, wd, "world/dup");
  char c = 0;
  std::thread waiter([&] { w.recv(&c, 1, 0); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  wd.check_now();
  stuck.release.set_value();
  waiter.join();
  ASSERT_EQ(rec.events.size(), 1u);
  EXPECT_NE(rec.events[0].find("recv #1 on communicator 'world/dup' (count 1) has not completed"), std::string::npos)
      << rec.events[0];
}

}  // namespace
}  // namespace st
