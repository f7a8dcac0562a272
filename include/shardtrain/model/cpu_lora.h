// The LoRA adapters inside the CPU models (model/lora.h): after each adapted base GEMM of a block, forward() adds
// the adapters of that weight to its output, keeping h = x A^T for the backward; backward() accumulates their A and B
// gradients and their part of the input's gradient. Every block has the same layout, so one adapter list serves
// them all. Without LoRA both calls do nothing.
//
//   matmul_forward(a.qkv, a.norm1, p.qkvw, p.qkvb, N, C, QKV);
//   lora_.forward(layer, "attn.qkv.weight", params, a.qkv, QKV, a.norm1, N);   // q, k and v's adapters
// With lora.dropout each adapter's input goes through lora_dropout (kernels/lora.h), keyed by set_batch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/kernels/lora.h"
#include "shardtrain/model/lora.h"
#include "shardtrain/model/lora_run.h"
#include "shardtrain/model/units.h"

namespace st {

class CpuLora {
 public:
  // recompute.sets(n_layer) blocks keep their h at once (LoraRun), each for up to max_rows tokens.
  CpuLora(const ModelConfig& cfg, const std::vector<UnitLayout>& units, int64_t max_rows, Recompute recompute);

  // LoraRun::set_batch: the micro-batch that keys the dropout masks; first_sequence < 0: no dropout (evaluation).
  void set_batch(uint64_t seed, int64_t first_sequence, int64_t rows_per_sequence) {
    run_.set_batch(seed, first_sequence, rows_per_sequence);
  }

  // Floats the constructor allocates (lora_activation_elems).
  static int64_t footprint_floats(const ModelConfig& cfg, int64_t max_rows, int64_t slots);
  int64_t allocated_floats() const {
    return static_cast<int64_t>(h_.size() + dh_.size() + x_drop_.size() + dxd_.size());
  }

  // out[n, row0 .. row0 + rows) += scale B A x[n] for each adapter of `weight` (out's row pitch ldo), x [N, in];
  // the block's parameters are `params` (its gathered flat buffer).
  void forward(int layer, const std::string& weight, const float* params, float* out, int64_t ldo, const float* x,
               int64_t N);
  // With dout the gradient of that output (row pitch ldo): grads (the block's gradient buffer) += the adapters'
  // gradients, and dx [N, in] += their part of x's gradient.
  void backward(int layer, const std::string& weight, const float* params, float* grads, float* dx, const float* dout,
                int64_t ldo, const float* x, int64_t N);

 private:
  LoraRun run_;
  std::vector<float> h_, dh_, x_drop_, dxd_;  // the buffers LoraRun sizes
};

}  // namespace st
