// gpu::fp8_delayed_maxima, gpu::fp8_max_over_ranks and gpu::fp8_history_push against their CPU references
// (kernels/fp8_history.h), bit for bit: random maxima (zeros among them, so that both of a pick's branches run, a
// NaN's and an infinity's bits), recording on and off, one to four ranks with the result written over the first rank's
// row, and pushes that wrap around the ring at lengths 1, 3 and 16 over more than 256 operands (several blocks).
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "gpu_kernel_test.h"
#include "shardtrain/core/rng.h"
#include "shardtrain/kernels/fp8_history.h"
#include "shardtrain/kernels/gpu/fp8_history.h"

namespace st {
namespace {

// n maxima: a third zeros, the rest the bits of positive floats of magnitudes far apart, one NaN where nan_at >= 0.
std::vector<unsigned> random_maxima(int64_t n, uint64_t stream, int64_t nan_at = -1) {
  Rng rng(::st::testing::kSeed, stream);
  std::vector<unsigned> v(static_cast<size_t>(n));
  for (unsigned& b : v)
    b = rng.next_below(3) == 0 ? 0u : 0x00800000u + static_cast<unsigned>(rng.next_below(0x7e000000));
  if (nan_at >= 0) v[static_cast<size_t>(nan_at)] = 0x7fc00000u;
  return v;
}

TEST(Fp8HistoryGpu, DelayedMaximaGiveTheReferenceBits) {
  ST_SKIP_WITHOUT_GPU();
  test::GpuEnv env;
  const int64_t n = 700;
  for (bool record : {true, false}) {
    std::vector<unsigned> own = random_maxima(n, 1, 5);
    own[6] = 0x7f800000u;  // an infinity's bits: applied as they are, whatever the history
    const std::vector<unsigned> history = random_maxima(n, 2), step0 = random_maxima(n, 3);
    std::vector<unsigned> want_step = step0, want_applied(static_cast<size_t>(n));
    fp8_delayed_maxima(own.data(), want_step.data(), history.data(), want_applied.data(), n, record);
    const DeviceBuffer<unsigned> d_own = test::ints_to_device(own), d_history = test::ints_to_device(history);
    DeviceBuffer<unsigned> d_step = test::ints_to_device(step0), d_applied(n);
    gpu::fp8_delayed_maxima(d_own.data(), d_step.data(), d_history.data(), d_applied.data(), n, record, env.ctx);
    EXPECT_EQ(test::ints_to_host(d_step), want_step) << "record " << record;
    EXPECT_EQ(test::ints_to_host(d_applied), want_applied) << "record " << record;
  }
}

TEST(Fp8HistoryGpu, MaxOverRanksGivesTheReferenceBits) {
  ST_SKIP_WITHOUT_GPU();
  test::GpuEnv env;
  const int64_t n = 300;
  for (int world : {1, 2, 3, 4}) {
    const std::vector<unsigned> gathered = random_maxima(n * world, 10 + world, n / 2);
    std::vector<unsigned> want(static_cast<size_t>(n));
    fp8_max_over_ranks(gathered.data(), world, n, want.data());
    DeviceBuffer<unsigned> d = test::ints_to_device(gathered);
    gpu::fp8_max_over_ranks(d.data(), world, n, d.data(), env.ctx);  // into the first rank's row
    const std::vector<unsigned> got = test::ints_to_host(d);
    EXPECT_EQ(std::vector<unsigned>(got.begin(), got.begin() + n), want) << "world " << world;
  }
}

// A sequence of pushes, the entry being the step's own buffer as the model passes it: ring, history maxima and the
// zeroed step as the reference leaves them after each.
TEST(Fp8HistoryGpu, PushesGiveTheReferenceRing) {
  ST_SKIP_WITHOUT_GPU();
  test::GpuEnv env;
  const int64_t n = 261;
  for (int length : {1, 3, 16}) {
    std::vector<unsigned> ring(static_cast<size_t>(n * length), 0u), history(static_cast<size_t>(n), 0u);
    DeviceBuffer<unsigned> d_ring = test::ints_to_device(ring), d_history = test::ints_to_device(history);
    int slot = -1, filled = 0;
    for (int p = 0; p < 2 * length + 2; ++p) {
      std::vector<unsigned> step = random_maxima(n, 100 + p);
      DeviceBuffer<unsigned> d_step = test::ints_to_device(step);
      slot = (slot + 1) % length;
      filled = std::min(filled + 1, length);
      fp8_history_push(step.data(), n, ring.data(), length, slot, filled, history.data(), step.data());
      gpu::fp8_history_push(d_step.data(), n, d_ring.data(), length, slot, filled, d_history.data(), d_step.data(),
                            env.ctx);
      ASSERT_EQ(test::ints_to_host(d_ring), ring) << "length " << length << " push " << p;
      ASSERT_EQ(test::ints_to_host(d_history), history) << "length " << length << " push " << p;
      ASSERT_EQ(test::ints_to_host(d_step), std::vector<unsigned>(static_cast<size_t>(n), 0u));
    }
  }
}

}  // namespace
}  // namespace st
