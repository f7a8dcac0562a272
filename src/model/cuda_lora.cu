#include "shardtrain/model/cuda_lora.h"

#include "shardtrain/core/error.h"
#include "shardtrain/kernels/gpu/lora.h"

namespace st {

template <typename T>
CudaLora<T>::CudaLora(const ModelConfig& cfg, const std::vector<UnitLayout>& units, int64_t max_rows, int64_t slots)
    : run_(cfg, units, max_rows, slots),
      h_(run_.h_elems()),
      dh_(run_.dh_elems()),
      x_drop_(run_.dropout_elems()),
      dxd_(run_.dropout_elems()) {}

template <typename T>
void CudaLora<T>::forward(int layer, const std::string& weight, const T* params, T* out, int64_t ldo, const T* x,
                          int64_t N, OpTimer::Laps& lap, const gpu::GpuContext& ctx) {
  if (!adapts(weight)) return;  // no lap either: a run without LoRA profiles as before
  ST_CHECK(N <= run_.max_rows(), "LoRA forward over ", N, " rows, sized for ", run_.max_rows());
  lap("fwd.lora");
  for (size_t i = 0; i < run_.adapters().size(); ++i) {
    const LoraAdapter& a = run_.adapters()[i];
    if (a.linear.weight != weight) continue;
    const int in = static_cast<int>(a.linear.in);
    const T* input = x;
    if (const LoraDropoutKey* key = run_.dropout(layer, i)) {
      gpu::lora_dropout<T>(x_drop_.data(), x, N, in, *key, ctx);
      input = x_drop_.data();
    }
    gpu::lora_forward<T>(out + a.linear.row0, ldo, h_.data() + run_.h_offset(layer, i), input, params + a.a_offset,
                         params + a.b_offset, N, in, run_.rank(), static_cast<int>(a.linear.rows), run_.scale(), ctx);
  }
}

template <typename T>
void CudaLora<T>::backward(int layer, const std::string& weight, const T* params, T* grads, T* dx, const T* dout,
                           int64_t ldo, const T* x, int64_t N, OpTimer::Laps& lap, const gpu::GpuContext& ctx) {
  if (!adapts(weight)) return;
  ST_CHECK(N <= run_.max_rows(), "LoRA backward over ", N, " rows, sized for ", run_.max_rows());
  lap("bwd.lora");
  // Each adapter's A and B have this one producer in the block's backward: written, so the caller need not zero
  // the block's gradient buffer. dx already holds the base GEMM's input gradient: added to.
  for (size_t i = 0; i < run_.adapters().size(); ++i) {
    const LoraAdapter& a = run_.adapters()[i];
    if (a.linear.weight != weight) continue;
    const int in = static_cast<int>(a.linear.in), r = run_.rank();
    const LoraDropoutKey* key = run_.dropout(layer, i);
    // With dropout, the same mask again: dA from the dropped input, and x's gradient through the mask.
    if (key != nullptr) gpu::lora_dropout<T>(x_drop_.data(), x, N, in, *key, ctx);
    gpu::lora_backward<T>(key != nullptr ? nullptr : dx, grads + a.a_offset, grads + a.b_offset, dh_.data(),
                          dout + a.linear.row0, ldo, key != nullptr ? x_drop_.data() : x,
                          h_.data() + run_.h_offset(layer, i), params + a.a_offset, params + a.b_offset, N, in, r,
                          static_cast<int>(a.linear.rows), run_.scale(), ctx, GradWrite::kOverwrite);
    if (key != nullptr)
      gpu::lora_dropout_backward<T>(dx, dxd_.data(), dh_.data(), params + a.a_offset, N, in, r, *key, ctx);
  }
}

template class CudaLora<float>;
template class CudaLora<bf16>;
template class CudaLora<fp16>;

}  // namespace st
