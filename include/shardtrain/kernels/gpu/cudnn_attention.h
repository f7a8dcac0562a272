// Causal multi-head self-attention through cuDNN's fused flash-attention (SDPA) engines, built with the
// cuDNN 9 backend (graph) C API: an alternative to flash_attention.h with the same layouts and outputs, so a
// model can use either (and fall back to flash attention where cuDNN has no engine).
//
// Layouts as flash_attention.h / st::attention_*: qkv [B,T,3C] (q, k, v blocks per row; head h owns columns
// [h*hs, (h+1)*hs) of each, hs = C/NH), out [B,T,C], lse [B,NH,T] fp32 natural-log logsumexp of the scaled
// causal scores, scale 1/sqrt(hs). cuDNN reads q/k/v and writes out/dqkv in place through strides (no
// permuted copies). T = bf16 or fp16; products accumulate in fp32 and the probabilities are rounded to T
// before the P.V product, as in flash attention. Every pointer must be 16-byte aligned, which q, k and v of
// a cudaMalloc'd qkv are since hs (and so C) must be a multiple of 8.
//
// Each distinct (type, B, T, C, NH, pass) is planned once (operation graph, heuristics mode A, the first
// engine config that finalizes) and cached in the Cudnn object; a call then only binds pointers and launches.
//
//   st::gpu::Cudnn cudnn;                                   // on the current device, once per stream
//   ctx.cudnn = &cudnn;
//   if (st::gpu::cudnn_attention_supported<bf16>(B, T, C, NH, ctx)) {
//     // ctx.scratch >= cudnn_attention_backward_scratch_bytes<bf16>(B, T, C, NH, ctx)
//     st::gpu::cudnn_attention_forward<bf16>(out, lse, qkv, B, T, C, NH, ctx);
//     st::gpu::cudnn_attention_backward<bf16>(dqkv, dout, qkv, out, lse, B, T, C, NH, ctx);  // overwrites
//   }
#pragma once

#include <cstddef>
#include <memory>

#include "shardtrain/kernels/gpu/context.h"

namespace st::gpu {

// Owns a cuDNN handle (created on the device current at construction) and one plan per attention shape and
// pass. Not thread-safe: use one per stream, like Blas. Moves, does not copy.
class Cudnn {
 public:
  Cudnn();
  ~Cudnn();
  Cudnn(Cudnn&& o) noexcept;
  Cudnn& operator=(Cudnn&& o) noexcept;
  Cudnn(const Cudnn&) = delete;
  Cudnn& operator=(const Cudnn&) = delete;

  // Number of distinct attention graphs planned so far, including the ones cuDNN could not run.
  size_t plan_count() const;

  // The handle and the plan cache, for cudnn_attention.cu.
  struct State;
  State& state() { return *state_; }

 private:
  std::unique_ptr<State> state_;
};

// The version of the cuDNN library loaded at run time, e.g. 91400 for 9.14.0.
size_t cudnn_runtime_version();

// How the backward pass computes dq. cuDNN has no "deterministic" knob on Hopper: cudnn-frontend's
// set_deterministic_algorithm(true) selects a different graph, and so do we.
//   kDeterministic: dq = dS K written straight to dq, which cuDNN serves with its "dP workspace" kernels
//     (dS for all heads kept in cuDNN's workspace, about B*NH*T*T*2 bytes, and dq computed from it by a
//     separate GEMM: no atomics). Engines that declare CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC are refused.
//     Reruns with the same shape, device and cuDNN version are bit-identical (cudnn_attention_gpu_test).
//   kNondeterministic: dq accumulated with fp32 atomics into scratch (B*NH*T*hs*4 bytes), then converted;
//     less workspace and usually faster, but the last bits of dq vary from run to run.
enum class CudnnBackwardMode { kDeterministic, kNondeterministic };

// Whether cuDNN can run this attention (forward and the given backward mode) on the current device: builds
// and caches both plans, and returns false instead of throwing when cuDNN (>= 9.10) has no engine for them,
// hs is not a multiple of 8, the element type is fp32 (instantiated so that code generic over it links),
// or ctx.cudnn is null. Throws st::Error for an invalid shape (B, T, NH < 1, C not a multiple of NH), and a fault
// (kind kFault) when an engine config that suits the graph fails to build three times over (a runtime compilation
// or an allocation that failed): the next-ranked engine is never taken for a reason other than the graph.
// The other calls on an unsupported shape throw st::Error with cuDNN's reason.
template <typename T>
bool cudnn_attention_supported(int B, int T_, int C, int NH, const GpuContext& ctx,
                               CudnnBackwardMode mode = CudnnBackwardMode::kDeterministic);

// ctx.scratch the passes need: cuDNN's workspace for the plan (plus, for the backward, the dO.O row sums,
// B*NH*T fp32, and in kNondeterministic the fp32 dq accumulator), rounded up to 256 bytes. Builds the plan
// (hence the ctx, for ctx.cudnn) and throws st::Error if cuDNN cannot run the shape.
template <typename T>
size_t cudnn_attention_forward_scratch_bytes(int B, int T_, int C, int NH, const GpuContext& ctx);
template <typename T>
size_t cudnn_attention_backward_scratch_bytes(int B, int T_, int C, int NH, const GpuContext& ctx,
                                              CudnnBackwardMode mode = CudnnBackwardMode::kDeterministic);

// Overwrites out [B,T,C] and lse [B,NH,T] (fp32), as flash_attention_forward. Engines that declare
// themselves nondeterministic are refused, so reruns are bit-identical.
template <typename T>
void cudnn_attention_forward(T* out, float* lse, const T* qkv, int B, int T_, int C, int NH, const GpuContext& ctx);

// OVERWRITES dqkv [B,T,3C] with d(out)/d(qkv) applied to dout [B,T,C] (dq, dk, dv into the q, k, v column
// blocks), from qkv and the forward's out and lse. Unlike flash_attention_backward, which accumulates
// (+=), cuDNN writes its gradients: a caller that accumulates must add them itself. dqkv's previous
// contents are never read. Uses ctx.scratch (cudnn_attention_backward_scratch_bytes) as workspace.
template <typename T>
void cudnn_attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse, int B, int T_,
                              int C, int NH, const GpuContext& ctx,
                              CudnnBackwardMode mode = CudnnBackwardMode::kDeterministic);

// Grouped-query attention: the calls above with NKV key/value heads shared by NH query heads and hs per head, on
// qkv [B,T,(NH+2 NKV) hs] (q heads, then k heads, then v heads per row), out [B,T,NH hs], lse [B,NH,T]. The
// backward OVERWRITES dqkv. NKV = NH, hs = C / NH is the multi-head attention above.
template <typename T>
bool cudnn_attention_supported(int B, int T_, int NH, int NKV, int hs, const GpuContext& ctx,
                               CudnnBackwardMode mode = CudnnBackwardMode::kDeterministic);
template <typename T>
size_t cudnn_attention_forward_scratch_bytes(int B, int T_, int NH, int NKV, int hs, const GpuContext& ctx);
template <typename T>
size_t cudnn_attention_backward_scratch_bytes(int B, int T_, int NH, int NKV, int hs, const GpuContext& ctx,
                                              CudnnBackwardMode mode = CudnnBackwardMode::kDeterministic);
template <typename T>
void cudnn_attention_forward(T* out, float* lse, const T* qkv, int B, int T_, int NH, int NKV, int hs,
                             const GpuContext& ctx);
template <typename T>
void cudnn_attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse, int B, int T_,
                              int NH, int NKV, int hs, const GpuContext& ctx,
                              CudnnBackwardMode mode = CudnnBackwardMode::kDeterministic);

}  // namespace st::gpu
