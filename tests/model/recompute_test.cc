#include "shardtrain/model/recompute.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../common/config_problem.h"
#include "shardtrain/core/config.h"

namespace st {
namespace {

// Which blocks recompute and which set of activations each uses, over 4 blocks.
TEST(Recompute, NoneAllAndTheFirstN) {
  const Recompute none(false), all(true), two = Recompute::first(2);
  EXPECT_EQ(none.sets(4), 4);
  EXPECT_EQ(all.sets(4), 1);
  EXPECT_EQ(two.sets(4), 3);  // one shared by blocks 0 and 1, one each for 2 and 3
  const std::vector<int> none_sets = {0, 1, 2, 3}, all_sets = {0, 0, 0, 0}, two_sets = {0, 0, 1, 2};
  for (int layer = 0; layer < 4; ++layer) {
    EXPECT_FALSE(none.of(layer));
    EXPECT_TRUE(all.of(layer));
    EXPECT_EQ(two.of(layer), layer < 2);
    EXPECT_EQ(none.set_of(layer), none_sets[static_cast<size_t>(layer)]);
    EXPECT_EQ(all.set_of(layer), all_sets[static_cast<size_t>(layer)]);
    EXPECT_EQ(two.set_of(layer), two_sets[static_cast<size_t>(layer)]);
  }
  EXPECT_EQ(none.count(4), 0);
  EXPECT_EQ(all.count(4), 4);
  EXPECT_EQ(two.count(4), 2);
  // The first n of as many blocks is all of them; the first 0, none; a model without blocks holds no set.
  EXPECT_EQ(Recompute::first(4).sets(4), 1);
  EXPECT_EQ(Recompute::first(0).sets(4), 4);
  EXPECT_EQ(all.sets(0), 0);
  EXPECT_EQ(none.sets(0), 0);
}

TEST(Recompute, FromTheConfig) {
  TrainConfig t;
  EXPECT_EQ(recompute_of(t).count(12), 0);
  t.recompute = true;
  EXPECT_EQ(recompute_of(t).count(12), 12);
  t.recompute_blocks = 5;
  EXPECT_EQ(recompute_of(t).count(12), 5);
  EXPECT_TRUE(recompute_of(t).of(4));
  EXPECT_FALSE(recompute_of(t).of(5));
}

TEST(Recompute, TheKeysAreCheckedBeforeAnythingRuns) {
  const auto problem = testing::config_problem;
  EXPECT_EQ(problem({"--model.n_layer=12", "--train.recompute=true", "--train.recompute_blocks=12"}), "");
  EXPECT_EQ(problem({"--model.n_layer=12", "--train.recompute=true", "--train.recompute_blocks=1"}), "");
  testing::expect_refused(
      {{{"--model.n_layer=12", "--train.recompute=true", "--train.recompute_blocks=13"},
        "train.recompute_blocks must be in [0, model.n_layer = 12] (got 13)"},
       {{"--train.recompute=true", "--train.recompute_blocks=-1"}, "train.recompute_blocks must be in [0, "},
       // A count without the recompute it limits is refused, not ignored.
       {{"--model.n_layer=12", "--train.recompute_blocks=3"},
        "train.recompute_blocks (3) applies to train.recompute=true (got false)"}});
}

}  // namespace
}  // namespace st
