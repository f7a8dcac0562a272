#include "shardtrain/kernels/gpu/fp8_history.h"

#include "shardtrain/core/cuda.h"
#include "shardtrain/core/error.h"

namespace st::gpu {
namespace {

constexpr int kThreads = 256;

int blocks_for(int64_t n) { return static_cast<int>((n + kThreads - 1) / kThreads); }

__global__ void delayed_maxima_kernel(const unsigned* own, unsigned* step, const unsigned* history_max,
                                      unsigned* applied, int64_t n, bool record) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const unsigned o = own[i];
  if (record) step[i] = max(step[i], o);
  const unsigned h = history_max[i];
  applied[i] = h != 0 && o < 0x7f800000u ? h : o;  // a non-finite own maximum as it is (the reference's rule)
}

// A rank whose row goes into out reads it before any thread writes it: each element is one thread's.
__global__ void max_over_ranks_kernel(const unsigned* gathered, int world, int64_t n, unsigned* out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  unsigned m = gathered[i];
  for (int r = 1; r < world; ++r) m = max(m, gathered[r * n + i]);
  out[i] = m;
}

__global__ void history_push_kernel(const unsigned* entry, int64_t n, unsigned* ring, int length, int slot, int filled,
                                    unsigned* history_max, unsigned* step) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const unsigned e = entry[i];
  ring[slot * n + i] = e;
  unsigned m = e;
  for (int k = 1; k < filled; ++k) m = max(m, ring[((slot - k + length) % length) * n + i]);
  history_max[i] = m;
  step[i] = 0;
}

}  // namespace

void fp8_delayed_maxima(const unsigned* own, unsigned* step, const unsigned* history_max, unsigned* applied, int64_t n,
                        bool record, const GpuContext& ctx) {
  ST_CHECK(n >= 0, "gpu::fp8_delayed_maxima: n ", n);
  if (n == 0) return;
  delayed_maxima_kernel<<<blocks_for(n), kThreads, 0, ctx.stream>>>(own, step, history_max, applied, n, record);
  ST_CUDA_CHECK_LAUNCH();
}

void fp8_max_over_ranks(const unsigned* gathered, int world, int64_t n, unsigned* out, const GpuContext& ctx) {
  ST_CHECK(world >= 1 && n >= 0, "gpu::fp8_max_over_ranks: world ", world, ", n ", n);
  if (n == 0) return;
  max_over_ranks_kernel<<<blocks_for(n), kThreads, 0, ctx.stream>>>(gathered, world, n, out);
  ST_CUDA_CHECK_LAUNCH();
}

void fp8_history_push(const unsigned* entry, int64_t n, unsigned* ring, int length, int slot, int filled,
                      unsigned* history_max, unsigned* step, const GpuContext& ctx) {
  ST_CHECK(length >= 1 && slot >= 0 && slot < length && filled >= 1 && filled <= length && n >= 0,
           "gpu::fp8_history_push: slot ", slot, ", filled ", filled, ", length ", length, ", n ", n);
  if (n == 0) return;
  history_push_kernel<<<blocks_for(n), kThreads, 0, ctx.stream>>>(entry, n, ring, length, slot, filled, history_max,
                                                                  step);
  ST_CUDA_CHECK_LAUNCH();
}

}  // namespace st::gpu
