#include "shardtrain/model/cuda_lora.h"

#include "shardtrain/core/error.h"
#include "shardtrain/kernels/gpu/lora.h"

namespace st {

template <typename T>
CudaLora<T>::CudaLora(const ModelConfig& cfg, const std::vector<UnitLayout>& units, int64_t max_rows, int64_t slots)
    : adapters_(block_lora_adapters(units, cfg)), max_rows_(max_rows), slots_(slots) {
  if (adapters_.empty()) return;
  scale_ = lora_scale(cfg.lora);
  rank_ = cfg.lora.rank;
  dh_ = DeviceBuffer<T>(max_rows * rank_);
  h_ = DeviceBuffer<T>(lora_activation_elems(cfg, max_rows, slots) - dh_.size());
}

template <typename T>
bool CudaLora<T>::adapts(const std::string& weight) const {
  for (const LoraAdapter& a : adapters_)
    if (a.linear.weight == weight) return true;
  return false;
}

template <typename T>
T* CudaLora<T>::h(int64_t slot, size_t adapter) const {
  ST_CHECK(slot >= 0 && slot < slots_, "LoRA slot ", slot, " of ", slots_);
  return h_.data() +
         (slot * static_cast<int64_t>(adapters_.size()) + static_cast<int64_t>(adapter)) * max_rows_ * rank_;
}

template <typename T>
void CudaLora<T>::forward(int64_t slot, const std::string& weight, const T* params, T* out, int64_t ldo, const T* x,
                          int64_t N, OpTimer::Laps& lap, const gpu::GpuContext& ctx) {
  if (!adapts(weight)) return;  // no lap either: a run without LoRA profiles as before
  ST_CHECK(N <= max_rows_, "LoRA forward over ", N, " rows, sized for ", max_rows_);
  lap("fwd.lora");
  for (size_t i = 0; i < adapters_.size(); ++i) {
    const LoraAdapter& a = adapters_[i];
    if (a.linear.weight != weight) continue;
    gpu::lora_forward<T>(out + a.linear.row0, ldo, h(slot, i), x, params + a.a_offset, params + a.b_offset, N,
                         static_cast<int>(a.linear.in), static_cast<int>(rank_), static_cast<int>(a.linear.rows),
                         scale_, ctx);
  }
}

template <typename T>
void CudaLora<T>::backward(int64_t slot, const std::string& weight, const T* params, T* grads, T* dx, const T* dout,
                           int64_t ldo, const T* x, int64_t N, OpTimer::Laps& lap, const gpu::GpuContext& ctx) {
  if (!adapts(weight)) return;
  ST_CHECK(N <= max_rows_, "LoRA backward over ", N, " rows, sized for ", max_rows_);
  lap("bwd.lora");
  // Each adapter's A and B have this one producer in the block's backward: written, so the caller need not zero
  // the block's gradient buffer. dx already holds the base GEMM's input gradient: added to.
  for (size_t i = 0; i < adapters_.size(); ++i) {
    const LoraAdapter& a = adapters_[i];
    if (a.linear.weight != weight) continue;
    gpu::lora_backward<T>(dx, grads + a.a_offset, grads + a.b_offset, dh_.data(), dout + a.linear.row0, ldo, x,
                          h(slot, i), params + a.a_offset, params + a.b_offset, N, static_cast<int>(a.linear.in),
                          static_cast<int>(rank_), static_cast<int>(a.linear.rows), scale_, ctx, GradWrite::kOverwrite);
  }
}

template class CudaLora<float>;
template class CudaLora<bf16>;
template class CudaLora<fp16>;

}  // namespace st
