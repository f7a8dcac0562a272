// The GEMMs of one GPT-2 training step, one by one, through shardtrain's cuBLASLt layer: TFLOP/s of each
// shape as the model calls it (bias epilogue, GELU epilogue, backward pair), beside the same product with
// no epilogue, so an epilogue or algorithm choice that costs time shows up as a ratio.
//
//   ./build/bench_gemm_shapes [--rows 16384] [--n-embd 768] [--iters 20]
//
// rows = micro_batch x seq_len. Each case: 3 warm-up and `iters` timed calls with CUDA events on one
// stream, median; random bf16 operands (never zeros). One GPU, no MPI.
#include <cstdint>
#include <cstdio>

#include "bench_util.h"
#include "shardtrain/core/error.h"

#ifdef SHARDTRAIN_HAVE_CUDA
#include "shardtrain/core/cuda.h"
#include "shardtrain/kernels/gpu/matmul.h"

namespace st {
namespace {

using bench::median_ms;

// Operands at GPT-2's initialisation scale, 0.02 * N(0, 1).
DeviceBuffer<bf16> random_bf16(int64_t n, uint64_t stream) { return bench::random_bf16(n, stream, 0.02); }

void run(int64_t rows, int C, int iters) {
  CudaStream stream;
  gpu::Blas blas;
  const int64_t max_oc = 4 * C;
  DeviceBuffer<unsigned char> scratch(static_cast<int64_t>(gpu::matmul_backward_scratch_bytes(rows, max_oc)));
  gpu::GpuContext ctx{stream.get(), &blas, scratch.data(), scratch.bytes()};
  DeviceBuffer<bf16> inp = random_bf16(rows * max_oc, 1), w = random_bf16(max_oc * max_oc, 2),
                     bias = random_bf16(max_oc, 3), out = random_bf16(rows * max_oc, 4),
                     aux = random_bf16(rows * max_oc, 5), dout = random_bf16(rows * max_oc, 6),
                     dinp = random_bf16(rows * max_oc, 7), dw = random_bf16(max_oc * max_oc, 8),
                     db = random_bf16(max_oc, 9);
  struct Shape {
    const char* name;
    int c, oc;
  };
  const Shape shapes[] = {{"attn.qkv", C, 3 * C}, {"attn.proj", C, C}, {"mlp.fc", C, 4 * C}, {"mlp.proj", 4 * C, C}};
  std::printf("# rows %lld, n_embd %d, bf16, median of %d\n", static_cast<long long>(rows), C, iters);
  std::printf("%-10s %-22s %9s %9s\n", "shape", "call", "ms", "TFLOP/s");
  cudaStream_t s = stream.get();
  for (const Shape& sh : shapes) {
    const double fwd_flops = 2.0 * static_cast<double>(rows) * sh.c * sh.oc;
    auto row = [&](const char* call, double flops, double ms) {
      std::printf("%-10s %-22s %9.3f %9.1f\n", sh.name, call, ms, flops / (ms * 1e-3) / 1e12);
    };
    row("gemm, no epilogue", fwd_flops, median_ms(s, iters, [&] {
          blas.gemm(false, true, rows, sh.oc, sh.c, 1.0f, inp.data(), sh.c, 0, w.data(), sh.c, 0, 0.0f, out.data(),
                    sh.oc, 0, 1, s);
        }));
    row("matmul_forward (bias)", fwd_flops,
        median_ms(s, iters, [&] { gpu::matmul_forward<bf16>(out.data(), inp.data(), w.data(), bias.data(), rows, sh.c,
                                                             sh.oc, ctx); }));
    if (sh.oc == 4 * C)
      row("matmul_forward_gelu", fwd_flops, median_ms(s, iters, [&] {
            gpu::matmul_forward_gelu<bf16>(out.data(), aux.data(), inp.data(), w.data(), bias.data(), rows, sh.c, sh.oc,
                                           ctx);
          }));
    row("matmul_backward (+db)", 2 * fwd_flops, median_ms(s, iters, [&] {
          gpu::matmul_backward<bf16>(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), rows, sh.c,
                                     sh.oc, ctx);
        }));
  }
  std::printf("distinct cuBLASLt plans: %zu\n", blas.plan_count());
}

}  // namespace
}  // namespace st
#endif

int main(int argc, char** argv) {
  try {
#ifdef SHARDTRAIN_HAVE_CUDA
    int64_t rows = 16384;
    int C = 768, iters = 20;
    st::bench::parse_int_flags(argc, argv, "bench_gemm_shapes",
                               {{"--rows", &rows}, {"--n-embd", &C}, {"--iters", &iters}});
    if (rows < 1 || C < 1 || iters < 1) ST_BAD_INPUT("bench_gemm_shapes: --rows, --n-embd and --iters must be >= 1");
    if (st::cuda_device_count() == 0) ST_BAD_INPUT("bench_gemm_shapes: no CUDA device visible");
    st::run(rows, C, iters);
#else
    ST_BAD_INPUT("bench_gemm_shapes needs the CUDA backend; this build has none");
#endif
    return 0;
  } catch (const st::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return st::exit_code_for(e.kind());
  }
}
