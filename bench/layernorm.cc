// LayerNorm forward and backward (gpu::layernorm_*) at one shape, GPT-2 350M's by default (16 x 1024 tokens,
// n_embd 1024): time per call and effective memory bandwidth.
//
//   ./build/bench_layernorm [--rows 16384] [--n-embd 1024] [--dtype bf16|fp16|fp32] [--iters 50]
//                           [--staging auto|staged|direct]
//
// Each pass: 3 warm-up and `iters` timed samples with CUDA events on one stream, median; a sample is
// kCallsPerSample calls back to back, as in a training step where the stream's queue is never empty (an event pair
// around one call on an idle GPU adds a launch latency of the order of the forward's own time; docs/performance.md,
// "How to measure"). Inputs are random (rows with mean 1, standard deviation 2). Bytes counted are the activations'
// only, each once:
//   forward  reads inp, writes out                    = 2 * rows * n_embd * sizeof(T)
//   backward reads inp, dout and dinp, writes dinp    = 4 * rows * n_embd * sizeof(T)  (dinp is accumulated into)
// mean/rstd (8 bytes a row), weight/bias and the backward's partial column sums are left out, so GB/s is what the
// caller gets per byte of activations, to set against the device's memory bandwidth (docs/performance.md gives the
// H200's peak and what a device-to-device copy reaches).
// One GPU, no MPI.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_util.h"
#include "shardtrain/core/error.h"

#ifdef SHARDTRAIN_HAVE_CUDA
#include "shardtrain/core/cuda.h"
#include "shardtrain/kernels/gpu/layernorm.h"

namespace st {
namespace {

using bench::median_ms;
using bench::random_device;

constexpr int kCallsPerSample = 10;

// Median time of one call of fn, in ms.
template <typename Fn>
double per_call_ms(cudaStream_t s, int iters, Fn fn) {
  return median_ms(s, iters,
                   [&] {
                     for (int i = 0; i < kCallsPerSample; ++i) fn();
                   }) /
         kCallsPerSample;
}

template <typename T>
void run(int64_t N, int C, const char* dtype, int iters, gpu::RowStaging staging) {
  CudaStream stream;
  DeviceBuffer<unsigned char> scratch(static_cast<int64_t>(gpu::layernorm_backward_scratch_bytes(N, C)));
  const gpu::GpuContext ctx{stream.get(), nullptr, scratch.data(), scratch.bytes(), nullptr};

  const int64_t n = N * C;
  DeviceBuffer<T> inp = random_device<T>(n, 1, 2.0, 1.0), dout = random_device<T>(n, 2), dinp = random_device<T>(n, 3),
                  out(n);
  DeviceBuffer<T> weight = random_device<T>(C, 4, 0.5, 1.0), bias = random_device<T>(C, 5),
                  dweight = random_device<T>(C, 6), dbias = random_device<T>(C, 7);
  DeviceBuffer<float> mean(N), rstd(N);

  const double act = static_cast<double>(n) * sizeof(T);
  std::printf("# rows %lld, n_embd %d, %s, median of %d; GB/s counts activation bytes only (see bench/layernorm.cc)\n",
              static_cast<long long>(N), C, dtype, iters);
  std::printf("# backward scratch %zu bytes\n", gpu::layernorm_backward_scratch_bytes(N, C));
  std::printf("%-9s %12s %10s %9s\n", "pass", "bytes", "us", "GB/s");
  auto row = [](const char* pass, double bytes, double ms) {
    std::printf("%-9s %12.0f %10.2f %9.1f\n", pass, bytes, ms * 1e3, bytes / (ms * 1e-3) / 1e9);
  };
  cudaStream_t s = stream.get();
  row("forward", 2 * act, per_call_ms(s, iters, [&] {
        gpu::layernorm_forward<T>(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), N, C,
                                  ctx);
      }));
  // dinp, dweight and dbias grow by one gradient per call; the time does not depend on their values.
  row("backward", 4 * act, per_call_ms(s, iters, [&] {
        gpu::layernorm_backward<T>(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), weight.data(),
                                   mean.data(), rstd.data(), N, C, ctx, GradWrite::kAccumulate, staging);
      }));
}

}  // namespace
}  // namespace st
#endif

int main(int argc, char** argv) {
  return st::bench::gpu_main("bench_layernorm", [&] {
#ifdef SHARDTRAIN_HAVE_CUDA
    int64_t N = 16384;
    int C = 1024, iters = 50;
    std::string dtype = "bf16";
    std::string staging_name = "auto";
    std::vector<char*> rest = st::bench::take_text_flag(argc, argv, "--dtype", &dtype);
    rest = st::bench::take_text_flag(static_cast<int>(rest.size()), rest.data(), "--staging", &staging_name);
    st::bench::parse_int_flags(static_cast<int>(rest.size()), rest.data(), "bench_layernorm",
                               {{"--rows", &N}, {"--n-embd", &C}, {"--iters", &iters}});
    if (N < 1 || C < 1 || iters < 1) {
      ST_BAD_INPUT("bench_layernorm: --rows, --n-embd and --iters must be >= 1; got rows=", N, " n-embd=", C,
                   " iters=", iters);
    }
    st::gpu::RowStaging staging = st::gpu::RowStaging::kAuto;
    if (staging_name == "staged") {
      staging = st::gpu::RowStaging::kStaged;
    } else if (staging_name == "direct") {
      staging = st::gpu::RowStaging::kDirect;
    } else if (staging_name != "auto") {
      ST_BAD_INPUT("bench_layernorm: --staging must be auto, staged or direct; got ", staging_name);
    }
    std::printf("# backward row staging: %s (bf16/fp16 at C <= 2560, a multiple of 8)\n", staging_name.c_str());
    if (dtype == "bf16") {
      st::run<st::bf16>(N, C, "bf16", iters, staging);
    } else if (dtype == "fp16") {
      st::run<st::fp16>(N, C, "fp16", iters, staging);
    } else if (dtype == "fp32") {
      st::run<float>(N, C, "fp32", iters, staging);
    } else {
      ST_BAD_INPUT("bench_layernorm: --dtype must be bf16, fp16 or fp32; got ", dtype);
    }
#endif
  });
}
