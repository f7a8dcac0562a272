// Deferred finishes of the deterministic column sums (the bias, LayerNorm and RMSNorm parameter gradients).
//
// Those gradients are column sums in two passes: per-chunk partial sums, then a small kernel that adds the chunks in
// order (finish_column_sums). One transformer block's backward has six such finishes (four biases, two LayerNorms),
// each a launch of a few microseconds plus the gap before the next kernel, and nothing reads their results before
// the block's backward ends. With a ColumnSums in GpuContext::column_sums, matmul_backward, matmul_backward_gelu,
// layernorm_backward and rmsnorm_backward write their partials into its buffer instead of the context's scratch and
// queue their finish; the caller then finishes all of them in one launch, before anything reads those gradients:
//
//   gpu::GpuContext bctx = ctx;
//   bctx.column_sums = &sums;                   // sized by the caller for one block's partials
//   gpu::matmul_backward<bf16>(..., bctx, ...);  // dbias queued
//   gpu::layernorm_backward<bf16>(..., bctx, ...);
//   sums.finish(ctx.stream);                    // every queued dbias, dweight written
//
// Each sum is added in the same order as the immediate path's, so the bits are the same.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "shardtrain/core/cuda.h"
#include "shardtrain/kernels/grad_write.h"
#include "shardtrain/kernels/scratch_sizes.h"

namespace st::gpu {

class ColumnSums {
 public:
  static constexpr int kMaxQueued = 8;

  // A device buffer of `bytes` for queued partials (none when 0: reserve then always throws).
  explicit ColumnSums(size_t bytes = 0);

  // Room for `floats` partial sums, 256-byte aligned, valid until finish(). Throws if the buffer is full: the owner
  // sized it too small for what it queues between two finishes.
  float* reserve(int64_t floats);

  // Queues out[c] (+)= sum over g in [0, chunks) of part[g * C + c], c in [0, C), with finish_column_sums's order.
  // Every queued sum of one finish has the same T. Throws past kMaxQueued.
  template <typename T>
  void queue(T* out, const float* part, int64_t chunks, int C, GradWrite write);

  // Launches one kernel for every queued sum on `stream` (nothing when none is queued) and empties the queue and the
  // buffer.
  void finish(cudaStream_t stream);

  bool empty() const { return jobs_.empty(); }
  size_t capacity_bytes() const { return static_cast<size_t>(buffer_.bytes()); }

  // Bytes reserve() takes for `floats`, with its alignment: for sizing the buffer.
  static size_t reserved_bytes(int64_t floats) { return column_sums_reserved_bytes(floats); }

  struct Job {
    void* out;
    const float* part;
    int64_t chunks;
    int C;
    int accumulate;
  };

 private:
  enum class Type { kNone, kFloat, kBf16, kFp16 };
  DeviceBuffer<unsigned char> buffer_;
  size_t used_ = 0;
  Type type_ = Type::kNone;
  std::vector<Job> jobs_;
};

}  // namespace st::gpu
