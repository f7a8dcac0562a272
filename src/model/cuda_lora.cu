#include "shardtrain/model/cuda_lora.h"

#include <algorithm>

#include "shardtrain/core/error.h"
#include "shardtrain/kernels/gpu/lora.h"

namespace st {

template <typename T>
CudaLora<T>::CudaLora(const ModelConfig& cfg, const std::vector<UnitLayout>& units, int64_t max_rows, int64_t slots)
    : adapters_(block_lora_adapters(units, cfg)), max_rows_(max_rows), slots_(slots) {
  if (adapters_.empty()) return;
  scale_ = lora_scale(cfg.lora);
  rank_ = cfg.lora.rank;
  linear_index_ = lora_linear_indices(adapters_, cfg);
  const int64_t widest = widest_lora_input(adapters_);
  key_.p = cfg.lora.dropout;
  key_.seq_stride = cfg.seq_len;
  const int64_t dropout_elems = key_.p > 0 ? max_rows * widest : 0;
  dh_ = DeviceBuffer<T>(max_rows * rank_);
  x_drop_ = DeviceBuffer<T>(dropout_elems);
  dxd_ = DeviceBuffer<T>(dropout_elems);
  h_ = DeviceBuffer<T>(lora_activation_elems(cfg, max_rows, slots) - dh_.size() - 2 * dropout_elems);
}

template <typename T>
void CudaLora<T>::set_batch(uint64_t seed, int64_t first_sequence, int64_t rows_per_sequence) {
  dropping_ = key_.p > 0 && first_sequence >= 0;
  key_.seed = seed;
  key_.first_sequence = first_sequence;
  key_.rows_per_sequence = rows_per_sequence;
}

template <typename T>
const LoraDropoutKey* CudaLora<T>::dropout(int layer, size_t i) {
  if (!dropping_) return nullptr;
  key_.stream = lora_dropout_stream(layer, linear_index_[i]);
  return &key_;
}

template <typename T>
bool CudaLora<T>::adapts(const std::string& weight) const {
  for (const LoraAdapter& a : adapters_)
    if (a.linear.weight == weight) return true;
  return false;
}

template <typename T>
T* CudaLora<T>::h(int layer, size_t adapter) const {
  const int64_t slot = slots_ == 1 ? 0 : layer;
  ST_CHECK(slot >= 0 && slot < slots_, "LoRA slot ", slot, " of ", slots_);
  return h_.data() +
         (slot * static_cast<int64_t>(adapters_.size()) + static_cast<int64_t>(adapter)) * max_rows_ * rank_;
}

template <typename T>
void CudaLora<T>::forward(int layer, const std::string& weight, const T* params, T* out, int64_t ldo, const T* x,
                          int64_t N, OpTimer::Laps& lap, const gpu::GpuContext& ctx) {
  if (!adapts(weight)) return;  // no lap either: a run without LoRA profiles as before
  ST_CHECK(N <= max_rows_, "LoRA forward over ", N, " rows, sized for ", max_rows_);
  lap("fwd.lora");
  for (size_t i = 0; i < adapters_.size(); ++i) {
    const LoraAdapter& a = adapters_[i];
    if (a.linear.weight != weight) continue;
    const T* in = x;
    if (const LoraDropoutKey* key = dropout(layer, i)) {
      gpu::lora_dropout<T>(x_drop_.data(), x, N, static_cast<int>(a.linear.in), *key, ctx);
      in = x_drop_.data();
    }
    gpu::lora_forward<T>(out + a.linear.row0, ldo, h(layer, i), in, params + a.a_offset, params + a.b_offset, N,
                         static_cast<int>(a.linear.in), static_cast<int>(rank_), static_cast<int>(a.linear.rows),
                         scale_, ctx);
  }
}

template <typename T>
void CudaLora<T>::backward(int layer, const std::string& weight, const T* params, T* grads, T* dx, const T* dout,
                           int64_t ldo, const T* x, int64_t N, OpTimer::Laps& lap, const gpu::GpuContext& ctx) {
  if (!adapts(weight)) return;
  ST_CHECK(N <= max_rows_, "LoRA backward over ", N, " rows, sized for ", max_rows_);
  lap("bwd.lora");
  // Each adapter's A and B have this one producer in the block's backward: written, so the caller need not zero
  // the block's gradient buffer. dx already holds the base GEMM's input gradient: added to.
  for (size_t i = 0; i < adapters_.size(); ++i) {
    const LoraAdapter& a = adapters_[i];
    if (a.linear.weight != weight) continue;
    const int in = static_cast<int>(a.linear.in), r = static_cast<int>(rank_);
    if (const LoraDropoutKey* key = dropout(layer, i)) {  // the same mask again: dA from the dropped input
      gpu::lora_dropout<T>(x_drop_.data(), x, N, in, *key, ctx);
      gpu::lora_backward<T>(nullptr, grads + a.a_offset, grads + a.b_offset, dh_.data(), dout + a.linear.row0, ldo,
                            x_drop_.data(), h(layer, i), params + a.a_offset, params + a.b_offset, N, in, r,
                            static_cast<int>(a.linear.rows), scale_, ctx, GradWrite::kOverwrite);
      gpu::lora_dropout_backward<T>(dx, dxd_.data(), dh_.data(), params + a.a_offset, N, in, r, *key, ctx);
      continue;
    }
    gpu::lora_backward<T>(dx, grads + a.a_offset, grads + a.b_offset, dh_.data(), dout + a.linear.row0, ldo, x,
                          h(layer, i), params + a.a_offset, params + a.b_offset, N, in, r,
                          static_cast<int>(a.linear.rows), scale_, ctx, GradWrite::kOverwrite);
  }
}

template class CudaLora<float>;
template class CudaLora<bf16>;
template class CudaLora<fp16>;

}  // namespace st
