#include "shardtrain/model/cuda_lora.h"

#include "shardtrain/core/error.h"
#include "shardtrain/kernels/gpu/lora.h"

namespace st {

template <typename T>
CudaLora<T>::CudaLora(const ModelConfig& cfg, const std::vector<UnitLayout>& units, int64_t max_rows,
                      Recompute recompute)
    : run_(cfg, units, max_rows, recompute),
      h_(run_.h_elems()),
      dh_(run_.dh_elems()),
      x_drop_(run_.dropout_elems()),
      dxd_(run_.dropout_elems()) {}

template <typename T>
void CudaLora<T>::forward(int layer, const std::string& weight, const T* params, T* out, int64_t ldo, const T* x,
                          int64_t N, OpTimer::Laps& lap, const gpu::GpuContext& ctx,
                          const std::function<void(bool onto)>& base) {
  if (!adapts(weight)) return base(false);  // no lap either: a run without LoRA profiles as before
  if (!run_.dropping() && run_.covers(weight, ldo)) {
    lap("fwd.lora");
    update(layer, weight, params, out, ldo, GradWrite::kOverwrite, x, N, ctx);
    base(true);
  } else {
    base(false);
    forward(layer, weight, params, out, ldo, x, N, lap, ctx);
  }
}

template <typename T>
void CudaLora<T>::forward(int layer, const std::string& weight, const T* params, T* out, int64_t ldo, const T* x,
                          int64_t N, OpTimer::Laps& lap, const gpu::GpuContext& ctx) {
  if (!adapts(weight)) return;
  lap("fwd.lora");
  update(layer, weight, params, out, ldo, GradWrite::kAccumulate, x, N, ctx);
}

template <typename T>
void CudaLora<T>::update(int layer, const std::string& weight, const T* params, T* out, int64_t ldo,
                         GradWrite out_write, const T* x, int64_t N, const gpu::GpuContext& ctx) {
  ST_CHECK(N <= run_.max_rows(), "LoRA forward over ", N, " rows, sized for ", run_.max_rows());
  for (const LoraRun::Stack& s : run_.stacks()) {
    if (s.weight != weight) continue;
    const T* input = x;
    if (const LoraDropoutKey* key = run_.dropout(layer, s.first)) {
      gpu::lora_dropout<T>(x_drop_.data(), x, N, s.shape.in, *key, ctx);
      input = x_drop_.data();
    }
    gpu::lora_forward<T>(out, ldo, out_write, h_.data() + run_.h_offset(layer, s.first), input, params + s.a_offset,
                         params + s.b_offset, N, s.shape, run_.scale(), ctx);
  }
}

template <typename T>
void CudaLora<T>::backward(int layer, const std::string& weight, const T* params, T* grads, T* dx, const T* dout,
                           int64_t ldo, const T* x, int64_t N, OpTimer::Laps& lap, const gpu::GpuContext& ctx,
                           const std::function<void(bool onto)>& base) {
  if (!adapts(weight)) return base(false);
  ST_CHECK(N <= run_.max_rows(), "LoRA backward over ", N, " rows, sized for ", run_.max_rows());
  if (run_.dropping()) {  // through each adapter's mask, added to the base's input gradient
    base(false);
    lap("bwd.lora");
    update_backward(layer, weight, params, grads, dx, GradWrite::kAccumulate, dout, ldo, x, N, ctx);
  } else {
    lap("bwd.lora");
    update_backward(layer, weight, params, grads, dx, GradWrite::kOverwrite, dout, ldo, x, N, ctx);
    base(true);
  }
}

template <typename T>
void CudaLora<T>::update_backward(int layer, const std::string& weight, const T* params, T* grads, T* dx,
                                  GradWrite dx_write, const T* dout, int64_t ldo, const T* x, int64_t N,
                                  const gpu::GpuContext& ctx) {
  // Each adapter's A and B have this one producer in the block's backward: written, so the caller need not zero
  // the block's gradient buffer. The first stack writes dx (dx_write), the others add to it.
  for (const LoraRun::Stack& s : run_.stacks()) {
    if (s.weight != weight) continue;
    const int in = s.shape.in;
    const LoraDropoutKey* key = run_.dropout(layer, s.first);
    // With dropout (a stack of one), the same mask again: dA from the dropped input, and x's gradient through it.
    if (key != nullptr) gpu::lora_dropout<T>(x_drop_.data(), x, N, in, *key, ctx);
    gpu::lora_backward<T>(key != nullptr ? nullptr : dx, dx_write, grads + s.a_offset, grads + s.b_offset, dh_.data(),
                          dout, ldo, key != nullptr ? x_drop_.data() : x, h_.data() + run_.h_offset(layer, s.first),
                          params + s.a_offset, params + s.b_offset, N, s.shape, run_.scale(), ctx,
                          GradWrite::kOverwrite);
    if (key != nullptr)
      gpu::lora_dropout_backward<T>(dx, dxd_.data(), dh_.data(), params + s.a_offset, N, in, s.shape.r, *key, ctx);
    dx_write = GradWrite::kAccumulate;
  }
}

template class CudaLora<float>;
template class CudaLora<bf16>;
template class CudaLora<fp16>;

}  // namespace st
