#include "shardtrain/core/cuda_timer.h"

#include <gtest/gtest.h>

#include "../common/gpu_test.h"

namespace st {
namespace {

// Laps split a stream's work by name: each region's calls are counted, a region is closed by the next
// lap or by the end of the Laps scope, a paused timer records nothing new, and a disabled timer nothing at all.
TEST(OpTimer, AttributesEachRegionToItsName) {
  ST_SKIP_WITHOUT_GPU();
  CudaStream s;
  DeviceBuffer<float> big(int64_t{64} << 20);
  OpTimer timer(true);
  for (int step = 0; step < 2; ++step) {
    OpTimer::Laps lap = timer.laps(s.get());
    lap("fill");
    ST_CUDA_CHECK(cudaMemsetAsync(big.data(), 1, big.bytes(), s.get()));
    lap("copy");
    ST_CUDA_CHECK(cudaMemcpyAsync(big.data(), big.data() + (int64_t{32} << 20), big.bytes() / 2,
                                  cudaMemcpyDeviceToDevice, s.get()));
  }
  timer.pause(true);
  {
    OpTimer::Laps lap = timer.laps(s.get());
    lap("paused");
    ST_CUDA_CHECK(cudaMemsetAsync(big.data(), 2, big.bytes(), s.get()));
  }
  timer.pause(false);
  s.synchronize();
  timer.collect();
  const std::string r = timer.report(2);
  EXPECT_EQ(r.find("paused"), std::string::npos) << r;
  EXPECT_NE(r.find("fill"), std::string::npos) << r;
  EXPECT_NE(r.find("copy"), std::string::npos) << r;
  EXPECT_NE(r.find("1.0 calls"), std::string::npos) << r;  // one call of each per step
  OpTimer off(false);
  { OpTimer::Laps lap = off.laps(s.get()); lap("fill"); }
  off.collect();
  EXPECT_EQ(off.report(1).find("fill"), std::string::npos);
}

// collect_first(n) adds the regions among the first n marks and keeps the later ones (another stream's, still
// running) for the next collect, which adds them once.
TEST(OpTimer, CollectFirstKeepsTheLaterMarks) {
  ST_SKIP_WITHOUT_GPU();
  CudaStream s, other;
  DeviceBuffer<float> big(int64_t{16} << 20);
  OpTimer timer(true);
  {
    OpTimer::Laps lap = timer.laps(s.get());
    lap("first");
    ST_CUDA_CHECK(cudaMemsetAsync(big.data(), 1, big.bytes(), s.get()));
  }
  const size_t n = timer.recorded();
  EXPECT_EQ(n, 2u);  // the region's start and the scope's end
  {
    OpTimer::Laps lap = timer.laps(other.get());
    lap("later");
    ST_CUDA_CHECK(cudaMemsetAsync(big.data(), 2, big.bytes(), other.get()));
  }
  EXPECT_EQ(timer.recorded(), 4u);
  timer.collect_first(n);
  EXPECT_EQ(timer.recorded(), 2u);
  std::string r = timer.report(1);
  EXPECT_NE(r.find("first"), std::string::npos) << r;
  EXPECT_EQ(r.find("later"), std::string::npos) << r;
  timer.collect();
  EXPECT_EQ(timer.recorded(), 0u);
  r = timer.report(1);
  EXPECT_NE(r.find("later"), std::string::npos) << r;
  EXPECT_EQ(r.find("2.0 calls"), std::string::npos) << r;  // "first" added once
}

}  // namespace
}  // namespace st
