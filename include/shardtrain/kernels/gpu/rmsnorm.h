// RMSNorm on the GPU: the CUDA version of kernels/rmsnorm.h, same operands and meaning, for activations T in
// {float, bf16, fp16} (fp32 arithmetic; rstd is fp32). Device pointers, asynchronous on ctx.stream. amax (device,
// optional) gets the maximum of the tensor written (out, dinp) folded in as kernels/rmsnorm.h says, of the values as
// stored in T: the bits gpu::fp8_maxima_async (kernels/gpu/fp8.h) takes of that tensor, non-finite values included,
// one atomicMax a block; the caller zeroes it first (a linear layer's FP8 cast then needs no pass of its own).
#pragma once

#include <cstddef>
#include <cstdint>

#include "shardtrain/kernels/gpu/context.h"
#include "shardtrain/kernels/rmsnorm.h"
#include "shardtrain/kernels/scratch_sizes.h"

namespace st::gpu {

// For each of N rows of C: out = inp * rstd * weight, rstd = 1/sqrt(mean(inp^2) + eps), saved for backward.
template <typename T>
void rmsnorm_forward(T* out, float* rstd, const T* inp, const T* weight, float eps, int64_t N, int C,
                     const GpuContext& ctx, unsigned* amax = nullptr);

// st::rmsnorm_forward_fp8 (kernels/rmsnorm.h) on the device: rstd, and out's codes (q [N, C] and q_t [C, N], either may
// be null), 1 / scale and out's maximum (own, may be null) as gpu::swiglu_forward_fp8 casts its output, for T float or
// bf16, with the device's maximum *amax known ahead. rstd and the codes are the bits of rmsnorm_forward<T> followed
// by that cast; out itself is never stored.
template <typename T>
void rmsnorm_forward_fp8(uint8_t* q, uint8_t* q_t, float* inverse_scale, unsigned* own, float* rstd, const T* inp,
                         const T* weight, float eps, int64_t N, int C, Fp8Format f, const unsigned* amax,
                         const GpuContext& ctx);

// Accumulates dinp [N,C] += ... and dweight [C] += ... (param_write = kOverwrite: dweight is written). dweight is
// reduced over rows in fp32 in a fixed order (per chunk of rows into ctx.scratch, then over chunks), so the result
// is bit-identical run to run. Needs rmsnorm_backward_scratch_bytes(N, C) bytes of ctx.scratch, or, with
// ctx.column_sums, as much room there, and dweight is then complete only after that ColumnSums's finish()
// (column_sums.h). dweight may be null (a frozen weight): no reduction, no scratch, and dinp gets the same bits.
// amax: of dinp as accumulated.
template <typename T>
void rmsnorm_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, const float* rstd, int64_t N,
                      int C, const GpuContext& ctx, GradWrite param_write = GradWrite::kAccumulate,
                      unsigned* amax = nullptr);

}  // namespace st::gpu
