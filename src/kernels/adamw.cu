
#include "gpu_pack.cuh"
#include "shardtrain/kernels/gpu/adamw.h"

namespace st::gpu {

using namespace kernels_internal;  // gpu_pack.cuh

namespace {

constexpr int kBlock = 256;

// Runs that one launch updates: contiguous, sharing every scalar but the weight decay (adamw_runs gives a run a
// tensor, so a unit's shard is one launch instead of one a tensor, most of them a bias or a LayerNorm's C floats).
constexpr int kMaxSegments = 16;
struct Segments {
  AdamWScalars s;  // s.decay unused: each segment has its own
  int count = 0;
  int64_t end[kMaxSegments];  // each segment's end, counted from the launch's first element; ascending
  float decay[kMaxSegments];
};

// __fmul_rn/__fadd_rn keep nvcc from contracting to FMA: the CPU reference is built without FMA, and
// this way a shard updated on the GPU and one updated on the CPU stay identical.
template <int kVec, typename T>
__global__ void adamw_kernel(float* param, float* m, float* v, const float* grad, int64_t n, const Segments sg,
                             T* param_out, const StepGate* gate) {
  const AdamWScalars& s = sg.s;
  float gs = s.gs;
  if (gate != nullptr) {  // the step's end decided on the device (decide_step)
    if (gate->skip != 0) return;
    gs = gate->grad_scale;
  }
  for_each_pack<kVec>(n, thread_index(), thread_count(), [&](int64_t i, auto w) {
    constexpr int W = decltype(w)::value;
    int seg = 0;  // the segment of element i; the pack's later elements may lie in later ones
    while (i >= sg.end[seg]) ++seg;
    float p[W], mi[W], vi[W], g[W];
    load<W>(param + i, p);
    load<W>(m + i, mi);
    load<W>(v + i, vi);
    load<W>(grad + i, g);
    for (int k = 0; k < W; ++k) {
      while (i + k >= sg.end[seg]) ++seg;
      const float gk = __fmul_rn(g[k], gs);
      mi[k] = __fadd_rn(__fmul_rn(s.b1, mi[k]), __fmul_rn(s.omb1, gk));
      vi[k] = __fadd_rn(__fmul_rn(s.b2, vi[k]), __fmul_rn(__fmul_rn(s.omb2, gk), gk));
      const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi[k]), s.bc2_sqrt), s.eps);
      p[k] = __fsub_rn(__fmul_rn(p[k], sg.decay[seg]), __fmul_rn(s.step_size, __fdiv_rn(mi[k], denom)));
    }
    store<W>(param + i, p);
    store<W>(m + i, mi);
    store<W>(v + i, vi);
    if (param_out != nullptr) store<W>(param_out + i, p);
  });
}

// Every field but the weight decay equal: one launch's segments.
bool same_but_decay(const AdamWParams& a, const AdamWParams& b) {
  AdamWParams x = a;
  x.weight_decay = b.weight_decay;
  return x == b;
}

__global__ void decide_step_kernel(const double* sums, double loss_scale, float grad_clip, StepGate* out) {
  *out = st::decide_step(sums[0], sums[1], loss_scale, grad_clip);
}

template <typename T>
void launch_segments(float* param, float* m, float* v, const float* grad, int64_t n, const Segments& sg, T* param_out,
                     const StepGate* gate, const GpuContext& ctx) {
  if (n == 0) return;
  // Packs of four fp32 (16 bytes); param_out's packs are then 4 * sizeof(T) bytes.
  constexpr int kVec = 16 / sizeof(float);
  const bool vec = all_aligned(16, param, m, v, grad) && all_aligned(kVec * sizeof(T), param_out);
  launch_packed<float>(vec, [&](auto w) {
    constexpr int W = decltype(w)::value;
    adamw_kernel<W>
        <<<grid_for((n + W - 1) / W, kBlock), kBlock, 0, ctx.stream>>>(param, m, v, grad, n, sg, param_out, gate);
  });
}

}  // namespace

void decide_step(const double* sums, double loss_scale, float grad_clip, StepGate* out, const GpuContext& ctx) {
  decide_step_kernel<<<1, 1, 0, ctx.stream>>>(sums, loss_scale, grad_clip, out);
  ST_CUDA_CHECK_LAUNCH();
}

template <typename T>
void adamw_update_runs(float* param, float* m, float* v, const float* grad, const std::vector<AdamWRun>& runs,
                       T* param_out, const GpuContext& ctx, const StepGate* gate) {
  for (size_t i = 0; i < runs.size();) {
    const AdamWRun& first = runs[i];
    Segments sg;
    sg.s = adamw_scalars(first.params);
    int64_t end = first.offset;
    for (; i < runs.size() && sg.count < kMaxSegments && runs[i].offset == end &&
           same_but_decay(runs[i].params, first.params);
         ++i) {
      end += runs[i].count;
      sg.end[sg.count] = end - first.offset;
      sg.decay[sg.count++] = adamw_scalars(runs[i].params).decay;
    }
    launch_segments<T>(param + first.offset, m + first.offset, v + first.offset, grad + first.offset,
                       end - first.offset, sg, param_out == nullptr ? nullptr : param_out + first.offset, gate, ctx);
  }
}

template <typename T>
void adamw_update(float* param, float* m, float* v, const float* grad, int64_t n, const AdamWParams& p, T* param_out,
                  const GpuContext& ctx) {
  adamw_update_runs<T>(param, m, v, grad, {AdamWRun{0, n, p}}, param_out, ctx);
}

template void adamw_update<float>(float*, float*, float*, const float*, int64_t, const AdamWParams&, float*,
                                  const GpuContext&);
template void adamw_update<bf16>(float*, float*, float*, const float*, int64_t, const AdamWParams&, bf16*,
                                 const GpuContext&);
template void adamw_update<fp16>(float*, float*, float*, const float*, int64_t, const AdamWParams&, fp16*,
                                 const GpuContext&);

template void adamw_update_runs<float>(float*, float*, float*, const float*, const std::vector<AdamWRun>&, float*,
                                       const GpuContext&, const StepGate*);
template void adamw_update_runs<bf16>(float*, float*, float*, const float*, const std::vector<AdamWRun>&, bf16*,
                                      const GpuContext&, const StepGate*);
template void adamw_update_runs<fp16>(float*, float*, float*, const float*, const std::vector<AdamWRun>&, fp16*,
                                      const GpuContext&, const StepGate*);

}  // namespace st::gpu
