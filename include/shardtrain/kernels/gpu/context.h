// What every CUDA kernel wrapper needs besides its operands: the stream to launch on, the cuBLASLt state
// (handle, workspace, cached descriptors) and the cuDNN state (handle, cached attention plans). Passed
// explicitly; nothing is global.
//
// GPU kernels live in namespace st::gpu with the signature of their CPU reference in st (same operand
// order and meaning), templated on the activation type T (float, bf16 or fp16), plus a trailing context:
//   st::layernorm_forward(out, mean, rstd, inp, w, b, N, C);                 // CPU, fp32
//   st::gpu::layernorm_forward<bf16>(out, mean, rstd, inp, w, b, N, C, ctx); // GPU, device pointers
// All pointers are device pointers, all launches are asynchronous on ctx.stream, and accumulating
// (+=) outputs accumulate exactly as the CPU reference documents.
#pragma once

#include "shardtrain/core/cuda.h"

namespace st::gpu {

class Blas;        // kernels/gpu/matmul.h
class Cudnn;       // kernels/gpu/cudnn_attention.h
class ColumnSums;  // kernels/gpu/column_sums.h

struct GpuContext {
  cudaStream_t stream = nullptr;
  Blas* blas = nullptr;  // needed by the matmuls only
  // Device scratch for kernels that need temporaries (flash attention's row terms, deterministic
  // reductions' partial sums). A kernel that uses it publishes `<kernel>_scratch_bytes(shape...)`; the
  // caller sizes `scratch` as the max over the kernels it runs on this stream, allocated once. Kernels
  // on one stream run in order, so they can share it; contents do not survive between calls.
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
  Cudnn* cudnn = nullptr;  // needed by cudnn_attention only
  // When set, the bias, LayerNorm and RMSNorm parameter gradients' column sums keep their partials there and queue
  // their finish for the caller's ColumnSums::finish (column_sums.h); scratch is then not used for them.
  ColumnSums* column_sums = nullptr;
};

}  // namespace st::gpu
