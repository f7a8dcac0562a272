#include "shardtrain/model/llama/cuda_llama_model.h"

#include <algorithm>
#include <optional>

#include "shardtrain/core/cuda.h"
#include "shardtrain/core/error.h"
#include "shardtrain/kernels/gpu/cudnn_attention.h"
#include "shardtrain/kernels/gpu/embedding.h"
#include "shardtrain/kernels/gpu/flash_attention.h"
#include "shardtrain/kernels/gpu/matmul.h"
#include "shardtrain/kernels/gpu/reduce.h"
#include "shardtrain/kernels/gpu/rmsnorm.h"
#include "shardtrain/kernels/gpu/rope.h"
#include "shardtrain/kernels/gpu/swiglu.h"
#include "shardtrain/kernels/rope.h"
#include "shardtrain/model/cuda_linear.h"
#include "shardtrain/model/llama/block_view.h"

namespace st {
namespace {

template <typename T>
DeviceBuffer<T> device_copy(const std::vector<T>& host, cudaStream_t s) {
  DeviceBuffer<T> d(static_cast<int64_t>(host.size()));
  ST_CUDA_CHECK(cudaMemcpyAsync(d.data(), host.data(), d.bytes(), cudaMemcpyHostToDevice, s));
  return d;
}

}  // namespace

template <typename T>
CudaLlama<T>::CudaLlama(const ModelConfig& cfg, int64_t max_batch, Recompute recompute, bool cudnn_attention,
                        const gpu::GpuContext& ctx, gpu::CudnnBackwardMode attention_backward, const Fp8Policy& fp8)
    : CudaModelBase<T>(cfg, max_batch, recompute, cudnn_attention, ctx, attention_backward,
                       cuda_llama_footprint(cfg, max_batch, recompute, sizeof(T), 0, fp8).scratch_bytes, fp8) {
  ST_CHECK(cfg.is_llama());
  // Exactly the buffers cuda_llama_footprint counts (LlamaActivationSizes); the base allocates the layer outputs, the
  // embedding output, CudaLmIo's and the adapters'.
  const LlamaActivationSizes z(cfg, max_batch, recompute, fp8);
  const int64_t BT = z.BT, C = z.C, F = z.F;
  const RopeTable rope = rope_table(cfg, cfg.seq_len);
  rope_cos_ = device_copy(rope.cos, ctx_.stream);
  rope_sin_ = device_copy(rope.sin, ctx_.stream);
  blocks_.resize(static_cast<size_t>(z.blocks));
  for (BlockActs& a : blocks_) {
    for (DeviceBuffer<T>* b : {&a.atty, &a.res2}) *b = DeviceBuffer<T>(BT * C);
    this->allocate_input(z.coded_qkv, BT * C, &a.norm1, &a.norm1_t);
    this->allocate_input(z.coded_gate_up, BT * C, &a.norm2, &a.norm2_t);
    this->allocate_input(z.coded_down, BT * F, &a.mlp, &a.mlp_t);
    a.qkv = DeviceBuffer<T>(BT * z.QKV);
    a.gate_up = DeviceBuffer<T>(BT * 2 * F);
    a.rstd1 = DeviceBuffer<float>(BT);
    a.rstd2 = DeviceBuffer<float>(BT);
    a.att_lse = DeviceBuffer<float>(z.B * z.NH * z.T);
  }
  for (DeviceBuffer<T>* b : {&normf_, &dresid_, &dnormf_, &dbuf_c_}) *b = DeviceBuffer<T>(BT * C);
  dqkv_ = DeviceBuffer<T>(BT * z.QKV);
  dmlp_ = DeviceBuffer<T>(BT * F);
  dgate_up_ = DeviceBuffer<T>(BT * 2 * F);
  rstdf_ = DeviceBuffer<float>(BT);
  // The tables' host copies go out of scope: the copies must have left them.
  ST_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
}

template <typename T>
const T* CudaLlama<T>::classifier(const T* head_params, const T* emb_params) const {
  return cfg_.tie_embeddings ? emb_params + units_.front().tensor("embed_tokens").offset
                             : head_params + units_.back().tensor("lm_head").offset;
}

template <typename T>
void CudaLlama<T>::embedding_forward(const T* emb_params, const int32_t* tokens, int64_t B, int64_t t) {
  const int32_t* dev_tokens = this->start_batch(tokens, B, t);
  OpTimer::Laps lap = timer_.laps(ctx_.stream);
  lap("fwd.embedding");
  gpu::embedding_forward<T>(encoded_.data(), dev_tokens, emb_params + units_[0].tensor("embed_tokens").offset, nullptr,
                            static_cast<int>(B), static_cast<int>(t), cfg_.n_embd, ctx_);
}

template <typename T>
void CudaLlama<T>::attention_forward(BlockActs& a) {
  const int B = static_cast<int>(B_), Tn = static_cast<int>(T_), NH = cfg_.n_head, KV = cfg_.kv_heads(),
            D = cfg_.head_dim();
  if (cudnn_shape())
    gpu::cudnn_attention_forward<T>(a.atty.data(), a.att_lse.data(), a.qkv.data(), B, Tn, NH, KV, D, ctx_);
  else
    gpu::flash_attention_forward<T>(a.atty.data(), a.att_lse.data(), a.qkv.data(), B, Tn, NH, KV, D, ctx_);
}

template <typename T>
void CudaLlama<T>::block_forward(int layer, const T* block_params) {
  const LlamaBlockView<const T> p(block_params, units_[static_cast<size_t>(1 + layer)]);
  BlockActs& a = acts(layer);
  const int64_t slot = static_cast<int64_t>(this->acts_index(layer));
  T* out = block_out_[static_cast<size_t>(layer)].data();
  const int64_t N = B_ * T_;
  const int C = cfg_.n_embd, QKV = cfg_.qkv_dim(), F = cfg_.mlp_dim();
  const float eps = cfg_.rms_norm_eps;
  const T* x = block_input(layer);
  // The linear layers' inputs: where the block keeps their codes, written into backward buffers idle till then.
  T* const norm1 = input(a.norm1, dbuf_c_);
  T* const norm2 = input(a.norm2, dbuf_c_);
  T* const mlp = input(a.mlp, dmlp_);
  OpTimer::Laps lap = timer_.laps(ctx_.stream);
  // The norms and the SwiGLU write the inputs of the linear layers after them with their maxima (input_maxima).
  lap("fwd.rmsnorm");
  if (!fused_norm({layer, "attn.qkv.weight"}, a.norm1_t, a.rstd1.data(), x, p.attn_norm, p.qkvw, p.qkvb, a.qkv.data(),
                  QKV, lap)) {
    gpu::rmsnorm_forward<T>(norm1, a.rstd1.data(), x, p.attn_norm, eps, N, C, ctx_,
                            linear_.input_maxima({layer, "attn.qkv.weight"}, LinearInput::kX, ctx_));
    lora_.forward(layer, "attn.qkv.weight", block_params, a.qkv.data(), QKV, norm1, N, lap, ctx_, [&](bool onto) {
      lap("fwd.matmul");
      this->base_forward(a.qkv.data(), norm1, p.qkvw, p.qkvb, N, C, QKV, onto, &lap, {layer, "attn.qkv.weight"},
                         codes_to_keep(layer, a.norm1_t));
    });
  }
  lap("fwd.rope");
  gpu::rope_forward<T>(a.qkv.data(), rope_cos_.data(), rope_sin_.data(), B_, T_, cfg_.n_head, cfg_.kv_heads(),
                       cfg_.head_dim(), ctx_);
  lap("fwd.attention");
  attention_forward(a);
  lap("fwd.matmul_residual");
  linear_.forward(a.res2.data(), a.atty.data(), p.ow, nullptr, x, N, C, C, ctx_, &lap, {layer, "attn.o.weight"});
  // The adapter adds to x + o(atty): the CPU model's sum, in another order.
  lora_.forward(layer, "attn.o.weight", block_params, a.res2.data(), C, a.atty.data(), N, lap, ctx_);
  lap("fwd.rmsnorm");
  if (!fused_norm({layer, "mlp.gate_up.weight"}, a.norm2_t, a.rstd2.data(), a.res2.data(), p.mlp_norm, p.gate_up,
                  nullptr, a.gate_up.data(), 2 * F, lap)) {
    gpu::rmsnorm_forward<T>(norm2, a.rstd2.data(), a.res2.data(), p.mlp_norm, eps, N, C, ctx_,
                            linear_.input_maxima({layer, "mlp.gate_up.weight"}, LinearInput::kX, ctx_));
    lora_.forward(layer, "mlp.gate_up.weight", block_params, a.gate_up.data(), 2 * F, norm2, N, lap, ctx_,
                  [&](bool onto) {
                    lap("fwd.matmul");
                    this->base_forward(a.gate_up.data(), norm2, p.gate_up, nullptr, N, C, 2 * F, onto, &lap,
                                       {layer, "mlp.gate_up.weight"}, codes_to_keep(layer, a.norm2_t));
                  });
  }
  lap("fwd.swiglu");
  if (fused_swiglu(layer, a, p.down, out, N, lap)) return;
  gpu::swiglu_forward<T>(mlp, a.gate_up.data(), N, F, ctx_,
                         linear_.input_maxima({layer, "mlp.down.weight"}, LinearInput::kX, ctx_));
  if (this->output_unread("mlp.down.weight")) {  // the re-run ends with what the down projection's backward reads
    linear_.forward_without_output(mlp, p.down, N, F, C, ctx_, &lap, {layer, "mlp.down.weight"},
                                   codes_to_keep(layer, a.mlp_t));
    return;
  }
  lap("fwd.matmul_residual");
  linear_.forward(out, mlp, p.down, nullptr, a.res2.data(), N, F, C, ctx_, &lap, {layer, "mlp.down.weight"},
                  codes_to_keep(layer, a.mlp_t));
  lora_.forward(layer, "mlp.down.weight", block_params, out, C, mlp, N, lap, ctx_);
}

// train.fp8=delayed with a history (CudaLinear::fused_input): the RMSNorm writes the next projection's codes, never its
// output, and the projection reads them: the codes for its GEMM in every forward, and x^T's where the forward keeps
// them (codes_to_keep: in a block that recomputes, the re-run). Only where the block keeps x^T's codes in place of x,
// so that no backward reads the norm's output (no LoRA there: fp8_input_codes).
template <typename T>
bool CudaLlama<T>::fused_norm(LinearSite site, DeviceBuffer<uint8_t>& kept, float* rstd, const T* inp, const T* norm_w,
                              const T* w, const T* bias, T* out, int OC, OpTimer::Laps& lap) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bf16>) {
    if (this->codes(kept) == nullptr) return false;
    const int64_t N = B_ * T_;
    const int C = cfg_.n_embd;
    uint8_t* const codes = codes_to_keep(site.layer, kept);
    const std::optional<typename CudaLinear<T>::FusedInput> in = linear_.fused_input(site, N, C, OC, codes, ctx_);
    if (!in) return false;
    gpu::rmsnorm_forward_fp8<T>(in->q, in->q_t, in->inverse_scale, in->own, rstd, inp, norm_w, cfg_.rms_norm_eps, N, C,
                                in->format, in->amax, ctx_);
    lap("fwd.matmul");
    linear_.forward_fused(out, w, bias, nullptr, N, C, OC, ctx_, &lap, site, codes);
    return true;
  } else {
    return false;
  }
}

// train.fp8=delayed with a history (CudaLinear::fused_input): the SwiGLU writes the down projection's codes, never its
// output, and the down projection reads them (its re-run under recompute keeps x^T's codes alone). No LoRA here: the
// adapters read the SwiGLU's output, and fused_input takes only a layer that keeps x^T's codes, which LoRA's do not.
template <typename T>
bool CudaLlama<T>::fused_swiglu(int layer, BlockActs& a, const T* down, T* out, int64_t N, OpTimer::Laps& lap) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bf16>) {
    const int C = cfg_.n_embd, F = cfg_.mlp_dim();
    // Only where the block keeps the down projection's x^T codes in place of its input: the backward then reads no
    // input (with recompute, the first forward writes the codes for its GEMM alone, and the re-run the x^T codes).
    if (this->codes(a.mlp_t) == nullptr) return false;
    const LinearSite site{layer, "mlp.down.weight"};
    uint8_t* const codes = codes_to_keep(layer, a.mlp_t);
    const std::optional<typename CudaLinear<T>::FusedInput> in = linear_.fused_input(site, N, F, C, codes, ctx_);
    if (!in) return false;
    const bool rerun = this->output_unread("mlp.down.weight");
    gpu::swiglu_forward_fp8<T>(rerun ? nullptr : in->q, in->q_t, in->inverse_scale, in->own, a.gate_up.data(), N, F,
                               in->format, in->amax, ctx_);
    if (rerun) {
      linear_.forward_fused_without_output(down, N, F, C, ctx_, &lap, site);
      return true;
    }
    lap("fwd.matmul_residual");
    linear_.forward_fused(out, down, nullptr, a.res2.data(), N, F, C, ctx_, &lap, site, codes);
    return true;
  } else {
    return false;
  }
}

// train.fp8=delayed with a history (CudaLinear::fused_output_grad): the SwiGLU's backward writes the gate/up
// projection's dy and dy^T codes, never d(gate_up), and that projection's backward reads them. Not with adapters on
// gate/up (they read d(gate_up)), nor with its weight frozen.
template <typename T>
bool CudaLlama<T>::fused_swiglu_backward(int layer, BlockActs& a, const T* gate_up_w, T* gate_up_grad, int64_t N,
                                         OpTimer::Laps& lap) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bf16>) {
    if (lora_.adapts("mlp.gate_up.weight") || gate_up_grad == nullptr) return false;
    const int C = cfg_.n_embd, F = cfg_.mlp_dim();
    const LinearSite site{layer, "mlp.gate_up.weight"};
    const std::optional<typename CudaLinear<T>::FusedInput> dy = linear_.fused_output_grad(site, N, C, 2 * F, ctx_);
    if (!dy) return false;
    gpu::swiglu_backward_fp8<T>(dy->q, dy->q_t, dy->inverse_scale, dy->own, dmlp_.data(), a.gate_up.data(), N, F,
                                dy->format, dy->amax, ctx_);
    lap("bwd.matmul");
    linear_.backward_fused(dbuf_c_.data(), gate_up_grad, a.norm2.data(), gate_up_w, N, C, 2 * F, ctx_,
                           GradWrite::kOverwrite, GradWrite::kOverwrite, &lap, site, this->codes(a.norm2_t));
    return true;
  } else {
    return false;
  }
}

template <typename T>
void CudaLlama<T>::head_pass(const T* head_params, const T* emb_params, const int32_t* targets, float dloss,
                             T* head_grads, T* emb_grads, bool backward) {
  const UnitLayout& hu = units_.back();
  const int64_t N = B_ * T_;
  const int C = cfg_.n_embd;
  const T* x = final_output();
  const T* normw = head_params + hu.tensor("norm.weight").offset;
  // Tied: the classifier's gradient adds to the embedding's (the token lookup adds to it too). Untied: lm_head's is
  // the head's own, written by the first chunk. Frozen (LoRA): none.
  T* dw = nullptr;
  if (backward)
    dw = cfg_.tie_embeddings ? tensor_in(emb_grads, units_.front().tensor("embed_tokens"), ViewOf::kGrads)
                             : tensor_in(head_grads, hu.tensor("lm_head"), ViewOf::kGrads);
  const GradWrite dw_write = cfg_.tie_embeddings ? GradWrite::kAccumulate : GradWrite::kOverwrite;
  io_.upload_targets(targets, N, ctx_.stream);
  OpTimer::Laps lap = timer_.laps(ctx_.stream);
  lap("head.rmsnorm");
  gpu::rmsnorm_forward<T>(normf_.data(), rstdf_.data(), x, normw, cfg_.rms_norm_eps, N, C, ctx_);
  io_.classify(normf_.data(), classifier(head_params, emb_params), N, dloss, backward ? dnormf_.data() : nullptr, dw,
               dw_write, lap, ctx_);
  if (backward) {
    lap("head.rmsnorm_bwd");
    zero_async(dresid_, N * C, ctx_.stream);
    // dresid is the last block's d(out), the output gradient of its down projection.
    unsigned* const down_dy = cfg_.n_layer > 0
                                  ? linear_.input_maxima({cfg_.n_layer - 1, "mlp.down.weight"}, LinearInput::kDy, ctx_)
                                  : nullptr;
    gpu::rmsnorm_backward<T>(dresid_.data(), tensor_in(head_grads, hu.tensor("norm.weight"), ViewOf::kGrads),
                             dnormf_.data(), x, normw, rstdf_.data(), N, C, ctx_, GradWrite::kOverwrite, down_dy);
  }
}

template <typename T>
void CudaLlama<T>::head_logits(const T* head_params, const T* emb_params, int64_t pos, std::vector<float>* logits) {
  ST_CHECK(pos >= 0 && pos < T_, "position ", pos, " outside the active length ", T_);
  const int C = cfg_.n_embd;
  const T* x = (final_output()) + pos * C;
  gpu::rmsnorm_forward<T>(normf_.data(), rstdf_.data(), x, head_params + units_.back().tensor("norm.weight").offset,
                          cfg_.rms_norm_eps, 1, C, ctx_);
  io_.logits_of_row(normf_.data(), classifier(head_params, emb_params), logits, ctx_);
  timer_.collect();
}

template <typename T>
void CudaLlama<T>::attention_backward(BlockActs& a, OpTimer::Laps& lap) {
  const int B = static_cast<int>(B_), Tn = static_cast<int>(T_), NH = cfg_.n_head, KV = cfg_.kv_heads(),
            D = cfg_.head_dim();
  if (cudnn_shape()) {  // overwrites dqkv
    lap("bwd.attention");
    gpu::cudnn_attention_backward<T>(dqkv_.data(), dbuf_c_.data(), a.qkv.data(), a.atty.data(), a.att_lse.data(), B, Tn,
                                     NH, KV, D, ctx_, attention_backward_);
  } else {  // accumulates into dqkv
    lap("bwd.zero");
    zero_async(dqkv_, B_ * T_ * cfg_.qkv_dim(), ctx_.stream);
    lap("bwd.attention");
    gpu::flash_attention_backward<T>(dqkv_.data(), dbuf_c_.data(), a.qkv.data(), a.atty.data(), a.att_lse.data(), B, Tn,
                                     NH, KV, D, ctx_);
  }
}

template <typename T>
void CudaLlama<T>::block_backward(int layer, const T* block_params, T* block_grads) {
  if (recompute_.of(layer)) this->recompute_forward(layer, block_params);  // refills the shared activations
  const LlamaBlockView<const T> p(block_params, units_[static_cast<size_t>(1 + layer)]);
  const LlamaBlockView<T> g(block_grads, units_[static_cast<size_t>(1 + layer)], ViewOf::kGrads);
  BlockActs& a = acts(layer);
  const int64_t slot = static_cast<int64_t>(this->acts_index(layer));
  const int64_t N = B_ * T_;
  const int C = cfg_.n_embd, QKV = cfg_.qkv_dim(), F = cfg_.mlp_dim();
  const T* x = block_input(layer);
  OpTimer::Laps lap = timer_.laps(ctx_.stream);
  // Every activation gradient has one producer and every parameter gradient of the block is written, not added to
  // (the caller need not zero block_grads); only dresid accumulates, through the two RMSNorms' input gradients, and
  // each adapted GEMM's input gradient, with its adapters' (base_write: whichever runs second adds). A frozen tensor's
  // gradient pointer is null: skipped. The kernels that write the linear layers' output gradients (the SwiGLU, the
  // RMSNorms, RoPE) take their maxima as they write them (input_maxima); dresid as d(out) came from the head's or the
  // next block's RMSNorm with the down projection's.
  constexpr GradWrite kOverwrite = GradWrite::kOverwrite;

  // MLP branch: dresid is d(out); the residual passes it to res2 unchanged.
  lora_.backward(layer, "mlp.down.weight", block_params, block_grads, dmlp_.data(), dresid_.data(), C, a.mlp.data(), N,
                 lap, ctx_, [&](bool onto) {
                   lap("bwd.matmul");
                   linear_.backward(dmlp_.data(), g.down, nullptr, dresid_.data(), a.mlp.data(), p.down, N, F, C, ctx_,
                                    base_write(onto), kOverwrite, &lap, {layer, "mlp.down.weight"}, codes(a.mlp_t));
                 });
  lap("bwd.swiglu");
  if (!fused_swiglu_backward(layer, a, p.gate_up, g.gate_up, N, lap)) {
    gpu::swiglu_backward<T>(dgate_up_.data(), dmlp_.data(), a.gate_up.data(), N, F, ctx_, kOverwrite,
                            linear_.input_maxima({layer, "mlp.gate_up.weight"}, LinearInput::kDy, ctx_));
    lora_.backward(layer, "mlp.gate_up.weight", block_params, block_grads, dbuf_c_.data(), dgate_up_.data(), 2 * F,
                   a.norm2.data(), N, lap, ctx_, [&](bool onto) {
                     lap("bwd.matmul");
                     linear_.backward(dbuf_c_.data(), g.gate_up, nullptr, dgate_up_.data(), a.norm2.data(), p.gate_up,
                                      N, C, 2 * F, ctx_, base_write(onto), kOverwrite, &lap,
                                      {layer, "mlp.gate_up.weight"}, codes(a.norm2_t));
                   });
  }
  lap("bwd.rmsnorm");
  gpu::rmsnorm_backward<T>(dresid_.data(), g.mlp_norm, dbuf_c_.data(), a.res2.data(), p.mlp_norm, a.rstd2.data(), N, C,
                           ctx_, kOverwrite, linear_.input_maxima({layer, "attn.o.weight"}, LinearInput::kDy, ctx_));

  // Attention branch: dresid is now d(res2); the residual passes it to x unchanged.
  lora_.backward(layer, "attn.o.weight", block_params, block_grads, dbuf_c_.data(), dresid_.data(), C, a.atty.data(), N,
                 lap, ctx_, [&](bool onto) {
                   lap("bwd.matmul");
                   linear_.backward(dbuf_c_.data(), g.ow, nullptr, dresid_.data(), a.atty.data(), p.ow, N, C, C, ctx_,
                                    base_write(onto), kOverwrite, &lap, {layer, "attn.o.weight"});
                 });
  attention_backward(a, lap);
  lap("bwd.rope");  // d(rotated q, k) -> d(q, k) as the qkv matmul produced them
  gpu::rope_backward<T>(dqkv_.data(), rope_cos_.data(), rope_sin_.data(), B_, T_, cfg_.n_head, cfg_.kv_heads(),
                        cfg_.head_dim(), ctx_,
                        linear_.input_maxima({layer, "attn.qkv.weight"}, LinearInput::kDy, ctx_));
  lora_.backward(layer, "attn.qkv.weight", block_params, block_grads, dbuf_c_.data(), dqkv_.data(), QKV, a.norm1.data(),
                 N, lap, ctx_, [&](bool onto) {
                   lap("bwd.matmul");
                   linear_.backward(dbuf_c_.data(), g.qkvw, g.qkvb, dqkv_.data(), a.norm1.data(), p.qkvw, N, C, QKV,
                                    ctx_, base_write(onto), kOverwrite, &lap, {layer, "attn.qkv.weight"},
                                    codes(a.norm1_t));
                 });
  lap("bwd.rmsnorm");  // dresid becomes d(x), the previous block's d(out)
  unsigned* const down_dy =
      layer > 0 ? linear_.input_maxima({layer - 1, "mlp.down.weight"}, LinearInput::kDy, ctx_) : nullptr;
  gpu::rmsnorm_backward<T>(dresid_.data(), g.attn_norm, dbuf_c_.data(), x, p.attn_norm, a.rstd1.data(), N, C, ctx_,
                           kOverwrite, down_dy);
}

template <typename T>
void CudaLlama<T>::embedding_backward(T* emb_grads) {
  T* dwte = tensor_in(emb_grads, units_[0].tensor("embed_tokens"), ViewOf::kGrads);
  if (dwte == nullptr) return;  // frozen (LoRA)
  OpTimer::Laps lap = timer_.laps(ctx_.stream);
  lap("bwd.embedding");
  gpu::embedding_backward<T>(dwte, nullptr, dresid_.data(), io_.tokens(), static_cast<int>(B_), static_cast<int>(T_),
                             cfg_.n_embd, ctx_);
}

template class CudaLlama<float>;
template class CudaLlama<bf16>;
template class CudaLlama<fp16>;

}  // namespace st
