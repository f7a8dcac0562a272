#include "shardtrain/data/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "data_test_util.h"

namespace st {
namespace {

using testing::bad_input_message;
using testing::contains;

// token[i] == i: a window is recognised by its first input, w = inputs[b*T] / T.
class IotaSource final : public TokenSource {
 public:
  explicit IotaSource(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  void read(int64_t offset, int64_t count, int32_t* out) const override {
    ASSERT_TRUE(offset >= 0 && count >= 0 && offset + count <= n_) << offset << " + " << count << " of " << n_;
    for (int64_t k = 0; k < count; ++k) out[k] = static_cast<int32_t>(offset + k);
  }
  std::string describe() const override { return "iota"; }
  int vocab_size() const override { return 1 << 30; }

 private:
  int64_t n_;
};

struct Batch {
  std::vector<int32_t> inputs, targets;
};

Batch fill(const Sampler& s, int64_t step, int64_t micro_step) {
  const size_t n = static_cast<size_t>(s.options().micro_batch * s.options().T);
  Batch b{std::vector<int32_t>(n, -1), std::vector<int32_t>(n, -1)};
  s.fill(step, micro_step, b.inputs.data(), b.targets.data());
  return b;
}

// The windows of a batch, recovered from the inputs of an IotaSource.
std::vector<int64_t> windows_of(const Sampler& s, const Batch& b) {
  const int T = s.options().T;
  std::vector<int64_t> w;
  for (int64_t i = 0; i < s.options().micro_batch; ++i) w.push_back(b.inputs[i * T] / T);
  return w;
}

TEST(Sampler, NumWindowsIsSizeMinusOneOverT) {
  IotaSource a(101), b(100), c(11);
  EXPECT_EQ(Sampler(a, {10, 1, 0, 1, 1, 0, false}).num_windows(), 10);
  EXPECT_EQ(Sampler(b, {10, 1, 0, 1, 1, 0, false}).num_windows(), 9);
  EXPECT_EQ(Sampler(c, {10, 1, 0, 1, 1, 0, false}).num_windows(), 1);
}

TEST(Sampler, TargetsAreInputsShiftedByOneAndWindowsAreAligned) {
  IotaSource src(1000);
  for (bool shuffle : {false, true}) {
    Sampler s(src, {16, 4, 1, 3, 2, 99, shuffle});
    for (int64_t step = 0; step < 5; ++step) {
      for (int64_t m = 0; m < 2; ++m) {
        Batch b = fill(s, step, m);
        for (int64_t i = 0; i < 4; ++i) {
          const int64_t w = s.window_of(s.global_index(step, m, i));
          for (int t = 0; t < 16; ++t) {
            ASSERT_EQ(b.inputs[i * 16 + t], w * 16 + t) << "shuffle " << shuffle << " b " << i << " t " << t;
            ASSERT_EQ(b.targets[i * 16 + t], w * 16 + t + 1);
          }
        }
      }
    }
  }
}

TEST(Sampler, SequentialOrderIsExactlyAsDocumented) {
  // T = 4, 29 tokens: W = 7 windows; window w is tokens [4w, 4w + 5).
  IotaSource src(29);
  // world 2, rank 1, micro_batch 3, accum 2: g = ((step*2 + m)*2 + 1)*3 + b.
  Sampler s(src, {4, 3, 1, 2, 2, 1234, false});
  ASSERT_EQ(s.num_windows(), 7);
  EXPECT_EQ(s.sequences_per_step(), 12);
  EXPECT_EQ(s.global_index(0, 0, 0), 3);
  EXPECT_EQ(s.global_index(0, 1, 2), 11);
  EXPECT_EQ(s.global_index(2, 1, 1), 34);
  // step 0, m 0: g 3,4,5 -> windows 3,4,5.  step 0, m 1: g 9,10,11 -> 2,3,4 (wrapped past the epoch end).
  EXPECT_EQ(windows_of(s, fill(s, 0, 0)), (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(windows_of(s, fill(s, 0, 1)), (std::vector<int64_t>{2, 3, 4}));
  // step 2, m 1: g 33,34,35 -> 5,6,0.
  EXPECT_EQ(windows_of(s, fill(s, 2, 1)), (std::vector<int64_t>{5, 6, 0}));
  Batch b = fill(s, 2, 1);
  EXPECT_EQ(std::vector<int32_t>(b.inputs.begin() + 4, b.inputs.begin() + 8), (std::vector<int32_t>{24, 25, 26, 27}));
  EXPECT_EQ(std::vector<int32_t>(b.targets.begin() + 4, b.targets.begin() + 8), (std::vector<int32_t>{25, 26, 27, 28}));
  // The seed does not matter without shuffling.
  Sampler other(src, {4, 3, 1, 2, 2, 1, false});
  EXPECT_EQ(fill(other, 2, 1).inputs, b.inputs);
}

TEST(Sampler, ShuffledOrderIsAPermutationWithinEachEpoch) {
  IotaSource src(37 * 8 + 1);  // T = 8: W = 37 windows, a size that is not a power of two
  Sampler s(src, {8, 5, 0, 1, 1, 2024, true});
  const int64_t W = s.num_windows();
  ASSERT_EQ(W, 37);
  std::vector<std::vector<int64_t>> epochs(4);
  for (int64_t g = 0; g < 4 * W; ++g) epochs[g / W].push_back(s.window_of(g));
  for (int e = 0; e < 4; ++e) {
    std::vector<int64_t> sorted = epochs[e];
    std::sort(sorted.begin(), sorted.end());
    for (int64_t w = 0; w < W; ++w) ASSERT_EQ(sorted[w], w) << "epoch " << e;
  }
  EXPECT_NE(epochs[0], epochs[1]);  // a fresh order every epoch
  EXPECT_NE(epochs[1], epochs[2]);
  int in_place = 0;
  for (int64_t i = 0; i < W; ++i) in_place += epochs[0][i] == i;
  EXPECT_LT(in_place, 8);  // not the sequential order

  // fill() reads exactly those windows, spanning an epoch boundary: steps 7 and 8 cover g = 35..44.
  for (int64_t step : {7, 8}) {
    std::vector<int64_t> expect;
    for (int64_t b = 0; b < 5; ++b) expect.push_back(epochs[(step * 5 + b) / W][(step * 5 + b) % W]);
    EXPECT_EQ(windows_of(s, fill(s, step, 0)), expect) << "step " << step;
  }
}

TEST(Sampler, DifferentSeedsGiveDifferentOrders) {
  IotaSource src(200 * 4 + 1);
  Sampler a(src, {4, 1, 0, 1, 1, 1, true});
  Sampler b(src, {4, 1, 0, 1, 1, 2, true});
  Sampler a2(src, {4, 1, 0, 1, 1, 1, true});
  int differ = 0;
  for (int64_t g = 0; g < 200; ++g) {
    differ += a.window_of(g) != b.window_of(g);
    ASSERT_EQ(a.window_of(g), a2.window_of(g));  // a pure function of the options
  }
  EXPECT_GT(differ, 180);
}

// world = 1 with micro_batch 4 and world = 2 with micro_batch 2 (or micro_batch 1 and accum 2) cover the
// same global batch of 4: concatenating the ranks' micro-batches must reproduce world = 1, in order.
TEST(Sampler, RanksSplitTheSameGlobalBatchAsOneProcess) {
  IotaSource src(23 * 8 + 5);  // W = 23: steps cross epoch boundaries
  for (bool shuffle : {false, true}) {
    Sampler one(src, {8, 4, 0, 1, 1, 77, shuffle});
    Sampler r0(src, {8, 2, 0, 2, 1, 77, shuffle});
    Sampler r1(src, {8, 2, 1, 2, 1, 77, shuffle});
    Sampler q0(src, {8, 1, 0, 2, 2, 77, shuffle});  // accum 2: micro-step 0 is ranks 0,1; then micro-step 1
    Sampler q1(src, {8, 1, 1, 2, 2, 77, shuffle});
    for (int64_t step = 0; step < 30; ++step) {
      Batch whole = fill(one, step, 0);
      std::vector<int32_t> split = fill(r0, step, 0).inputs;
      std::vector<int32_t> second = fill(r1, step, 0).inputs;
      split.insert(split.end(), second.begin(), second.end());
      ASSERT_EQ(split, whole.inputs) << "shuffle " << shuffle << " step " << step;

      std::vector<int32_t> accum;
      for (int64_t m = 0; m < 2; ++m) {
        for (const Sampler* s : {&q0, &q1}) {
          std::vector<int32_t> part = fill(*s, step, m).inputs;
          accum.insert(accum.end(), part.begin(), part.end());
        }
      }
      ASSERT_EQ(accum, whole.inputs) << "shuffle " << shuffle << " step " << step;
    }
  }
}

TEST(Sampler, EvalIsSequentialPerRankAndIdenticalEveryPass) {
  IotaSource src(10 * 4 + 1);                 // W = 10
  Sampler r1(src, {4, 3, 1, 2, 1, 5, true});  // shuffle and seed do not affect evaluation
  Sampler r1_other_seed(src, {4, 3, 1, 2, 1, 6, true});
  // batch i, rank 1, world 2, micro_batch 3: windows ((2i + 1)*3 + b) % 10.
  auto eval = [](const Sampler& s, int64_t i) {
    Batch b{std::vector<int32_t>(12), std::vector<int32_t>(12)};
    s.fill_eval(i, b.inputs.data(), b.targets.data());
    return b;
  };
  EXPECT_EQ(windows_of(r1, eval(r1, 0)), (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(windows_of(r1, eval(r1, 1)), (std::vector<int64_t>{9, 0, 1}));
  EXPECT_EQ(windows_of(r1, eval(r1, 2)), (std::vector<int64_t>{5, 6, 7}));
  EXPECT_EQ(r1.eval_window(2, 2), 7);
  Batch first = eval(r1, 1);
  EXPECT_EQ(eval(r1, 1).inputs, first.inputs);
  EXPECT_EQ(eval(r1_other_seed, 1).inputs, first.inputs);
  for (size_t k = 0; k < first.inputs.size(); ++k) EXPECT_EQ(first.targets[k], first.inputs[k] + 1);
}

TEST(Sampler, SourceShorterThanOneWindowIsBadInput) {
  IotaSource src(64);
  const std::string msg = bad_input_message([&] { Sampler(src, {64, 1, 0, 1, 1, 0, true}); });
  EXPECT_TRUE(contains(msg, "holds 64 tokens")) << msg;
  EXPECT_TRUE(contains(msg, "model.seq_len + 1 = 65")) << msg;
}

}  // namespace
}  // namespace st
