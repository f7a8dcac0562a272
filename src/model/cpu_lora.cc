#include "shardtrain/model/cpu_lora.h"

#include "shardtrain/core/error.h"
#include "shardtrain/kernels/lora.h"

namespace st {

CpuLora::CpuLora(const ModelConfig& cfg, const std::vector<UnitLayout>& units, int64_t max_rows, int64_t slots)
    : max_rows_(max_rows) {
  if (!cfg.lora.enabled() || cfg.n_layer == 0) return;
  adapters_ = lora_adapters(units[1], cfg);
  for (size_t l = 2; l + 1 < units.size(); ++l) {
    const std::vector<LoraAdapter> other = lora_adapters(units[l], cfg);
    for (size_t i = 0; i < adapters_.size(); ++i)
      ST_CHECK(other[i].a_offset == adapters_[i].a_offset && other[i].b_offset == adapters_[i].b_offset,
               "LoRA adapters of ", units[l].name, " lie elsewhere than block.0's");
  }
  scale_ = lora_scale(cfg.lora);
  rank_ = cfg.lora.rank;
  h_.assign(static_cast<size_t>(footprint_floats(cfg, max_rows, slots) - max_rows * rank_), 0.0f);
  dh_.assign(static_cast<size_t>(max_rows * rank_), 0.0f);
}

int64_t CpuLora::footprint_floats(const ModelConfig& cfg, int64_t max_rows, int64_t slots) {
  if (!cfg.lora.enabled() || cfg.n_layer == 0) return 0;
  const int64_t adapters = static_cast<int64_t>(lora_targets(cfg).size());
  return (slots * adapters + 1) * max_rows * cfg.lora.rank;
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
