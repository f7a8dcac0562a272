#include "shardtrain/model/gpt2/cuda_gpt_model.h"

#include <algorithm>

#include "shardtrain/core/cuda.h"
#include "shardtrain/core/error.h"
#include "shardtrain/kernels/gpu/cudnn_attention.h"
#include "shardtrain/kernels/gpu/embedding.h"
#include "shardtrain/kernels/gpu/flash_attention.h"
#include "shardtrain/kernels/gpu/gelu.h"
#include "shardtrain/kernels/gpu/layernorm.h"
#include "shardtrain/kernels/gpu/matmul.h"
#include "shardtrain/kernels/gpu/reduce.h"
#include "shardtrain/model/cuda_linear.h"
#include "shardtrain/model/gpt2/block_view.h"

namespace st {
template <typename T>
CudaGpt<T>::CudaGpt(const ModelConfig& cfg, int64_t max_batch, Recompute recompute, bool cudnn_attention,
                    const gpu::GpuContext& ctx, gpu::CudnnBackwardMode attention_backward, const Fp8Policy& fp8)
    : CudaModelBase<T>(cfg, max_batch, recompute, cudnn_attention, ctx, attention_backward,
                       cuda_gpt_footprint(cfg, max_batch, recompute, sizeof(T), 0, fp8).scratch_bytes, fp8) {
  // Exactly the buffers cuda_gpt_footprint counts (GptActivationSizes); the base allocates the layer outputs, the
  // embedding output, CudaLmIo's and the adapters'.
  const GptActivationSizes z(cfg, max_batch, recompute, fp8);
  const int64_t BT = z.BT, C = z.C;
  blocks_.resize(static_cast<size_t>(z.blocks));
  for (BlockActs& a : blocks_) {
    this->allocate_input(z.coded_qkv, BT * C, &a.ln1, &a.ln1_t);
    a.qkv = DeviceBuffer<T>(BT * 3 * C);
    a.atty = DeviceBuffer<T>(BT * C);
    a.res2 = DeviceBuffer<T>(BT * C);
    this->allocate_input(z.coded_fc, BT * C, &a.ln2, &a.ln2_t);
    a.fch = DeviceBuffer<T>(BT * 4 * C);
    this->allocate_input(z.coded_proj, BT * 4 * C, &a.fch_gelu, &a.fch_gelu_t);
    a.ln1_mean = DeviceBuffer<float>(BT);
    a.ln1_rstd = DeviceBuffer<float>(BT);
    a.ln2_mean = DeviceBuffer<float>(BT);
    a.ln2_rstd = DeviceBuffer<float>(BT);
    a.att_lse = DeviceBuffer<float>(z.B * z.NH * z.T);
  }
  column_sums_ = gpu::ColumnSums(static_cast<size_t>(gpt_block_column_sums_bytes(BT, static_cast<int>(C))));
  lnf_ = DeviceBuffer<T>(BT * C);
  dresid_ = DeviceBuffer<T>(BT * C);
  dlnf_ = DeviceBuffer<T>(BT * C);
  dbuf_c_ = DeviceBuffer<T>(BT * C);
  dqkv_ = DeviceBuffer<T>(BT * 3 * C);
  dfch_ = DeviceBuffer<T>(BT * 4 * C);
  lnf_mean_ = DeviceBuffer<float>(BT);
  lnf_rstd_ = DeviceBuffer<float>(BT);
}

template <typename T>
void CudaGpt<T>::embedding_forward(const T* emb_params, const int32_t* tokens, int64_t B, int64_t t) {
  const int32_t* dev_tokens = this->start_batch(tokens, B, t);
  const UnitLayout& u = units_[0];
  OpTimer::Laps lap = timer_.laps(ctx_.stream);
  lap("fwd.embedding");
  gpu::embedding_forward<T>(encoded_.data(), dev_tokens, emb_params + u.tensors[0].offset,
                            emb_params + u.tensors[1].offset, static_cast<int>(B), static_cast<int>(t), cfg_.n_embd,
                            ctx_);
}

template <typename T>
void CudaGpt<T>::block_forward(int layer, const T* block_params) {
  const BlockView<const T> p(block_params, units_[static_cast<size_t>(1 + layer)]);
  BlockActs& a = acts(layer);
  const int64_t slot = static_cast<int64_t>(this->acts_index(layer));
  T* out = block_out_[static_cast<size_t>(layer)].data();
  const int64_t N = B_ * T_;
  const int C = cfg_.n_embd;
  const T* x = block_input(layer);
  // The linear layers' inputs: where the block keeps their codes, written into backward buffers idle till then.
  T* const ln1 = input(a.ln1, dbuf_c_);
  T* const ln2 = input(a.ln2, dbuf_c_);
  T* const fch_gelu = input(a.fch_gelu, dfch_);
  OpTimer::Laps lap = timer_.laps(ctx_.stream);
  // The LayerNorms and the GELU write the inputs of the linear layers after them with their maxima (input_maxima).
  lap("fwd.layernorm");
  gpu::layernorm_forward<T>(ln1, a.ln1_mean.data(), a.ln1_rstd.data(), x, p.ln1w, p.ln1b, N, C, ctx_,
                            linear_.input_maxima({layer, "attn.qkv.weight"}, LinearInput::kX, ctx_));
  lora_.forward(layer, "attn.qkv.weight", block_params, a.qkv.data(), 3 * C, ln1, N, lap, ctx_, [&](bool onto) {
    lap("fwd.matmul");
    this->base_forward(a.qkv.data(), ln1, p.qkvw, p.qkvb, N, C, 3 * C, onto, &lap, {layer, "attn.qkv.weight"},
                       codes_to_keep(layer, a.ln1_t));
  });
  lap("fwd.attention");
  if (cudnn_shape())
    gpu::cudnn_attention_forward<T>(a.atty.data(), a.att_lse.data(), a.qkv.data(), static_cast<int>(B_),
                                    static_cast<int>(T_), C, cfg_.n_head, ctx_);
  else
    gpu::flash_attention_forward<T>(a.atty.data(), a.att_lse.data(), a.qkv.data(), static_cast<int>(B_),
                                    static_cast<int>(T_), C, cfg_.n_head, ctx_);
  lap("fwd.matmul_residual");
  linear_.forward(a.res2.data(), a.atty.data(), p.projw, p.projb, x, N, C, C, ctx_, &lap, {layer, "attn.proj.weight"});
  // The adapters of the residual GEMMs add to x + proj(atty): the CPU model's sum, in another order.
  lora_.forward(layer, "attn.proj.weight", block_params, a.res2.data(), C, a.atty.data(), N, lap, ctx_);
  lap("fwd.layernorm");
  gpu::layernorm_forward<T>(ln2, a.ln2_mean.data(), a.ln2_rstd.data(), a.res2.data(), p.ln2w, p.ln2b, N, C, ctx_,
                            linear_.input_maxima({layer, "mlp.fc.weight"}, LinearInput::kX, ctx_));
  if (lora_.adapts("mlp.fc.weight") || linear_.policy().applies(C, 4 * C)) {
    // The adapters add to fc's output before the GELU, which the fused GEMM + GELU cannot wait for, and an FP8 GEMM
    // has no GELU epilogue here: apart.
    lora_.forward(layer, "mlp.fc.weight", block_params, a.fch.data(), 4 * C, ln2, N, lap, ctx_, [&](bool onto) {
      lap("fwd.matmul");
      this->base_forward(a.fch.data(), ln2, p.fcw, p.fcb, N, C, 4 * C, onto, &lap, {layer, "mlp.fc.weight"},
                         codes_to_keep(layer, a.ln2_t));
    });
    lap("fwd.gelu");
    gpu::gelu_forward<T>(fch_gelu, a.fch.data(), N * 4 * C, ctx_,
                         linear_.input_maxima({layer, "mlp.proj.weight"}, LinearInput::kX, ctx_));
  } else {
    lap("fwd.matmul_gelu");
    gpu::matmul_forward_gelu<T>(fch_gelu, a.fch.data(), ln2, p.fcw, p.fcb, N, C, 4 * C, ctx_);
  }
  if (this->output_unread("mlp.proj.weight")) {  // the re-run ends with what the output projection's backward reads
    linear_.forward_without_output(fch_gelu, p.fcprojw, N, 4 * C, C, ctx_, &lap, {layer, "mlp.proj.weight"},
                                   codes_to_keep(layer, a.fch_gelu_t));
    return;
  }
  lap("fwd.matmul_residual");
  linear_.forward(out, fch_gelu, p.fcprojw, p.fcprojb, a.res2.data(), N, 4 * C, C, ctx_, &lap,
                  {layer, "mlp.proj.weight"}, codes_to_keep(layer, a.fch_gelu_t));
  lora_.forward(layer, "mlp.proj.weight", block_params, out, C, fch_gelu, N, lap, ctx_);
}

template <typename T>
void CudaGpt<T>::head_pass(const T* head_params, const T* emb_params, const int32_t* targets, float dloss,
                           T* head_grads, T* emb_grads, bool backward) {
  const UnitLayout& hu = units_.back();
  const UnitLayout& eu = units_[0];
  const int64_t N = B_ * T_;
  const int C = cfg_.n_embd;
  const T* x = final_output();
  const T* lnfw = head_params + hu.tensor("lnf.weight").offset;
  const T* lnfb = head_params + hu.tensor("lnf.bias").offset;
  io_.upload_targets(targets, N, ctx_.stream);
  OpTimer::Laps lap = timer_.laps(ctx_.stream);
  lap("head.layernorm");
  gpu::layernorm_forward<T>(lnf_.data(), lnf_mean_.data(), lnf_rstd_.data(), x, lnfw, lnfb, N, C, ctx_);
  io_.classify(lnf_.data(), emb_params + eu.tensor("wte").offset, N, dloss, backward ? dlnf_.data() : nullptr,
               backward ? tensor_in(emb_grads, eu.tensor("wte"), ViewOf::kGrads) : nullptr, GradWrite::kAccumulate, lap,
               ctx_);
  if (backward) {
    lap("head.layernorm_bwd");
    zero_async(dresid_, N * C, ctx_.stream);
    // The head unit's only gradients: written, not added to (none when frozen).
    gpu::layernorm_backward<T>(dresid_.data(), tensor_in(head_grads, hu.tensor("lnf.weight"), ViewOf::kGrads),
                               tensor_in(head_grads, hu.tensor("lnf.bias"), ViewOf::kGrads), dlnf_.data(), x, lnfw,
                               lnf_mean_.data(), lnf_rstd_.data(), N, C, ctx_, GradWrite::kOverwrite);
  }
}

template <typename T>
void CudaGpt<T>::head_logits(const T* head_params, const T* emb_params, int64_t pos, std::vector<float>* logits) {
  ST_CHECK(pos >= 0 && pos < T_, "position ", pos, " outside the active length ", T_);
  const UnitLayout& hu = units_.back();
  const int C = cfg_.n_embd;
  const T* x = (final_output()) + pos * C;
  gpu::layernorm_forward<T>(lnf_.data(), lnf_mean_.data(), lnf_rstd_.data(), x, head_params + hu.tensors[0].offset,
                            head_params + hu.tensors[1].offset, 1, C, ctx_);
  io_.logits_of_row(lnf_.data(), emb_params + units_[0].tensors[0].offset, logits, ctx_);
  timer_.collect();
}

template <typename T>
void CudaGpt<T>::block_backward(int layer, const T* block_params, T* block_grads) {
  if (recompute_.of(layer)) this->recompute_forward(layer, block_params);
  const BlockView<const T> p(block_params, units_[static_cast<size_t>(1 + layer)]);
  const BlockView<T> g(block_grads, units_[static_cast<size_t>(1 + layer)], ViewOf::kGrads);
  BlockActs& a = acts(layer);
  const int64_t slot = static_cast<int64_t>(this->acts_index(layer));
  const int64_t N = B_ * T_;
  const int C = cfg_.n_embd;
  const T* x = block_input(layer);
  cudaStream_t s = ctx_.stream;
  OpTimer::Laps lap = timer_.laps(s);
  // Single-producer buffers, no memsets: the activation gradients, and every one of the block's parameter gradients
  // (block_grads is written, not added to; the caller need not zero it). An adapted GEMM's input gradient also gets
  // its adapters' part (base_write: whichever runs second adds); a frozen tensor's gradient pointer is null: skipped.
  constexpr GradWrite kOverwrite = GradWrite::kOverwrite;
  // The four biases' and two LayerNorms' gradient sums are finished together at the end, in one launch.
  gpu::GpuContext ctx = ctx_;
  ctx.column_sums = &column_sums_;

  // MLP branch: dresid is d(out); the residual passes it to res2 unchanged. d(fch) through the GELU in one pass,
  // or, when adapters add to d(fch_gelu) first or the GEMM runs in FP8, in two (matmul_backward_gelu's unfused path).
  T* dfch = dfch_.data();
  if (lora_.adapts("mlp.proj.weight") || linear_.policy().applies(4 * C, C)) {
    lora_.backward(layer, "mlp.proj.weight", block_params, block_grads, dfch, dresid_.data(), C, a.fch_gelu.data(), N,
                   lap, ctx, [&](bool onto) {
                     lap("bwd.matmul");
                     linear_.backward(dfch, g.fcprojw, g.fcprojb, dresid_.data(), a.fch_gelu.data(), p.fcprojw, N,
                                      4 * C, C, ctx, base_write(onto), kOverwrite, &lap, {layer, "mlp.proj.weight"},
                                      codes(a.fch_gelu_t));
                   });
    lap("bwd.gelu");
    gpu::gelu_backward<T>(dfch, a.fch.data(), dfch, N * 4 * C, ctx, kOverwrite);
  } else {
    lap("bwd.matmul_gelu");
    gpu::matmul_backward_gelu<T>(dfch, g.fcprojw, g.fcprojb, dresid_.data(), a.fch_gelu.data(), p.fcprojw, a.fch.data(),
                                 N, 4 * C, C, ctx, kOverwrite);
  }
  lora_.backward(layer, "mlp.fc.weight", block_params, block_grads, dbuf_c_.data(), dfch, 4 * C, a.ln2.data(), N, lap,
                 ctx, [&](bool onto) {
                   lap("bwd.matmul");
                   linear_.backward(dbuf_c_.data(), g.fcw, g.fcb, dfch, a.ln2.data(), p.fcw, N, C, 4 * C, ctx,
                                    base_write(onto), kOverwrite, &lap, {layer, "mlp.fc.weight"}, codes(a.ln2_t));
                 });
  lap("bwd.layernorm");
  gpu::layernorm_backward<T>(dresid_.data(), g.ln2w, g.ln2b, dbuf_c_.data(), a.res2.data(), p.ln2w, a.ln2_mean.data(),
                             a.ln2_rstd.data(), N, C, ctx, kOverwrite);

  // Attention branch: dresid is now d(res2); the residual passes it to x unchanged.
  lora_.backward(layer, "attn.proj.weight", block_params, block_grads, dbuf_c_.data(), dresid_.data(), C, a.atty.data(),
                 N, lap, ctx, [&](bool onto) {
                   lap("bwd.matmul");
                   linear_.backward(dbuf_c_.data(), g.projw, g.projb, dresid_.data(), a.atty.data(), p.projw, N, C, C,
                                    ctx, base_write(onto), kOverwrite, &lap, {layer, "attn.proj.weight"});
                 });
  if (cudnn_shape()) {  // overwrites dqkv
    lap("bwd.attention");
    gpu::cudnn_attention_backward<T>(dqkv_.data(), dbuf_c_.data(), a.qkv.data(), a.atty.data(), a.att_lse.data(),
                                     static_cast<int>(B_), static_cast<int>(T_), C, cfg_.n_head, ctx,
                                     attention_backward_);
  } else {  // accumulates into dqkv
    lap("bwd.zero");
    zero_async(dqkv_, N * 3 * C, s);
    lap("bwd.attention");
    gpu::flash_attention_backward<T>(dqkv_.data(), dbuf_c_.data(), a.qkv.data(), a.atty.data(), a.att_lse.data(),
                                     static_cast<int>(B_), static_cast<int>(T_), C, cfg_.n_head, ctx);
  }
  lora_.backward(layer, "attn.qkv.weight", block_params, block_grads, dbuf_c_.data(), dqkv_.data(), 3 * C, a.ln1.data(),
                 N, lap, ctx, [&](bool onto) {
                   lap("bwd.matmul");
                   linear_.backward(dbuf_c_.data(), g.qkvw, g.qkvb, dqkv_.data(), a.ln1.data(), p.qkvw, N, C, 3 * C,
                                    ctx, base_write(onto), kOverwrite, &lap, {layer, "attn.qkv.weight"},
                                    codes(a.ln1_t));
                 });
  lap("bwd.layernorm");
  gpu::layernorm_backward<T>(dresid_.data(), g.ln1w, g.ln1b, dbuf_c_.data(), x, p.ln1w, a.ln1_mean.data(),
                             a.ln1_rstd.data(), N, C, ctx, kOverwrite);
  lap("bwd.layernorm");  // the block's column sums (bias and LayerNorm gradients), all in one launch
  column_sums_.finish(s);
}

template <typename T>
void CudaGpt<T>::embedding_backward(T* emb_grads) {
  const UnitLayout& u = units_[0];
  T* dwte = tensor_in(emb_grads, u.tensor("wte"), ViewOf::kGrads);
  T* dwpe = tensor_in(emb_grads, u.tensor("wpe"), ViewOf::kGrads);
  if (dwte == nullptr && dwpe == nullptr) return;  // frozen (LoRA)
  ST_CHECK(dwte != nullptr && dwpe != nullptr, "wte and wpe are trained together or not at all");
  OpTimer::Laps lap = timer_.laps(ctx_.stream);
  lap("bwd.embedding");
  gpu::embedding_backward<T>(dwte, dwpe, dresid_.data(), io_.tokens(), static_cast<int>(B_), static_cast<int>(T_),
                             cfg_.n_embd, ctx_);
}

template class CudaGpt<float>;
template class CudaGpt<bf16>;
template class CudaGpt<fp16>;

}  // namespace st
