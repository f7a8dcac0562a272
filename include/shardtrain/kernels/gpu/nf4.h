// NF4 on the GPU: the CUDA version of kernels/nf4.h, same operands and meaning. The quantiser gives the CPU
// reference's bytes exactly (codes, absmax codes, scales and offset), from float or bf16 weights (bf16 as the CPU
// reference sees it converted to float); the dequantiser gives its floats exactly, or those rounded to bf16 (to
// nearest even). Views hold device pointers.
//
//   DeviceBuffer<uint8_t> storage(nf4_bytes(n));                    // nf4_layout's one buffer, gathered as bytes
//   const Nf4View q = nf4_view(storage.data(), n);
//   gpu::nf4_quantize<bf16>(w, n, q, "layers.3.mlp.up.weight", ctx);  // syncs ctx.stream once
//   gpu::nf4_dequantize<bf16>(q, w_back, ctx);                      // asynchronous
#pragma once

#include <cstdint>
#include <string>

#include "shardtrain/kernels/gpu/context.h"
#include "shardtrain/kernels/nf4.h"
#include "shardtrain/kernels/scratch_sizes.h"

namespace st::gpu {

// st::nf4_quantize(x, n, out, name) for T in {float, bf16}: x and out's storage (out.n == n) on the device. Every
// byte of out is written. Needs nf4_quantize_scratch_bytes(n) of ctx.scratch. Runs on ctx.stream, then waits for it
// once, to read whether a weight was not finite: the first one (lowest index) is refused as the CPU refuses it, a
// kBadInput st::Error naming `name` and the element (nf4_refuse), and out is then unspecified.
template <typename T>
void nf4_quantize(const T* x, int64_t n, Nf4View out, const std::string& name, const GpuContext& ctx);

// st::nf4_dequantize(q, out) for T in {float, bf16, fp16}: out[i] = T(level(code_i) * absmax_i), i < q.n, with q's
// storage and out on the device. Asynchronous on ctx.stream; no scratch. Reads the codes four bytes at a time and
// writes 16-byte packs when q.codes is 4-byte aligned and out 16-byte aligned (nf4_view's buffers from cudaMalloc
// are), else one weight at a time.
template <typename T>
void nf4_dequantize(Nf4ConstView q, T* out, const GpuContext& ctx);

}  // namespace st::gpu
