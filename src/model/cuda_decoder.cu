#include "shardtrain/model/cuda_decoder.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <type_traits>

#include "shardtrain/core/error.h"
#include "shardtrain/core/format.h"
#include "shardtrain/kernels/adamw_host.h"
#include "shardtrain/kernels/gpu/argmax.h"
#include "shardtrain/kernels/gpu/decode_attention.h"
#include "shardtrain/kernels/gpu/sample.h"
#include "shardtrain/kernels/scratch_sizes.h"
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
CudaDecoderBase<T>::CudaDecoderBase(const ModelConfig& cfg, int device, int max_batch, const DecoderStage& stage)
    : Decoder(cfg, max_batch, stage),
      device_(use_device(device)),
      units_(build_units(cfg)),
      ctx_{stream_.get(), &blas_, nullptr, 0},
      x_(max_rows() * cfg.n_embd),
      device_name_(cuda_device_name()),
      kv_width_(int64_t{cfg.kv_heads()} * cfg.head_dim()),
      qkv_width_(cfg.qkv_dim()),
      seq_elems_(int64_t{cfg.seq_len} * kv_width_),
      layer_elems_(max_batch * seq_elems_),
      k_(layers().count() * layer_elems_),
      v_(layers().count() * layer_elems_),
      logits_(stage.last() ? max_batch * cfg.padded_vocab() : 0),
      rows_host_(stage.split() ? max_rows() * cfg.n_embd : 0),
      tokens_(max_rows()),
      positions_(max_rows()),
      scratch_(static_cast<int64_t>(
          gpu::decode_step_scratch_bytes(max_batch, cfg.n_head, cfg.head_dim(), cfg.seq_len, cfg.vocab_size))),
      step_host_(3 * max_batch),
      step_dev_(3 * max_batch),
      draws_host_(max_batch),
      draws_dev_(max_batch),
      arrivals_(int64_t{gpu::kDecodeSplitMaxRows} * cfg.n_head) {
  for (const UnitLayout& u : units_) w_.emplace_back(holds(u.index) ? u.numel : 0);
  ST_CUDA_CHECK(cudaMemsetAsync(arrivals_.data(), 0, arrivals_.bytes(), stream_.get()));
}

template <typename T>
CudaDecoderBase<T>::~CudaDecoderBase() {
  for (auto& [key, graph] : graphs_) cudaGraphExecDestroy(graph);
}

template <typename T>
void CudaDecoderBase<T>::forward_batch_next(const int32_t* tokens, const int32_t* positions, int n,
                                            const SamplingOptions& o, const uint64_t* draws, int32_t* next) {
  const int B = max_batch(), V = config().vocab_size;
  const bool greedy = o.temperature == 0 || o.top_k == 1;
  int32_t* io = step_host_.data();
  int32_t* dev = step_dev_.data();
  std::copy(tokens, tokens + n, io);
  std::copy(positions, positions + n, io + B);
  ST_CUDA_CHECK(cudaMemcpyAsync(dev, io, 2 * B * sizeof(int32_t), cudaMemcpyHostToDevice, ctx_.stream));
  if (!greedy) {
    std::copy(draws, draws + n, draws_host_.data());
    ST_CUDA_CHECK(cudaMemcpyAsync(draws_dev_.data(), draws_host_.data(), n * sizeof(uint64_t), cudaMemcpyHostToDevice,
                                  ctx_.stream));
  }
  auto step = [&] {
    run(dev, dev + B, n, true);
    if (!stage().last()) return;
    const gpu::GpuContext c = step_context();
    if (greedy) return gpu::argmax_rows<T>(logits_.data(), config().padded_vocab(), n, V, dev + 2 * B, c);
    gpu::sample_rows<T>(logits_.data(), config().padded_vocab(), n, V, draws_dev_.data(), o, dev + 2 * B, c);
  };
  if (stage().split()) {
    step();                       // eagerly: a stage's transfers are host calls
    if (!stage().last()) return;  // the last stage's ids: step_batch_next broadcasts them
  } else {
    run_step_graph(greedy ? StepKey{n, 0.0, 0, 0} : StepKey{n, o.temperature, o.top_k, o.seed}, step);
  }
  ST_CUDA_CHECK(cudaMemcpyAsync(io + 2 * B, dev + 2 * B, n * sizeof(int32_t), cudaMemcpyDeviceToHost, ctx_.stream));
  stream_.synchronize();
  std::copy(io + 2 * B, io + 2 * B + n, next);
  for (int r = 0; r < n; ++r) {
    if (positions[r] < 0 || next[r] >= 0) continue;
    // A NaN or an infinity among row r's logits: sample_token says which, as the host path does.
    std::vector<float> rows;
    copy_logits(&rows, n);
    sample_token(std::vector<float>(rows.begin() + r * V, rows.begin() + (r + 1) * V), o, draws[r]);
    ST_CHECK(false, "the device found a NaN or an infinity in row ", r, "'s logits, which the host does not see");
  }
}

template <typename T>
void CudaDecoderBase<T>::run_step_graph(const StepKey& key, const std::function<void()>& step) {
  const auto graph = graphs_.find(key);
  if (graph != graphs_.end()) {
    ST_CUDA_CHECK(cudaGraphLaunch(graph->second, ctx_.stream));
    return;
  }
  if (warm_.count(key) == 0) {
    step();  // eagerly: cuBLASLt's algorithm choices and any lazy setup happen outside a capture
    warm_.insert(key);
    return;
  }
  cudaGraph_t captured = nullptr;
  ST_CUDA_CHECK(cudaStreamBeginCapture(ctx_.stream, cudaStreamCaptureModeThreadLocal));
  step();
  ST_CUDA_CHECK(cudaStreamEndCapture(ctx_.stream, &captured));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, captured, 0);
  cudaGraphDestroy(captured);
  ST_CUDA_CHECK(made);
  graphs_[key] = exec;
  ST_CUDA_CHECK(cudaGraphLaunch(exec, ctx_.stream));
}

template <typename T>
void CudaDecoderBase<T>::forward_batch(const int32_t* tokens, const int32_t* positions, int n,
                                       std::vector<float>* logits) {
  const int32_t* dev_tokens = upload_tokens(tokens, n);
  ST_CUDA_CHECK(cudaMemcpyAsync(positions_.data(), positions, sizeof(int32_t) * static_cast<size_t>(n),
                                cudaMemcpyHostToDevice, ctx_.stream));
  run(dev_tokens, positions_.data(), n, true);
  if (stage().last()) copy_logits(logits, n);
}

template <typename T>
void CudaDecoderBase<T>::run(const int32_t* tokens, const int32_t* positions, int64_t n, bool batch) {
  const auto bytes = static_cast<int64_t>(sizeof(T)) * n * config().n_embd;
  if (stage().first()) {
    embed(tokens, positions, n);
  } else {
    // The pinned rows are free: the last use of them, a send or an upload, was synchronised since.
    receive_rows(rows_host_.data(), bytes);
    ST_CUDA_CHECK(
        cudaMemcpyAsync(x_.data(), rows_host_.data(), static_cast<size_t>(bytes), cudaMemcpyHostToDevice, ctx_.stream));
  }
  for (int l = layers().first; l < layers().end; ++l) block(l, positions, n, batch);
  if (stage().last()) return head(batch ? 0 : n - 1, batch ? n : 1);
  ST_CUDA_CHECK(
      cudaMemcpyAsync(rows_host_.data(), x_.data(), static_cast<size_t>(bytes), cudaMemcpyDeviceToHost, ctx_.stream));
  stream_.synchronize();
  send_rows(rows_host_.data(), bytes);
}

template <typename T>
gpu::GpuContext CudaDecoderBase<T>::step_context() const {
  gpu::GpuContext c = ctx_;
  c.scratch = scratch_.data();
  c.scratch_bytes = scratch_.bytes();
  return c;
}

template <typename T>
void CudaDecoderBase<T>::attend(int layer, T* out, T* qkv, const int32_t* positions, int64_t n, bool batch,
                                const float* rope_cos, const float* rope_sin) {
  const ModelConfig& cfg = config();
  const int H = cfg.n_head, KV = cfg.kv_heads(), D = cfg.head_dim();
  // batch: row r in sequence r's cache; otherwise every row in the current sequence's (seq_stride 0). The caches are
  // the stage's layers'.
  const int64_t at = (layer - layers().first) * layer_elems_ + (batch ? 0 : seq_ * seq_elems_);
  T* k = k_.data() + at;
  T* v = v_.data() + at;
  const int64_t seq_stride = batch ? seq_elems_ : 0;
  const gpu::GpuContext c = step_context();
  const int rows = static_cast<int>(n);
  if (rope_cos != nullptr)
    return gpu::rope_append_attend_at<T>(out, qkv, k, v, rope_cos, rope_sin, seq_stride, positions, rows, H, KV, D,
                                         cfg.seq_len, c, arrivals_.data());
  gpu::kv_append_at<T>(k, v, qkv, seq_stride, positions, rows, H, KV, D, ctx_);
  gpu::decode_attention_at<T>(out, qkv, qkv_width_, k, v, seq_stride, positions, rows, H, KV, D, cfg.seq_len, c,
                              arrivals_.data());
}

template <typename T>
void CudaDecoderBase<T>::classify_on_device(const T* xn, const T* w, int64_t rows) {
  const ModelConfig& cfg = config();
  gpu::matmul_forward<T>(logits_.data(), xn, w, nullptr, rows, cfg.n_embd, cfg.padded_vocab(), ctx_);
}

template <typename T>
void CudaDecoderBase<T>::rmsnorm_classify_on_device(const T* x, const T* norm_weight, float eps, const T* w,
                                                    int64_t rows, T* norm, float* rstd) {
  const ModelConfig& cfg = config();
  gpu::rmsnorm_matmul_forward<T>(logits_.data(), norm, rstd, x, norm_weight, eps, w, nullptr, rows, cfg.n_embd,
                                 cfg.padded_vocab(), ctx_);
}

template <typename T>
void CudaDecoderBase<T>::copy_logits(std::vector<float>* logits, int64_t rows) {
  const auto V = static_cast<size_t>(config().vocab_size), Vp = static_cast<size_t>(config().padded_vocab());
  // The rows' real vocabularies, one 2D copy leaving the padding behind.
  std::vector<T> row(static_cast<size_t>(rows) * V);
  ST_CUDA_CHECK(cudaMemcpy2DAsync(row.data(), sizeof(T) * V, logits_.data(), sizeof(T) * Vp, sizeof(T) * V,
                                  static_cast<size_t>(rows), cudaMemcpyDeviceToHost, ctx_.stream));
  stream_.synchronize();
  logits->resize(row.size());
  for (size_t i = 0; i < row.size(); ++i) (*logits)[i] = static_cast<float>(row[i]);
}

template <typename T>
void CudaDecoderBase<T>::upload_in_chunks(int u,
                                          const std::function<void(int64_t at, int64_t n, uint16_t* chunk)>& fill) {
  // Two pinned chunks in turn, each uploaded while the next is filled: the device holds no copy but the unit's own.
  DeviceBuffer<T>& w = w_[static_cast<size_t>(u)];
  if (upload_.size() == 0) upload_ = PinnedBuffer<T>(2 * kUploadChunk);
  for (int64_t at = 0, i = 0; at < w.size(); at += kUploadChunk, ++i) {
    const int64_t n = std::min(kUploadChunk, w.size() - at);
    T* chunk = upload_.data() + (i % 2) * kUploadChunk;
    CudaEvent& uploaded = chunk_uploaded_[i % 2];
    if (i >= 2) uploaded.synchronize();  // the chunk's last upload has left it
    fill(at, n, reinterpret_cast<uint16_t*>(chunk));
    ST_CUDA_CHECK(
        cudaMemcpyAsync(w.data() + at, chunk, sizeof(T) * static_cast<size_t>(n), cudaMemcpyHostToDevice, ctx_.stream));
    uploaded.record(ctx_.stream);
  }
  stream_.synchronize();                                  // the chunks are the next unit's, the values the caller's
  if (units_to_load() == 1) upload_ = PinnedBuffer<T>();  // this was the last (the load counts it on return)
}

template <typename T>
void CudaDecoderBase<T>::store_unit(int u, std::vector<float>& values) {
  if constexpr (std::is_same_v<T, float>) {
    DeviceBuffer<T>& w = w_[static_cast<size_t>(u)];
    ST_CUDA_CHECK(
        cudaMemcpyAsync(w.data(), values.data(), sizeof(float) * values.size(), cudaMemcpyHostToDevice, ctx_.stream));
    stream_.synchronize();  // `values` is the caller's again
  } else {
    // Rounded to T on the host (round_to_half: CUDA's rounding, bit for bit): half the bytes of fp32 cross the bus.
    upload_in_chunks(
        u, [&](int64_t at, int64_t n, uint16_t* chunk) { round_to_half(values.data() + at, n, half_kind(), chunk); });
  }
}

template <typename T>
void CudaDecoderBase<T>::store_unit_half(int u, const std::vector<uint16_t>& values, HalfKind kind) {
  if (kind != half_kind()) {
    Decoder::store_unit_half(u, values, kind);  // widened, then rounded to T by store_unit
    return;
  }
  upload_in_chunks(u, [&](int64_t at, int64_t n, uint16_t* chunk) {
    constexpr int64_t kPiece = int64_t{1} << 18;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < n; p += kPiece)
      std::memcpy(chunk + p, values.data() + at + p, sizeof(uint16_t) * static_cast<size_t>(std::min(kPiece, n - p)));
  });
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
  run(upload_tokens(tokens, n), upload_positions(pos, n), n, false);
  if (stage().last()) copy_logits(logits);
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

template class CudaDecoderBase<float>;
template class CudaDecoderBase<bf16>;
template class CudaDecoderBase<fp16>;

int64_t cuda_device_free_bytes(int device) {
  use_device(device);
  size_t free_b = 0, total_b = 0;
  ST_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return static_cast<int64_t>(free_b);
}

std::string cuda_device_name_of(int device) {
  use_device(device);
  return cuda_device_name();
}

std::unique_ptr<Decoder> make_cuda_decoder(const ModelConfig& model, DType dtype, int device, int max_batch,
                                           const DecoderStage& stage) {
  switch (dtype) {
    case DType::kF32:
      return cuda_model_family<float>(model.arch).make_decoder(model, device, max_batch, stage);
    case DType::kBF16:
      return cuda_model_family<bf16>(model.arch).make_decoder(model, device, max_batch, stage);
    case DType::kF16:
      return cuda_model_family<fp16>(model.arch).make_decoder(model, device, max_batch, stage);
    case DType::kAuto:
      break;
  }
  ST_CHECK(false, "a decoder's compute type must be resolved (compute_dtype()), got auto");
  return nullptr;
}

}  // namespace st
