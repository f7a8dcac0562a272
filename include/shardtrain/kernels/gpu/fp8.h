// FP8 casts on the GPU: the CUDA version of kernels/fp8.h's fp8_quantize_matrix, same operands and meaning. Codes
// and inverse scales are the CPU reference's bytes (the cast is CUDA's __nv_cvt_float_to_fp8 with __NV_SATFINITE:
// round to nearest even, saturating), from float or bf16 elements (bf16 as the CPU reference sees it converted to
// float). What an FP8 GEMM (cuBLASLt) reads: the codes and a pointer to the inverse scales.
//
//   gpu::fp8_quantize_matrix<bf16>(x, rows, cols, Fp8Format::kE4M3, Fp8Scaling::kRow, true, q, inv, "attn.qkv", ctx);
#pragma once

#include <cstdint>
#include <string>

#include "shardtrain/kernels/fp8.h"
#include "shardtrain/kernels/gpu/context.h"
#include "shardtrain/kernels/scratch_sizes.h"

namespace st::gpu {

// st::fp8_quantize_matrix for T in {float, bf16}: x, q (rows x cols bytes) and inverse_scales (fp8_groups floats) on
// the device. Needs fp8_quantize_scratch_bytes(fp8_groups(scaling, rows, cols)) of ctx.scratch. Runs on ctx.stream
// and then waits for it once, to read whether an element was not finite: the first one (lowest index) is refused as
// the CPU refuses it (kBadInput naming `what` and the element), and q is then unspecified.
template <typename T>
void fp8_quantize_matrix(const T* x, int64_t rows, int64_t cols, Fp8Format f, Fp8Scaling scaling, bool power_of_2,
                         uint8_t* q, float* inverse_scales, const std::string& what, const GpuContext& ctx);

}  // namespace st::gpu
