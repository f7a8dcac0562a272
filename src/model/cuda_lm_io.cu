#include "shardtrain/model/cuda_lm_io.h"

#include <algorithm>
#include <cstring>

#include "shardtrain/core/error.h"
#include "shardtrain/kernels/gpu/matmul.h"
#include "shardtrain/kernels/gpu/reduce.h"
#include "shardtrain/kernels/gpu/softmax_cross_entropy.h"

namespace st {
template <typename T>
CudaLmIo<T>::CudaLmIo(const ModelConfig& cfg, int64_t max_batch, cudaStream_t stream)
    : C_(cfg.n_embd),
      V_(cfg.vocab_size),
      Vp_(cfg.padded_vocab()),
      max_tokens_(max_batch * cfg.seq_len),
      chunk_rows_(cuda_classifier_chunk_rows(cfg, max_batch * cfg.seq_len)) {
  tokens_ = DeviceBuffer<int32_t>(max_tokens_);
  targets_ = DeviceBuffer<int32_t>(max_tokens_);
  staging_ = PinnedBuffer<int32_t>(2 * max_tokens_);
  logits_chunk_ = DeviceBuffer<T>(chunk_rows_ * Vp_);
  losses_ = DeviceBuffer<float>(max_tokens_);
  loss_sum_ = DeviceBuffer<double>(1);
  ST_CUDA_CHECK(cudaMemsetAsync(loss_sum_.data(), 0, sizeof(double), stream));
}

template <typename T>
const int32_t* CudaLmIo<T>::upload(DeviceBuffer<int32_t>& dst, int64_t staging_offset, const int32_t* host, int64_t n,
                                   cudaStream_t stream) {
  ST_CHECK(n >= 0 && n <= max_tokens_, n, " tokens exceed the ", max_tokens_, " the model was sized for");
  int32_t* stage = staging_.data() + staging_offset;
  std::memcpy(stage, host, sizeof(int32_t) * static_cast<size_t>(n));
  ST_CUDA_CHECK(
      cudaMemcpyAsync(dst.data(), stage, sizeof(int32_t) * static_cast<size_t>(n), cudaMemcpyHostToDevice, stream));
  return dst.data();
}

template <typename T>
const int32_t* CudaLmIo<T>::upload_tokens(const int32_t* host, int64_t n, cudaStream_t stream) {
  return upload(tokens_, 0, host, n, stream);
}

template <typename T>
const int32_t* CudaLmIo<T>::upload_targets(const int32_t* host, int64_t n, cudaStream_t stream) {
  return upload(targets_, max_tokens_, host, n, stream);
}

template <typename T>
void CudaLmIo<T>::classify(const T* x, const T* w, int64_t N, float dloss, T* dx, T* dw, GradWrite dw_write,
                           OpTimer::Laps& lap, const gpu::GpuContext& ctx) {
  const bool backward = dx != nullptr;
  const int C = C_;
  for (int64_t r0 = 0; r0 < N; r0 += chunk_rows_) {
    const int64_t rows = std::min(chunk_rows_, N - r0);
    T* logits = logits_chunk_.data();
    lap("head.classifier_fwd");
    gpu::matmul_forward<T>(logits, x + r0 * C, w, nullptr, rows, C, Vp_, ctx);
    lap("head.softmax_xent");
    gpu::softmax_cross_entropy<T>(losses_.data() + r0, backward ? logits : nullptr, logits, targets_.data() + r0, rows,
                                  V_, Vp_, dloss, ctx);
    if (backward) {
      lap("head.classifier_bwd");
      gpu::matmul_backward<T>(dx + r0 * C, dw, nullptr, logits, x + r0 * C, w, rows, C, Vp_, ctx, GradWrite::kOverwrite,
                              r0 == 0 ? dw_write : GradWrite::kAccumulate);
    }
  }
  lap("head.loss_sum");
  gpu::sum(losses_.data(), N, loss_sum_.data(), ctx);
}

template <typename T>
void CudaLmIo<T>::logits_of_row(const T* x, const T* w, std::vector<float>* logits, const gpu::GpuContext& ctx) {
  gpu::matmul_forward<T>(logits_chunk_.data(), x, w, nullptr, 1, C_, Vp_, ctx);
  std::vector<T> row(static_cast<size_t>(V_));
  ST_CUDA_CHECK(
      cudaMemcpyAsync(row.data(), logits_chunk_.data(), sizeof(T) * row.size(), cudaMemcpyDeviceToHost, ctx.stream));
  ST_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
  logits->resize(row.size());
  for (size_t i = 0; i < row.size(); ++i) (*logits)[i] = static_cast<float>(row[i]);
}

template <typename T>
double CudaLmIo<T>::take_loss_sum(cudaStream_t stream) {
  double sum = 0;
  ST_CUDA_CHECK(cudaMemcpyAsync(&sum, loss_sum_.data(), sizeof(double), cudaMemcpyDeviceToHost, stream));
  ST_CUDA_CHECK(cudaMemsetAsync(loss_sum_.data(), 0, sizeof(double), stream));
  ST_CUDA_CHECK(cudaStreamSynchronize(stream));
  return sum;
}

template <typename T>
void CudaLmIo<T>::move_loss_sum(double* dst, cudaStream_t stream) {
  ST_CUDA_CHECK(cudaMemcpyAsync(dst, loss_sum_.data(), sizeof(double), cudaMemcpyDeviceToDevice, stream));
  ST_CUDA_CHECK(cudaMemsetAsync(loss_sum_.data(), 0, sizeof(double), stream));
}

template class CudaLmIo<float>;
template class CudaLmIo<bf16>;
template class CudaLmIo<fp16>;

}  // namespace st
