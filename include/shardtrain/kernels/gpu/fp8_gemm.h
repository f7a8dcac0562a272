// The FP8 GEMM on the GPU: st::fp8_gemm (kernels/fp8_gemm.h) through cuBLASLt, same operands and meaning, on device
// codes, scales and output, with the plan cached in ctx.blas (gpu::Blas::fp8_gemm, kernels/gpu/matmul.h).
//
//   gpu::fp8_quantize_matrix_async<bf16>(x, N, C, Fp8Format::kE4M3, Fp8Scaling::kRow, true, Fp8Layout::kRowMajor,
//                                        xq, x_inv, ctx);
//   gpu::fp8_quantize_matrix_async<bf16>(w, OC, C, Fp8Format::kE4M3, Fp8Scaling::kRow, true, Fp8Layout::kRowMajor,
//                                        wq, w_inv, ctx);
//   gpu::fp8_gemm<bf16>(y, OC, GradWrite::kOverwrite, {xq, C, Fp8Format::kE4M3, x_inv, true},
//                       {wq, C, Fp8Format::kE4M3, w_inv, true}, N, OC, C, ctx);
//
// Which devices: FP8 tensor cores exist from compute capability 8.9 (Ada) and 9.0 (Hopper). cuBLASLt runs
// tensorwise-scaled FP8 GEMMs on both; its outer-vector (rowwise) scale mode, added in cuBLAS 12.9 for Hopper, is
// documented for sm_90 only (the cuBLAS documentation's table of scaling modes by device; PyTorch keeps its rowwise
// cuBLAS path off sm_100 and sm_120 for that reason). Where cuBLASLt has no algorithm the GEMM throws; nothing is
// emulated.
#pragma once

#include <cstdint>

#include "shardtrain/kernels/fp8_gemm.h"
#include "shardtrain/kernels/gpu/context.h"

namespace st::gpu {

// Whether `device` has FP8 tensor cores, on which cuBLASLt runs tensorwise-scaled FP8 GEMMs: compute capability 8.9
// or higher.
bool fp8_gemm_supported(int device);

// Whether cuBLASLt documents rowwise (outer-vector) scales for `device`: compute capability 9.x (Hopper). A newer
// cuBLASLt may add others; gpu::fp8_gemm asks cuBLASLt itself and throws where it has no algorithm.
bool fp8_rowwise_gemm_supported(int device);

// st::fp8_gemm for T in {float, bf16} on ctx.stream, through ctx.blas: fp32 accumulation, out rounded to T once
// (kAccumulate: D = product + out in fp32, then rounded). Refuses what check_fp8_gemm refuses; st::Error naming the
// GEMM when cuBLASLt has no algorithm for it here (Blas::fp8_gemm says more).
// bias (n elements of T) rides in cuBLASLt's BIAS epilogue for bf16 outputs (fp32 outputs, which have none, add it
// after the GEMM); a residual is its C matrix (beta 1), D = out. fast_accum: cuBLASLt's FAST_ACCUM, the FP8 tensor
// cores' accumulator (about 13 mantissa bits on Hopper) kept throughout instead of promoted to fp32 at intervals:
// faster, and further from the CPU reference (which accumulates in fp32).
template <typename T>
void fp8_gemm(T* out, int64_t ldo, GradWrite write, const Fp8GemmOperand& a, const Fp8GemmOperand& b, int64_t m,
              int64_t n, int64_t k, const GpuContext& ctx, const T* bias = nullptr, const T* residual = nullptr,
              bool fast_accum = false);

}  // namespace st::gpu
