// AdamW on the GPU: the CUDA version of kernels/adamw.h (PyTorch's formulation), on fp32 master
// weights and state, optionally writing the updated weights rounded to the activation type T as well.
// Device pointers, asynchronous on ctx.stream; no scratch.
#pragma once

#include <cstdint>

#include "shardtrain/kernels/adamw.h"
#include "shardtrain/kernels/gpu/context.h"

namespace st::gpu {

// Updates param, m, v [n] in place exactly as st::adamw_update (same operation order, no FMA
// contraction, so the fp32 results equal the CPU reference's bit for bit on IEEE hardware). If param_out
// is non-null it also receives the updated param rounded to T (round to nearest even), e.g. the bf16
// or fp16 copy the next all-gather sends.
template <typename T>
void adamw_update(float* param, float* m, float* v, const float* grad, int64_t n, const AdamWParams& p, T* param_out,
                  const GpuContext& ctx);

}  // namespace st::gpu
