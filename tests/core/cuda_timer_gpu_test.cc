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

}  // namespace
}  // namespace st
