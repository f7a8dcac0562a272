// GPU tests of FP8 GEMMs: skip (never pass) where the device has no FP8 tensor cores (compute capability below 8.9),
// and whether it has cuBLASLt's per-row scales (the rowwise recipe).
#pragma once

#include "gpu_test.h"
#include "shardtrain/kernels/gpu/fp8_gemm.h"

#define ST_SKIP_WITHOUT_FP8()                                               \
  do {                                                                      \
    ST_SKIP_WITHOUT_GPU();                                                  \
    if (!::st::gpu::fp8_gemm_supported(::st::test::current_device()))       \
      GTEST_SKIP() << "no FP8 tensor cores (compute capability below 8.9)"; \
  } while (0)

namespace st::test {

inline int current_device() {
  int device = 0;
  ST_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

inline bool rowwise_fp8_here() { return gpu::fp8_rowwise_gemm_supported(current_device()); }

}  // namespace st::test
