// The amax history of train.fp8=delayed (model/fp8_history.h) and the operations it runs on (kernels/fp8_history.h):
// what a cast scales by after each push, the ring's length, a skipped step's maxima dropped, evaluation's casts
// recording nothing, the ranks' maxima reduced, and entries that round-trip at any length.
#include "shardtrain/model/fp8_history.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "shardtrain/core/error.h"
#include "shardtrain/kernels/fp8_history.h"

namespace st {
namespace {

unsigned bits(float v) {
  unsigned b = 0;
  std::memcpy(&b, &v, sizeof(b));
  return b;
}

// One site's step: casts of x that took the values in `x`, of W that took `w`, of dy that took `dy`; then the push.
void step(Fp8AmaxHistory* h, std::vector<float> x, float w, float dy) {
  for (float v : x) h->pick(fp8_history_index(0, kFp8X), bits(v), true);
  h->pick(fp8_history_index(0, kFp8W), bits(w), true);
  h->pick(fp8_history_index(0, kFp8Dy), bits(dy), true);
  h->push(h->step_maxima());
}

TEST(Fp8AmaxHistory, ScalesByTheLargestOfTheLastLengthSteps) {
  Fp8AmaxHistory h(1, 2);
  const int64_t x = fp8_history_index(0, kFp8X), w = fp8_history_index(0, kFp8W), dy = fp8_history_index(0, kFp8Dy);
  EXPECT_EQ(h.filled(), 0);
  // Empty: the cast takes its own maximum, and records it.
  EXPECT_EQ(h.pick(x, bits(4.0f), true), bits(4.0f));
  EXPECT_EQ(h.pick(x, bits(1.0f), true), bits(1.0f));
  EXPECT_EQ(h.scale_max(x), 0.0f);  // recording alone changes no scale
  h.pick(w, bits(0.5f), true);
  h.pick(dy, bits(1e-3f), true);
  h.push(h.step_maxima());
  EXPECT_EQ(h.filled(), 1);
  EXPECT_EQ(h.scale_max(x), 4.0f);                      // the step's largest
  EXPECT_EQ(h.pick(x, bits(9.0f), false), bits(4.0f));  // the history's, whatever the cast's own
  EXPECT_EQ(h.scale_max(w), 0.5f);
  EXPECT_EQ(h.scale_max(dy), 1e-3f);
  EXPECT_EQ(h.step_maxima(), std::vector<unsigned>(3, 0u));  // the next step starts from 0 (9 was not recorded)
  step(&h, {1.0f}, 0.75f, 2e-3f);
  EXPECT_EQ(h.scale_max(x), 4.0f);  // still within the last 2 steps
  EXPECT_EQ(h.scale_max(w), 0.75f);
  step(&h, {2.0f}, 0.25f, 1e-4f);
  EXPECT_EQ(h.filled(), 2);
  EXPECT_EQ(h.scale_max(x), 2.0f);  // the 4 has left the history
  EXPECT_EQ(h.scale_max(w), 0.75f);
  EXPECT_EQ(h.scale_max(dy), 2e-3f);
  EXPECT_EQ(h.entries(), (std::vector<std::vector<float>>{{2.0f, 0.25f, 1e-4f}, {1.0f, 0.75f, 2e-3f}}));
}

TEST(Fp8AmaxHistory, ASkippedStepsMaximaAreDropped) {
  Fp8AmaxHistory h(2, 4);
  h.pick(fp8_history_index(1, kFp8W), bits(3.0f), true);
  h.push(h.step_maxima());
  h.pick(fp8_history_index(1, kFp8W), bits(100.0f), true);  // a step that is then skipped
  h.pick(fp8_history_index(0, kFp8X), bits(7.0f), true);
  h.drop();
  EXPECT_EQ(h.step_maxima(), std::vector<unsigned>(6, 0u));
  h.push(h.step_maxima());  // an applied step whose casts recorded nothing
  EXPECT_EQ(h.filled(), 2);
  EXPECT_EQ(h.scale_max(fp8_history_index(1, kFp8W)), 3.0f);
  EXPECT_EQ(h.scale_max(fp8_history_index(0, kFp8X)), 0.0f);
  // A history of zeros scales as an empty one: by the cast's own maximum.
  EXPECT_EQ(h.pick(fp8_history_index(0, kFp8X), bits(7.0f), false), bits(7.0f));
  // A non-finite operand is cast by its own maximum, whatever the history, so that its cast turns NaN (and the step
  // is skipped) instead of saturating: an infinity's bits and a NaN's.
  for (unsigned nonfinite : {0x7f800000u, 0x7fc00000u})
    EXPECT_EQ(h.pick(fp8_history_index(1, kFp8W), nonfinite, false), nonfinite);
  EXPECT_THROW(h.pick(6, bits(1.0f), true), Error);  // operand 6 of 2 sites x 3
}

// The step's end over three ranks: every element's largest, NaN's bits above every finite one (a non-finite step is
// skipped, its maxima dropped, before they could reach a history).
TEST(Fp8AmaxHistory, TheRanksMaximaAreTheLargestOfEach) {
  const std::vector<unsigned> gathered = {bits(1.0f), bits(0.0f), bits(5.0f),   //
                                          bits(2.0f), bits(0.0f), 0x7fc00000u,  //
                                          bits(0.5f), bits(3.0f), bits(4.0f)};
  std::vector<unsigned> out(3, 0xdeadbeefu);
  fp8_max_over_ranks(gathered.data(), 3, 3, out.data());
  EXPECT_EQ(out, (std::vector<unsigned>{bits(2.0f), bits(3.0f), 0x7fc00000u}));
  std::vector<unsigned> in_place = gathered;  // into the first rank's row, as the model reduces
  fp8_max_over_ranks(in_place.data(), 3, 3, in_place.data());
  EXPECT_EQ(std::vector<unsigned>(in_place.begin(), in_place.begin() + 3), out);
  fp8_max_over_ranks(in_place.data(), 1, 3, in_place.data());  // one rank: its own row
  EXPECT_EQ(std::vector<unsigned>(in_place.begin(), in_place.begin() + 3), out);
}

// A checkpoint's entries load into a history of any length: the newest `length` of them, in order.
TEST(Fp8AmaxHistory, EntriesRoundTripAtAnyLength) {
  Fp8AmaxHistory h(1, 3);
  for (float v : {1.0f, 8.0f, 2.0f, 3.0f}) step(&h, {v}, v / 2, v / 4);
  const std::vector<std::vector<float>> e = h.entries();  // newest first: 3, 2, 8
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[0][0], 3.0f);
  EXPECT_EQ(e[2][0], 8.0f);

  const int64_t x = fp8_history_index(0, kFp8X);
  Fp8AmaxHistory same(1, 3), shorter(1, 2), longer(1, 16);
  same.load(e);
  EXPECT_EQ(same.entries(), e);
  EXPECT_EQ(same.scale_max(x), 8.0f);
  shorter.load(e);
  EXPECT_EQ(shorter.entries(), (std::vector<std::vector<float>>{e[0], e[1]}));
  EXPECT_EQ(shorter.scale_max(x), 3.0f);  // the 8 was the oldest
  longer.load(e);
  EXPECT_EQ(longer.filled(), 3);
  EXPECT_EQ(longer.entries(), e);
  longer.load({});
  EXPECT_EQ(longer.filled(), 0);
  EXPECT_EQ(longer.scale_max(x), 0.0f);

  // A loaded history goes on as the saved one does.
  step(&h, {0.5f}, 0.5f, 0.5f);
  step(&same, {0.5f}, 0.5f, 0.5f);
  EXPECT_EQ(same.entries(), h.entries());
  EXPECT_EQ(same.scale_max(x), 3.0f);
}

TEST(Fp8AmaxHistory, RefusesEntriesOfAnotherSize) {
  Fp8AmaxHistory h(2, 4);
  EXPECT_THROW(h.load({std::vector<float>(3, 1.0f)}), Error);  // one site's, not two
  EXPECT_THROW(h.push(std::vector<unsigned>(3, 0u)), Error);
  EXPECT_THROW(Fp8AmaxHistory(1, 0), Error);
  EXPECT_THROW(Fp8AmaxHistory(1, 1025), Error);
}

}  // namespace
}  // namespace st
