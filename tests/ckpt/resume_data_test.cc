// check_data_order: which differences between a checkpoint's data order and a resuming run's are refused, and
// what the log says about where the data continues.
#include "shardtrain/ckpt/resume_data.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ckpt_test_util.h"

namespace st {
namespace {

using testing::bad_input_message;
using testing::contains;

const std::string kWhere = "/ckpt/step_00000010";
const DataOrder kSaved{16, 1337, true, 1000};

TEST(CheckDataOrder, TheSameOrderSaysWhereTheRunContinues) {
  const std::vector<std::string> lines = check_data_order(kSaved, 10, kSaved, false, kWhere);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0],
            "data: the checkpoint trained on global sequences [0, 160) (step 10 x 16), shuffled with train.seed 1337; "
            "this run continues at step 11 from global sequence 160 = epoch 0, position 160 of 1000 windows, shuffled "
            "with train.seed 1337");
}

TEST(CheckDataOrder, EachDifferenceIsRefusedNamingTheKeyAndBothValues) {
  const DataOrder run{32, 7, false, 999};
  const std::string msg = bad_input_message([&] { check_data_order(kSaved, 10, run, false, kWhere); });
  EXPECT_TRUE(contains(msg, kWhere + ": resuming would change the data order: train.global_batch is 16 in the "
                                     "checkpoint, 32 in this run; data.shuffle is true in the checkpoint, false in "
                                     "this run; train.seed is 1337 in the checkpoint, 7 in this run; the training "
                                     "data holds 1000 windows in the checkpoint, 999 in this run"))
      << msg;
  EXPECT_TRUE(contains(msg, "set ckpt.allow_data_change = true")) << msg;
}

// Unshuffled on both sides, the seed orders nothing: not a difference.
TEST(CheckDataOrder, TheSeedOfAnUnshuffledOrderIsNotADifference) {
  const DataOrder saved{16, 1337, false, 1000};
  const DataOrder run{16, 7, false, 1000};
  const std::vector<std::string> lines = check_data_order(saved, 10, run, false, kWhere);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_TRUE(contains(lines[0], "in file order (data.shuffle false)")) << lines[0];
}

TEST(CheckDataOrder, AnAllowedChangeSaysWhatIsSkippedOrRepeated) {
  DataOrder run = kSaved;
  run.global_batch = 8;  // step 10 now starts at sequence 80: [80, 160) again
  std::vector<std::string> lines = check_data_order(kSaved, 10, run, true, kWhere);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "ckpt.allow_data_change: train.global_batch is 16 in the checkpoint, 8 in this run");
  EXPECT_TRUE(contains(lines[1], "this run continues at step 11 from global sequence 80 = epoch 0")) << lines[1];
  EXPECT_EQ(lines[2], "data: global sequences [80, 160) of the order are trained on again");

  run.global_batch = 250;  // sequence 2500: epoch 2, position 500
  lines = check_data_order(kSaved, 10, run, true, kWhere);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_TRUE(contains(lines[1], "from global sequence 2500 = epoch 2, position 500 of 1000 windows")) << lines[1];
  EXPECT_EQ(lines[2], "data: global sequences [160, 2500) of the order are skipped");

  run = kSaved;
  run.seed = 8;
  lines = check_data_order(kSaved, 10, run, true, kWhere);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "ckpt.allow_data_change: train.seed is 1337 in the checkpoint, 8 in this run");
  EXPECT_TRUE(contains(lines[2], "data: the order itself changed")) << lines[2];
}

// A checkpoint that records no window count: the data's size is not compared, and the log says so.
TEST(CheckDataOrder, AnUnrecordedWindowCountIsNotComparedAndNoted) {
  const DataOrder saved{16, 1337, true, 0};
  const std::vector<std::string> lines = check_data_order(saved, 10, kSaved, false, kWhere);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[1], kWhere +
                          " does not record its training data's window count (written by a build that did not record "
                          "it): a change of the training data itself is not detected");
}

}  // namespace
}  // namespace st
