#include "shardtrain/model/cpu_lora.h"

#include "shardtrain/core/error.h"
#include "shardtrain/kernels/lora.h"

namespace st {

CpuLora::CpuLora(const ModelConfig& cfg, const std::vector<UnitLayout>& units, int64_t max_rows, int64_t slots)
    : adapters_(block_lora_adapters(units, cfg)), max_rows_(max_rows) {
  if (adapters_.empty()) return;
  scale_ = lora_scale(cfg.lora);
  rank_ = cfg.lora.rank;
  h_.assign(static_cast<size_t>(footprint_floats(cfg, max_rows, slots) - max_rows * rank_), 0.0f);
  dh_.assign(static_cast<size_t>(max_rows * rank_), 0.0f);
}

int64_t CpuLora::footprint_floats(const ModelConfig& cfg, int64_t max_rows, int64_t slots) {
  return lora_activation_elems(cfg, max_rows, slots);
}

void CpuLora::forward(int64_t slot, const std::string& weight, const float* params, float* out, int64_t ldo,
                      const float* x, int64_t N) {
  ST_CHECK(N <= max_rows_, "LoRA forward over ", N, " rows, sized for ", max_rows_);
  for (size_t i = 0; i < adapters_.size(); ++i) {
    const LoraAdapter& a = adapters_[i];
    if (a.linear.weight != weight) continue;
    lora_forward(out + a.linear.row0, ldo, h(slot, i), x, params + a.a_offset, params + a.b_offset, N,
                 static_cast<int>(a.linear.in), static_cast<int>(rank_), static_cast<int>(a.linear.rows), scale_);
  }
}

void CpuLora::backward(int64_t slot, const std::string& weight, const float* params, float* grads, float* dx,
                       const float* dout, int64_t ldo, const float* x, int64_t N) {
  for (size_t i = 0; i < adapters_.size(); ++i) {
    const LoraAdapter& a = adapters_[i];
    if (a.linear.weight != weight) continue;
    lora_backward(dx, grads + a.a_offset, grads + a.b_offset, dh_.data(), dout + a.linear.row0, ldo, x, h(slot, i),
                  params + a.a_offset, params + a.b_offset, N, static_cast<int>(a.linear.in), static_cast<int>(rank_),
                  static_cast<int>(a.linear.rows), scale_);
  }
}

}  // namespace st
