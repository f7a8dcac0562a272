// The token choice of a decoding step at Llama 3's vocabulary (128256 of 128256 padded, bf16 logits) for batches of
// 1, 4 and 16 rows: the greedy argmax (gpu::argmax_rows), the sampled draw on the device (gpu::sample_rows over every
// token and over the top 40), and the draw on the host that it replaces (the rows' logits copied back and
// converted, then the CPU reference). Time per step and the ratio to the argmax, in one run.
//
//   ./build/bench_sample [--vocab 128256] [--iters 50]
//
// Device cases: 3 warm-up and `iters` samples of kCallsPerSample calls back to back with CUDA events, median. The
// host case is timed on the wall clock (median of `iters`), the copy's synchronisation included, as a step pays it.
// One GPU, no MPI.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "bench_util.h"
#include "shardtrain/core/error.h"

#ifdef SHARDTRAIN_HAVE_CUDA
#include "shardtrain/core/cuda.h"
#include "shardtrain/core/stats.h"
#include "shardtrain/kernels/gpu/argmax.h"
#include "shardtrain/kernels/gpu/sample.h"
#include "shardtrain/kernels/sample.h"
#include "shardtrain/kernels/scratch_sizes.h"

namespace st {
namespace {

constexpr int kCallsPerSample = 10;

template <typename Fn>
double per_call_us(cudaStream_t s, int iters, Fn fn) {
  return bench::median_ms(s, iters,
                          [&] {
                            for (int i = 0; i < kCallsPerSample; ++i) fn();
                          }) *
         1e3 / kCallsPerSample;
}

void run(int V, int iters) {
  const int64_t ld = (int64_t{V} + 127) / 128 * 128;
  std::printf("# vocabulary %d (rows of %lld), bf16 logits, median of %d\n", V, static_cast<long long>(ld), iters);
  std::printf("%-5s %-22s %10s %9s\n", "rows", "choice", "us/step", "x argmax");
  for (int rows : {1, 4, 16}) {
    CudaStream stream;
    const cudaStream_t s = stream.get();
    DeviceBuffer<unsigned char> scratch(static_cast<int64_t>(
        std::max(gpu::sample_rows_scratch_bytes(rows, V), gpu::argmax_rows_scratch_bytes(rows, V))));
    const gpu::GpuContext ctx{s, nullptr, scratch.data(), scratch.bytes(), nullptr};
    const DeviceBuffer<bf16> logits = bench::random_device<bf16>(rows * ld, 1, 3.0);
    std::vector<uint64_t> draws(static_cast<size_t>(rows), 17);
    DeviceBuffer<uint64_t> dev_draws(rows);
    ST_CUDA_CHECK(cudaMemcpy(dev_draws.data(), draws.data(), dev_draws.bytes(), cudaMemcpyHostToDevice));
    ST_CUDA_CHECK(cudaDeviceSynchronize());
    DeviceBuffer<int32_t> tokens(rows);
    const double argmax =
        per_call_us(s, iters, [&] { gpu::argmax_rows<bf16>(logits.data(), ld, rows, V, tokens.data(), ctx); });
    auto row = [&](const char* choice, double us) {
      std::printf("%-5d %-22s %10.1f %9.2f\n", rows, choice, us, us / argmax);
    };
    row("argmax (device)", argmax);
    for (const SamplingOptions& o : {SamplingOptions{0.8, 0, 3}, SamplingOptions{0.8, 40, 3}}) {
      row(o.top_k == 0 ? "sample, every token" : "sample, top 40", per_call_us(s, iters, [&] {
            gpu::sample_rows<bf16>(logits.data(), ld, rows, V, dev_draws.data(), o, tokens.data(), ctx);
          }));
    }
    PinnedBuffer<bf16> host(rows * ld);
    std::vector<float> rows_f(static_cast<size_t>(rows * ld));
    std::vector<int32_t> picked(static_cast<size_t>(rows));
    std::vector<double> us;
    for (int i = 0; i < iters + 3; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      ST_CUDA_CHECK(cudaMemcpyAsync(host.data(), logits.data(), logits.bytes(), cudaMemcpyDeviceToHost, s));
      stream.synchronize();
      for (size_t k = 0; k < rows_f.size(); ++k) rows_f[k] = static_cast<float>(host.data()[k]);
      sample_rows(rows_f.data(), ld, rows, V, draws.data(), SamplingOptions{0.8, 40, 3}, picked.data());
      if (i >= 3)
        us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    row("sample, top 40 (host)", median(std::move(us)));
  }
}

}  // namespace
}  // namespace st
#endif

int main(int argc, char** argv) {
  return st::bench::gpu_main("bench_sample", [&] {
#ifdef SHARDTRAIN_HAVE_CUDA
    int V = 128256, iters = 50;
    st::bench::parse_int_flags(argc, argv, "bench_sample", {{"--vocab", &V}, {"--iters", &iters}});
    if (V < 1 || iters < 1) ST_BAD_INPUT("bench_sample: --vocab and --iters must be >= 1; got ", V, " and ", iters);
    st::run(V, iters);
#endif
  });
}
