// What the CPU decoders (GptDecoder, LlamaDecoder) share besides their activations: the unit list, the weights (every
// unit's full fp32 buffer, kept by the decoder), the key/value cache (kv_cache.h) and the forward, which runs the
// family's three parts (embed, block, head) over the hidden rows, and in a layer split (decoder_stage.h) receives and
// sends those rows between the stages. The CPU twin of CudaDecoderBase (cuda_decoder_base.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/model/decoder.h"
#include "shardtrain/model/kv_cache.h"
#include "shardtrain/model/units.h"

namespace st {

class CpuDecoderBase : public Decoder {
 public:
  std::string describe() const override { return "cpu/fp32"; }

 protected:
  // No weights until load_unit gives them; a cache of the stage's layers for each of max_batch sequences.
  CpuDecoderBase(const ModelConfig& cfg, int max_batch, const DecoderStage& stage);
  void use_sequence(int seq) override { seq_ = seq; }
  // The cache of the sequence forward() runs.
  KvCache& cache() { return caches_[static_cast<size_t>(seq_)]; }
  void store_unit(int u, std::vector<float>& values) override { w_[static_cast<size_t>(u)] = std::move(values); }

  // Unit u's weights.
  const float* unit(int u) const { return w_[static_cast<size_t>(u)].data(); }

  // The family's forward in three parts, over hidden rows x [n, n_embd]:
  // the embedding of n tokens at positions pos .. pos + n - 1 into x;
  virtual void embed(const int32_t* tokens, int64_t n, int64_t pos, float* x) = 0;
  // block `layer` on x in place, its keys and values appended to the current sequence's cache at pos ..;
  virtual void block(int layer, float* x, int64_t n, int64_t pos) = 0;
  // the final norm and the classifier on one row x [n_embd]: the logits over the padded vocabulary.
  virtual void head(const float* x, float* logits) = 0;

  // embed (or the rows from the previous stage), the stage's blocks, head on the last row (or the rows to the next
  // stage).
  void forward(const int32_t* tokens, int64_t n, int64_t pos, std::vector<float>* logits) final;
  // Row by row, each through every stage's blocks as one step does (bit for bit single steps), the rows crossing the
  // ranks of a split together.
  void forward_batch(const int32_t* tokens, const int32_t* positions, int n, std::vector<float>* logits) final;

  std::vector<UnitLayout> units_;
  std::vector<KvCache> caches_;
  int seq_ = 0;

 private:
  std::vector<std::vector<float>> w_;
  std::vector<float> x_;  // the hidden rows
};

}  // namespace st
