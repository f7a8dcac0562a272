// Llama forward and backward, one unit at a time, on the CPU in fp32 (the numerical reference): the calls of
// UnitModel (unit_model.h) on llama's units (units.h). The block is Hugging Face's LlamaDecoderLayer:
//   h   = x + o(attention(rope(q), rope(k), v))    with q, k, v = qkv(rmsnorm(x)) (+ bias with model.qkv_bias)
//   out = h + down(silu(gate(n)) * up(n))         with n = rmsnorm(h)
// grouped-query attention (model.n_kv_head), the final RMSNorm and an LM head tied to embed_tokens or untied.
#pragma once

#include <cstdint>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/kernels/rope.h"
#include "shardtrain/model/cpu_linear.h"
#include "shardtrain/model/cpu_lora.h"
#include "shardtrain/model/recompute.h"
#include "shardtrain/model/unit_model.h"
#include "shardtrain/model/units.h"

namespace st {

class LlamaModel final : public UnitModel {
 public:
  // Allocates activations for micro-batches of up to max_batch sequences of cfg.seq_len tokens. A block that
  // recomputes (model/recompute.h) keeps only its output, and the recomputed blocks share one block's worth of
  // activations that block_backward refills.
  LlamaModel(const ModelConfig& cfg, int64_t max_batch, Recompute recompute = false);

  // The bytes that constructor allocates, computed without allocating (the memory plan's count).
  static int64_t footprint_bytes(const ModelConfig& cfg, int64_t max_batch, Recompute recompute);
  int64_t allocated_bytes() const override;

  const ModelConfig& config() const override { return cfg_; }
  const std::vector<UnitLayout>& units() const override { return units_; }

  void set_fp8(const Fp8Policy& policy) override { linear_.set_policy(policy, cfg_); }
  Fp8AmaxHistory* fp8_history() override { return linear_.history(); }
  void set_fp8_recording(bool on) override { linear_.set_recording(on); }
  void set_dropout_batch(uint64_t seed, int64_t first_sequence) override {
    dropout_seed_ = seed;
    first_sequence_ = first_sequence;
  }
  void embedding_forward(const float* emb_params, const int32_t* tokens, int64_t B, int64_t t) override;
  void block_forward(int layer, const float* block_params) override;
  // Final RMSNorm and the classifier: embed_tokens when tied (its gradient goes to emb_grads), else the head's
  // lm_head (to head_grads).
  double head_forward_backward(const float* head_params, const float* emb_params, const int32_t* targets, float dloss,
                               float* head_grads, float* emb_grads) override;
  double head_forward(const float* head_params, const float* emb_params, const int32_t* targets) override;
  void head_logits(const float* head_params, const float* emb_params, int64_t pos, std::vector<float>* logits) override;
  void block_backward(int layer, const float* block_params, float* block_grads) override;
  void embedding_backward(float* emb_grads) override;

 private:
  struct BlockActs {
    std::vector<float> norm1, rstd1, qkv, att, atty, res2, norm2, rstd2, gate_up, mlp;
  };
  const float* block_input(int layer) const;
  BlockActs& acts(int layer) { return blocks_[static_cast<size_t>(recompute_.set_of(layer))]; }
  int64_t slot(int layer) const { return recompute_.set_of(layer); }
  // The head's forward, and its backward when `backward`.
  double head_pass(const float* head_params, const float* emb_params, const int32_t* targets, float dloss,
                   float* head_grads, float* emb_grads, bool backward);
  // The classifier's weight [Vp, C] and where its gradient goes.
  const float* classifier(const float* head_params, const float* emb_params) const;

  ModelConfig cfg_;
  std::vector<UnitLayout> units_;
  int64_t max_batch_;
  Recompute recompute_;
  RopeTable rope_;
  int64_t B_ = 0, T_ = 0;
  std::vector<int32_t> tokens_;
  std::vector<float> encoded_;
  std::vector<BlockActs> blocks_;
  std::vector<std::vector<float>> block_out_;
  std::vector<float> normf_, rstdf_, losses_;
  // Backward scratch, shared by all blocks.
  std::vector<float> dresid_, dnormf_, dbuf_c_, dqkv_, dmlp_, dgate_up_, logits_chunk_;
  CpuLora lora_;      // the blocks' adapters (nothing without LoRA)
  CpuLinear linear_;  // the blocks' linear layers' GEMMs (train.fp8)
  uint64_t dropout_seed_ = 0;
  int64_t first_sequence_ = -1;
};

}  // namespace st
