// The FP8 GEMM: a product of two FP8 operands (codes from kernels/fp8.h's scaled casts) with their inverse scales,
// accumulated in fp32. This is the CPU reference; kernels/gpu/fp8_gemm.h is cuBLASLt's, with the same signature.
//
//   out[i, j] (= or +=) sum_k decode(a[i, k]) * a_inv[i or 0] * decode(b[j, k]) * b_inv[j or 0]
//
// Both operands are row-major and K-contiguous (cuBLASLt's "TN" layout, the only one its FP8 kernels take on Hopper
// and Ada): A holds m rows of k codes, B n rows of k codes. A linear layer's three GEMMs in this form:
//   forward      y [N, OC]  = x [N, C] . W [OC, C]           A = x,     B = W
//   input grad   dx [N, C]  = dy [N, OC] . W^T [C, OC]       A = dy,    B = W cast transposed (Fp8Layout)
//   weight grad  dW [OC, C] = dy^T [OC, N] . x^T [C, N]      A = dy cast transposed, B = x cast transposed
// Scales are one float per operand (tensorwise) or one per row of the operand (rowwise: cuBLASLt's outer-vector
// scaling, A's vector of m, B's of n), both operands alike.
//
//   Fp8GemmOperand a{xq, C, Fp8Format::kE4M3, x_inv, /*per_row=*/true}, b{wq, C, Fp8Format::kE4M3, w_inv, true};
//   fp8_gemm(y, OC, GradWrite::kOverwrite, a, b, N, OC, C);
#pragma once

#include <cstdint>
#include <string>

#include "shardtrain/kernels/fp8.h"
#include "shardtrain/kernels/grad_write.h"

namespace st {

// One operand: `rows` x k codes at `codes` (row r at codes + r * ld), in `format`, and the inverse scales the
// casts wrote (fp8_quantize_matrix's inverse_scales): one float, or one per row when per_row. The caller owns both.
struct Fp8GemmOperand {
  const uint8_t* codes = nullptr;
  int64_t ld = 0;  // row pitch in codes (bytes), >= k and a multiple of 16
  Fp8Format format = Fp8Format::kE4M3;
  const float* inverse_scales = nullptr;
  bool per_row = false;
};

// "FP8 GEMM m=64 n=144 k=48 (e5m2 x e4m3, rowwise scales, lda=48 ldb=48 ldo=144)": how errors name a GEMM.
std::string describe_fp8_gemm(const Fp8GemmOperand& a, const Fp8GemmOperand& b, int64_t m, int64_t n, int64_t k,
                              int64_t ldo);

// The shapes fp8_gemm takes, on the CPU and the GPU alike (st::Error, kInternal, naming the GEMM otherwise): m, n >= 0;
// k > 0 and a multiple of 16, and lda, ldb >= k and multiples of 16 (FP8 tensor cores read 16-byte rows); ldo >= n;
// not E5M2 x E5M2 (cuBLASLt has no such GEMM); both operands per row or both per tensor (cuBLASLt's outer-vector
// mode scales both). Codes and scales given when m and n are not 0.
void check_fp8_gemm(const Fp8GemmOperand& a, const Fp8GemmOperand& b, int64_t m, int64_t n, int64_t k, int64_t ldo);

// out [m, n] (row pitch ldo) = (kOverwrite, out not read) or += (kAccumulate) the product above, plus bias[j] (n
// elements) when bias is given; with `residual` (same layout as out; kOverwrite only) out = residual + product (+
// bias), a linear layer's residual add. The sum over k runs in fp32 (OpenBLAS sgemm on the decoded codes, whose
// products are exact in fp32), then each element is multiplied by its two inverse scales and the other terms added in
// double, rounded to float once. A NaN code or scale makes its outputs NaN.
void fp8_gemm(float* out, int64_t ldo, GradWrite write, const Fp8GemmOperand& a, const Fp8GemmOperand& b, int64_t m,
              int64_t n, int64_t k, const float* bias = nullptr, const float* residual = nullptr);

}  // namespace st
