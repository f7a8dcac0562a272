// A llama block's linear layers, one by one, in bf16 and in FP8 (model/cuda_linear.h's calls): each GEMM's time in
// bf16 through cuBLASLt, the FP8 GEMM's time on cast operands, and the time of the casts that feed it, for both
// recipes, so that a step's FP8 profile (fwd.fp8_cast, fwd.fp8_gemm, ...) splits by layer and by cast kind. The casts'
// effective bandwidth counts one read of the bf16 operand and one write of its codes. A last row per layer times the
// backward's cast of dy for both of its GEMMs at once (gpu::fp8_quantize_pair_async), which a step runs instead of
// dy's two casts in the GEMM rows.
//
//   ./build/bench_fp8_linear [--rows 8192] [--n-embd 3072] [--ffn 8192] [--qkv 5120] [--iters 20]
//
// The defaults are Llama-3.2-3B at micro batch 4, T 2048 (rows = micro_batch x seq_len; qkv = (heads + 2 x kv
// heads) x head size). Each case: 3 warm-up and `iters` timed calls with CUDA events on one stream, median; random
// operands at the scale of activations (1), weights (0.02) and gradients (1e-3). One GPU, no MPI.
//
// A last table times what train.fp8=delayed runs instead, each kernel one pass with the scale known ahead: the casts
// ahead (gpu::fp8_quantize_ahead_async: a weight in both layouts, a layer's input in both, dy's pair) and the
// producers that write their output's codes (RMSNorm, SwiGLU forward and backward) beside their bf16 forms, in GB/s
// of the bytes each reads and writes once.
#include <cstdint>
#include <cstdio>

#include "bench_util.h"
#include "shardtrain/core/error.h"

#ifdef SHARDTRAIN_HAVE_CUDA
#include "shardtrain/core/cuda.h"
#include "shardtrain/kernels/gpu/fp8.h"
#include "shardtrain/kernels/gpu/fp8_gemm.h"
#include "shardtrain/kernels/gpu/matmul.h"
#include "shardtrain/kernels/gpu/rmsnorm.h"
#include "shardtrain/kernels/gpu/swiglu.h"
#include "shardtrain/model/fp8_policy.h"

namespace st {
namespace {

using bench::median_ms;

struct Layer {
  const char* name;
  int64_t in, out;
};

// The cast's codes and inverse scales, sized for the largest operand.
struct Casts {
  DeviceBuffer<uint8_t> a, b, t;
  DeviceBuffer<float> a_inv, b_inv, t_inv;
  DeviceBuffer<unsigned char> scratch;
  Casts(int64_t codes, int64_t groups)
      : a(codes),
        b(codes),
        t(codes),
        a_inv(groups),
        b_inv(groups),
        t_inv(groups),
        scratch(static_cast<int64_t>(gpu::fp8_quantize_scratch_bytes(2 * groups))) {}
};

// train.fp8=delayed's one-pass kernels at the block's shapes; `casts` holds room for the widest operand's codes.
void run_delayed(int64_t N, int64_t C, int64_t F, int64_t QKV, int iters, const gpu::GpuContext& ctx, Casts& casts) {
  cudaStream_t s = ctx.stream;
  const int64_t widest = std::max({C, F, QKV, 2 * F});
  const DeviceBuffer<bf16> x = bench::random_bf16(N * 2 * F, 4), dy = bench::random_bf16(N * widest, 5, 1e-3),
                           w = bench::random_bf16(2 * F * C, 6, 0.02), norm_w = bench::random_bf16(C, 7, 0.1);
  DeviceBuffer<bf16> out(N * 2 * F);
  DeviceBuffer<float> rstd(N);
  DeviceBuffer<unsigned> amax(3), own(1);
  gpu::fp8_maxima_async<bf16>(x.data(), N, 2 * F, Fp8Scaling::kTensor, amax.data(), ctx);
  gpu::fp8_maxima_async<bf16>(w.data(), 2 * F, C, Fp8Scaling::kTensor, amax.data() + 1, ctx);
  gpu::fp8_maxima_async<bf16>(dy.data(), N, widest, Fp8Scaling::kTensor, amax.data() + 2, ctx);
  std::printf("\ndelayed: one pass a kernel, scale known ahead; ms per call and GB/s of bytes read + written\n");
  std::printf("%-34s %9s %9s\n", "kernel", "ms", "GB/s");
  const auto row = [&](const char* name, double bytes, const auto& fn) {
    const double ms = median_ms(s, iters, fn);
    std::printf("%-34s %9.3f %9.0f\n", name, ms, bytes / (ms * 1e6));
  };
  uint8_t *q = casts.a.data(), *q_t = casts.t.data();
  float* inv = casts.a_inv.data();
  const struct {
    const char* name;
    int64_t rows, cols;
    const bf16* src;
    const unsigned* max;
    Fp8Format f;
  } aheads[] = {{"W attn.qkv, both layouts", QKV, C, w.data(), amax.data() + 1, Fp8Format::kE4M3},
                {"W mlp.gate_up, both layouts", 2 * F, C, w.data(), amax.data() + 1, Fp8Format::kE4M3},
                {"W mlp.down, both layouts", C, F, w.data(), amax.data() + 1, Fp8Format::kE4M3},
                {"x attn.o, both layouts", N, C, x.data(), amax.data(), Fp8Format::kE4M3},
                {"dy attn.qkv pair", N, QKV, dy.data(), amax.data() + 2, Fp8Format::kE5M2},
                {"dy mlp.down pair", N, C, dy.data(), amax.data() + 2, Fp8Format::kE5M2}};
  for (const auto& a : aheads)
    row(a.name, 4.0 * static_cast<double>(a.rows * a.cols),
        [&] { gpu::fp8_quantize_ahead_async<bf16>(a.src, a.rows, a.cols, a.f, a.max, q, q_t, inv, own.data(), ctx); });
  const double nc = static_cast<double>(N * C), nf = static_cast<double>(N * F);
  row("RMSNorm, bf16 out", 4.0 * nc, [&] {
    gpu::rmsnorm_forward<bf16>(out.data(), rstd.data(), x.data(), norm_w.data(), 1e-5f, N, static_cast<int>(C), ctx);
  });
  row("RMSNorm, codes in both layouts", 4.0 * nc, [&] {
    gpu::rmsnorm_forward_fp8<bf16>(q, q_t, inv, own.data(), rstd.data(), x.data(), norm_w.data(), 1e-5f, N,
                                   static_cast<int>(C), Fp8Format::kE4M3, amax.data(), ctx);
  });
  row("RMSNorm, codes in x's layout", 3.0 * nc, [&] {
    gpu::rmsnorm_forward_fp8<bf16>(q, nullptr, inv, own.data(), rstd.data(), x.data(), norm_w.data(), 1e-5f, N,
                                   static_cast<int>(C), Fp8Format::kE4M3, amax.data(), ctx);
  });
  row("SwiGLU forward, bf16 out", 6.0 * nf,
      [&] { gpu::swiglu_forward<bf16>(out.data(), x.data(), N, static_cast<int>(F), ctx); });
  row("SwiGLU forward, codes both layouts", 6.0 * nf, [&] {
    gpu::swiglu_forward_fp8<bf16>(q, q_t, inv, own.data(), x.data(), N, static_cast<int>(F), Fp8Format::kE4M3,
                                  amax.data(), ctx);
  });
  row("SwiGLU backward, bf16 out", 10.0 * nf,
      [&] { gpu::swiglu_backward<bf16>(out.data(), dy.data(), x.data(), N, static_cast<int>(F), ctx); });
  row("SwiGLU backward, codes both layouts", 10.0 * nf, [&] {
    gpu::swiglu_backward_fp8<bf16>(q, q_t, inv, own.data(), dy.data(), x.data(), N, static_cast<int>(F),
                                   Fp8Format::kE5M2, amax.data() + 2, ctx);
  });
}

void run(int64_t rows, int64_t C, int64_t F, int64_t QKV, int iters) {
  CudaStream stream;
  cudaStream_t s = stream.get();
  gpu::Blas blas;
  const Layer layers[] = {{"attn.qkv", C, QKV}, {"attn.o", C, C}, {"mlp.gate_up", C, 2 * F}, {"mlp.down", F, C}};
  int64_t widest = 0;
  for (const Layer& l : layers) widest = std::max({widest, l.in, l.out});
  const DeviceBuffer<bf16> x = bench::random_bf16(rows * widest, 1), dy = bench::random_bf16(rows * widest, 2, 1e-3),
                           w = bench::random_bf16(widest * widest, 3, 0.02);
  DeviceBuffer<bf16> out(rows * widest), dw(widest * widest);
  Casts casts(std::max(rows, widest) * widest, std::max(rows, widest));
  gpu::GpuContext ctx{s, &blas, casts.scratch.data(), casts.scratch.bytes()};
  std::printf(
      "rows %lld, C %lld, F %lld, qkv %lld; ms per call (median of %d), casts in GB/s of bf16 read + codes "
      "written\n",
      static_cast<long long>(rows), static_cast<long long>(C), static_cast<long long>(F), static_cast<long long>(QKV),
      iters);
  std::printf("%-12s %-10s %9s %9s %9s %9s %9s\n", "layer", "gemm", "bf16", "fp8 t", "fp8 r", "casts t", "casts r");
  double total_bf16 = 0, total_t = 0, total_r = 0, cast_t = 0, cast_r = 0;
  for (const Layer& l : layers) {
    const int64_t N = rows, in = l.in, out_f = l.out;
    // The three GEMMs: {m, n, k} of the FP8 form and the two operands' casts (rows, cols, source, layout).
    struct Op {
      const char* name;
      int64_t m, n, k;
      const bf16 *a_src, *b_src;
      int64_t a_rows, a_cols, b_rows, b_cols;
      Fp8Layout a_layout, b_layout;
    };
    const Op ops[] = {
        {"forward", N, out_f, in, x.data(), w.data(), N, in, out_f, in, Fp8Layout::kRowMajor, Fp8Layout::kRowMajor},
        {"input grad", N, in, out_f, dy.data(), w.data(), N, out_f, out_f, in, Fp8Layout::kRowMajor,
         Fp8Layout::kTransposed},
        {"weight grad", out_f, in, N, dy.data(), x.data(), N, out_f, N, in, Fp8Layout::kTransposed,
         Fp8Layout::kTransposed}};
    const Fp8Gemm* policy_gemms[2][3];
    const Fp8Policy t = fp8_policy(Fp8Recipe::kTensorwise), r = fp8_policy(Fp8Recipe::kRowwise);
    for (int p = 0; p < 2; ++p) {
      const Fp8Policy& pol = p == 0 ? t : r;
      policy_gemms[p][0] = &pol.forward;
      policy_gemms[p][1] = &pol.input_grad;
      policy_gemms[p][2] = &pol.weight_grad;
    }
    for (int o = 0; o < 3; ++o) {
      const Op& op = ops[o];
      double bf16_ms = 0;
      if (o == 0)
        bf16_ms = median_ms(s, iters, [&] {
          blas.gemm<bf16>(false, true, N, out_f, in, 1.0f, x.data(), in, 0, w.data(), in, 0, 0.0f, out.data(), out_f, 0,
                          1, s);
        });
      else if (o == 1)
        bf16_ms = median_ms(s, iters, [&] {
          blas.gemm<bf16>(false, false, N, in, out_f, 1.0f, dy.data(), out_f, 0, w.data(), in, 0, 0.0f, out.data(), in,
                          0, 1, s);
        });
      else
        bf16_ms = median_ms(s, iters, [&] {
          blas.gemm<bf16>(true, false, out_f, in, N, 1.0f, dy.data(), out_f, 0, x.data(), in, 0, 0.0f, dw.data(), in, 0,
                          1, s);
        });
      double fp8_ms[2], cast_ms[2];
      for (int p = 0; p < 2; ++p) {
        const Fp8Gemm& g = *policy_gemms[p][o];
        const Fp8Policy& pol = p == 0 ? t : r;
        const auto cast = [&] {
          gpu::fp8_quantize_matrix_async<bf16>(op.a_src, op.a_rows, op.a_cols, g.a.format, g.a.scaling, pol.power_of_2,
                                               op.a_layout, casts.a.data(), casts.a_inv.data(), ctx);
          gpu::fp8_quantize_matrix_async<bf16>(op.b_src, op.b_rows, op.b_cols, g.b.format, g.b.scaling, pol.power_of_2,
                                               op.b_layout, casts.b.data(), casts.b_inv.data(), ctx);
        };
        cast_ms[p] = median_ms(s, iters, cast);
        const bool per_row = p == 1;
        bf16* dst = o == 2 ? dw.data() : out.data();
        fp8_ms[p] = median_ms(s, iters, [&] {
          gpu::fp8_gemm<bf16>(dst, op.n, GradWrite::kOverwrite,
                              {casts.a.data(), op.k, g.a.format, casts.a_inv.data(), per_row},
                              {casts.b.data(), op.k, g.b.format, casts.b_inv.data(), per_row}, op.m, op.n, op.k, ctx);
        });
      }
      const double bytes = 3.0 * static_cast<double>(op.a_rows * op.a_cols + op.b_rows * op.b_cols);  // 2 B + 1 B
      std::printf("%-12s %-10s %9.3f %9.3f %9.3f %9.3f %9.3f   (%.0f / %.0f GB/s)\n", l.name, op.name, bf16_ms,
                  fp8_ms[0], fp8_ms[1], cast_ms[0], cast_ms[1], bytes / (cast_ms[0] * 1e6), bytes / (cast_ms[1] * 1e6));
      total_bf16 += bf16_ms;
      total_t += fp8_ms[0];
      total_r += fp8_ms[1];
      cast_t += cast_ms[0];
      cast_r += cast_ms[1];
    }
    // The backward casts dy once for both of its GEMMs (CudaLinear: gpu::fp8_quantize_pair_async), which replaces
    // dy's two casts above (input grad's row-major, weight grad's transposed).
    double pair_ms[2];
    for (int p = 0; p < 2; ++p) {
      const Fp8Policy& pol = p == 0 ? t : r;
      pair_ms[p] = median_ms(s, iters, [&] {
        gpu::fp8_quantize_pair_async<bf16>(
            dy.data(), N, out_f, pol.power_of_2,
            {pol.input_grad.a.format, pol.input_grad.a.scaling, casts.a.data(), casts.a_inv.data()},
            {pol.weight_grad.a.format, pol.weight_grad.a.scaling, casts.t.data(), casts.t_inv.data()}, ctx);
      });
    }
    const double pair_bytes = 4.0 * static_cast<double>(N * out_f);  // 2 B read, 2 x 1 B written
    std::printf("%-12s %-10s %9s %9s %9s %9.3f %9.3f   (%.0f / %.0f GB/s)\n", l.name, "dy pair", "", "", "", pair_ms[0],
                pair_ms[1], pair_bytes / (pair_ms[0] * 1e6), pair_bytes / (pair_ms[1] * 1e6));
  }
  std::printf("%-23s %9.3f %9.3f %9.3f %9.3f %9.3f   a block, all GEMMs and casts\n", "total", total_bf16, total_t,
              total_r, cast_t, cast_r);
  run_delayed(rows, C, F, QKV, iters, ctx, casts);
}

}  // namespace
}  // namespace st
#endif

int main(int argc, char** argv) {
  return st::bench::gpu_main("bench_fp8_linear", [&] {
#ifdef SHARDTRAIN_HAVE_CUDA
    int64_t rows = 8192, C = 3072, F = 8192, QKV = 5120;
    int iters = 20;
    st::bench::parse_int_flags(
        argc, argv, "bench_fp8_linear",
        {{"--rows", &rows}, {"--n-embd", &C}, {"--ffn", &F}, {"--qkv", &QKV}, {"--iters", &iters}});
    if (rows < 16 || C < 16 || F < 16 || QKV < 16 || iters < 1 || rows % 16 || C % 16 || F % 16 || QKV % 16)
      ST_BAD_INPUT("bench_fp8_linear: --rows, --n-embd, --ffn and --qkv must be multiples of 16, --iters >= 1");
    st::run(rows, C, F, QKV, iters);
#endif
  });
}
