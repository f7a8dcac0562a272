// Llama forward and backward on one GPU, unit by unit: the CUDA twin of LlamaModel (llama_model.h), op for op, with
// the calls of CudaUnitModel (cuda_unit_model.h) on llama's units (units.h):
//   h   = x + o(attention(rope(q), rope(k), v))    with q, k, v = qkv(rmsnorm(x)) (+ bias with model.qkv_bias)
//   out = h + down(silu(gate(n)) * up(n))         with n = rmsnorm(h)
// grouped-query attention (model.n_kv_head), the final RMSNorm and a classifier tied to embed_tokens or untied.
// With LoRA (model/lora.h) the targeted GEMMs' adapters add to their outputs (CudaLora) and frozen tensors get no
// gradient, as in LlamaModel.
// Gradients: the embedding's accumulate (+=: the token lookup, and the classifier when tied, add to it); a block's
// and the head's are written (=), so their buffers need no zeroing. Parameters and gradients are the unit's full flat
// buffers in the compute type T (float, bf16 or fp16), in device memory. Activations are T; RMSNorm statistics, the
// RoPE tables, attention's logsumexp and per-token losses are fp32. Every call is asynchronous on ctx.stream except
// those that return a host value. Under train.fp8 (tensorwise) a block keeps the x^T codes of its q/k/v, gate/up and
// down projections' inputs instead of the inputs themselves (LlamaActivationSizes::coded_*: only their weight
// gradients read them), and the forward writes those inputs into backward buffers that are idle until then.
//
//   CudaLlama<bf16> m(cfg, B, recompute, cudnn_attention, ctx);   // ctx.scratch >= cuda_llama_footprint(...)
//                                                                 // .scratch_bytes (cuda_footprint.h)
//   ... the calls of CudaUnitModel, in its order ...
#pragma once

#include <cstdint>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/core/cuda.h"
#include "shardtrain/core/cuda_timer.h"
#include "shardtrain/kernels/gpu/context.h"
#include "shardtrain/kernels/gpu/cudnn_attention.h"
#include "shardtrain/model/cuda_footprint.h"
#include "shardtrain/model/cuda_model_base.h"
#include "shardtrain/model/units.h"

namespace st {

template <typename T>
class CudaLlama final : public CudaModelBase<T> {
 public:
  // As CudaGpt's constructor: ctx.scratch must hold cuda_llama_footprint(...).scratch_bytes and ctx must outlive
  // the model; with cudnn_attention, passes at the full shape (max_batch x seq_len) run cuDNN's fused attention,
  // others flash attention; attention_backward picks cuDNN's backward. Uploads the RoPE tables (st::rope_table) once.
  // fp8: train.fp8's policy for the blocks' linear layers (ctx.scratch then also holds their codes).
  CudaLlama(const ModelConfig& cfg, int64_t max_batch, Recompute recompute, bool cudnn_attention,
            const gpu::GpuContext& ctx,
            gpu::CudnnBackwardMode attention_backward = gpu::CudnnBackwardMode::kDeterministic,
            const Fp8Policy& fp8 = {});

  void embedding_forward(const T* emb_params, const int32_t* tokens, int64_t B, int64_t t) override;
  void block_forward(int layer, const T* block_params) override;
  void head_logits(const T* head_params, const T* emb_params, int64_t pos, std::vector<float>* logits) override;
  void block_backward(int layer, const T* block_params, T* block_grads) override;
  void embedding_backward(T* emb_grads) override;

 private:
  using Base = CudaModelBase<T>;
  using Base::attention_backward_, Base::B_, Base::block_input, Base::block_out_, Base::cfg_, Base::codes,
      Base::codes_to_keep, Base::ctx_, Base::cudnn_shape, Base::encoded_, Base::final_output, Base::input, Base::io_,
      Base::linear_, Base::lora_, Base::recompute_, Base::T_, Base::timer_, Base::units_;
  struct BlockActs {
    DeviceBuffer<T> norm1, qkv, atty, res2, norm2, gate_up, mlp;  // norm1, norm2, mlp: empty where coded
    DeviceBuffer<uint8_t> norm1_t, norm2_t, mlp_t;                // their x^T codes [C|C|F, N], where coded
    DeviceBuffer<float> rstd1, rstd2;
    DeviceBuffer<float> att_lse;  // [B, NH, T]: what attention's backward needs besides qkv and atty
  };
  BlockActs& acts(int layer) { return blocks_[this->acts_index(layer)]; }
  // Final RMSNorm and the classifier: embed_tokens when tied (its gradient added to emb_grads), else the head's
  // lm_head (its gradient written into head_grads).
  void head_pass(const T* head_params, const T* emb_params, const int32_t* targets, float dloss, T* head_grads,
                 T* emb_grads, bool backward) override;
  // The classifier's weight [Vp, C]: embed_tokens when tied, else lm_head.
  const T* classifier(const T* head_params, const T* emb_params) const;
  void attention_forward(BlockActs& a);
  // train.fp8=delayed: an RMSNorm (rstd into rstd, its weight norm_w) and the linear layer at `site` after it (weight
  // w, bias, OC outputs into out) with the layer's input codes written by the norm (CudaLinear::fused_input) into the
  // block's kept x^T codes `kept`, when the site takes them; false, and nothing run, otherwise.
  bool fused_norm(LinearSite site, DeviceBuffer<uint8_t>& kept, float* rstd, const T* inp, const T* norm_w, const T* w,
                  const T* bias, T* out, int OC, OpTimer::Laps& lap);
  // train.fp8=delayed: the SwiGLU and the down projection of `layer` with the down projection's codes written by the
  // SwiGLU (CudaLinear::fused_input), when the site takes them; false, and nothing run, otherwise.
  bool fused_swiglu(int layer, BlockActs& a, const T* down, T* out, int64_t N, OpTimer::Laps& lap);
  // Its backward: the SwiGLU's backward writing the gate/up projection's dy codes (fused_output_grad), and that
  // projection's backward; false, and nothing run, where the site does not take them.
  bool fused_swiglu_backward(int layer, BlockActs& a, const T* gate_up_w, T* gate_up_grad, int64_t N,
                             OpTimer::Laps& lap);
  void attention_backward(BlockActs& a, OpTimer::Laps& lap);  // dbuf_c_ (d atty) -> dqkv_ (written)

  DeviceBuffer<float> rope_cos_, rope_sin_;  // [seq_len, hs/2]
  std::vector<BlockActs> blocks_;
  DeviceBuffer<T> normf_, dresid_, dnormf_, dbuf_c_, dqkv_, dmlp_, dgate_up_;
  DeviceBuffer<float> rstdf_;
};

}  // namespace st
