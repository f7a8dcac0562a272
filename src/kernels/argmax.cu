#include "shardtrain/kernels/gpu/argmax.h"

#include "candidates.cuh"
#include "gpu_pack.cuh"
#include "shardtrain/core/error.h"
#include "shardtrain/kernels/scratch_sizes.h"

namespace st::gpu {

using namespace kernels_internal;  // gpu_pack.cuh

namespace {

constexpr int kThreads = 256;
static_assert(kArgmaxChunk % (16 / sizeof(float)) == 0 && kArgmaxChunk % (16 / sizeof(bf16)) == 0,
              "a chunk holds whole packs");
using Best = Candidate<float>;
static_assert(sizeof(Best) == 12, "argmax_rows_scratch_bytes counts 12 bytes a chunk");

__device__ __forceinline__ void take(float v, int i, float* best, int* best_i, int* bad) {
  if (!isfinite(v)) *bad = 1;
  if (better_candidate(v, i, *best, *best_i)) *best = v, *best_i = i;
}

// Block (chunk c, row r): the best of ids [c kArgmaxChunk, (c + 1) kArgmaxChunk) of row r into part[r chunks + c],
// read in packs of kVec (rows 16-byte aligned; else kVec 1).
template <int kVec, typename T>
__global__ void __launch_bounds__(kThreads) chunk_kernel(const T* logits, int64_t ld, int V, Best* part, int chunks) {
  allow_dependents();
  wait_for_predecessor();  // launched by launch_after_predecessor
  const int r = static_cast<int>(blockIdx.y), c = static_cast<int>(blockIdx.x);
  const T* row = logits + r * ld;
  const int end = min(V, (c + 1) * kArgmaxChunk);
  float best = -INFINITY;
  int best_id = V, bad = 0;
  for (int i = c * kArgmaxChunk + static_cast<int>(threadIdx.x) * kVec; i < end; i += kThreads * kVec) {
    if (i + kVec <= end) {
      const Pack<T, kVec> pk = *reinterpret_cast<const Pack<T, kVec>*>(row + i);
#pragma unroll
      for (int j = 0; j < kVec; ++j) take(to_f32(pk.v[j]), i + j, &best, &best_id, &bad);
    } else {
      for (int j = i; j < end; ++j) take(to_f32(row[j]), j, &best, &best_id, &bad);
    }
  }
  block_best<kThreads>(best, best_id, bad, part + r * chunks + c);
}

}  // namespace

template <typename T>
void argmax_rows(const T* logits, int64_t ld, int rows, int V, int32_t* tokens, const GpuContext& ctx) {
  ST_CHECK(rows >= 0 && rows <= 65535 && V >= 1 && ld >= V, "argmax of ", rows, " rows of ", V,
           " logits with a row stride of ", ld);
  if (rows == 0) return;
  const size_t need = argmax_rows_scratch_bytes(rows, V);
  ST_CHECK(ctx.scratch != nullptr && ctx.scratch_bytes >= need, "argmax_rows needs ", need,
           " bytes of scratch, ctx has ", ctx.scratch_bytes);
  const int chunks = argmax_chunks(V);
  auto* part = static_cast<Best*>(ctx.scratch);
  constexpr int kVec = 16 / sizeof(T);
  launch_packed<T>(all_aligned(16, logits) && ld % kVec == 0, [&](auto w) {
    launch_after_predecessor(chunk_kernel<decltype(w)::value, T>,
                             dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(rows)), dim3(kThreads), 0,
                             ctx.stream, logits, ld, V, part, chunks);
  });
  launch_after_predecessor(best_of_chunks_kernel<float>, dim3(static_cast<unsigned>(rows)), dim3(kWarpSize), 0,
                           ctx.stream, part, chunks, V, tokens);
}

template void argmax_rows<float>(const float*, int64_t, int, int, int32_t*, const GpuContext&);
template void argmax_rows<bf16>(const bf16*, int64_t, int, int, int32_t*, const GpuContext&);
template void argmax_rows<fp16>(const fp16*, int64_t, int, int, int32_t*, const GpuContext&);

}  // namespace st::gpu
