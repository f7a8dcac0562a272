#include "shardtrain/shard/unit_buffers.h"

#include <algorithm>

#include "shardtrain/core/error.h"

namespace st {

template <typename T>
UnitBuffers<T>::UnitBuffers(int units, int64_t emb_elements, int64_t unit_elements, int64_t emb_grad_elements,
                            int64_t unit_grad_elements, int param_pool, int grad_pool, WindowArena& params,
                            WindowArena& grads)
    : param_pool_(static_cast<size_t>(param_pool)),
      grad_pool_(static_cast<size_t>(grad_pool)),
      params_of_(static_cast<size_t>(units), nullptr),
      grads_of_(static_cast<size_t>(units), nullptr) {
  emb_params_.data = params.take<T>(emb_elements);
  for (Buffer& b : param_pool_) b.data = params.take<T>(unit_elements);
  emb_grads_.data = grads.take<T>(emb_grad_elements);
  for (Buffer& b : grad_pool_) {
    b.data = grads.take<T>(unit_grad_elements);
    if (b.data.bytes() > 0) ST_CUDA_CHECK(cudaMemset(b.data.data(), 0, b.data.bytes()));
  }
  // cudaMemset runs on the legacy default stream, which the training streams (non-blocking) do not wait for.
  ST_CUDA_CHECK(cudaDeviceSynchronize());
}

template <typename T>
typename UnitBuffers<T>::Buffer* UnitBuffers<T>::free_buffer(std::vector<Buffer>& pool, Buffer& emb, int unit) {
  if (unit == 0) return emb.unit == -1 ? &emb : nullptr;
  // The least recently released: its `free` event is the oldest, so the wait on it is the shortest. Taking the first
  // free one instead would hand backward the buffer whose reduce-scatter was issued a moment ago, and every block's
  // backward would wait for the previous block's reduce-scatter.
  Buffer* oldest = nullptr;
  for (Buffer& b : pool)
    if (b.unit == -1 && (oldest == nullptr || b.released < oldest->released)) oldest = &b;
  return oldest;
}

template <typename T>
bool UnitBuffers<T>::can_take_params(int unit) {
  return params(unit) == nullptr && free_buffer(param_pool_, emb_params_, unit) != nullptr;
}

template <typename T>
typename UnitBuffers<T>::Buffer& UnitBuffers<T>::take(std::vector<Buffer*>& of, std::vector<Buffer>& pool, Buffer& emb,
                                                      int unit, const char* what) {
  Buffer*& held = of[static_cast<size_t>(unit)];
  ST_CHECK(held == nullptr, "unit ", unit, " already holds a ", what, " buffer");
  Buffer* b = free_buffer(pool, emb, unit);
  ST_CHECK(b != nullptr, "no free ", what, " buffer for unit ", unit, ": the schedule is inconsistent");
  b->unit = unit;
  held = b;
  in_use_bytes_ += static_cast<int64_t>(b->data.bytes());
  peak_bytes_ = std::max(peak_bytes_, in_use_bytes_);
  return *b;
}

template <typename T>
typename UnitBuffers<T>::Buffer& UnitBuffers<T>::take_params(int unit) {
  return take(params_of_, param_pool_, emb_params_, unit, "parameter");
}

template <typename T>
typename UnitBuffers<T>::Buffer& UnitBuffers<T>::take_grads(int unit) {
  return take(grads_of_, grad_pool_, emb_grads_, unit, "gradient");
}

template <typename T>
void UnitBuffers<T>::release(std::vector<Buffer*>& of, int unit, cudaStream_t after, const char* what) {
  Buffer*& b = of[static_cast<size_t>(unit)];
  ST_CHECK(b != nullptr, "release of unit ", unit, "'s ", what, " buffer, which it does not hold");
  b->free.record(after);
  b->unit = -1;
  b->released = ++release_tick_;
  in_use_bytes_ -= static_cast<int64_t>(b->data.bytes());
  b = nullptr;
}

template <typename T>
void UnitBuffers<T>::release_params(int unit, cudaStream_t after) {
  release(params_of_, unit, after, "parameter");
}

template <typename T>
void UnitBuffers<T>::release_grads(int unit, cudaStream_t after) {
  release(grads_of_, unit, after, "gradient");
}

template class UnitBuffers<float>;
template class UnitBuffers<bf16>;
template class UnitBuffers<fp16>;

}  // namespace st
