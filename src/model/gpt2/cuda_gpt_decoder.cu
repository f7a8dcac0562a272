#include "shardtrain/model/gpt2/cuda_gpt_decoder.h"

#include "shardtrain/kernels/gpu/decode_attention.h"
#include "shardtrain/kernels/gpu/embedding.h"
#include "shardtrain/kernels/gpu/layernorm.h"
#include "shardtrain/kernels/gpu/matmul.h"
#include "shardtrain/model/gpt2/block_view.h"

namespace st {

template <typename T>
CudaGptDecoder<T>::CudaGptDecoder(const ModelConfig& cfg, int device, int max_batch, const DecoderStage& stage)
    : CudaDecoderBase<T>(cfg, device, max_batch, stage) {
  const int64_t rows = this->max_rows(), C = cfg.n_embd;
  for (DeviceBuffer<T>* b : {&norm_, &att_}) *b = DeviceBuffer<T>(rows * C);
  qkv_ = DeviceBuffer<T>(rows * 3 * C);
  fch_ = DeviceBuffer<T>(rows * 4 * C);
  fch_gelu_ = DeviceBuffer<T>(rows * 4 * C);
  mean_ = DeviceBuffer<float>(rows);
  rstd_ = DeviceBuffer<float>(rows);
}

template <typename T>
void CudaGptDecoder<T>::embed(const int32_t* tokens, const int32_t* positions, int64_t n) {
  const UnitLayout& eu = this->units_[0];
  gpu::embedding_forward_at<T>(this->x_.data(), tokens, this->unit(0) + eu.tensors[0].offset,
                               this->unit(0) + eu.tensors[1].offset, positions, static_cast<int>(n),
                               this->config().n_embd, this->ctx_);
}

template <typename T>
void CudaGptDecoder<T>::block(int layer, const int32_t* positions, int64_t n, bool batch) {
  const gpu::GpuContext& ctx = this->ctx_;
  const int C = this->config().n_embd;
  T* x = this->x_.data();
  const BlockView<const T> p(this->unit(1 + layer), this->units_[static_cast<size_t>(1 + layer)]);
  gpu::layernorm_forward<T>(norm_.data(), mean_.data(), rstd_.data(), x, p.ln1w, p.ln1b, n, C, ctx);
  gpu::matmul_forward<T>(qkv_.data(), norm_.data(), p.qkvw, p.qkvb, n, C, 3 * C, ctx);
  this->attend(layer, att_.data(), qkv_.data(), positions, n, batch);
  gpu::matmul_forward_residual<T>(x, att_.data(), p.projw, p.projb, x, n, C, C, ctx);
  gpu::layernorm_forward<T>(norm_.data(), mean_.data(), rstd_.data(), x, p.ln2w, p.ln2b, n, C, ctx);
  gpu::matmul_forward_gelu<T>(fch_gelu_.data(), fch_.data(), norm_.data(), p.fcw, p.fcb, n, C, 4 * C, ctx);
  gpu::matmul_forward_residual<T>(x, fch_gelu_.data(), p.fcprojw, p.fcprojb, x, n, 4 * C, C, ctx);
}

template <typename T>
void CudaGptDecoder<T>::head(int64_t first, int64_t rows) {
  // The final LayerNorm and the classifier (wte, tied).
  const ModelConfig& cfg = this->config();
  const int C = cfg.n_embd;
  const UnitLayout& hu = this->units_.back();
  const T* h = this->unit(cfg.n_layer + 1);
  gpu::layernorm_forward<T>(norm_.data(), mean_.data(), rstd_.data(), this->x_.data() + first * C,
                            h + hu.tensors[0].offset, h + hu.tensors[1].offset, rows, C, this->ctx_);
  this->classify_on_device(norm_.data(), this->unit(0) + this->units_[0].tensors[0].offset, rows);
}

template class CudaGptDecoder<float>;
template class CudaGptDecoder<bf16>;
template class CudaGptDecoder<fp16>;

}  // namespace st
