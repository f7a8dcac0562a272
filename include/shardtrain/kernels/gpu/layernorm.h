// LayerNorm on the GPU: the CUDA version of kernels/layernorm.h (eps = kLayerNormEps), same operands and
// meaning, for activations T in {float, bf16, fp16} (fp32 arithmetic; mean and rstd are fp32). Device
// pointers, asynchronous on ctx.stream.
#pragma once

#include <cstddef>
#include <cstdint>

#include "shardtrain/kernels/gpu/context.h"
#include "shardtrain/kernels/layernorm.h"
#include "shardtrain/kernels/scratch_sizes.h"

namespace st::gpu {

// For each of N rows of C: out = (inp - mean) * rstd * weight + bias. Writes mean[N] and rstd[N]
// (rstd = 1/sqrt(biased var + eps)) for backward. No scratch. amax (device, optional) gets out's maximum folded in as
// kernels/layernorm.h says, of the values as stored in T: the bits gpu::fp8_maxima_async (kernels/gpu/fp8.h) takes of
// out, non-finite values included, one atomicMax a block; the caller zeroes it first.
template <typename T>
void layernorm_forward(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias, int64_t N, int C,
                       const GpuContext& ctx, unsigned* amax = nullptr);

// Accumulates: dinp [N,C] += ..., dweight [C] += ..., dbias [C] += ... (param_write = kOverwrite: dweight and dbias
// are written, as st::layernorm_backward). dweight and dbias are reduced over rows in fp32, per fixed chunk of rows
// into ctx.scratch and then over chunks in order, so the result is bit-identical run to run. Needs
// layernorm_backward_scratch_bytes(N, C) bytes of scratch, or, with ctx.column_sums, as much room there, and dweight
// and dbias are then complete only after that ColumnSums's finish() (column_sums.h). dweight and dbias may both be
// null (a frozen weight and bias): no reduction is finished and dinp gets the same bits; the scratch is needed all
// the same.
//
// How the bf16/fp16 backward (C <= 2560, a multiple of 8) reads its rows: kStaged reads each row ahead into shared
// memory, kDirect straight into registers when it is used. Both do the same arithmetic in the same order, so give
// the same bits; kStaged is faster, but its block needs more shared memory than some GPUs allow one (an RTX 4090
// allows 99 KiB: enough up to C = 1792). kAuto takes kStaged where the device allows it; forcing kStaged where it
// does not is an error. fp32 and other widths ignore it.
enum class RowStaging { kAuto, kStaged, kDirect };

template <typename T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, const float* mean,
                        const float* rstd, int64_t N, int C, const GpuContext& ctx,
                        GradWrite param_write = GradWrite::kAccumulate, RowStaging staging = RowStaging::kAuto);

}  // namespace st::gpu
