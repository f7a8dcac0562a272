// GPT-2 decoding with a key/value cache on the CPU in fp32 (the Decoder of decoder.h): GptModel's forward
// (gpt_model.h), op for op, on the new positions only, their attention reading the cache
// (kernels/decode_attention.h). Positions come from wpe's rows pos .. pos + n - 1.
#pragma once

#include <cstdint>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/model/cpu_decoder_base.h"

namespace st {

class GptDecoder final : public CpuDecoderBase {
 public:
  // Without weights: load_unit gives them (decoder.h); stage: its stage of a layer split (decoder_stage.h).
  GptDecoder(const ModelConfig& cfg, int max_batch = 1, const DecoderStage& stage = {});

 protected:
  void embed(const int32_t* tokens, int64_t n, int64_t pos, float* x) override;
  void block(int layer, float* x, int64_t n, int64_t pos) override;
  void head(const float* x, float* logits) override;

 private:
  // Activations of the new positions (n rows), resized per call.
  std::vector<float> norm_, mean_, rstd_, qkv_, att_, fch_, fch_gelu_;
};

}  // namespace st
