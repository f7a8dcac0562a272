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
// the first K algorithms cuBLASLt's heuristic offers, straight through cuBLASLt: how much the heuristic's first
// choice (the one shardtrain runs) leaves against the fastest of its own list.
#include <cstdint>
#include <cstdio>

#include "bench_util.h"
#include "shardtrain/core/error.h"

#ifdef SHARDTRAIN_HAVE_CUDA
#include <cublasLt.h>

#include <vector>

#include "shardtrain/core/cuda.h"
#include "shardtrain/kernels/gpu/matmul.h"

namespace st {
namespace {

using bench::median_ms;

// Operands at GPT-2's initialisation scale, 0.02 * N(0, 1).
DeviceBuffer<bf16> random_bf16(int64_t n, uint64_t stream) { return bench::random_bf16(n, stream, 0.02); }

// out (m x n, row-major) = a (m x k, or k x m with trans_a) . b (k x n, or n x k with trans_b), as Blas::gemm lays
// it out for cuBLASLt (column-major: out^T = b^T a^T). Prints the heuristic's first algorithm and the fastest of its
// first `max_algos`.
void algo_sweep(const char* name, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const bf16* a,
                const bf16* b, bf16* out, int iters, int max_algos, cudaStream_t s) {
  cublasLtHandle_t h = nullptr;
  ST_CUBLAS_CHECK(cublasLtCreate(&h));
  DeviceBuffer<unsigned char> ws(static_cast<int64_t>(gpu::Blas::kDefaultWorkspaceBytes));
  cublasLtMatmulDesc_t desc = nullptr;
  ST_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op1 = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, op2 = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  ST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op1, sizeof(op1)));
  ST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op2, sizeof(op2)));
  const int64_t ldb = trans_b ? k : n, lda = trans_a ? m : k;
  cublasLtMatrixLayout_t first = nullptr, second = nullptr, lo = nullptr;
  ST_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&first, CUDA_R_16BF, trans_b ? k : n, trans_b ? n : k, ldb));
  ST_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&second, CUDA_R_16BF, trans_a ? m : k, trans_a ? k : m, lda));
  ST_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lo, CUDA_R_16BF, n, m, n));
  cublasLtMatmulPreference_t pref = nullptr;
  ST_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t wsb = gpu::Blas::kDefaultWorkspaceBytes;
  ST_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb)));
  std::vector<cublasLtMatmulHeuristicResult_t> res(static_cast<size_t>(max_algos));
  int got = 0;
  ST_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(h, desc, first, second, lo, lo, pref, max_algos, res.data(), &got));
  const float alpha = 1.0f, beta = 0.0f;
  double first_ms = 0, best_ms = 1e30;
  int best = -1;
  for (int i = 0; i < got; ++i) {
    if (res[static_cast<size_t>(i)].state != CUBLAS_STATUS_SUCCESS) continue;
    const cublasLtMatmulAlgo_t* algo = &res[static_cast<size_t>(i)].algo;
    const double ms = bench::median_ms(s, iters, [&] {
      ST_CUBLAS_CHECK(cublasLtMatmul(h, desc, &alpha, b, first, a, second, &beta, out, lo, out, lo, algo, ws.data(),
                                     wsb, s));
    });
    if (i == 0) first_ms = ms;
    if (ms < best_ms) best_ms = ms, best = i;
  }
  const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  std::printf("%-10s m %6lld n %6lld k %6lld: heuristic #0 %7.3f ms %6.1f TF/s, fastest of %2d #%-2d %7.3f ms %6.1f TF/s"
              " (%.3fx)\n",
              name, static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k), first_ms,
              flops / (first_ms * 1e-3) / 1e12, got, best, best_ms, flops / (best_ms * 1e-3) / 1e12, first_ms / best_ms);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(first);
  cublasLtMatrixLayoutDestroy(second);
  cublasLtMatrixLayoutDestroy(lo);
  cublasLtMatmulDescDestroy(desc);
  cublasLtDestroy(h);
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
  }
  std::printf("distinct cuBLASLt plans: %zu\n", blas.plan_count());
  if (algos <= 0) return;
  std::printf("# the heuristic's first algorithm against the fastest of its first %d (no epilogue)\n", algos);
  for (const Shape& sh : shapes) {
    // forward out = inp . w^T; input gradient dinp = dout . w; weight gradient dw = dout^T . inp
    algo_sweep(sh.name, false, true, rows, sh.oc, sh.c, inp.data(), w.data(), out.data(), iters, algos, s);
    algo_sweep(sh.name, false, false, rows, sh.c, sh.oc, dout.data(), w.data(), dinp.data(), iters, algos, s);
    algo_sweep(sh.name, true, false, sh.oc, sh.c, rows, dout.data(), inp.data(), dw.data(), iters, algos, s);
  }
}

}  // namespace
}  // namespace st
#endif

int main(int argc, char** argv) {
  try {
#ifdef SHARDTRAIN_HAVE_CUDA
    int64_t rows = 16384;
    int C = 768, iters = 20, algos = 0;
    st::bench::parse_int_flags(argc, argv, "bench_gemm_shapes",
                               {{"--rows", &rows}, {"--n-embd", &C}, {"--iters", &iters}, {"--algos", &algos}});
    if (rows < 1 || C < 1 || iters < 1) ST_BAD_INPUT("bench_gemm_shapes: --rows, --n-embd and --iters must be >= 1");
    if (st::cuda_device_count() == 0) ST_BAD_INPUT("bench_gemm_shapes: no CUDA device visible");
    st::run(rows, C, iters, algos);
#else
    ST_BAD_INPUT("bench_gemm_shapes needs the CUDA backend; this build has none");
#endif
    return 0;
  } catch (const st::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return st::exit_code_for(e.kind());
  }
}
