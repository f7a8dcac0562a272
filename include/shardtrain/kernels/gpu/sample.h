// A sampled decoding step on the GPU: the CUDA version of kernels/sample.h, for logits T in {float, bf16, fp16} (read
// as fp32), giving the CPU reference's tokens bit for bit. Device pointers (logits, draws, tokens), asynchronous on
// ctx.stream, with sample_rows_scratch_bytes(rows, V) of ctx.scratch (kernels/scratch_sizes.h). The draws are read
// when the kernels run, so a captured CUDA graph replays with new ones; the options are the launch's.
//
// With top_k in (0, V), one block per row finds its k-th candidate: a radix select, 8 bits a pass, over the logits'
// order-preserving bits, then, among the logits equal to it, the rank that is left by a scan over runs of ids. Then
// blocks of kSampleChunk ids score their candidates, and a last kernel takes each row's best over its chunks. Every
// choice is the largest (score, then lowest id), so the order in which threads meet does not change it.
#pragma once

#include <cstdint>

#include "shardtrain/kernels/gpu/context.h"
#include "shardtrain/kernels/sample.h"

namespace st::gpu {

template <typename T>
void sample_rows(const T* logits, int64_t ld, int rows, int V, const uint64_t* draws, const SamplingOptions& o,
                 int32_t* tokens, const GpuContext& ctx);

}  // namespace st::gpu
