// Utility kernels of the GPU model: deterministic sums into a device double (gradient norm, mean loss),
// fp32 <-> T conversion, accumulation and scaling. T in {float, bf16, fp16}. Device pointers, asynchronous on
// ctx.stream.
//
//   DeviceBuffer<double> norm2(1);  // zeroed by the caller
//   gpu::sum_of_squares<bf16>(grad, n, norm2.data(), ctx);  // needs reduce_scratch_bytes() of scratch
#pragma once

#include <cstddef>
#include <cstdint>

#include "shardtrain/kernels/gpu/context.h"
#include "shardtrain/kernels/grad_write.h"
#include "shardtrain/kernels/scratch_sizes.h"

namespace st::gpu {

// sum_of_squares and sum need reduce_scratch_bytes() of scratch (scratch_sizes.h): a fixed number of per-block
// partials, whatever n is.

// Accumulates: *out += sum_i x[i]^2 (*out is one device double). Squares are summed in fp32 per thread
// and in double across threads and blocks, over a fixed grid and in a fixed order: bit-identical run to
// run, and independent of the device. Needs reduce_scratch_bytes() of scratch.
template <typename T>
void sum_of_squares(const T* x, int64_t n, double* out, const GpuContext& ctx);

// Accumulates: *out += sum_i x[i], as sum_of_squares (e.g. the losses of a batch, for the mean loss).
void sum(const float* x, int64_t n, double* out, const GpuContext& ctx);

// *out = ((0 + parts[0]) + parts[1]) + ... in index order, on one thread (st::sum_in_order on the host). Per-unit
// sums of squares, each taken into its own zeroed part and then added this way, give the bits of one out that
// sum_of_squares accumulated unit after unit.
void sum_in_order(const double* parts, int64_t n, double* out, const GpuContext& ctx);

// out[i] = in[i] rounded to T (round to nearest even).
template <typename T>
void convert(T* out, const float* in, int64_t n, const GpuContext& ctx);

// Accumulates: acc[i] += in[i], in fp32; with GradWrite::kOverwrite, acc[i] = in[i] (the same value as adding to a
// zeroed acc, but for the sign of a zero: one pass instead of a memset, a read and a write).
// With sum_sq, also *sum_sq += sum_i acc[i]^2 of the values stored, with the bits sum_of_squares<float>(acc, n,
// sum_sq, ctx) would give after it, in the same pass where the pointers' alignment allows (a gradient shard's
// share of the norm as it is written). Then it needs reduce_scratch_bytes() of scratch.
template <typename T>
void accumulate(float* acc, const T* in, int64_t n, const GpuContext& ctx, GradWrite write = GradWrite::kAccumulate,
                double* sum_sq = nullptr);

// Accumulates: acc[i] += the sum of parts[q * stride + i] over q in [0, nparts), added in index order in fp32 and
// rounded to T (as a reduce-scatter in T delivers it: with two parts, NCCL's one addition, bit for bit); with
// kOverwrite, acc[i] = that sum. st::accumulate_parts (kernels/reduce.h) is the fp32 reference; for half T the
// rounding comes between its sum and its addition to acc. sum_sq as for accumulate.
template <typename T>
void accumulate_parts(float* acc, const T* parts, int nparts, int64_t stride, int64_t n, const GpuContext& ctx,
                      GradWrite write = GradWrite::kAccumulate, double* sum_sq = nullptr);

}  // namespace st::gpu
