#include "shardtrain/model/cpu_lora.h"

#include "shardtrain/core/error.h"
#include "shardtrain/kernels/lora.h"

namespace st {

CpuLora::CpuLora(const ModelConfig& cfg, const std::vector<UnitLayout>& units, int64_t max_rows, int64_t slots)
    : run_(cfg, units, max_rows, slots),
      h_(static_cast<size_t>(run_.h_elems())),
      dh_(static_cast<size_t>(run_.dh_elems())),
      x_drop_(static_cast<size_t>(run_.dropout_elems())),
      dxd_(static_cast<size_t>(run_.dropout_elems())) {}

int64_t CpuLora::footprint_floats(const ModelConfig& cfg, int64_t max_rows, int64_t slots) {
  return lora_activation_elems(cfg, max_rows, slots);
}

void CpuLora::forward(int layer, const std::string& weight, const float* params, float* out, int64_t ldo,
                      const float* x, int64_t N) {
  ST_CHECK(N <= run_.max_rows(), "LoRA forward over ", N, " rows, sized for ", run_.max_rows());
  for (size_t i = 0; i < run_.adapters().size(); ++i) {
    const LoraAdapter& a = run_.adapters()[i];
    if (a.linear.weight != weight) continue;
    const int in = static_cast<int>(a.linear.in);
    const float* input = x;
    if (const LoraDropoutKey* key = run_.dropout(layer, i)) {
      lora_dropout(x_drop_.data(), x, N, in, *key);
      input = x_drop_.data();
    }
    lora_forward(out + a.linear.row0, ldo, h_.data() + run_.h_offset(layer, i), input, params + a.a_offset,
                 params + a.b_offset, N, in, run_.rank(), static_cast<int>(a.linear.rows), run_.scale());
  }
}

void CpuLora::backward(int layer, const std::string& weight, const float* params, float* grads, float* dx,
                       const float* dout, int64_t ldo, const float* x, int64_t N) {
  for (size_t i = 0; i < run_.adapters().size(); ++i) {
    const LoraAdapter& a = run_.adapters()[i];
    if (a.linear.weight != weight) continue;
    const int in = static_cast<int>(a.linear.in), r = run_.rank();
    const LoraDropoutKey* key = run_.dropout(layer, i);
    // With dropout, the same mask again: dA from the dropped input, and x's gradient through the mask.
    if (key != nullptr) lora_dropout(x_drop_.data(), x, N, in, *key);
    lora_backward(key != nullptr ? nullptr : dx, grads + a.a_offset, grads + a.b_offset, dh_.data(),
                  dout + a.linear.row0, ldo, key != nullptr ? x_drop_.data() : x, h_.data() + run_.h_offset(layer, i),
                  params + a.a_offset, params + a.b_offset, N, in, r, static_cast<int>(a.linear.rows), run_.scale());
    if (key != nullptr) lora_dropout_backward(dx, dxd_.data(), dh_.data(), params + a.a_offset, N, in, r, *key);
  }
}

}  // namespace st
