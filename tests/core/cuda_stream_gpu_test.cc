// CudaStream (core/cuda.h): a non-blocking stream at the device's least priority (the one a stream created without a
// priority gets) or, asked for kHigh, its greatest.
#include <gtest/gtest.h>

#include "../common/gpu_test.h"
#include "shardtrain/core/cuda.h"

namespace st {
namespace {

int priority_of(cudaStream_t s) {
  int p = 0;
  ST_CUDA_CHECK(cudaStreamGetPriority(s, &p));
  return p;
}

unsigned flags_of(cudaStream_t s) {
  unsigned f = 0;
  ST_CUDA_CHECK(cudaStreamGetFlags(s, &f));
  return f;
}

TEST(CudaStream, HighTakesTheDevicesGreatestPriorityAndLowAPlainStreams) {
  ST_SKIP_WITHOUT_GPU();
  int least = 0, greatest = 0;
  ST_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t plain = nullptr;
  ST_CUDA_CHECK(cudaStreamCreateWithFlags(&plain, cudaStreamNonBlocking));
  const int plain_priority = priority_of(plain);
  ST_CUDA_CHECK(cudaStreamDestroy(plain));

  const CudaStream standard, low(CudaStream::Priority::kLow), high(CudaStream::Priority::kHigh);
  EXPECT_EQ(priority_of(standard.get()), least);
  EXPECT_EQ(priority_of(standard.get()), plain_priority);
  EXPECT_EQ(priority_of(low.get()), least);
  EXPECT_EQ(priority_of(high.get()), greatest);
  for (const CudaStream* s : {&standard, &low, &high}) EXPECT_EQ(flags_of(s->get()), cudaStreamNonBlocking);
}

}  // namespace
}  // namespace st
