// gpu::ColumnSums's bookkeeping, which runs on the host: its refusals name what went wrong, and a finish with
// nothing queued launches nothing. (The queued finish itself is compared with the immediate path in
// column_sums_gpu_test.cc.) Needs a CUDA build, not a device: no memory is allocated and nothing is launched.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#ifdef SHARDTRAIN_HAVE_CUDA
#include "shardtrain/core/error.h"
#include "shardtrain/kernels/gpu/column_sums.h"
#endif

namespace st {
namespace {

#ifdef SHARDTRAIN_HAVE_CUDA
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ColumnSums, ReservesWhole256ByteBlocks) {
  EXPECT_EQ(gpu::ColumnSums::reserved_bytes(0), 0u);
  EXPECT_EQ(gpu::ColumnSums::reserved_bytes(1), 256u);
  EXPECT_EQ(gpu::ColumnSums::reserved_bytes(64), 256u);
  EXPECT_EQ(gpu::ColumnSums::reserved_bytes(65), 512u);
}

TEST(ColumnSums, RefusesPartialsBeyondItsBuffer) {
  gpu::ColumnSums sums(0);
  EXPECT_EQ(sums.capacity_bytes(), 0u);
  const std::string e = error_of([&] { sums.reserve(10); });
  EXPECT_NE(e.find("256 more bytes of partial sums do not fit (0 of 0 in use)"), std::string::npos) << e;
}

TEST(ColumnSums, RefusesMoreThanItsQueueAndMixedTypes) {
  gpu::ColumnSums sums(0);
  float out[4];
  const float part[4] = {};
  for (int i = 0; i < gpu::ColumnSums::kMaxQueued; ++i) sums.queue(out, part, 1, 4, GradWrite::kOverwrite);
  EXPECT_FALSE(sums.empty());
  std::string e = error_of([&] { sums.queue(out, part, 1, 4, GradWrite::kOverwrite); });
  EXPECT_NE(e.find("more than 8 sums queued"), std::string::npos) << e;

  gpu::ColumnSums other(0);
  other.queue(out, part, 1, 4, GradWrite::kAccumulate);
  bf16 half_out[4];
  e = error_of([&] { other.queue(half_out, part, 1, 4, GradWrite::kAccumulate); });
  EXPECT_NE(e.find("must share their type"), std::string::npos) << e;
}

TEST(ColumnSums, EmptyFinishLaunchesNothingAndZeroWidthQueuesNothing) {
  gpu::ColumnSums sums(0);
  float out[1];
  sums.queue(out, nullptr, 5, 0, GradWrite::kOverwrite);  // no columns: nothing to finish
  EXPECT_TRUE(sums.empty());
  sums.finish(nullptr);  // no launch, so no device needed
  EXPECT_TRUE(sums.empty());
}
#else
TEST(ColumnSums, NeedsACudaBuild) { GTEST_SKIP() << "gpu::ColumnSums is built with CUDA only"; }
#endif

}  // namespace
}  // namespace st
