#include "shardtrain/shard/schedule_runner.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "shardtrain/core/error.h"

namespace st {
namespace {

// Records every hook as text.
class Recorder : public ScheduleExecutor {
 public:
  std::vector<std::string> calls;
  std::vector<size_t> prefetched_at;
  void prefetch(const std::vector<ScheduleOp>&, size_t at) override { prefetched_at.push_back(at); }
  void gather(int unit, size_t at) override {
    calls.push_back("gather " + std::to_string(unit) + "@" + std::to_string(at));
  }
  void embedding_forward() override { calls.push_back("embedding_forward"); }
  void block_forward(int unit) override { calls.push_back("block_forward " + std::to_string(unit)); }
  void head(int unit) override { calls.push_back("head " + std::to_string(unit)); }
  void block_backward(int unit) override { calls.push_back("block_backward " + std::to_string(unit)); }
  void embedding_backward() override { calls.push_back("embedding_backward"); }
  void reduce_scatter(int unit) override { calls.push_back("reduce_scatter " + std::to_string(unit)); }
  void release(int unit) override { calls.push_back("release " + std::to_string(unit)); }
};

TEST(ScheduleRunner, CallsTheHooksOfEveryOpInOrder) {
  Recorder r;
  run_schedule(training_schedule(1, /*reshard_after_forward=*/true, /*keep_embedding=*/true), r);
  const std::vector<std::string> want = {"gather 0@0",       "embedding_forward", "gather 1@2",
                                         "block_forward 1",  "release 1",         "gather 2@5",
                                         "head 2",           "release 0",         "reduce_scatter 2",
                                         "release 2",        "gather 1@10",       "block_backward 1",
                                         "reduce_scatter 1", "release 1",         "embedding_backward",
                                         "reduce_scatter 0"};
  EXPECT_EQ(r.calls, want);
  ASSERT_EQ(r.prefetched_at.size(), 16u);  // once before each op, with its index
  for (size_t i = 0; i < r.prefetched_at.size(); ++i) EXPECT_EQ(r.prefetched_at[i], i);
}

TEST(ScheduleRunner, RunsEveryScheduleTheBackendsRun) {
  for (int layers : {1, 2, 5})
    for (bool reshard : {true, false})
      for (bool keep : {true, false}) {
        Recorder t, e;
        EXPECT_NO_THROW(run_schedule(training_schedule(layers, reshard, keep), t));
        EXPECT_NO_THROW(run_schedule(eval_schedule(layers, keep), e));
        EXPECT_EQ(t.calls.size(), training_schedule(layers, reshard, keep).size());
      }
}

// A schedule that breaks its own order is refused, naming the op.
void expect_refused(const std::vector<ScheduleOp>& s, const std::string& what) {
  Recorder r;
  try {
    run_schedule(s, r);
    FAIL() << "accepted a schedule that should fail with: " << what;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(ScheduleRunner, RefusesASchedulesBrokenOrder) {
  expect_refused({{OpKind::kForward, 0}}, "forward 0: unit 0 is not gathered");
  expect_refused({{OpKind::kGather, 1}, {OpKind::kGather, 1}}, "gather 1: unit 1 is already gathered");
  expect_refused({{OpKind::kReduceScatter, 3}}, "reduce-scatter 3: unit 3 has no gradient");
  expect_refused({{OpKind::kRelease, 2}}, "release 2: unit 2 is not gathered");
  expect_refused({{OpKind::kGather, 2}, {OpKind::kHeadForwardBackward, 2}},
                 "the tied embedding (unit 0) is not gathered");
  expect_refused({{OpKind::kGather, 1}}, "the schedule ends with unit 1 gathered");
  std::vector<ScheduleOp> no_rs = training_schedule(1);
  no_rs.pop_back();  // the embedding's reduce-scatter
  expect_refused(no_rs, "unit 0's gradient not reduce-scattered");
}

}  // namespace
}  // namespace st
