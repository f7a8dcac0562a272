// GPT-2 forward and backward on one GPU, unit by unit: the CUDA twin of GptModel (gpt_model.h), with the same
// calls (those of CudaUnitModel, cuda_unit_model.h) and the same unit layout. Gradients: the embedding's accumulate
// (+=: the classifier and the token lookup both add to it), as in GptModel; a block's and the head's are written (=),
// so their buffers need no zeroing (GptModel adds to them, the same values on zeroed buffers). With LoRA
// (model/lora.h) the targeted GEMMs' adapters add to their outputs (CudaLora; fc's before the GELU, so an adapted fc
// runs without the fused GEMM + GELU) and frozen tensors get no gradient, as in GptModel. Parameters and gradients
// are the unit's full flat buffers in the compute type T (float, bf16 or fp16), in device memory, gathered and
// reduce-scattered by the caller. Activations are T; LayerNorm statistics and per-token losses are fp32. Every call is
// asynchronous on ctx.stream except those that return a host value. Under train.fp8 (tensorwise) a block keeps the x^T
// codes of its qkv, fc and MLP proj inputs instead of the inputs (GptActivationSizes::coded_*), as CudaLlama does.
//
//   CudaGpt<bf16> m(cfg, B, recompute, ctx);
//   m.embedding_forward(P[0], host_tokens, B, T);
//   for (l...) m.block_forward(l, P[1 + l]);
//   m.head_forward_backward(P[L+1], P[0], host_targets, dloss, G[L+1], G[0]);  // adds the batch's loss
//   for (l = L-1...0) m.block_backward(l, P[1 + l], G[1 + l]);
//   m.embedding_backward(G[0]);
//   double loss = m.take_loss_sum() / targets;                                     // synchronises
#pragma once

#include <cstdint>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/core/cuda.h"
#include "shardtrain/core/cuda_timer.h"
#include "shardtrain/kernels/gpu/column_sums.h"
#include "shardtrain/kernels/gpu/context.h"
#include "shardtrain/kernels/gpu/cudnn_attention.h"
#include "shardtrain/model/cuda_footprint.h"
#include "shardtrain/model/cuda_model_base.h"
#include "shardtrain/model/units.h"

namespace st {

template <typename T>
class CudaGpt final : public CudaModelBase<T> {
 public:
  // ctx.scratch must hold cuda_gpt_footprint(...).scratch_bytes (cuda_footprint.h); ctx must outlive the model. With
  // cudnn_attention, passes at the full shape (max_batch x seq_len: every training micro-step) run cuDNN's
  // fused attention (ctx.cudnn, plans already built); other shapes (sampling, short evaluations) and
  // !cudnn_attention run flash attention. Both compute the same function. attention_backward picks cuDNN's
  // deterministic backward or the one that adds dQ with atomics (train.deterministic=false). fp8: train.fp8's policy
  // for the blocks' linear layers (ctx.scratch then also holds their codes: cuda_model_footprint with the recipe).
  CudaGpt(const ModelConfig& cfg, int64_t max_batch, Recompute recompute, bool cudnn_attention,
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
    DeviceBuffer<T> ln1, qkv, atty, res2, ln2, fch, fch_gelu;  // ln1, ln2, fch_gelu: empty where coded
    DeviceBuffer<uint8_t> ln1_t, ln2_t, fch_gelu_t;            // their x^T codes [C|C|4C, N], where coded
    DeviceBuffer<float> ln1_mean, ln1_rstd, ln2_mean, ln2_rstd;
    DeviceBuffer<float> att_lse;  // [B, NH, T]: what flash attention's backward needs besides qkv and atty
  };
  BlockActs& acts(int layer) { return blocks_[this->acts_index(layer)]; }
  // Final LayerNorm, the classifier tied to wte, cross-entropy (targets: host [B, t]) and, with backward, the start
  // of backward (GptModel::head_forward_backward).
  void head_pass(const T* head_params, const T* emb_params, const int32_t* targets, float dloss, T* head_grads,
                 T* emb_grads, bool backward) override;

  std::vector<BlockActs> blocks_;
  DeviceBuffer<T> lnf_, dresid_, dlnf_, dbuf_c_, dqkv_, dfch_;
  DeviceBuffer<float> lnf_mean_, lnf_rstd_;
  gpu::ColumnSums column_sums_;  // block_backward's bias and LayerNorm gradient sums, finished in one launch
};

}  // namespace st
