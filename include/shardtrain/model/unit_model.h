// The calls through which the engine runs a model on the CPU, one unit at a time (units.h): each family's fp32
// reference model implements them (GptModel, LlamaModel). The model does not own parameters: every call receives
// the unit's *gathered* flat parameter buffer and, in backward, the unit's full flat gradient buffer, into which it
// accumulates (+=). Who gathers, frees and reduce-scatters those buffers is the caller's business; the model only
// does math and keeps activations.
//
// A step over one micro-batch, for a caller holding every unit's params P[u] and grads G[u]:
//   std::unique_ptr<UnitModel> m = model_family(cfg.arch).make_cpu_model(cfg, B, recompute);
//   m->embedding_forward(P[0], tokens, B, T);
//   for (int l = 0; l < L; ++l) m->block_forward(l, P[1 + l]);
//   double loss_sum = m->head_forward_backward(P[L + 1], P[0], targets, dloss, G[L + 1], G[0]);
//   for (int l = L - 1; l >= 0; --l) m->block_backward(l, P[1 + l], G[1 + l]);
//   m->embedding_backward(G[0]);
// The head is fused with the start of backward: the classifier is processed in row chunks, each of which computes
// logits, the loss and dlogits in place and feeds them straight back, so fp32 logits for the whole batch never
// exist. The head receives the embedding's parameters and gradient too, for a head tied to the token embedding.
#pragma once

#include <cstdint>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/model/fp8_history.h"
#include "shardtrain/model/fp8_policy.h"
#include "shardtrain/model/units.h"

namespace st {

class UnitModel {
 public:
  virtual ~UnitModel() = default;

  virtual const ModelConfig& config() const = 0;
  virtual const std::vector<UnitLayout>& units() const = 0;
  // The bytes of activations and scratch the model allocated (equals its family's cpu_footprint_bytes).
  virtual int64_t allocated_bytes() const = 0;

  // The micro-batches that follow: the global index of the first one's first sequence (its rows are sequences first
  // .. first + B - 1) and the run's seed, which key adapter dropout (kernels/lora.h); first < 0 (the default): no
  // dropout, as evaluation.
  virtual void set_dropout_batch(uint64_t seed, int64_t first_sequence) = 0;
  // The precision of the blocks' linear layers' GEMMs from now on (train.fp8; fp32 until called).
  virtual void set_fp8(const Fp8Policy& policy) = 0;
  // train.fp8=delayed: the amax history the blocks' casts scale by (null under any other recipe), and whether the
  // casts record their maxima into its step maxima (off until set: the training passes record, evaluation does not).
  virtual Fp8AmaxHistory* fp8_history() { return nullptr; }
  virtual void set_fp8_recording(bool on) {}
  // Forward of unit 0. tokens [B, t] with B <= max_batch, t <= seq_len; sets the active shape.
  virtual void embedding_forward(const float* emb_params, const int32_t* tokens, int64_t B, int64_t t) = 0;
  // Forward of block `layer` on the active shape; keeps what its backward needs.
  virtual void block_forward(int layer, const float* block_params) = 0;
  // Final norm, LM head, cross-entropy and the start of backward: head_grads (+=), emb_grads (+= the classifier's
  // gradient when the head is tied) and the residual gradient that block_backward continues from; a frozen tensor
  // (LoRA) gets no gradient, and a wholly frozen unit's buffer may be null. Each token's loss gradient is scaled by
  // dloss (the caller passes 1 / the step's number of targets). A target < 0 is not a target: no loss, no gradient.
  // Returns the sum of the per-token losses over the active B*t tokens (the targets among them).
  virtual double head_forward_backward(const float* head_params, const float* emb_params, const int32_t* targets,
                                       float dloss, float* head_grads, float* emb_grads) = 0;
  // The same loss sum, without backward.
  virtual double head_forward(const float* head_params, const float* emb_params, const int32_t* targets) = 0;
  // Logits over the real vocabulary for position `pos` of sequence 0 of the active batch (for sampling).
  virtual void head_logits(const float* head_params, const float* emb_params, int64_t pos,
                           std::vector<float>* logits) = 0;
  // Backward of block `layer`: consumes the residual gradient, accumulates into block_grads. With recompute it
  // first re-runs the block's forward from its saved input.
  virtual void block_backward(int layer, const float* block_params, float* block_grads) = 0;
  // Backward of unit 0 (needs no parameters): accumulates into emb_grads.
  virtual void embedding_backward(float* emb_grads) = 0;
};

}  // namespace st
