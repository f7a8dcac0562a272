// N ranks (the in-process fake communicator's threads) train what one process trains, on testing::train's corpus:
// rank 0's loss at each step to 1e-5 relative and each unit's parameters after the last step to 1e-5 in norm (the
// bars of reordered float32 sums over a few steps); and the loss went down, so the steps trained something.
//
//   testing::expect_ranks_equal_one_process(c, /*seed=*/5, {2, 3});
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <initializer_list>
#include <utility>

#include "shardtrain/comm/communicator.h"
#include "shardtrain/comm/fake_communicator.h"
#include "tiny_training.h"

namespace st::testing {

// param_bar: the parameters' bar (FP8 casts turn a last-bit difference of a reordered sum into a code's step now and
// then, and take a looser one).
inline void expect_ranks_equal_one_process(const Config& c, uint64_t seed, std::initializer_list<int> worlds,
                                           double param_bar = 1e-5) {
  SoloCommunicator solo;
  const Trace ref = train(c, solo, seed, c.train.steps);
  for (int world : worlds) {
    Trace got;
    fake::spawn(world, [&](Communicator& comm) {
      Trace t = train(c, comm, seed, c.train.steps);
      if (comm.rank() == 0) got = std::move(t);
    });
    ASSERT_EQ(got.losses.size(), ref.losses.size());
    for (size_t i = 0; i < ref.losses.size(); ++i)
      EXPECT_NEAR(got.losses[i], ref.losses[i], 1e-5 * std::fabs(ref.losses[i])) << "world " << world;
    for (size_t u = 0; u < ref.params.size(); ++u)
      EXPECT_LE(rel_norm_error(got.params[u], ref.params[u]), param_bar) << "world " << world << " unit " << u;
  }
  EXPECT_LT(ref.losses.back(), ref.losses.front());
}

}  // namespace st::testing
