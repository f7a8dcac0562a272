// GPT-2 forward and backward, one unit at a time, on the CPU in fp32 (the numerical reference).
//
// The model does not own parameters. Every call receives the unit's *gathered* flat parameter buffer
// (see units.h for the layout) and, in backward, the unit's full flat gradient buffer, into which it
// accumulates (+=). Who gathers, frees and reduce-scatters those buffers is the caller's business (a
// single-process store, or the sharding schedule); the model only does math and keeps activations.
//
// A step over one micro-batch, for a caller holding every unit's params P[u] and grads G[u]:
//   GptModel m(cfg, B);
//   m.embedding_forward(P[0], tokens);
//   for (int l = 0; l < L; ++l) m.block_forward(l, P[1 + l]);
//   float loss = m.head_forward_backward(P[L + 1], P[0], targets, dloss, G[L + 1], G[0]);
//   for (int l = L - 1; l >= 0; --l) m.block_backward(l, P[1 + l], G[1 + l]);
//   m.embedding_backward(G[0]);
// The head is fused with the start of backward: the classifier is processed in row chunks, each of
// which computes logits, the loss and dlogits in place and feeds them straight back, so fp32 logits for
// the whole batch never exist.
#pragma once

#include <cstdint>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/model/units.h"

namespace st {

class GptModel {
 public:
  // Allocates activations for micro-batches of up to max_batch sequences of cfg.seq_len tokens. With
  // recompute, only each block's output (the next block's input) is kept per layer, plus one block's
  // worth of activations that block_backward refills by re-running that block's forward.
  GptModel(const ModelConfig& cfg, int64_t max_batch, bool recompute = false);

  // The bytes that constructor allocates (activations, backward scratch, the logits chunk), computed without
  // allocating: the CPU backend's memory plan (shard/memory_plan.h) counts them before the model exists.
  // Equals allocated_bytes() of the model it would build.
  static int64_t footprint_bytes(const ModelConfig& cfg, int64_t max_batch, bool recompute);
  int64_t allocated_bytes() const;

  const ModelConfig& config() const { return cfg_; }
  const std::vector<UnitLayout>& units() const { return units_; }

  // Forward of unit 0. tokens [B, t] with B <= max_batch, t <= seq_len; sets the active shape.
  void embedding_forward(const float* emb_params, const int32_t* tokens, int64_t B, int64_t t);
  void embedding_forward(const float* emb_params, const int32_t* tokens) {
    embedding_forward(emb_params, tokens, max_batch_, cfg_.seq_len);
  }
  // Forward of block `layer` on the active shape; keeps what its backward needs.
  void block_forward(int layer, const float* block_params);

  // Final LayerNorm, tied LM head, mean cross-entropy and, if head_grads is non-null, the start of
  // backward: head_grads (+= lnf grads), emb_grads (+= the wte grad of the classifier) and the residual
  // gradient that block_backward continues from. Each token's loss gradient is scaled by dloss (the
  // caller passes 1/(B*T*accum)). Returns the mean loss over the active B*t tokens.
  float head_forward_backward(const float* head_params, const float* emb_params, const int32_t* targets, float dloss,
                              float* head_grads, float* emb_grads);
  float head_forward(const float* head_params, const float* emb_params, const int32_t* targets) {
    return head_forward_backward(head_params, emb_params, targets, 0.0f, nullptr, nullptr);
  }

  // Logits over the real vocabulary for position `pos` of sequence 0 of the active batch (for sampling).
  void head_logits(const float* head_params, const float* emb_params, int64_t pos, std::vector<float>* logits);

  // Backward of block `layer`: consumes the residual gradient, accumulates into block_grads. With
  // recompute it first re-runs the block's forward from its saved input.
  void block_backward(int layer, const float* block_params, float* block_grads);
  // Backward of unit 0 (needs no parameters): accumulates wte and wpe grads into emb_grads.
  void embedding_backward(float* emb_grads);

 private:
  struct BlockActs {
    std::vector<float> ln1, ln1_mean, ln1_rstd, qkv, att, atty, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu;
  };
  const float* block_input(int layer) const;
  BlockActs& acts(int layer) { return blocks_[recompute_ ? 0 : layer]; }

  ModelConfig cfg_;
  std::vector<UnitLayout> units_;
  int64_t max_batch_;
  bool recompute_;
  int64_t B_ = 0, T_ = 0;  // the active shape of the last embedding_forward
  std::vector<int32_t> tokens_;
  std::vector<float> encoded_;
  std::vector<BlockActs> blocks_;             // n_layer of them, or 1 with recompute
  std::vector<std::vector<float>> block_out_;  // each block's output: the next block's input
  std::vector<float> lnf_, lnf_mean_, lnf_rstd_, losses_;
  // Backward scratch, shared by all blocks.
  std::vector<float> dresid_, dlnf_, dbuf_c_, dqkv_, dfch_, logits_chunk_;
};

}  // namespace st
