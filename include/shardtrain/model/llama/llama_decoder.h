// Llama decoding with a key/value cache on the CPU in fp32 (the Decoder of decoder.h): LlamaModel's forward
// (llama_model.h), op for op, on the new positions only: RoPE turns their q and k by the angles of positions pos ..
// pos + n - 1 (rows pos .. of the model's table), and their grouped-query attention reads the cache
// (kernels/decode_attention.h).
#pragma once

#include <cstdint>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/kernels/rope.h"
#include "shardtrain/model/cpu_decoder_base.h"

namespace st {

class LlamaDecoder final : public CpuDecoderBase {
 public:
  // Without weights: load_unit gives them (decoder.h); stage: its stage of a layer split (decoder_stage.h).
  LlamaDecoder(const ModelConfig& cfg, int max_batch = 1, const DecoderStage& stage = {});

 protected:
  void embed(const int32_t* tokens, int64_t n, int64_t pos, float* x) override;
  void block(int layer, float* x, int64_t n, int64_t pos) override;
  void head(const float* x, float* logits) override;

 private:
  RopeTable rope_;  // [seq_len, hs/2]
  // Activations of the new positions (n rows), resized per call.
  std::vector<float> norm_, rstd_, qkv_, att_, gate_up_, mlp_;
};

}  // namespace st
