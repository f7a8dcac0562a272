// The LoRA adapters inside the CUDA models (model/lora.h): CpuLora's calls (cpu_lora.h) on device buffers in the
// compute type T, through gpu::lora_forward and gpu::lora_backward (kernels/gpu/lora.h). After each adapted base GEMM
// of a block, forward() adds the adapters of that weight to its output, keeping h = x A^T for the backward; after
// that GEMM's backward, backward() writes their A and B gradients (=, as the CUDA models write every block gradient)
// and adds their part of the input's gradient. Every block has the same layout, so one adapter list serves them all.
// Without LoRA nothing is allocated and both calls do nothing.
//
//   CudaLora<bf16> lora(cfg, units, max_batch * cfg.seq_len, recompute ? 1 : cfg.n_layer);
//   gpu::matmul_forward<bf16>(a.qkv, a.norm1, p.qkvw, p.qkvb, N, C, QKV, ctx);
//   lora.forward(layer, "attn.qkv.weight", params, a.qkv, QKV, a.norm1, N, lap, ctx);   // q, k and v's adapters
// With lora.dropout each adapter's input goes through gpu::lora_dropout, keyed by set_batch as CpuLora's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/core/cuda.h"
#include "shardtrain/core/cuda_timer.h"
#include "shardtrain/kernels/gpu/context.h"
#include "shardtrain/kernels/lora.h"
#include "shardtrain/model/lora.h"
#include "shardtrain/model/lora_run.h"
#include "shardtrain/model/units.h"

namespace st {

template <typename T>
class CudaLora {
 public:
  CudaLora() = default;
  // `slots` blocks keep their h at once (n_layer, or 1 with recompute), each for up to max_rows tokens: allocates
  // lora_activation_elems(cfg, max_rows, slots) elements of T (model/lora.h), which the CUDA footprint counts.
  CudaLora(const ModelConfig& cfg, const std::vector<UnitLayout>& units, int64_t max_rows, int64_t slots);

  int64_t allocated_elems() const { return h_.size() + dh_.size() + x_drop_.size() + dxd_.size(); }
  // LoraRun::set_batch: the micro-batch that keys the dropout masks; first_sequence < 0: no dropout.
  void set_batch(uint64_t seed, int64_t first_sequence, int64_t rows_per_sequence) {
    run_.set_batch(seed, first_sequence, rows_per_sequence);
  }
  // Whether `weight` (a block tensor's name) has adapters: its GEMM's fused epilogue (GELU) must then wait for them.
  bool adapts(const std::string& weight) const { return run_.adapts(weight); }

  // out[n, row0 .. row0 + rows) += scale B A x[n] for each adapter of `weight` (out's row pitch ldo), x [N, in];
  // the block's parameters are `params` (its gathered flat buffer, device memory). Lap "fwd.lora" when it adapts.
  void forward(int layer, const std::string& weight, const T* params, T* out, int64_t ldo, const T* x, int64_t N,
               OpTimer::Laps& lap, const gpu::GpuContext& ctx);
  // With dout the gradient of that output (row pitch ldo): writes the adapters' A and B gradients into grads (the
  // block's gradient buffer) and adds their part of x's gradient to dx [N, in]. Lap "bwd.lora" when it adapts.
  void backward(int layer, const std::string& weight, const T* params, T* grads, T* dx, const T* dout, int64_t ldo,
                const T* x, int64_t N, OpTimer::Laps& lap, const gpu::GpuContext& ctx);

 private:
  LoraRun run_;
  DeviceBuffer<T> h_, dh_, x_drop_, dxd_;  // the buffers LoraRun sizes
};

}  // namespace st
