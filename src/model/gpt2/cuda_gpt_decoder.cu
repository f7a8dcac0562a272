#include "shardtrain/model/gpt2/cuda_gpt_decoder.h"

#include "shardtrain/kernels/gpu/decode_attention.h"
#include "shardtrain/kernels/gpu/embedding.h"
#include "shardtrain/kernels/gpu/layernorm.h"
#include "shardtrain/kernels/gpu/matmul.h"
#include "shardtrain/model/gpt2/block_view.h"

namespace st {

template <typename T>
CudaGptDecoder<T>::CudaGptDecoder(const ModelConfig& cfg, int device, int max_batch)
    : CudaDecoderBase<T>(cfg, device, max_batch) {
  const int64_t rows = this->max_rows(), C = cfg.n_embd;
  for (DeviceBuffer<T>* b : {&x_, &norm_, &att_}) *b = DeviceBuffer<T>(rows * C);
  qkv_ = DeviceBuffer<T>(rows * 3 * C);
  fch_ = DeviceBuffer<T>(rows * 4 * C);
  fch_gelu_ = DeviceBuffer<T>(rows * 4 * C);
  mean_ = DeviceBuffer<float>(rows);
  rstd_ = DeviceBuffer<float>(rows);
}

template <typename T>
void CudaGptDecoder<T>::run(const int32_t* tokens, const int32_t* positions, int64_t n, bool batch) {
  const ModelConfig& cfg = this->config();
  const gpu::GpuContext& ctx = this->ctx_;
  const std::vector<UnitLayout>& units = this->units_;
  const int C = cfg.n_embd;
  const T* wte = this->unit(0) + units[0].tensors[0].offset;
  const T* wpe = this->unit(0) + units[0].tensors[1].offset;
  gpu::embedding_forward_at<T>(x_.data(), tokens, wte, wpe, positions, static_cast<int>(n), C, ctx);
  for (int l = 0; l < cfg.n_layer; ++l) {
    const BlockView<const T> p(this->unit(1 + l), units[static_cast<size_t>(1 + l)]);
    gpu::layernorm_forward<T>(norm_.data(), mean_.data(), rstd_.data(), x_.data(), p.ln1w, p.ln1b, n, C, ctx);
    gpu::matmul_forward<T>(qkv_.data(), norm_.data(), p.qkvw, p.qkvb, n, C, 3 * C, ctx);
    this->attend(l, att_.data(), qkv_.data(), positions, n, batch);
    gpu::matmul_forward_residual<T>(x_.data(), att_.data(), p.projw, p.projb, x_.data(), n, C, C, ctx);
    gpu::layernorm_forward<T>(norm_.data(), mean_.data(), rstd_.data(), x_.data(), p.ln2w, p.ln2b, n, C, ctx);
    gpu::matmul_forward_gelu<T>(fch_gelu_.data(), fch_.data(), norm_.data(), p.fcw, p.fcb, n, C, 4 * C, ctx);
    gpu::matmul_forward_residual<T>(x_.data(), fch_gelu_.data(), p.fcprojw, p.fcprojb, x_.data(), n, 4 * C, C, ctx);
  }
  // The final LayerNorm and the classifier (wte, tied): every row of a batch, a prompt's last.
  const UnitLayout& hu = units.back();
  const T* head = this->unit(cfg.n_layer + 1);
  const int64_t first = batch ? 0 : n - 1, rows = batch ? n : 1;
  gpu::layernorm_forward<T>(norm_.data(), mean_.data(), rstd_.data(), x_.data() + first * C,
                            head + hu.tensors[0].offset, head + hu.tensors[1].offset, rows, C, ctx);
  this->classify_on_device(norm_.data(), wte, rows);
}

template class CudaGptDecoder<float>;
template class CudaGptDecoder<bf16>;
template class CudaGptDecoder<fp16>;

}  // namespace st
