// AdamW on the GPU: the CUDA version of kernels/adamw.h (PyTorch's formulation), on fp32 master
// weights and state, optionally writing the updated weights rounded to the activation type T as well.
// Device pointers, asynchronous on ctx.stream; no scratch.
#pragma once

#include <cstdint>
#include <vector>

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

// st::adamw_update_runs: each run [offset, offset + count) of param, m, v, grad (and param_out) updated with its
// own parameters. Contiguous runs that differ in nothing but the weight decay (a unit's tensors, as adamw_runs
// gives them) go out as one launch, up to 16 runs a launch. gate (device memory; null: none) is read when the
// kernels run: its grad_scale replaces the runs', and a skipping gate leaves everything untouched.
template <typename T>
void adamw_update_runs(float* param, float* m, float* v, const float* grad, const std::vector<AdamWRun>& runs,
                       T* param_out, const GpuContext& ctx, const StepGate* gate = nullptr);

// *out = st::decide_step(sums[0], sums[1], loss_scale, grad_clip) on the device (sums: the global sum of squares
// and loss sum, device memory), so that AdamW can read the step's clip and skip without the host.
void decide_step(const double* sums, double loss_scale, float grad_clip, StepGate* out, const GpuContext& ctx);

}  // namespace st::gpu
