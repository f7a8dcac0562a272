// GPT-2 forward and backward, one unit at a time, on the CPU in fp32 (the numerical reference): the calls of
// UnitModel (unit_model.h) on GPT-2's units (units.h): LayerNorm, learned positions, GELU MLP, biases, and the LM
// head tied to wte.
#pragma once

#include <cstdint>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/model/cpu_linear.h"
#include "shardtrain/model/cpu_lora.h"
#include "shardtrain/model/recompute.h"
#include "shardtrain/model/unit_model.h"
#include "shardtrain/model/units.h"

namespace st {

class GptModel final : public UnitModel {
 public:
  // Allocates activations for micro-batches of up to max_batch sequences of cfg.seq_len tokens. A block that
  // recomputes (model/recompute.h) keeps only its output (the next block's input), and the recomputed blocks share
  // one block's worth of activations that block_backward refills by re-running that block's forward.
  GptModel(const ModelConfig& cfg, int64_t max_batch, Recompute recompute = false);

  // The bytes that constructor allocates (activations, backward scratch, the logits chunk), computed without
  // allocating: the CPU backend's memory plan (shard/memory_plan.h) counts them before the model exists.
  // Equals allocated_bytes() of the model it would build.
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
  void embedding_forward(const float* emb_params, const int32_t* tokens) {
    embedding_forward(emb_params, tokens, max_batch_, cfg_.seq_len);
  }
  void block_forward(int layer, const float* block_params) override;

  // Final LayerNorm and the classifier on wte (tied): its gradient goes to emb_grads.
  double head_forward_backward(const float* head_params, const float* emb_params, const int32_t* targets, float dloss,
                               float* head_grads, float* emb_grads) override;
  double head_forward(const float* head_params, const float* emb_params, const int32_t* targets) override;
  void head_logits(const float* head_params, const float* emb_params, int64_t pos, std::vector<float>* logits) override;
  void block_backward(int layer, const float* block_params, float* block_grads) override;
  // Accumulates wte and wpe grads into emb_grads.
  void embedding_backward(float* emb_grads) override;

 private:
  struct BlockActs {
    std::vector<float> ln1, ln1_mean, ln1_rstd, qkv, att, atty, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu;
  };
  const float* block_input(int layer) const;
  BlockActs& acts(int layer) { return blocks_[static_cast<size_t>(recompute_.set_of(layer))]; }
  int64_t slot(int layer) const { return recompute_.set_of(layer); }
  // The head's forward, and its backward when `backward`.
  double head_pass(const float* head_params, const float* emb_params, const int32_t* targets, float dloss,
                   float* head_grads, float* emb_grads, bool backward);

  ModelConfig cfg_;
  std::vector<UnitLayout> units_;
  int64_t max_batch_;
  Recompute recompute_;
  int64_t B_ = 0, T_ = 0;  // the active shape of the last embedding_forward
  std::vector<int32_t> tokens_;
  std::vector<float> encoded_;
  std::vector<BlockActs> blocks_;              // recompute_.sets(n_layer) of them
  std::vector<std::vector<float>> block_out_;  // each block's output: the next block's input
  std::vector<float> lnf_, lnf_mean_, lnf_rstd_, losses_;
  // Backward scratch, shared by all blocks.
  std::vector<float> dresid_, dlnf_, dbuf_c_, dqkv_, dfch_, logits_chunk_;
  CpuLora lora_;      // the blocks' adapters (nothing without LoRA)
  CpuLinear linear_;  // the blocks' linear layers' GEMMs (train.fp8)
  uint64_t dropout_seed_ = 0;
  int64_t first_sequence_ = -1;
};

}  // namespace st
