// Causal self-attention, our flash_attention kernels against cuDNN's fused SDPA engines (cudnn_attention),
// forward and backward (both cuDNN backward modes), at GPT-2 124M's attention shape: time per call, TFLOP/s
// and the speed relative to flash attention in the same run.
//
//   ./build/bench_attention [--batch 16] [--seq 1024] [--n-embd 768] [--n-head 12] [--iters 20]
//
// Each case: 3 warm-up and `iters` timed calls with CUDA events on one stream, median; random bf16 inputs
// (unit normals). FLOPs are the causal ones: forward 2 GEMMs x 2*B*NH*T*T*hs / 2, backward 2.5x that
// (5 GEMMs). Flash's backward accumulates into dqkv, cuDNN's overwrites; neither difference costs time. One
// GPU, no MPI.
#include <algorithm>
#include <cstdio>
#include <string>

#include "bench_util.h"
#include "shardtrain/core/error.h"

#ifdef SHARDTRAIN_HAVE_CUDA
#include "shardtrain/core/cuda.h"
#include "shardtrain/kernels/gpu/cudnn_attention.h"
#include "shardtrain/kernels/gpu/flash_attention.h"

namespace st {
namespace {

using bench::median_ms;
using bench::random_bf16;

void run(int B, int T, int C, int NH, int iters) {
  using gpu::CudnnBackwardMode;
  CudaStream stream;
  gpu::Cudnn cudnn;
  gpu::GpuContext ctx{stream.get(), nullptr, nullptr, 0, &cudnn};

  // cuDNN's plans first: their scratch sizes set the shared scratch.
  std::string cudnn_unsupported;
  size_t scratch_bytes = gpu::flash_attention_backward_scratch_bytes(B, T, C, NH);
  size_t det_bytes = 0, nondet_bytes = 0;
  try {
    scratch_bytes = std::max(scratch_bytes, gpu::cudnn_attention_forward_scratch_bytes<bf16>(B, T, C, NH, ctx));
    det_bytes = gpu::cudnn_attention_backward_scratch_bytes<bf16>(B, T, C, NH, ctx, CudnnBackwardMode::kDeterministic);
    nondet_bytes =
        gpu::cudnn_attention_backward_scratch_bytes<bf16>(B, T, C, NH, ctx, CudnnBackwardMode::kNondeterministic);
    scratch_bytes = std::max({scratch_bytes, det_bytes, nondet_bytes});
  } catch (const Error& e) {
    cudnn_unsupported = e.what();
  }
  DeviceBuffer<unsigned char> scratch(static_cast<int64_t>(scratch_bytes));
  ctx.scratch = scratch.data();
  ctx.scratch_bytes = scratch.bytes();

  const int64_t qkv_n = static_cast<int64_t>(B) * T * 3 * C, out_n = static_cast<int64_t>(B) * T * C;
  DeviceBuffer<bf16> qkv = random_bf16(qkv_n, 1), dout = random_bf16(out_n, 2), out = random_bf16(out_n, 3),
                     dqkv = random_bf16(qkv_n, 4);
  DeviceBuffer<float> lse(static_cast<int64_t>(B) * NH * T);

  const int hs = C / NH;
  const double fwd_flops = 2.0 * 2.0 * B * NH * static_cast<double>(T) * T * hs / 2.0;
  const double bwd_flops = 2.5 * fwd_flops;
  std::printf("# B %d, T %d, C %d, NH %d (hs %d), bf16, causal, median of %d\n", B, T, C, NH, hs, iters);
  if (cudnn_unsupported.empty()) {
    std::printf("# cuDNN %zu; backward scratch %zu bytes deterministic, %zu nondeterministic\n",
                gpu::cudnn_runtime_version(), det_bytes, nondet_bytes);
  }
  std::printf("%-9s %-30s %9s %9s %9s\n", "pass", "kernel", "ms", "TFLOP/s", "vs flash");
  cudaStream_t s = stream.get();
  auto row = [](const char* pass, const char* kernel, double flops, double ms, double flash_ms) {
    std::printf("%-9s %-30s %9.3f %9.1f %8.2fx\n", pass, kernel, ms, flops / (ms * 1e-3) / 1e12, flash_ms / ms);
  };

  const double flash_fwd = median_ms(
      s, iters, [&] { gpu::flash_attention_forward<bf16>(out.data(), lse.data(), qkv.data(), B, T, C, NH, ctx); });
  row("forward", "flash_attention", fwd_flops, flash_fwd, flash_fwd);
  if (cudnn_unsupported.empty()) {
    row("forward", "cudnn_attention", fwd_flops,
        median_ms(s, iters,
                  [&] { gpu::cudnn_attention_forward<bf16>(out.data(), lse.data(), qkv.data(), B, T, C, NH, ctx); }),
        flash_fwd);
  }

  const double flash_bwd = median_ms(s, iters, [&] {
    gpu::flash_attention_backward<bf16>(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, C, NH, ctx);
  });
  row("backward", "flash_attention", bwd_flops, flash_bwd, flash_bwd);
  if (cudnn_unsupported.empty()) {
    for (CudnnBackwardMode mode : {CudnnBackwardMode::kDeterministic, CudnnBackwardMode::kNondeterministic}) {
      row("backward",
          mode == CudnnBackwardMode::kDeterministic ? "cudnn_attention deterministic"
                                                    : "cudnn_attention nondeterministic",
          bwd_flops,
          median_ms(s, iters,
                    [&] {
                      gpu::cudnn_attention_backward<bf16>(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(),
                                                          B, T, C, NH, ctx, mode);
                    }),
          flash_bwd);
    }
  } else {
    std::printf("cuDNN attention unsupported: %s\n", cudnn_unsupported.c_str());
  }
}

}  // namespace
}  // namespace st
#endif

int main(int argc, char** argv) {
  return st::bench::gpu_main("bench_attention", [&] {
#ifdef SHARDTRAIN_HAVE_CUDA
    int B = 16, T = 1024, C = 768, NH = 12, iters = 20;
    st::bench::parse_int_flags(
        argc, argv, "bench_attention",
        {{"--batch", &B}, {"--seq", &T}, {"--n-embd", &C}, {"--n-head", &NH}, {"--iters", &iters}});
    if (B < 1 || T < 1 || NH < 1 || iters < 1 || C < 1 || C % NH != 0) {
      ST_BAD_INPUT(
          "bench_attention: --batch, --seq, --n-head, --iters must be >= 1 and --n-embd a positive multiple of "
          "--n-head; got B=",
          B, " T=", T, " C=", C, " NH=", NH, " iters=", iters);
    }
    st::run(B, T, C, NH, iters);
#endif
  });
}
