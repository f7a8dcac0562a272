// AdamW on the host for optimizer offload: adamw_update's maths (kernels/adamw.h) vectorised with AVX-512 or
// AVX2, chosen at run time from what the CPU has, with the scalar loop as the reference; plus the rounded
// half-precision copy of the new parameters that the GPU gathers (bf16 or fp16 bits, round to nearest even).
//
//   const SimdIsa isa = fastest_simd_isa();                    // kAvx512, kAvx2 or kScalar, timed once
//   adamw_update_isa(isa, param, m, v, grad, n, p, HalfKind::kBF16, out);
//
// Every ISA gives the same bits as adamw_update and as the GPU kernel: the same scalars (adamw_scalars), the
// same operation order, IEEE division and square root, and no fused multiply-add (this file's sources are built
// with -ffp-contract=off). Single-threaded: HostAdamW (optim/host_adamw.h) splits the work over threads.
#pragma once

#include <cstdint>

#include "shardtrain/kernels/adamw.h"

namespace st {

enum class SimdIsa { kScalar, kAvx2, kAvx512 };
enum class HalfKind { kNone, kBF16, kF16 };

const char* to_string(SimdIsa isa);
// The widest ISA this CPU supports (cpuid).
SimdIsa best_simd_isa();
// The supported ISA that runs the update fastest here, timed once per process on 4 MiB arrays (a
// hundredth of a second). Widest is not always fastest: AVX-512's division and square root, which dominate this loop,
// are no faster per element than AVX2's on some CPUs (an AMD EPYC runs AVX-512 at about half AVX2's speed:
// docs/offload.md, "The host AdamW").
SimdIsa fastest_simd_isa();
// Whether this CPU can run `isa`.
bool simd_isa_supported(SimdIsa isa);

// float -> bf16 / fp16 bits, round to nearest even, as CUDA's __float2bfloat16 / __float2half: NaN stays a
// (quiet) NaN, overflow goes to infinity, fp16 subnormals are rounded correctly.
uint16_t round_to_bf16(float x);
uint16_t round_to_f16(float x);
// out[i] = round_to_bf16(in[i]) or round_to_f16(in[i]) (kind kBF16 or kF16) for i < n, on every core.
void round_to_half(const float* in, int64_t n, HalfKind kind, uint16_t* out);
// bf16 / fp16 bits -> float, exactly (fp16 subnormals included), as CUDA's __bfloat162float / __half2float.
float bf16_to_float(uint16_t h);
float f16_to_float(uint16_t h);
// out[i] = bf16_to_float(in[i]) or f16_to_float(in[i]) (kind kBF16 or kF16) for i < n, on the calling thread alone
// (vectorised: a reader's threads each widen what they read).
void widen_half(const uint16_t* in, int64_t n, HalfKind kind, float* out);

// The state an update reads and the state it writes: the same arrays (in place), or others of the same length
// (optimizer offload's speculative step writes beside the state it reads, so that dropping it costs nothing).
// Each output array is either its input or does not overlap any input.
struct AdamWArrays {
  const float *param, *m, *v;
  float *param_out, *m_out, *v_out;
  static AdamWArrays in_place(float* param, float* m, float* v) { return {param, m, v, param, m, v}; }
  AdamWArrays offset(int64_t i) const { return {param + i, m + i, v + i, param_out + i, m_out + i, v_out + i}; }
};

// adamw_update on [0, n) with `isa` (which the CPU must support): reads a.param/m/v, writes a.param_out/m_out/v_out;
// when kind != kNone also writes out[i] = the new param[i] rounded to that type.
void adamw_update_isa(SimdIsa isa, const AdamWArrays& a, const float* grad, int64_t n, const AdamWParams& p,
                      HalfKind kind, uint16_t* out);
// The same, in place.
void adamw_update_isa(SimdIsa isa, float* param, float* m, float* v, const float* grad, int64_t n, const AdamWParams& p,
                      HalfKind kind, uint16_t* out);

}  // namespace st
