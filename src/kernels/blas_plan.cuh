// Private to src/kernels/*.cu: the plan gpu::Blas keeps per distinct GEMM (matmul.cu's gemm, fp8_gemm.cu's FP8 GEMM),
// and the alignment its keys and heuristic queries record.
#pragma once

#include <cstdint>

#include "shardtrain/kernels/gpu/matmul.h"

namespace st::gpu {

// cuBLASLt's descriptors of one GEMM and the algorithm it runs. cuBLASLt is column-major, so its A is our B and
// its B our A (matmul.cu explains the swap).
struct Blas::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t first = nullptr, second = nullptr, out = nullptr;  // cuBLASLt's A (our B), B (our A), C=D
  cublasLtMatmulAlgo_t algo{};
  bool found = false;  // false: cuBLASLt has no algorithm; remembered so a fallback is not re-planned

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (out) cublasLtMatrixLayoutDestroy(out);
    if (second) cublasLtMatrixLayoutDestroy(second);
    if (first) cublasLtMatrixLayoutDestroy(first);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

namespace kernels_internal {

// The alignment cuBLASLt may assume for a matrix: the largest power of two (<= 256, its default) dividing
// the address and, when batched, the byte stride between matrices. A null pointer imposes nothing.
inline int64_t alignment_of(const void* p, int64_t stride_bytes) {
  const uint64_t x = reinterpret_cast<uintptr_t>(p) | 256u | static_cast<uint64_t>(stride_bytes);
  return static_cast<int64_t>(x & (~x + 1));
}

}  // namespace kernels_internal
}  // namespace st::gpu
