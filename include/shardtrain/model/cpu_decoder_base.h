// What the CPU decoders (GptDecoder, LlamaDecoder) share besides their activations: the unit list, the weights (every
// unit's full fp32 buffer, kept by the decoder) and the key/value cache (kv_cache.h). The CPU twin of
// CudaDecoderBase (cuda_decoder_base.h).
#pragma once

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
  // Checks the weights (check_decoder_weights) and keeps them.
  CpuDecoderBase(const ModelConfig& cfg, std::vector<std::vector<float>> weights);

  // Unit u's weights.
  const float* unit(int u) const { return w_[static_cast<size_t>(u)].data(); }

  std::vector<UnitLayout> units_;
  KvCache cache_;

 private:
  std::vector<std::vector<float>> w_;
};

}  // namespace st
