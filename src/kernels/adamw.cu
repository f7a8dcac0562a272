
#include "gpu_pack.cuh"
#include "shardtrain/kernels/gpu/adamw.h"

namespace st::gpu {

using namespace kernels_internal;  // gpu_pack.cuh

namespace {

constexpr int kBlock = 256;

// __fmul_rn/__fadd_rn keep nvcc from contracting to FMA: the CPU reference is built without FMA, and
// this way a shard updated on the GPU and one updated on the CPU stay identical.
template <int kVec, typename T>
__global__ void adamw_kernel(float* param, float* m, float* v, const float* grad, int64_t n, AdamWScalars s,
                             T* param_out) {
  for_each_pack<kVec>(n, thread_index(), thread_count(), [&](int64_t i, auto w) {
    constexpr int W = decltype(w)::value;
    float p[W], mi[W], vi[W], g[W];
    load<W>(param + i, p);
    load<W>(m + i, mi);
    load<W>(v + i, vi);
    load<W>(grad + i, g);
    for (int k = 0; k < W; ++k) {
      const float gk = __fmul_rn(g[k], s.gs);
      mi[k] = __fadd_rn(__fmul_rn(s.b1, mi[k]), __fmul_rn(s.omb1, gk));
      vi[k] = __fadd_rn(__fmul_rn(s.b2, vi[k]), __fmul_rn(__fmul_rn(s.omb2, gk), gk));
      const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi[k]), s.bc2_sqrt), s.eps);
      p[k] = __fsub_rn(__fmul_rn(p[k], s.decay), __fmul_rn(s.step_size, __fdiv_rn(mi[k], denom)));
    }
    store<W>(param + i, p);
    store<W>(m + i, mi);
    store<W>(v + i, vi);
    if (param_out != nullptr) store<W>(param_out + i, p);
  });
}

}  // namespace

template <typename T>
void adamw_update(float* param, float* m, float* v, const float* grad, int64_t n, const AdamWParams& p, T* param_out,
                  const GpuContext& ctx) {
  if (n == 0) return;
  const AdamWScalars s = adamw_scalars(p);
  // Packs of four fp32 (16 bytes); param_out's packs are then 4 * sizeof(T) bytes.
  constexpr int kVec = 16 / sizeof(float);
  const bool vec = all_aligned(16, param, m, v, grad) && all_aligned(kVec * sizeof(T), param_out);
  launch_packed<float>(vec, [&](auto w) {
    constexpr int W = decltype(w)::value;
    adamw_kernel<W><<<grid_for((n + W - 1) / W, kBlock), kBlock, 0, ctx.stream>>>(param, m, v, grad, n, s, param_out);
  });
}

template void adamw_update<float>(float*, float*, float*, const float*, int64_t, const AdamWParams&, float*,
                                  const GpuContext&);
template void adamw_update<bf16>(float*, float*, float*, const float*, int64_t, const AdamWParams&, bf16*,
                                 const GpuContext&);
template void adamw_update<fp16>(float*, float*, float*, const float*, int64_t, const AdamWParams&, fp16*,
                                 const GpuContext&);

}  // namespace st::gpu
