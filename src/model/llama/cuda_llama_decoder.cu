#include "shardtrain/model/llama/cuda_llama_decoder.h"

#include "shardtrain/kernels/gpu/decode_attention.h"
#include "shardtrain/kernels/gpu/embedding.h"
#include "shardtrain/kernels/gpu/matmul.h"
#include "shardtrain/kernels/gpu/rmsnorm.h"
#include "shardtrain/kernels/gpu/rope.h"
#include "shardtrain/kernels/gpu/swiglu.h"
#include "shardtrain/kernels/rope.h"
#include "shardtrain/model/llama/block_view.h"

namespace st {

template <typename T>
CudaLlamaDecoder<T>::CudaLlamaDecoder(const ModelConfig& cfg, int device, int max_batch)
    : CudaDecoderBase<T>(cfg, device, max_batch) {
  const int64_t rows = this->max_rows(), C = cfg.n_embd, F = cfg.mlp_dim();
  const RopeTable rope = rope_table(cfg, cfg.seq_len);
  for (auto [dst, src] : {std::make_pair(&rope_cos_, &rope.cos), std::make_pair(&rope_sin_, &rope.sin)}) {
    *dst = DeviceBuffer<float>(static_cast<int64_t>(src->size()));
    // On the decoder's stream: a pageable cudaMemcpy may return before its DMA lands, on a stream ours do not wait for.
    ST_CUDA_CHECK(cudaMemcpyAsync(dst->data(), src->data(), dst->bytes(), cudaMemcpyHostToDevice, this->ctx_.stream));
  }
  this->stream_.synchronize();  // the tables' host arrays go with this constructor
  for (DeviceBuffer<T>* b : {&x_, &norm_, &att_}) *b = DeviceBuffer<T>(rows * C);
  qkv_ = DeviceBuffer<T>(rows * cfg.qkv_dim());
  gate_up_ = DeviceBuffer<T>(rows * 2 * F);
  mlp_ = DeviceBuffer<T>(rows * F);
  rstd_ = DeviceBuffer<float>(rows);
}

template <typename T>
void CudaLlamaDecoder<T>::run(const int32_t* tokens, const int32_t* positions, int64_t n, bool batch) {
  const ModelConfig& cfg = this->config();
  const gpu::GpuContext& ctx = this->ctx_;
  const std::vector<UnitLayout>& units = this->units_;
  const int C = cfg.n_embd, H = cfg.n_head, KV = cfg.kv_heads(), D = cfg.head_dim(), QKV = cfg.qkv_dim(),
            F = cfg.mlp_dim();
  const float eps = cfg.rms_norm_eps;
  const T* embed = this->unit(0) + units[0].tensor("embed_tokens").offset;
  gpu::embedding_forward<T>(x_.data(), tokens, embed, nullptr, 1, static_cast<int>(n), C, ctx);
  for (int l = 0; l < cfg.n_layer; ++l) {
    const LlamaBlockView<const T> p(this->unit(1 + l), units[static_cast<size_t>(1 + l)]);
    gpu::rmsnorm_forward<T>(norm_.data(), rstd_.data(), x_.data(), p.attn_norm, eps, n, C, ctx);
    gpu::matmul_forward<T>(qkv_.data(), norm_.data(), p.qkvw, p.qkvb, n, C, QKV, ctx);
    gpu::rope_forward_at<T>(qkv_.data(), rope_cos_.data(), rope_sin_.data(), positions, n, H, KV, D, ctx);
    this->attend(l, att_.data(), qkv_.data(), positions, n, batch);
    gpu::matmul_forward_residual<T>(x_.data(), att_.data(), p.ow, nullptr, x_.data(), n, C, C, ctx);
    gpu::rmsnorm_forward<T>(norm_.data(), rstd_.data(), x_.data(), p.mlp_norm, eps, n, C, ctx);
    gpu::matmul_forward<T>(gate_up_.data(), norm_.data(), p.gate_up, nullptr, n, C, 2 * F, ctx);
    gpu::swiglu_forward<T>(mlp_.data(), gate_up_.data(), n, F, ctx);
    gpu::matmul_forward_residual<T>(x_.data(), mlp_.data(), p.down, nullptr, x_.data(), n, F, C, ctx);
  }
  // The final RMSNorm and the classifier (embed_tokens when tied, else lm_head): every row of a batch, a prompt's last.
  const UnitLayout& hu = units.back();
  const T* head = this->unit(cfg.n_layer + 1);
  const int64_t first = batch ? 0 : n - 1, rows = batch ? n : 1;
  gpu::rmsnorm_forward<T>(norm_.data(), rstd_.data(), x_.data() + first * C, head + hu.tensor("norm.weight").offset,
                          eps, rows, C, ctx);
  this->classify_on_device(norm_.data(), cfg.tie_embeddings ? embed : head + hu.tensor("lm_head").offset, rows);
}

template class CudaLlamaDecoder<float>;
template class CudaLlamaDecoder<bf16>;
template class CudaLlamaDecoder<fp16>;

}  // namespace st
