// The calls through which the CUDA engine (shard/cuda_sharded_model.cu) runs a model on one GPU, one unit at a time
// (units.h): each family's CUDA model implements them (CudaGpt, CudaLlama), and cuda_model_family() (cuda_family.h)
// makes the one cfg.model.arch names. The CUDA twin of UnitModel (unit_model.h), with its calls and meaning except:
//   - parameters and gradients are the unit's full flat buffers in the compute type T (float, bf16 or fp16), in device
//     memory, gathered and reduce-scattered by the caller;
//   - gradients: the embedding's accumulate (+=: the classifier of a tied head and the token lookup both add to it);
//     a block's and the head's are written (=), so their buffers need no zeroing;
//   - the loss is summed on the device (take_loss_sum, move_loss_sum), not returned by the head;
//   - every call is asynchronous on the model's stream except those that return a host value.
//
//   std::unique_ptr<CudaUnitModel<bf16>> m = cuda_model_family<bf16>(cfg.arch).make_model(cfg, B, recompute, ...);
//   m->embedding_forward(P[0], host_tokens, B, T);
//   for (l...) m->block_forward(l, P[1 + l]);
//   m->head_forward_backward(P[L+1], P[0], host_targets, dloss, G[L+1], G[0]);  // adds the batch's loss
//   for (l = L-1...0) m->block_backward(l, P[1 + l], G[1 + l]);
//   m->embedding_backward(G[0]);
//   double loss = m->take_loss_sum() / targets;                                   // synchronises
#pragma once

#include <cstdint>
#include <vector>

#include "shardtrain/core/cuda_timer.h"
#include "shardtrain/model/cuda_footprint.h"
#include "shardtrain/model/cuda_fp8_history.h"
#include "shardtrain/model/fp8_policy.h"
#include "shardtrain/model/units.h"

namespace st {

template <typename T>
class CudaUnitModel {
 public:
  virtual ~CudaUnitModel() = default;

  virtual const std::vector<UnitLayout>& units() const = 0;

  // Copies tokens [B, t] (host) to the device and runs unit 0's forward; sets the active shape.
  // As UnitModel::set_dropout_batch: the seed and the first global sequence of the micro-batches that follow, which
  // key adapter dropout; first_sequence < 0: none.
  virtual void set_dropout_batch(uint64_t seed, int64_t first_sequence) = 0;
  // The FP8 scales and maxima of the blocks' linear layers (train.fp8, given to make_model:
  // cuda_linear_workspace_bytes, cuda_footprint.h); their codes take the context's kernel scratch.
  virtual int64_t fp8_workspace_bytes() const = 0;
  // train.fp8=delayed: the amax history the blocks' casts scale by (model/cuda_fp8_history.h); null under any other
  // recipe.
  virtual CudaFp8History* fp8_history() { return nullptr; }
  virtual void embedding_forward(const T* emb_params, const int32_t* tokens, int64_t B, int64_t t) = 0;
  // Forward of block `layer` on the active shape; keeps what its backward needs.
  virtual void block_forward(int layer, const T* block_params) = 0;
  // Final norm, classifier, cross-entropy (targets: host [B, t]) and the start of backward
  // (UnitModel::head_forward_backward): head_grads written, emb_grads += the classifier's gradient when the head is
  // tied; a frozen tensor (LoRA) gets no gradient, and a wholly frozen unit's buffer may be null. Without LoRA a null
  // head_grads runs the forward only, as head_forward. A target < 0 is not a target: no loss, no gradient. The batch's
  // summed per-token loss is added to a device accumulator read by take_loss_sum().
  virtual void head_forward_backward(const T* head_params, const T* emb_params, const int32_t* targets, float dloss,
                                     T* head_grads, T* emb_grads) = 0;
  // The same loss, added to the same accumulator, without backward.
  virtual void head_forward(const T* head_params, const T* emb_params, const int32_t* targets) = 0;
  // Sum of the per-token losses since the last call; synchronises the stream.
  virtual double take_loss_sum() = 0;
  // The same sum, moved to *dst (device memory) on the stream, without waiting: the accumulator restarts at 0. The
  // caller synchronises before the next token upload reuses the pinned staging area.
  virtual void move_loss_sum(double* dst) = 0;
  // Logits over the real vocabulary at position `pos` of sequence 0; synchronises.
  virtual void head_logits(const T* head_params, const T* emb_params, int64_t pos, std::vector<float>* logits) = 0;
  // Backward of block `layer`: consumes the residual gradient and writes block_grads (its trainable tensors': with
  // LoRA the adapters'). With recompute it first re-runs the block's forward from its saved input.
  virtual void block_backward(int layer, const T* block_params, T* block_grads) = 0;
  // Backward of unit 0: accumulates into emb_grads; nothing when its tensors are frozen (LoRA).
  virtual void embedding_backward(T* emb_grads) = 0;

  // Per-op GPU time of the calls above (SHARDTRAIN_PROFILE_OPS=1; see core/cuda_timer.h). Collected by
  // take_loss_sum() and head_logits(), which synchronise.
  virtual OpTimer& timer() = 0;
};

}  // namespace st
