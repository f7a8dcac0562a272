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
  // No weights until load_unit gives them.
  explicit CpuDecoderBase(const ModelConfig& cfg);
  void store_unit(int u, std::vector<float>& values) override { w_[static_cast<size_t>(u)] = std::move(values); }

  // Unit u's weights.
  const float* unit(int u) const { return w_[static_cast<size_t>(u)].data(); }

  std::vector<UnitLayout> units_;
  KvCache cache_;

 private:
  std::vector<std::vector<float>> w_;
};

}  // namespace st
