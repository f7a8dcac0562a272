// Prints how many CUDA devices this process sees (0 without a driver, a device, or a CUDA build), so
// scripted GPU tests can report themselves skipped on machines that cannot run them.
#include <cstdio>

#ifdef SHARDTRAIN_HAVE_CUDA
#include "shardtrain/core/cuda.h"
#endif

int main() {
#ifdef SHARDTRAIN_HAVE_CUDA
  std::printf("%d\n", st::cuda_device_count());
#else
  std::printf("0\n");
#endif
  return 0;
}
