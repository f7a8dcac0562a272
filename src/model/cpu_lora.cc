#include "shardtrain/model/cpu_lora.h"

#include <algorithm>

#include "shardtrain/core/error.h"
#include "shardtrain/kernels/lora.h"

namespace st {

CpuLora::CpuLora(const ModelConfig& cfg, const std::vector<UnitLayout>& units, int64_t max_rows, int64_t slots)
    : adapters_(block_lora_adapters(units, cfg)), max_rows_(max_rows), slots_(slots) {
  if (adapters_.empty()) return;
  scale_ = lora_scale(cfg.lora);
  rank_ = cfg.lora.rank;
  linear_index_ = lora_linear_indices(adapters_, cfg);
  const int64_t widest = widest_lora_input(adapters_);
  key_.p = cfg.lora.dropout;
  key_.seq_stride = cfg.seq_len;
  const int64_t dropout_floats = key_.p > 0 ? 2 * max_rows * widest : 0;
  h_.assign(static_cast<size_t>(footprint_floats(cfg, max_rows, slots) - max_rows * rank_ - dropout_floats), 0.0f);
  dh_.assign(static_cast<size_t>(max_rows * rank_), 0.0f);
  x_drop_.assign(static_cast<size_t>(dropout_floats / 2), 0.0f);
  dxd_.assign(static_cast<size_t>(dropout_floats / 2), 0.0f);
}

void CpuLora::set_batch(uint64_t seed, int64_t first_sequence, int64_t rows_per_sequence) {
  dropping_ = key_.p > 0 && first_sequence >= 0;
  key_.seed = seed;
  key_.first_sequence = first_sequence;
  key_.rows_per_sequence = rows_per_sequence;
}

const LoraDropoutKey* CpuLora::dropout(int layer, size_t i) {
  if (!dropping_) return nullptr;
  key_.stream = lora_dropout_stream(layer, linear_index_[i]);
  return &key_;
}

int64_t CpuLora::footprint_floats(const ModelConfig& cfg, int64_t max_rows, int64_t slots) {
  return lora_activation_elems(cfg, max_rows, slots);
}

void CpuLora::forward(int layer, const std::string& weight, const float* params, float* out, int64_t ldo,
                      const float* x, int64_t N) {
  ST_CHECK(N <= max_rows_, "LoRA forward over ", N, " rows, sized for ", max_rows_);
  for (size_t i = 0; i < adapters_.size(); ++i) {
    const LoraAdapter& a = adapters_[i];
    if (a.linear.weight != weight) continue;
    const float* in = x;
    if (const LoraDropoutKey* key = dropout(layer, i)) {
      lora_dropout(x_drop_.data(), x, N, static_cast<int>(a.linear.in), *key);
      in = x_drop_.data();
    }
    lora_forward(out + a.linear.row0, ldo, h(slot(layer), i), in, params + a.a_offset, params + a.b_offset, N,
                 static_cast<int>(a.linear.in), static_cast<int>(rank_), static_cast<int>(a.linear.rows), scale_);
  }
}

void CpuLora::backward(int layer, const std::string& weight, const float* params, float* grads, float* dx,
                       const float* dout, int64_t ldo, const float* x, int64_t N) {
  for (size_t i = 0; i < adapters_.size(); ++i) {
    const LoraAdapter& a = adapters_[i];
    if (a.linear.weight != weight) continue;
    const int in = static_cast<int>(a.linear.in), r = static_cast<int>(rank_);
    if (const LoraDropoutKey* key = dropout(layer, i)) {  // the same mask again: dA from the dropped input
      lora_dropout(x_drop_.data(), x, N, in, *key);
      lora_backward(nullptr, grads + a.a_offset, grads + a.b_offset, dh_.data(), dout + a.linear.row0, ldo,
                    x_drop_.data(), h(slot(layer), i), params + a.a_offset, params + a.b_offset, N, in, r,
                    static_cast<int>(a.linear.rows), scale_);
      lora_dropout_backward(dx, dxd_.data(), dh_.data(), params + a.a_offset, N, in, r, *key);
      continue;
    }
    lora_backward(dx, grads + a.a_offset, grads + a.b_offset, dh_.data(), dout + a.linear.row0, ldo, x,
                  h(slot(layer), i), params + a.a_offset, params + a.b_offset, N, static_cast<int>(a.linear.in),
                  static_cast<int>(rank_), static_cast<int>(a.linear.rows), scale_);
  }
}

}  // namespace st
