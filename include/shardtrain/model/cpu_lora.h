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
#include "shardtrain/model/units.h"

namespace st {

class CpuLora {
 public:
  // `slots` blocks keep their h at once (n_layer, or 1 with recompute), each for up to max_rows tokens.
  CpuLora(const ModelConfig& cfg, const std::vector<UnitLayout>& units, int64_t max_rows, int64_t slots);

  // The micro-batch the next calls run: its first sequence's global index and its active length (rows per sequence),
  // which key the dropout masks with `seed`; first_sequence < 0 runs without dropout (evaluation).
  void set_batch(uint64_t seed, int64_t first_sequence, int64_t rows_per_sequence);

  // Floats the constructor allocates.
  static int64_t footprint_floats(const ModelConfig& cfg, int64_t max_rows, int64_t slots);
  int64_t allocated_floats() const { return static_cast<int64_t>(h_.size() + dh_.size()); }

  // out[n, row0 .. row0 + rows) += scale B A x[n] for each adapter of `weight` (out's row pitch ldo), x [N, in];
  // the block's parameters are `params` (its gathered flat buffer).
  void forward(int layer, const std::string& weight, const float* params, float* out, int64_t ldo, const float* x,
               int64_t N);
  // With dout the gradient of that output (row pitch ldo): grads (the block's gradient buffer) += the adapters'
  // gradients, and dx [N, in] += their part of x's gradient.
  void backward(int layer, const std::string& weight, const float* params, float* grads, float* dx, const float* dout,
                int64_t ldo, const float* x, int64_t N);

 private:
  float* h(int64_t slot, size_t adapter) {
    return h_.data() +
           (slot * static_cast<int64_t>(adapters_.size()) + static_cast<int64_t>(adapter)) * max_rows_ * rank_;
  }

  int64_t slot(int layer) const { return slots_ == 1 ? 0 : layer; }
  // The dropout key of `layer`'s adapter i, or null without dropout for the running micro-batch.
  const LoraDropoutKey* dropout(int layer, size_t i);

  std::vector<LoraAdapter> adapters_;
  std::vector<int> linear_index_;  // each adapter's place in the family's lora_linears
  int64_t slots_ = 0;
  LoraDropoutKey key_;  // p, seed and batch; stream set per adapter
  bool dropping_ = false;
  std::vector<float> x_drop_, dxd_;  // [max_rows][max in], with dropout only
  float scale_ = 0.0f;
  int64_t rank_ = 0, max_rows_ = 0;
  std::vector<float> h_;   // [slot][adapter][max_rows][rank]
  std::vector<float> dh_;  // [max_rows][rank]
};

}  // namespace st
