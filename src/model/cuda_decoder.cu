#include "shardtrain/model/cuda_decoder.h"

#include <algorithm>
#include <type_traits>

#include "shardtrain/core/error.h"
#include "shardtrain/core/format.h"
#include "shardtrain/kernels/gpu/reduce.h"
#include "shardtrain/model/cuda_decoder_base.h"
#include "shardtrain/model/cuda_family.h"

namespace st {
namespace {

// Makes `device` current and returns it.
int use_device(int device) {
  const int devices = cuda_device_count();
  if (devices == 0) ST_BAD_INPUT("train.device = cuda, but no CUDA device is visible");
  if (device < 0 || device >= devices)
    ST_BAD_INPUT("train.device = cuda: CUDA device ", device, " is not visible (", devices, " device(s) are)");
  ST_CUDA_CHECK(cudaSetDevice(device));
  return device;
}

}  // namespace

template <typename T>
CudaDecoderBase<T>::CudaDecoderBase(const ModelConfig& cfg, int device)
    : Decoder(cfg),
      device_(use_device(device)),
      units_(build_units(cfg)),
      ctx_{stream_.get(), &blas_, nullptr, 0},
      device_name_(cuda_device_name()),
      q_width_(int64_t{cfg.n_head} * cfg.head_dim()),
      kv_width_(int64_t{cfg.kv_heads()} * cfg.head_dim()),
      qkv_width_(cfg.qkv_dim()),
      layer_elems_(int64_t{cfg.seq_len} * kv_width_),
      k_(cfg.n_layer * layer_elems_),
      v_(cfg.n_layer * layer_elems_),
      logits_(cfg.padded_vocab()),
      tokens_(cfg.seq_len) {
  for (const UnitLayout& u : units_) w_.emplace_back(u.numel);
}

template <typename T>
void CudaDecoderBase<T>::store_unit(int u, std::vector<float>& values) {
  // fp32 up through a staging buffer (the largest unit's, made by the first load), rounded to T on the device.
  if constexpr (!std::is_same_v<T, float>) {
    if (staging_.size() == 0) {
      int64_t largest = 0;
      for (const UnitLayout& unit : units_) largest = std::max(largest, unit.numel);
      staging_ = DeviceBuffer<float>(largest);
    }
  }
  DeviceBuffer<T>& w = w_[static_cast<size_t>(u)];
  float* dst = std::is_same_v<T, float> ? reinterpret_cast<float*>(w.data()) : staging_.data();
  ST_CUDA_CHECK(
      cudaMemcpyAsync(dst, values.data(), sizeof(float) * values.size(), cudaMemcpyHostToDevice, ctx_.stream));
  if constexpr (!std::is_same_v<T, float>) gpu::convert<T>(w.data(), staging_.data(), w.size(), ctx_);
  // The staging buffer is the next unit's, and `values` the caller's again.
  stream_.synchronize();
  if (++stored_ == static_cast<int>(w_.size())) staging_ = DeviceBuffer<float>();  // the last unit
}

template <typename T>
std::string CudaDecoderBase<T>::describe() const {
  const char* dtype = std::is_same_v<T, float> ? "fp32" : std::is_same_v<T, bf16> ? "bf16" : "fp16";
  return str_cat("cuda/", dtype, " on ", device_name_);
}

template <typename T>
const int32_t* CudaDecoderBase<T>::upload_tokens(const int32_t* tokens, int64_t n) {
  ST_CHECK(n >= 1 && n <= tokens_.size(), n, " tokens for room of ", tokens_.size());
  // From pageable memory the copy has left the host array when the call returns.
  ST_CUDA_CHECK(cudaMemcpyAsync(tokens_.data(), tokens, sizeof(int32_t) * static_cast<size_t>(n),
                                cudaMemcpyHostToDevice, ctx_.stream));
  return tokens_.data();
}

template <typename T>
void CudaDecoderBase<T>::append_kv(int layer, const T* qkv, int64_t n, int64_t pos) {
  ST_CHECK(pos >= 0 && n >= 1 && pos + n <= config().seq_len, "positions ", pos, " .. ", pos + n - 1,
           " outside the cache's ", config().seq_len);
  const size_t row = sizeof(T) * static_cast<size_t>(kv_width_);
  const size_t src_pitch = sizeof(T) * static_cast<size_t>(qkv_width_);
  const size_t rows = static_cast<size_t>(n);
  ST_CUDA_CHECK(cudaMemcpy2DAsync(k_.data() + layer * layer_elems_ + pos * kv_width_, row, qkv + q_width_, src_pitch,
                                  row, rows, cudaMemcpyDeviceToDevice, ctx_.stream));
  ST_CUDA_CHECK(cudaMemcpy2DAsync(v_.data() + layer * layer_elems_ + pos * kv_width_, row, qkv + q_width_ + kv_width_,
                                  src_pitch, row, rows, cudaMemcpyDeviceToDevice, ctx_.stream));
}

template <typename T>
void CudaDecoderBase<T>::classify_row(const T* xn, const T* w, std::vector<float>* logits) {
  const ModelConfig& cfg = config();
  gpu::matmul_forward<T>(logits_.data(), xn, w, nullptr, 1, cfg.n_embd, cfg.padded_vocab(), ctx_);
  std::vector<T> row(static_cast<size_t>(cfg.vocab_size));
  ST_CUDA_CHECK(
      cudaMemcpyAsync(row.data(), logits_.data(), sizeof(T) * row.size(), cudaMemcpyDeviceToHost, ctx_.stream));
  stream_.synchronize();
  logits->resize(row.size());
  for (size_t i = 0; i < row.size(); ++i) (*logits)[i] = static_cast<float>(row[i]);
}

template class CudaDecoderBase<float>;
template class CudaDecoderBase<bf16>;
template class CudaDecoderBase<fp16>;

std::unique_ptr<Decoder> make_cuda_decoder(const ModelConfig& model, DType dtype, int device) {
  switch (dtype) {
    case DType::kF32:
      return cuda_model_family<float>(model.arch).make_decoder(model, device);
    case DType::kBF16:
      return cuda_model_family<bf16>(model.arch).make_decoder(model, device);
    case DType::kF16:
      return cuda_model_family<fp16>(model.arch).make_decoder(model, device);
    case DType::kAuto:
      break;
  }
  ST_CHECK(false, "a decoder's compute type must be resolved (compute_dtype()), got auto");
  return nullptr;
}

}  // namespace st
