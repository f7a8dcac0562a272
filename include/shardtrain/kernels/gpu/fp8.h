// FP8 casts on the GPU: the CUDA version of kernels/fp8.h's fp8_quantize_matrix, same operands and meaning. Codes
// and inverse scales are the CPU reference's bytes (the cast is CUDA's __nv_cvt_float_to_fp8 with __NV_SATFINITE:
// round to nearest even, saturating), from float or bf16 elements (bf16 as the CPU reference sees it converted to
// float), in x's layout or transposed. What an FP8 GEMM (cuBLASLt, kernels/gpu/fp8_gemm.h) reads: the codes and a
// pointer to the inverse scales.
//
//   gpu::fp8_quantize_matrix<bf16>(x, rows, cols, Fp8Format::kE4M3, Fp8Scaling::kRow, true, Fp8Layout::kRowMajor, q,
//                                  inv, "attn.qkv", ctx);
//
// Two forms: fp8_quantize_matrix waits for the stream once to refuse a non-finite element by name, as the CPU does;
// fp8_quantize_matrix_async never waits (the training loop's form) and lets a non-finite element through as NaNs.
#pragma once

#include <cstdint>
#include <string>

#include "shardtrain/kernels/fp8.h"
#include "shardtrain/kernels/gpu/context.h"
#include "shardtrain/kernels/scratch_sizes.h"

namespace st::gpu {

// st::fp8_quantize_matrix for T in {float, bf16}: x, q (rows x cols bytes, laid out as `layout` says) and
// inverse_scales (fp8_groups floats) on the device. Needs fp8_quantize_scratch_bytes(fp8_groups(scaling, rows, cols))
// of ctx.scratch. Runs on ctx.stream and then waits for it once, to read whether an element was not finite: the
// first one (lowest index) is refused as the CPU refuses it (kBadInput naming `what` and the element), and q and
// inverse_scales are then unspecified.
template <typename T>
void fp8_quantize_matrix(const T* x, int64_t rows, int64_t cols, Fp8Format f, Fp8Scaling scaling, bool power_of_2,
                         Fp8Layout layout, uint8_t* q, float* inverse_scales, const std::string& what,
                         const GpuContext& ctx);

// The same cast, only launched on ctx.stream (no wait, so it can sit between a step's kernels), with the same scratch.
// On finite input it writes fp8_quantize_matrix's bytes. Nothing is refused: a non-finite element makes its group's
// inverse scale NaN and every code of the group NaN, so each output of a GEMM that reads the group is NaN, and the
// step's check of its gradients for non-finite values reports it a little later. (The CPU reference has no such
// form: its cast costs no wait, and it refuses.)
template <typename T>
void fp8_quantize_matrix_async(const T* x, int64_t rows, int64_t cols, Fp8Format f, Fp8Scaling scaling, bool power_of_2,
                               Fp8Layout layout, uint8_t* q, float* inverse_scales, const GpuContext& ctx);

// st::fp8_maxima and st::fp8_quantize_with_maxima, launched on ctx.stream without waiting: fp8_quantize_matrix_async
// in two halves, so that an operand cast twice with the same groups takes its maxima once (a non-finite element
// leaves its group's maximum non-finite, and the cast then turns the group into NaNs). The second needs
// fp8_quantize_scratch_bytes(groups) of ctx.scratch; the first none.
template <typename T>
void fp8_maxima_async(const T* x, int64_t rows, int64_t cols, Fp8Scaling scaling, unsigned* maxima,
                      const GpuContext& ctx);
template <typename T>
void fp8_quantize_with_maxima_async(const T* x, int64_t rows, int64_t cols, Fp8Format f, Fp8Scaling scaling,
                                    bool power_of_2, Fp8Layout layout, const unsigned* maxima, uint8_t* q,
                                    float* inverse_scales, const GpuContext& ctx);

// st::fp8_quantize_pair's two casts, launched on ctx.stream as fp8_quantize_matrix_async is (no wait; a non-finite
// element gives NaN codes and scales), from one read of x where rows and columns are multiples of 8: each tile of x
// gives both codes. The groups' maxima are one pass over x when both casts group alike, one each otherwise. Needs
// fp8_quantize_scratch_bytes(both casts' groups together) of ctx.scratch.
template <typename T>
void fp8_quantize_pair_async(const T* x, int64_t rows, int64_t cols, bool power_of_2, const Fp8Cast& row_major,
                             const Fp8Cast& transposed, const GpuContext& ctx);

// st::fp8_quantize_pair_with_maxima: fp8_quantize_pair_async with both casts grouped alike and their groups' maxima
// already in `maxima` (device; fp8_maxima_async's, or a producer kernel's amax for kTensor), so no pass over x takes
// them. The same scratch.
template <typename T>
void fp8_quantize_pair_with_maxima_async(const T* x, int64_t rows, int64_t cols, bool power_of_2,
                                         const Fp8Cast& row_major, const Fp8Cast& transposed, const unsigned* maxima,
                                         const GpuContext& ctx);

// st::fp8_quantize_ahead for T in {float, bf16}, launched on ctx.stream (no wait): the codes of x with the scale of
// the maximum *amax (device) known ahead, in x's layout into q and transposed into q_t (either may be null; one read
// of x for both where rows and columns are multiples of 8), 1 / scale into *inverse_scale, and x's maximum folded into
// *own (may be null) as x is read, so that no pass over x takes it. The CPU reference's bytes (a NaN inverse scale's
// payload aside). Needs fp8_quantize_scratch_bytes(1) of ctx.scratch.
template <typename T>
void fp8_quantize_ahead_async(const T* x, int64_t rows, int64_t cols, Fp8Format f, const unsigned* amax, uint8_t* q,
                              uint8_t* q_t, float* inverse_scale, unsigned* own, const GpuContext& ctx);

// st::fp8_scales_of_parts and st::fp8_transpose on the device, launched on ctx.stream (no scratch, no wait): the same
// operands, the CPU reference's bits. A non-finite maximum gives a NaN inverse scale, as the casts' scales do.
void fp8_scales_of_parts(const unsigned* maxima, int world, int64_t k, Fp8Format f, bool power_of_2,
                         unsigned* out_maxima, float* inverse_scales, const GpuContext& ctx);
void fp8_transpose(const uint8_t* q, int64_t rows, int64_t cols, uint8_t* out, const GpuContext& ctx);

}  // namespace st::gpu
