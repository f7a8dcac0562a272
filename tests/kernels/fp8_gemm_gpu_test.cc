// gpu::fp8_gemm (cuBLASLt) against the CPU reference st::fp8_gemm on the same codes and inverse scales, for T = float
// and bf16: tensorwise and rowwise (cuBLASLt's outer-vector scales), written (out poisoned first) and accumulated, the
// output's padding columns untouched, on the three GEMMs of both families' linear layers at small sizes (gpt2's
// qkv, fc and fc-projection, llama's grouped qkv, gate/up and down), each with the FP8 policy's formats (forward
// E4M3 x E4M3, input and weight gradients E5M2 x E4M3) and casts (transposed for W^T, dy^T and x^T), plus E4M3 x E5M2.
// Plans are cached, and a second Blas given the first's algorithms computes the same bits; shapes the CPU refuses
// are refused with its message; NaN from an async cast reaches the outputs that read it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "../common/caught.h"
#include "../common/fp8_gpu_test.h"
#include "../common/snr.h"
#include "gpu_kernel_test.h"
#include "shardtrain/core/error.h"
#include "shardtrain/kernels/fp8.h"
#include "shardtrain/kernels/fp8_gemm.h"
#include "shardtrain/kernels/gpu/fp8.h"
#include "shardtrain/kernels/gpu/fp8_gemm.h"
#include "shardtrain/kernels/gpu/matmul.h"

namespace st {
namespace {

using test::poison;
using test::to_host;

// The bar. Both sides sum exact products (an FP8 code has at most 4 significant bits) and scale once, but Hopper's
// and Ada's FP8 tensor cores do not accumulate in fp32: between cuBLASLt's promotions of the partial sums to fp32
// (FAST_ACCUM off), the accumulator keeps about 13 mantissa bits and truncates (DeepSeek-V3 technical report,
// "Increasing Accumulation Precision"; SageAttention2: a 1-8-13 "FP22" accumulator in mma.f32.f8.f8.f32). An element
// can then be off by a few 2^-13 of the partial sums, which are of the output's scale: float is held to 1e-3 of
// the output's largest magnitude (8 * 2^-13), not fp32's 1e-5, for every element. bf16 adds its one rounding of the
// output (2^-9 of the element): the shared 1e-2 bar, floored at a tenth of the largest magnitude. A wrong scale,
// format, operand order or transpose is O(1), a missing k block O(0.1).
template <typename T>
::testing::AssertionResult fp8_close(const std::vector<float>& got, const std::vector<float>& want) {
  if constexpr (std::is_same_v<T, float>) {
    float amax = 0;
    for (float w : want) amax = std::max(amax, std::fabs(w));
    return test::all_close(got, want, 1e-3, amax);
  } else {
    return test::close(got, want, test::kTol<T>);
  }
}

struct Env {
  gpu::Blas blas;
  gpu::GpuContext ctx() { return {nullptr, &blas, nullptr, 0}; }
};

// One operand of a GEMM, cast on the CPU (the GPU's casts give the same bytes: fp8_gpu_test.cc), on host and device.
struct Operand {
  std::vector<uint8_t> codes;
  std::vector<float> inverse;
  int64_t rows = 0, k = 0;
  Fp8Format format = Fp8Format::kE4M3;
  bool per_row = false;
  DeviceBuffer<uint8_t> d_codes;
  DeviceBuffer<float> d_inverse;

  Fp8GemmOperand host() const { return {codes.data(), k, format, inverse.data(), per_row}; }
  Fp8GemmOperand device() const { return {d_codes.data(), k, format, d_inverse.data(), per_row}; }
};

// x [rows, cols] cast as a GEMM operand: itself (k = cols) or transposed (k = rows); rowwise: scaled per `by`
// (the operand's rows), power-of-two scales; tensorwise: one scale.
Operand cast(const std::vector<float>& x, int64_t rows, int64_t cols, Fp8Format f, bool rowwise, Fp8Scaling by,
             Fp8Layout layout) {
  Operand o;
  const bool transposed = layout == Fp8Layout::kTransposed;
  o.rows = transposed ? cols : rows;
  o.k = transposed ? rows : cols;
  o.format = f;
  o.per_row = rowwise;
  const Fp8Scaling scaling = rowwise ? by : Fp8Scaling::kTensor;
  o.codes.resize(x.size());
  o.inverse.resize(static_cast<size_t>(fp8_groups(scaling, rows, cols)));
  fp8_quantize_matrix(x.data(), rows, cols, f, scaling, rowwise, layout, o.codes.data(), o.inverse.data(), "x");
  o.d_codes = test::ints_to_device(o.codes);
  o.d_inverse = test::ints_to_device(o.inverse);
  return o;
}

// A linear layer y [N, OC] = x [N, C] W^T of one family, at a small size (every dimension a multiple of 16).
struct Layer {
  const char* name;
  int64_t N, C, OC;
};
const Layer kLayers[] = {{"gpt2 attn.qkv (3C)", 64, 48, 144},      {"gpt2 mlp.fc (4C)", 64, 48, 192},
                         {"gpt2 mlp.proj (4C -> C)", 64, 192, 48}, {"llama attn.qkv (GQA)", 48, 64, 128},
                         {"llama mlp gate/up", 48, 64, 352},       {"llama mlp.down", 48, 176, 64}};

// The GEMM on the GPU against the CPU reference on the same operands; out has ldo = n + 8 (16-byte rows for both
// types) and starts at random values of the product's own magnitude (so that the product shows in the sum), rounded
// through T, when accumulating, and NaN when writing. The padding keeps its start bits.
template <typename T>
void expect_gemm_matches(const Operand& a, const Operand& b, GradWrite write, Env& env, uint64_t seed) {
  const int64_t m = a.rows, n = b.rows, ldo = n + 8;
  std::vector<float> product(static_cast<size_t>(m * ldo));
  fp8_gemm(product.data(), ldo, GradWrite::kOverwrite, a.host(), b.host(), m, n, a.k);
  float amax = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) amax = std::max(amax, std::fabs(product[static_cast<size_t>(i * ldo + j)]));
  const std::vector<float> out0 = test::random_input<T>(m * ldo, seed, amax);
  std::vector<float> want = out0;
  fp8_gemm(want.data(), ldo, write, a.host(), b.host(), m, n, a.k);
  DeviceBuffer<T> out = test::to_device<T>(out0);
  if (write == GradWrite::kOverwrite) poison(out);
  const std::vector<float> start = to_host(out);
  gpu::fp8_gemm<T>(out.data(), ldo, write, a.device(), b.device(), m, n, a.k, env.ctx());
  const std::vector<float> all = to_host(out);
  std::vector<float> got, wanted;
  int64_t padding_changed = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < ldo; ++j) {
      const size_t at = static_cast<size_t>(i * ldo + j);
      if (j < n) {
        got.push_back(all[at]);
        wanted.push_back(want[at]);
      } else {
        padding_changed += std::memcmp(&all[at], &start[at], sizeof(float)) != 0 ? 1 : 0;
      }
    }
  EXPECT_TRUE(fp8_close<T>(got, wanted));
  EXPECT_EQ(padding_changed, 0);
}

template <typename T>
class Fp8GemmGpu : public ::testing::Test {};
using OutputTypes = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(Fp8GemmGpu, OutputTypes, test::ActivationNames);

// Forward, input gradient and weight gradient of every layer, each recipe and write, with the policy's formats and
// casts (model/fp8_policy.h): x and W per row; dy per row and W per column, transposed; dy and x per column,
// transposed. Rowwise runs wherever cuBLASLt documents outer-vector scales (sm_90); elsewhere it must refuse.
TYPED_TEST(Fp8GemmGpu, LinearLayerGemmsMatchTheCpu) {
  ST_SKIP_WITHOUT_FP8();
  using T = TypeParam;
  constexpr Fp8Format kE4M3 = Fp8Format::kE4M3, kE5M2 = Fp8Format::kE5M2;
  const Fp8Layout kRowMajor = Fp8Layout::kRowMajor, kTransposed = Fp8Layout::kTransposed;
  int device = 0;
  ST_CUDA_CHECK(cudaGetDevice(&device));
  Env env;
  uint64_t seed = 10;
  for (const Layer& l : kLayers) {
    const std::vector<float> x = test::random_input<float>(l.N * l.C, ++seed),
                             w = test::random_input<float>(l.OC * l.C, ++seed, 0.02f),
                             dy = test::random_input<float>(l.N * l.OC, ++seed, 1e-3f);
    for (bool rowwise : {false, true}) {
      if (rowwise && !gpu::fp8_rowwise_gemm_supported(device)) continue;
      const Operand x_rows = cast(x, l.N, l.C, kE4M3, rowwise, Fp8Scaling::kRow, kRowMajor),
                    w_rows = cast(w, l.OC, l.C, kE4M3, rowwise, Fp8Scaling::kRow, kRowMajor),
                    w_rows_e5m2 = cast(w, l.OC, l.C, kE5M2, rowwise, Fp8Scaling::kRow, kRowMajor),
                    dy_rows = cast(dy, l.N, l.OC, kE5M2, rowwise, Fp8Scaling::kRow, kRowMajor),
                    wt = cast(w, l.OC, l.C, kE4M3, rowwise, Fp8Scaling::kColumn, kTransposed),
                    dyt = cast(dy, l.N, l.OC, kE5M2, rowwise, Fp8Scaling::kColumn, kTransposed),
                    xt = cast(x, l.N, l.C, kE4M3, rowwise, Fp8Scaling::kColumn, kTransposed);
      for (GradWrite write : {GradWrite::kOverwrite, GradWrite::kAccumulate}) {
        const auto trace = [&](const char* gemm) {
          return ::testing::Message() << l.name << " N=" << l.N << " C=" << l.C << " OC=" << l.OC << " " << gemm
                                      << (rowwise ? " rowwise" : " tensorwise")
                                      << (write == GradWrite::kAccumulate ? " +=" : " =");
        };
        {
          SCOPED_TRACE(trace("forward e4m3 x e4m3"));
          expect_gemm_matches<T>(x_rows, w_rows, write, env, ++seed);
        }
        {
          SCOPED_TRACE(trace("forward e4m3 x e5m2"));
          expect_gemm_matches<T>(x_rows, w_rows_e5m2, write, env, ++seed);
        }
        {
          SCOPED_TRACE(trace("input grad e5m2 x e4m3 (W^T)"));
          expect_gemm_matches<T>(dy_rows, wt, write, env, ++seed);
        }
        {
          SCOPED_TRACE(trace("weight grad e5m2 x e4m3 (dy^T, x^T)"));
          expect_gemm_matches<T>(dyt, xt, write, env, ++seed);
        }
      }
    }
  }
}

// The bias (cuBLASLt's BIAS epilogue) and the residual (its C matrix, D = out) against the CPU reference, on a gpt2
// and a llama layer's forward, both recipes.
TYPED_TEST(Fp8GemmGpu, BiasAndResidualMatchTheCpu) {
  ST_SKIP_WITHOUT_FP8();
  using T = TypeParam;
  int device = 0;
  ST_CUDA_CHECK(cudaGetDevice(&device));
  Env env;
  uint64_t seed = 400;
  for (const Layer& l : {kLayers[0], kLayers[5]}) {
    const std::vector<float> x = test::random_input<float>(l.N * l.C, ++seed),
                             w = test::random_input<float>(l.OC * l.C, ++seed, 0.02f);
    const std::vector<float> bias = test::random_input<T>(l.OC, ++seed),
                             residual = test::random_input<T>(l.N * l.OC, ++seed);
    for (bool rowwise : {false, true}) {
      if (rowwise && !gpu::fp8_rowwise_gemm_supported(device)) continue;
      SCOPED_TRACE(::testing::Message() << l.name << (rowwise ? " rowwise" : " tensorwise"));
      const Operand a = cast(x, l.N, l.C, Fp8Format::kE4M3, rowwise, Fp8Scaling::kRow, Fp8Layout::kRowMajor),
                    b = cast(w, l.OC, l.C, Fp8Format::kE4M3, rowwise, Fp8Scaling::kRow, Fp8Layout::kRowMajor);
      std::vector<float> want(static_cast<size_t>(l.N * l.OC));
      fp8_gemm(want.data(), l.OC, GradWrite::kOverwrite, a.host(), b.host(), l.N, l.OC, l.C, bias.data(),
               residual.data());
      DeviceBuffer<T> out(l.N * l.OC);
      poison(out);
      const DeviceBuffer<T> d_bias = test::to_device<T>(bias), d_residual = test::to_device<T>(residual);
      gpu::fp8_gemm<T>(out.data(), l.OC, GradWrite::kOverwrite, a.device(), b.device(), l.N, l.OC, l.C, env.ctx(),
                       d_bias.data(), d_residual.data());
      EXPECT_TRUE(fp8_close<T>(to_host(out), want));
    }
  }
}

// FAST_ACCUM (Fp8Gemm::fast_accum, train.fp8_fast_accum): the tensor cores' accumulator over the whole depth, a
// plan of its own. Over k = 2048 (where cuBLASLt's promotions matter) both forms stay above 40 dB of the CPU's fp32
// sums (a 13-bit accumulator's drift over 2048 random-signed terms is about 60 dB down; a wrong scale or a lost k
// block is under 20).
TYPED_TEST(Fp8GemmGpu, FastAccumulationIsAPlanOfItsOwnNearTheCpu) {
  ST_SKIP_WITHOUT_FP8();
  using T = TypeParam;
  Env env;
  const int64_t N = 64, C = 2048, OC = 128;
  const std::vector<float> x = test::random_input<float>(N * C, 601), w = test::random_input<float>(OC * C, 602, 0.02f);
  const Operand a = cast(x, N, C, Fp8Format::kE4M3, false, Fp8Scaling::kRow, Fp8Layout::kRowMajor),
                b = cast(w, OC, C, Fp8Format::kE4M3, false, Fp8Scaling::kRow, Fp8Layout::kRowMajor);
  std::vector<float> want(static_cast<size_t>(N * OC));
  fp8_gemm(want.data(), OC, GradWrite::kOverwrite, a.host(), b.host(), N, OC, C);
  for (bool fast : {false, true}) {
    SCOPED_TRACE(fast ? "fast accumulation" : "promoted");
    DeviceBuffer<T> out(N * OC);
    poison(out);
    const size_t plans = env.blas.plan_count();
    gpu::fp8_gemm<T>(out.data(), OC, GradWrite::kOverwrite, a.device(), b.device(), N, OC, C, env.ctx(), nullptr,
                     nullptr, fast);
    EXPECT_EQ(env.blas.plan_count(), plans + 1);
    EXPECT_GT(testing::snr_db(want, to_host(out)), 40.0);
  }
}

// Where cuBLASLt documents no outer-vector scales (not sm_90), a rowwise GEMM is refused naming the GEMM: nothing is
// emulated.
TYPED_TEST(Fp8GemmGpu, RowwiseIsRefusedByNameWhereCublasLtHasNoOuterVectorScales) {
  ST_SKIP_WITHOUT_FP8();
  using T = TypeParam;
  int device = 0;
  ST_CUDA_CHECK(cudaGetDevice(&device));
  if (gpu::fp8_rowwise_gemm_supported(device)) GTEST_SKIP() << "this device has rowwise FP8 GEMMs";
  Env env;
  const std::vector<float> x = test::random_input<float>(32 * 48, 1), w = test::random_input<float>(16 * 48, 2);
  const Operand a = cast(x, 32, 48, Fp8Format::kE4M3, true, Fp8Scaling::kRow, Fp8Layout::kRowMajor),
                b = cast(w, 16, 48, Fp8Format::kE4M3, true, Fp8Scaling::kRow, Fp8Layout::kRowMajor);
  DeviceBuffer<T> out(32 * 16);
  const Error e = testing::caught(
      [&] { gpu::fp8_gemm<T>(out.data(), 16, GradWrite::kOverwrite, a.device(), b.device(), 32, 16, 48, env.ctx()); });
  EXPECT_NE(std::string(e.what()).find("cuBLASLt has no algorithm for the FP8 GEMM m=32 n=16 k=48 (e4m3 x e4m3, "
                                       "rowwise scales"),
            std::string::npos)
      << e.what();
}

// A GEMM is planned once: repeating it adds no plan and gives the same bits. A second Blas that takes the first's
// algorithm list (a checkpoint's gemm_algorithms) plans the FP8 GEMM with that algorithm and gives the same bits.
TYPED_TEST(Fp8GemmGpu, PlansAreCachedAndTheirAlgorithmsCarryOver) {
  ST_SKIP_WITHOUT_FP8();
  using T = TypeParam;
  const std::vector<float> x = test::random_input<float>(64 * 96, 3), w = test::random_input<float>(80 * 96, 4);
  const Operand a = cast(x, 64, 96, Fp8Format::kE5M2, false, Fp8Scaling::kRow, Fp8Layout::kRowMajor),
                b = cast(w, 80, 96, Fp8Format::kE4M3, false, Fp8Scaling::kRow, Fp8Layout::kRowMajor);
  const auto run = [&](Env& env) {
    DeviceBuffer<T> out(64 * 80);
    gpu::fp8_gemm<T>(out.data(), 80, GradWrite::kOverwrite, a.device(), b.device(), 64, 80, 96, env.ctx());
    return to_host(out);
  };
  Env first;
  const std::vector<float> once = run(first);
  EXPECT_EQ(first.blas.plan_count(), 1u);
  EXPECT_TRUE(test::bitwise_equal(run(first), once));
  EXPECT_EQ(first.blas.plan_count(), 1u);
  const std::string algorithms = first.blas.algorithms();
  EXPECT_EQ(algorithms.rfind("gemm 29 28 ", 0), 0u) << algorithms;  // CUDA_R_8F_E5M2 x CUDA_R_8F_E4M3
  Env second;
  second.blas.use_algorithms(algorithms);
  EXPECT_TRUE(test::bitwise_equal(run(second), once));
  EXPECT_EQ(second.blas.algorithms(), algorithms);
}

// The GPU refuses what the CPU refuses, with the CPU's message (the same check), before touching cuBLASLt.
TEST(Fp8GemmGpuRefusals, AreTheCpus) {
  ST_SKIP_WITHOUT_GPU();
  Env env;
  std::vector<uint8_t> codes(64 * 48, 0x38);
  std::vector<float> scales(64, 1.0f), host_out(64 * 64);
  DeviceBuffer<uint8_t> d_codes = test::ints_to_device(codes);
  DeviceBuffer<float> d_scales = test::ints_to_device(scales), d_out(64 * 64);
  const Fp8GemmOperand host{codes.data(), 48, Fp8Format::kE4M3, scales.data(), false},
      device{d_codes.data(), 48, Fp8Format::kE4M3, d_scales.data(), false};
  Fp8GemmOperand host_e5m2 = host, device_e5m2 = device;
  host_e5m2.format = device_e5m2.format = Fp8Format::kE5M2;
  for (int64_t k : {int64_t{40}, int64_t{48}}) {
    const Fp8GemmOperand& ha = k == 48 ? host_e5m2 : host;
    const Fp8GemmOperand& da = k == 48 ? device_e5m2 : device;
    const Fp8GemmOperand& hb = k == 48 ? host_e5m2 : host;
    const Fp8GemmOperand& db = k == 48 ? device_e5m2 : device;
    const Error want = testing::caught([&] { fp8_gemm(host_out.data(), 64, GradWrite::kOverwrite, ha, hb, 3, 5, k); });
    const Error got = testing::caught(
        [&] { gpu::fp8_gemm<float>(d_out.data(), 64, GradWrite::kOverwrite, da, db, 3, 5, k, env.ctx()); });
    EXPECT_EQ(std::string(got.what()), std::string(want.what()));
    EXPECT_NE(std::string(got.what()).find(k == 48 ? "e5m2 x e5m2" : "k=40"), std::string::npos) << got.what();
  }
  EXPECT_EQ(env.blas.plan_count(), 0u);
}

// A non-finite activation through the async cast (per row) reaches every output of its row, and only those.
TEST(Fp8GemmGpuNaN, FromAnAsyncCastReachesTheOutputsOfItsRow) {
  ST_SKIP_WITHOUT_FP8();
  int device = 0;
  ST_CUDA_CHECK(cudaGetDevice(&device));
  const bool rowwise = gpu::fp8_rowwise_gemm_supported(device);
  const int64_t N = 32, C = 64, OC = 48, bad_row = 9;
  std::vector<float> x = test::random_input<float>(N * C, 5);
  x[static_cast<size_t>(bad_row * C + 3)] = NAN;
  const Operand w = cast(test::random_input<float>(OC * C, 6), OC, C, Fp8Format::kE4M3, rowwise, Fp8Scaling::kRow,
                         Fp8Layout::kRowMajor);
  const Fp8Scaling scaling = rowwise ? Fp8Scaling::kRow : Fp8Scaling::kTensor;
  const int64_t groups = fp8_groups(scaling, N, C);
  Env env;
  test::GpuEnv cast_env(gpu::fp8_quantize_scratch_bytes(groups));
  const DeviceBuffer<float> dx = test::to_device<float>(x);
  DeviceBuffer<uint8_t> xq(N * C);
  DeviceBuffer<float> x_inv(groups), out(N * OC);
  gpu::fp8_quantize_matrix_async<float>(dx.data(), N, C, Fp8Format::kE4M3, scaling, rowwise, Fp8Layout::kRowMajor,
                                        xq.data(), x_inv.data(), cast_env.ctx);
  cast_env.stream.synchronize();
  gpu::fp8_gemm<float>(out.data(), OC, GradWrite::kOverwrite, {xq.data(), C, Fp8Format::kE4M3, x_inv.data(), rowwise},
                       w.device(), N, OC, C, env.ctx());
  const std::vector<float> y = to_host(out);
  int64_t nan_in_row = 0, nan_elsewhere = 0;
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < OC; ++j)
      (i == bad_row || !rowwise ? nan_in_row : nan_elsewhere) += std::isnan(y[i * OC + j]);
  EXPECT_EQ(nan_in_row, rowwise ? OC : N * OC);
  EXPECT_EQ(nan_elsewhere, 0);
}

}  // namespace
}  // namespace st
