// Random operands on the GPU: the CUDA version of kernels/fill.h, for T in {float, bf16, fp16} (each value computed
// in fp32, then rounded to T). Device pointer, asynchronous on ctx.stream; no scratch. Blas times GEMM algorithms on
// operands filled this way (train.gemm_autotune).
#pragma once

#include <cstdint>

#include "shardtrain/kernels/gpu/context.h"

namespace st::gpu {

// out[i] = T(st::uniform_pm1_at(seed, i)).
template <typename T>
void fill_uniform(T* out, int64_t n, uint64_t seed, const GpuContext& ctx);

}  // namespace st::gpu
