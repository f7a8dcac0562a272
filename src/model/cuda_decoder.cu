#include "shardtrain/model/cuda_decoder.h"

#include <algorithm>
#include <type_traits>

#include "shardtrain/core/error.h"
#include "shardtrain/core/format.h"
#include "shardtrain/kernels/gpu/argmax.h"
#include "shardtrain/kernels/gpu/decode_attention.h"
#include "shardtrain/kernels/gpu/reduce.h"
#include "shardtrain/model/cuda_decoder_base.h"
#include "shardtrain/model/cuda_family.h"
#include "shardtrain/model/sampling.h"

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
      kv_width_(int64_t{cfg.kv_heads()} * cfg.head_dim()),
      qkv_width_(cfg.qkv_dim()),
      layer_elems_(int64_t{cfg.seq_len} * kv_width_),
      k_(cfg.n_layer * layer_elems_),
      v_(cfg.n_layer * layer_elems_),
      logits_(cfg.padded_vocab()),
      tokens_(cfg.seq_len),
      positions_(cfg.seq_len),
      attention_scratch_(static_cast<int64_t>(
          gpu::decode_attention_at_scratch_bytes(gpu::kDecodeSplitMaxRows, cfg.n_head, cfg.head_dim(), cfg.seq_len))),
      step_host_(3),
      step_dev_(3) {
  for (const UnitLayout& u : units_) w_.emplace_back(u.numel);
}

template <typename T>
CudaDecoderBase<T>::~CudaDecoderBase() {
  if (step_graph_ != nullptr) cudaGraphExecDestroy(step_graph_);
}

template <typename T>
int32_t CudaDecoderBase<T>::forward_greedy(int32_t token, int64_t pos) {
  // step_dev_: [0] the token, [1] its position, [2] the greedy next token.
  int32_t* io = step_host_.data();
  io[0] = token;
  io[1] = static_cast<int32_t>(pos);
  const int32_t* dev = step_dev_.data();
  ST_CUDA_CHECK(cudaMemcpyAsync(step_dev_.data(), io, 2 * sizeof(int32_t), cudaMemcpyHostToDevice, ctx_.stream));
  auto step = [&] {
    run(dev, dev + 1, 1);
    gpu::argmax_rows<T>(logits_.data(), config().padded_vocab(), 1, config().vocab_size, step_dev_.data() + 2, ctx_);
  };
  if (step_graph_ != nullptr) {
    ST_CUDA_CHECK(cudaGraphLaunch(step_graph_, ctx_.stream));
  } else if (!step_warm_) {
    step();  // eagerly: cuBLASLt's algorithm choices and any lazy setup happen outside a capture
    step_warm_ = true;
  } else {
    cudaGraph_t graph = nullptr;
    ST_CUDA_CHECK(cudaStreamBeginCapture(ctx_.stream, cudaStreamCaptureModeThreadLocal));
    step();
    ST_CUDA_CHECK(cudaStreamEndCapture(ctx_.stream, &graph));
    const cudaError_t made = cudaGraphInstantiate(&step_graph_, graph, 0);
    cudaGraphDestroy(graph);
    ST_CUDA_CHECK(made);
    ST_CUDA_CHECK(cudaGraphLaunch(step_graph_, ctx_.stream));
  }
  ST_CUDA_CHECK(cudaMemcpyAsync(io + 2, dev + 2, sizeof(int32_t), cudaMemcpyDeviceToHost, ctx_.stream));
  stream_.synchronize();
  if (io[2] >= 0) return io[2];
  // A NaN or an infinity among the logits: sample_token says which, as the host path does.
  std::vector<float> logits;
  copy_logits(&logits);
  return sample_token(logits, SamplingOptions{0.0, 0, 0}, 0);
}

template <typename T>
void CudaDecoderBase<T>::attend(int layer, T* out, const T* qkv, const int32_t* positions, int64_t n) {
  const ModelConfig& cfg = config();
  const int H = cfg.n_head, KV = cfg.kv_heads(), D = cfg.head_dim();
  T* k = k_.data() + layer * layer_elems_;
  T* v = v_.data() + layer * layer_elems_;
  // One sequence: every row reads and writes the same cache (seq_stride 0).
  gpu::kv_append_at<T>(k, v, qkv, 0, positions, static_cast<int>(n), H, KV, D, ctx_);
  gpu::GpuContext c = ctx_;  // a step's split-K partials
  c.scratch = attention_scratch_.data();
  c.scratch_bytes = attention_scratch_.bytes();
  gpu::decode_attention_at<T>(out, qkv, qkv_width_, k, v, 0, positions, static_cast<int>(n), H, KV, D, cfg.seq_len, c);
}

template <typename T>
void CudaDecoderBase<T>::classify_on_device(const T* xn, const T* w) {
  const ModelConfig& cfg = config();
  gpu::matmul_forward<T>(logits_.data(), xn, w, nullptr, 1, cfg.n_embd, cfg.padded_vocab(), ctx_);
}

template <typename T>
void CudaDecoderBase<T>::copy_logits(std::vector<float>* logits) {
  std::vector<T> row(static_cast<size_t>(config().vocab_size));
  ST_CUDA_CHECK(
      cudaMemcpyAsync(row.data(), logits_.data(), sizeof(T) * row.size(), cudaMemcpyDeviceToHost, ctx_.stream));
  stream_.synchronize();
  logits->resize(row.size());
  for (size_t i = 0; i < row.size(); ++i) (*logits)[i] = static_cast<float>(row[i]);
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
void CudaDecoderBase<T>::forward(const int32_t* tokens, int64_t n, int64_t pos, std::vector<float>* logits) {
  run(upload_tokens(tokens, n), upload_positions(pos, n), n);
  copy_logits(logits);
}

template <typename T>
const int32_t* CudaDecoderBase<T>::upload_positions(int64_t pos, int64_t n) {
  ST_CHECK(n >= 1 && pos >= 0 && pos + n <= positions_.size(), "positions ", pos, " .. ", pos + n - 1,
           " outside the cache's ", positions_.size());
  std::vector<int32_t> host(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) host[static_cast<size_t>(i)] = static_cast<int32_t>(pos + i);
  // From pageable memory the copy has left the host array when the call returns.
  ST_CUDA_CHECK(cudaMemcpyAsync(positions_.data(), host.data(), sizeof(int32_t) * host.size(), cudaMemcpyHostToDevice,
                                ctx_.stream));
  return positions_.data();
}

template <typename T>
void CudaDecoderBase<T>::classify_row(const T* xn, const T* w, std::vector<float>* logits) {
  classify_on_device(xn, w);
  copy_logits(logits);
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
