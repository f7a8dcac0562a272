// The GEMM algorithms a backend computes with, and what they were picked on. A checkpoint keeps them (manifest
// field gemm_algorithms) so that a resumed run on the same kind of device with the same cuBLASLt takes the same
// algorithms, and so computes the same bits, whatever timing would pick this time (train.gemm_autotune).
#pragma once

#include <cstdint>
#include <string>

namespace st {

struct GemmAlgorithms {
  std::string device;   // the GPU's name, as cudaGetDeviceProperties gives it
  int64_t library = 0;  // cublasLtGetVersion()
  std::string plans;    // gpu::Blas::algorithms(): one line per planned GEMM; empty: none recorded

  bool empty() const { return plans.empty(); }
};

}  // namespace st
