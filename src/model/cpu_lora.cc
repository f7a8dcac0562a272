#include "shardtrain/model/cpu_lora.h"

#include "shardtrain/core/error.h"
#include "shardtrain/kernels/lora.h"

namespace st {

CpuLora::CpuLora(const ModelConfig& cfg, const std::vector<UnitLayout>& units, int64_t max_rows, Recompute recompute)
    : run_(cfg, units, max_rows, recompute),
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
  for (const LoraRun::Stack& s : run_.stacks()) {
    if (s.weight != weight) continue;
    const float* input = x;
    if (const LoraDropoutKey* key = run_.dropout(layer, s.first)) {
      lora_dropout(x_drop_.data(), x, N, s.shape.in, *key);
      input = x_drop_.data();
    }
    lora_forward(out, ldo, GradWrite::kAccumulate, h_.data() + run_.h_offset(layer, s.first), input,
                 params + s.a_offset, params + s.b_offset, N, s.shape, run_.scale());
  }
}

void CpuLora::backward(int layer, const std::string& weight, const float* params, float* grads, float* dx,
                       const float* dout, int64_t ldo, const float* x, int64_t N) {
  for (const LoraRun::Stack& s : run_.stacks()) {
    if (s.weight != weight) continue;
    const int in = s.shape.in;
    const LoraDropoutKey* key = run_.dropout(layer, s.first);
    // With dropout (a stack of one), the same mask again: dA from the dropped input, and x's gradient through it.
    if (key != nullptr) lora_dropout(x_drop_.data(), x, N, in, *key);
    lora_backward(key != nullptr ? nullptr : dx, GradWrite::kAccumulate, grads + s.a_offset, grads + s.b_offset,
                  dh_.data(), dout, ldo, key != nullptr ? x_drop_.data() : x, h_.data() + run_.h_offset(layer, s.first),
                  params + s.a_offset, params + s.b_offset, N, s.shape, run_.scale());
    if (key != nullptr) lora_dropout_backward(dx, dxd_.data(), dh_.data(), params + s.a_offset, N, in, s.shape.r, *key);
  }
}

}  // namespace st
