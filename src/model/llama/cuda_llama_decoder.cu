#include "shardtrain/model/llama/cuda_llama_decoder.h"

#include "shardtrain/kernels/gpu/decode_attention.h"
#include "shardtrain/kernels/gpu/embedding.h"
#include "shardtrain/kernels/gpu/matmul.h"
#include "shardtrain/kernels/rope.h"
#include "shardtrain/model/llama/block_view.h"

namespace st {

template <typename T>
CudaLlamaDecoder<T>::CudaLlamaDecoder(const ModelConfig& cfg, int device, int max_batch, const DecoderStage& stage)
    : CudaDecoderBase<T>(cfg, device, max_batch, stage) {
  const int64_t rows = this->max_rows(), C = cfg.n_embd, F = cfg.mlp_dim();
  const RopeTable rope = rope_table(cfg, cfg.seq_len);
  for (auto [dst, src] : {std::make_pair(&rope_cos_, &rope.cos), std::make_pair(&rope_sin_, &rope.sin)}) {
    *dst = DeviceBuffer<float>(static_cast<int64_t>(src->size()));
    // On the decoder's stream: a pageable cudaMemcpy may return before its DMA lands, on a stream ours do not wait for.
    ST_CUDA_CHECK(cudaMemcpyAsync(dst->data(), src->data(), dst->bytes(), cudaMemcpyHostToDevice, this->ctx_.stream));
  }
  this->stream_.synchronize();  // the tables' host arrays go with this constructor
  for (DeviceBuffer<T>* b : {&norm_, &att_}) *b = DeviceBuffer<T>(rows * C);
  qkv_ = DeviceBuffer<T>(rows * cfg.qkv_dim());
  gate_up_ = DeviceBuffer<T>(rows * 2 * F);
  mlp_ = DeviceBuffer<T>(rows * F);
  rstd_ = DeviceBuffer<float>(rows);
}

template <typename T>
void CudaLlamaDecoder<T>::embed(const int32_t* tokens, const int32_t* positions, int64_t n) {
  gpu::embedding_forward<T>(this->x_.data(), tokens, this->unit(0) + this->units_[0].tensor("embed_tokens").offset,
                            nullptr, 1, static_cast<int>(n), this->config().n_embd, this->ctx_);
}

template <typename T>
void CudaLlamaDecoder<T>::block(int layer, const int32_t* positions, int64_t n, bool batch) {
  const ModelConfig& cfg = this->config();
  const gpu::GpuContext& ctx = this->ctx_;
  const int C = cfg.n_embd, QKV = cfg.qkv_dim(), F = cfg.mlp_dim();
  const float eps = cfg.rms_norm_eps;
  T* x = this->x_.data();
  const LlamaBlockView<const T> p(this->unit(1 + layer), this->units_[static_cast<size_t>(1 + layer)]);
  gpu::rmsnorm_matmul_forward<T>(qkv_.data(), norm_.data(), rstd_.data(), x, p.attn_norm, eps, p.qkvw, p.qkvb, n, C,
                                 QKV, ctx);
  this->attend(layer, att_.data(), qkv_.data(), positions, n, batch, rope_cos_.data(), rope_sin_.data());
  gpu::matmul_forward_residual<T>(x, att_.data(), p.ow, nullptr, x, n, C, C, ctx);
  gpu::rmsnorm_matmul_forward<T>(gate_up_.data(), norm_.data(), rstd_.data(), x, p.mlp_norm, eps, p.gate_up, nullptr, n,
                                 C, 2 * F, ctx);
  gpu::swiglu_matmul_forward_residual<T>(x, mlp_.data(), gate_up_.data(), p.down, nullptr, x, n, F, C, ctx);
}

template <typename T>
void CudaLlamaDecoder<T>::head(int64_t first, int64_t rows) {
  // The final RMSNorm and the classifier (embed_tokens when tied, else lm_head).
  const ModelConfig& cfg = this->config();
  const int C = cfg.n_embd;
  const UnitLayout& hu = this->units_.back();
  const T* h = this->unit(cfg.n_layer + 1);
  const T* classifier = cfg.tie_embeddings ? this->unit(0) + this->units_[0].tensor("embed_tokens").offset
                                           : h + hu.tensor("lm_head").offset;
  this->rmsnorm_classify_on_device(this->x_.data() + first * C, h + hu.tensor("norm.weight").offset, cfg.rms_norm_eps,
                                   classifier, rows, norm_.data(), rstd_.data());
}

template class CudaLlamaDecoder<float>;
template class CudaLlamaDecoder<bf16>;
template class CudaLlamaDecoder<fp16>;

}  // namespace st
