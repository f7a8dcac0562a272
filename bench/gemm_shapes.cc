// The GEMMs of one GPT-2 training step, one by one, through shardtrain's cuBLASLt layer: TFLOP/s of each
// shape as the model calls it (bias epilogue, GELU epilogue, backward pair), beside the same product with
// no epilogue, so an epilogue or algorithm choice that costs time shows up as a ratio.
//
//   ./build/bench_gemm_shapes [--rows 16384] [--n-embd 768] [--iters 20] [--algos 0]
//
// rows = micro_batch x seq_len. Each case: 3 warm-up and `iters` timed calls with CUDA events on one
// stream, median; random bf16 operands (never zeros). One GPU, no MPI.
//
// --algos K (K > 0) also times, for each shape's forward, input-gradient and weight-gradient product (no epilogue),
// and for the MLP projection's input gradient with the DGELU epilogue, the first K algorithms cuBLASLt's heuristic
// offers, with Blas's own tuning (train.gemm_autotune): how much the heuristic's first choice leaves against the
// fastest of its own list.
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

// out (m x n, row-major) = a (m x k, or k x m with trans_a) . b (k x n, or n x k with trans_b), through a Blas that
// tunes (train.gemm_autotune's mechanism: the first `max_algos` candidates timed on scratch operands, best of three
// rounds of five calls): prints the heuristic's first algorithm's time and the chosen one's.
void algo_sweep(const char* name, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const bf16* a,
                const bf16* b, bf16* out, int max_algos, cudaStream_t s, const gpu::GemmEpilogue& ep = {}) {
  gpu::Blas blas;
  blas.set_tuning(max_algos);
  blas.gemm<bf16>(trans_a, trans_b, m, n, k, 1.0f, a, trans_a ? m : k, 0, b, trans_b ? k : n, 0, 0.0f, out, n, 0, 1, s,
                  ep);
  const gpu::Blas::TuningStats& t = blas.tuning_stats();
  if (t.plans == 0) {
    std::printf("%-10s m %6lld n %6lld k %6lld: not timed (one candidate, or no room for the scratch operands)\n", name,
                static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k));
    return;
  }
  const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  std::printf("%-10s m %6lld n %6lld k %6lld: heuristic #0 %7.3f ms %6.1f TF/s, fastest of its first %2d %7.3f ms"
              " %6.1f TF/s (%.3fx)\n",
              name, static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k), t.first_ms,
              flops / (t.first_ms * 1e-3) / 1e12, max_algos, t.chosen_ms, flops / (t.chosen_ms * 1e-3) / 1e12,
              t.first_ms / t.chosen_ms);
}

void run(int64_t rows, int C, int iters, int algos) {
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
    row("matmul_backward (no db)", 2 * fwd_flops, median_ms(s, iters, [&] {
          gpu::matmul_backward<bf16>(dinp.data(), dw.data(), nullptr, dout.data(), inp.data(), w.data(), rows, sh.c,
                                     sh.oc, ctx);
        }));
    if (sh.c == 4 * C) {  // the MLP projection's backward through the GELU, and its input gradient alone
      row("matmul_backward_gelu", 2 * fwd_flops, median_ms(s, iters, [&] {
            gpu::matmul_backward_gelu<bf16>(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(),
                                            aux.data(), rows, sh.c, sh.oc, ctx);
          }));
      gpu::GemmEpilogue dgelu;
      dgelu.dgelu_aux = aux.data();
      // dinp = dout . w, from w as the model stores it ([OC, C]) or transposed ([C, OC]: B transposed, the forward's
      // layout, for which cuBLASLt may offer other kernels), with or without the DGELU epilogue.
      auto dinp_row = [&](const char* call, bool w_transposed, const gpu::GemmEpilogue& ep) {
        row(call, fwd_flops, median_ms(s, iters, [&] {
              blas.gemm(false, w_transposed, rows, sh.c, sh.oc, 1.0f, dout.data(), sh.oc, 0, w.data(),
                        w_transposed ? sh.oc : sh.c, 0, 0.0f, dinp.data(), sh.c, 0, 1, s, ep);
            }));
      };
      dinp_row("dinp gemm, dgelu", false, dgelu);
      dinp_row("dinp gemm, no epilogue", false, {});
      dinp_row("dinp gemm, dgelu, w^T", true, dgelu);
      dinp_row("dinp gemm, w^T", true, {});
    }
  }
  std::printf("distinct cuBLASLt plans: %zu\n", blas.plan_count());
  if (algos <= 0) return;
  std::printf("# the heuristic's first algorithm against the fastest of its first %d (no epilogue)\n", algos);
  for (const Shape& sh : shapes) {
    // forward out = inp . w^T; input gradient dinp = dout . w; weight gradient dw = dout^T . inp
    algo_sweep(sh.name, false, true, rows, sh.oc, sh.c, inp.data(), w.data(), out.data(), algos, s);
    algo_sweep(sh.name, false, false, rows, sh.c, sh.oc, dout.data(), w.data(), dinp.data(), algos, s);
    algo_sweep(sh.name, true, false, sh.oc, sh.c, rows, dout.data(), inp.data(), dw.data(), algos, s);
  }
  gpu::GemmEpilogue dgelu;  // the MLP projection's input gradient with the GELU's derivative applied (DGELU)
  dgelu.dgelu_aux = aux.data();
  algo_sweep("mlp.proj dgelu", false, false, rows, 4 * C, C, dout.data(), w.data(), dinp.data(), algos, s, dgelu);
}

}  // namespace
}  // namespace st
#endif

int main(int argc, char** argv) {
  return st::bench::gpu_main("bench_gemm_shapes", [&] {
#ifdef SHARDTRAIN_HAVE_CUDA
    int64_t rows = 16384;
    int C = 768, iters = 20, algos = 0;
    st::bench::parse_int_flags(argc, argv, "bench_gemm_shapes",
                               {{"--rows", &rows}, {"--n-embd", &C}, {"--iters", &iters}, {"--algos", &algos}});
    if (rows < 1 || C < 1 || iters < 1) ST_BAD_INPUT("bench_gemm_shapes: --rows, --n-embd and --iters must be >= 1");
    st::run(rows, C, iters, algos);
#endif
  });
}
