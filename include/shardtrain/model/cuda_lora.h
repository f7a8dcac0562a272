// The LoRA adapters inside the CUDA models (model/lora.h): CpuLora's calls (cpu_lora.h) on device buffers in the
// compute type T, through gpu::lora_forward and gpu::lora_backward (kernels/gpu/lora.h), each weight's adapters as
// one stack. forward() adds the adapters of a weight to its GEMM's output, keeping h = x A^T for the backward;
// backward() writes their A and B gradients (=, as the CUDA models write every block gradient) and adds their part
// of the input's gradient. Every block has the same layout, so one adapter list serves them all. Without LoRA nothing
// is allocated and the calls do nothing but run the base.
//
// The adapters' update is memory-bound (rank 16: a read and a write of the GEMM's whole output), so where it can,
// it runs first and writes the output, and the base GEMM adds itself onto it (beta = 1): reading C is hidden in a
// compute-bound GEMM. The forms that take the base GEMM as `base(onto)` choose that order.
//
//   CudaLora<bf16> lora(cfg, units, max_batch * cfg.seq_len, recompute ? 1 : cfg.n_layer);
//   lora.forward(layer, "attn.qkv.weight", params, a.qkv, QKV, a.norm1, N, lap, ctx, [&](bool onto) {
//     if (onto) gpu::matmul_forward_residual<bf16>(a.qkv, a.norm1, p.qkvw, p.qkvb, a.qkv, N, C, QKV, ctx);
//     else gpu::matmul_forward<bf16>(a.qkv, a.norm1, p.qkvw, p.qkvb, N, C, QKV, ctx);
//   });
// With lora.dropout each adapter's input goes through gpu::lora_dropout, keyed by set_batch as CpuLora's.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/core/cuda.h"
#include "shardtrain/core/cuda_timer.h"
#include "shardtrain/kernels/gpu/context.h"
#include "shardtrain/kernels/grad_write.h"
#include "shardtrain/kernels/lora.h"
#include "shardtrain/model/lora.h"
#include "shardtrain/model/lora_run.h"
#include "shardtrain/model/units.h"

namespace st {

// How base(onto) writes its GEMM's output: onto adds to what the adapters wrote first.
inline GradWrite base_write(bool onto) { return onto ? GradWrite::kAccumulate : GradWrite::kOverwrite; }

template <typename T>
class CudaLora {
 public:
  CudaLora() = default;
  // recompute.sets(n_layer) blocks keep their h at once (LoraRun), each for up to max_rows tokens: allocates
  // lora_activation_elems(cfg, max_rows, recompute.sets(n_layer)) elements of T (model/lora.h), which the CUDA
  // footprint counts.
  CudaLora(const ModelConfig& cfg, const std::vector<UnitLayout>& units, int64_t max_rows, Recompute recompute);

  int64_t allocated_elems() const { return h_.size() + dh_.size() + x_drop_.size() + dxd_.size(); }
  // LoraRun::set_batch: the micro-batch that keys the dropout masks; first_sequence < 0: no dropout.
  void set_batch(uint64_t seed, int64_t first_sequence, int64_t rows_per_sequence) {
    run_.set_batch(seed, first_sequence, rows_per_sequence);
  }
  // Whether `weight` (a block tensor's name) has adapters: its GEMM's fused epilogue (GELU) must then wait for them.
  bool adapts(const std::string& weight) const { return run_.adapts(weight); }

  // The base GEMM of `weight`, base(onto), with onto adding to out instead of writing it; then (or first) its
  // adapters' update of out: out[n, row0 .. row0 + rows) += scale B A x[n] for each adapter (out's row pitch ldo),
  // x [N, in]; the block's parameters are `params` (its gathered flat buffer, device memory). The adapters run
  // first, writing out, when they cover all ldo columns and the micro-batch does not drop. Lap "fwd.lora" when it
  // adapts (base sets its own).
  void forward(int layer, const std::string& weight, const T* params, T* out, int64_t ldo, const T* x, int64_t N,
               OpTimer::Laps& lap, const gpu::GpuContext& ctx, const std::function<void(bool onto)>& base);
  // The update alone, added to out: for a base GEMM that cannot add onto it (one that adds a residual already).
  void forward(int layer, const std::string& weight, const T* params, T* out, int64_t ldo, const T* x, int64_t N,
               OpTimer::Laps& lap, const gpu::GpuContext& ctx);
  // With dout the gradient of that output (row pitch ldo): the base GEMM's input gradient base(onto) (onto: added to
  // dx, not written), and the adapters' A and B gradients written into grads (the block's gradient buffer) and their
  // part of x's gradient in dx [N, in]; the adapters write dx first unless the micro-batch drops. Lap "bwd.lora"
  // when it adapts.
  void backward(int layer, const std::string& weight, const T* params, T* grads, T* dx, const T* dout, int64_t ldo,
                const T* x, int64_t N, OpTimer::Laps& lap, const gpu::GpuContext& ctx,
                const std::function<void(bool onto)>& base);

 private:
  // The update of out (written or added to); the gradients with dx written or added to.
  void update(int layer, const std::string& weight, const T* params, T* out, int64_t ldo, GradWrite out_write,
              const T* x, int64_t N, const gpu::GpuContext& ctx);
  void update_backward(int layer, const std::string& weight, const T* params, T* grads, T* dx, GradWrite dx_write,
                       const T* dout, int64_t ldo, const T* x, int64_t N, const gpu::GpuContext& ctx);

  LoraRun run_;
  DeviceBuffer<T> h_, dh_, x_drop_, dxd_;  // the buffers LoraRun sizes
};

}  // namespace st
