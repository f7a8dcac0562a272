// The greedy choice of a decoding step on the GPU: the CUDA version of kernels/argmax.h, same meaning, for logits T in
// {float, bf16, fp16} (compared as fp32). Device pointers, asynchronous on ctx.stream, with
// argmax_rows_scratch_bytes(rows, V) of ctx.scratch (kernels/scratch_sizes.h). A block per chunk of kArgmaxChunk ids of
// a row, in 16-byte packs where the rows allow, then a warp per row over its chunks (candidates.cuh, as sample_rows): a
// row's logits are read by many multiprocessors (63 blocks at Llama 3's 128,256), where a block per row left a step's
// argmax to one. The result does not depend on the order in which threads meet (largest value, then lowest id).
#pragma once

#include <cstdint>

#include "shardtrain/kernels/argmax.h"
#include "shardtrain/kernels/gpu/context.h"

namespace st::gpu {

template <typename T>
void argmax_rows(const T* logits, int64_t ld, int rows, int V, int32_t* tokens, const GpuContext& ctx);

}  // namespace st::gpu
