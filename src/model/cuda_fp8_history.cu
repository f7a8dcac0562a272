#include "shardtrain/model/cuda_fp8_history.h"

#include <algorithm>
#include <cstring>

#include "shardtrain/core/error.h"
#include "shardtrain/kernels/gpu/fp8_history.h"

namespace st {
namespace {

void zero(DeviceBuffer<unsigned>& b, cudaStream_t stream) {
  if (b.size() > 0) ST_CUDA_CHECK(cudaMemsetAsync(b.data(), 0, b.bytes(), stream));
}

}  // namespace

CudaFp8History::CudaFp8History(int64_t sites, int length)
    : sites_(sites),
      length_(length),
      ring_(sites * kFp8Operands * length),
      step_(sites * kFp8Operands),
      history_max_(sites * kFp8Operands),
      applied_(sites * kFp8Operands) {
  ST_CHECK(sites >= 0 && length >= 1 && length <= 1024, "CudaFp8History: ", sites, " sites, length ", length,
           " (expected sites >= 0 and length in [1, 1024])");
  for (DeviceBuffer<unsigned>* b : {&ring_, &step_, &history_max_, &applied_})
    if (b->size() > 0) ST_CUDA_CHECK(cudaMemset(b->data(), 0, b->bytes()));
  ST_CUDA_CHECK(cudaDeviceSynchronize());  // zeroed before any stream of the caller's reads them
}

const unsigned* CudaFp8History::pick(int64_t index, const unsigned* own, const gpu::GpuContext& ctx) {
  ST_CHECK(index >= 0 && index < entry_size(), "CudaFp8History: operand ", index, " outside ", entry_size());
  gpu::fp8_delayed_maxima(own, step_.data() + index, history_max_.data() + index, applied_.data() + index, 1,
                          recording_, ctx);
  return applied_.data() + index;
}

void CudaFp8History::push(const unsigned* entry, const gpu::GpuContext& ctx) {
  newest_ = (newest_ + 1) % length_;
  filled_ = std::min(filled_ + 1, length_);
  gpu::fp8_history_push(entry, entry_size(), ring_.data(), length_, newest_, filled_, history_max_.data(), step_.data(),
                        ctx);
}

void CudaFp8History::drop(const gpu::GpuContext& ctx) { zero(step_, ctx.stream); }

std::vector<std::vector<float>> CudaFp8History::entries(const gpu::GpuContext& ctx) const {
  ST_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
  const auto n = static_cast<size_t>(entry_size());
  std::vector<unsigned> ring(static_cast<size_t>(ring_.size()));
  if (!ring.empty()) ST_CUDA_CHECK(cudaMemcpy(ring.data(), ring_.data(), ring_.bytes(), cudaMemcpyDeviceToHost));
  std::vector<std::vector<float>> out;
  for (int i = 0; i < filled_; ++i) {
    out.emplace_back(n);
    std::memcpy(out.back().data(), ring.data() + static_cast<size_t>((newest_ - i + length_) % length_) * n,
                n * sizeof(float));
  }
  return out;
}

void CudaFp8History::load(const std::vector<std::vector<float>>& entries, const gpu::GpuContext& ctx) {
  for (size_t i = 0; i < entries.size(); ++i)
    ST_CHECK(static_cast<int64_t>(entries[i].size()) == entry_size(), "CudaFp8History: entry ", i, " holds ",
             entries[i].size(), " maxima, expected ", entry_size());
  for (DeviceBuffer<unsigned>* b : {&ring_, &step_, &history_max_}) zero(*b, ctx.stream);
  filled_ = 0;
  newest_ = -1;
  // The newest length() entries, oldest first, each pushed as a step's would be.
  const int keep = static_cast<int>(std::min<size_t>(entries.size(), static_cast<size_t>(length_)));
  DeviceBuffer<unsigned> staged(entry_size());
  for (int i = keep - 1; i >= 0; --i) {
    ST_CUDA_CHECK(cudaMemcpyAsync(staged.data(), entries[static_cast<size_t>(i)].data(), staged.bytes(),
                                  cudaMemcpyHostToDevice, ctx.stream));
    push(staged.data(), ctx);
  }
  ST_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));  // the host entries and the staging buffer outlive the copies
}

}  // namespace st
