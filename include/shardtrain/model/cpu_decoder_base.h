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
  // No weights until load_unit gives them; a cache for each of max_batch sequences.
  CpuDecoderBase(const ModelConfig& cfg, int max_batch);
  void use_sequence(int seq) override { seq_ = seq; }
  // The cache of the sequence forward() runs.
  KvCache& cache() { return caches_[static_cast<size_t>(seq_)]; }
  void store_unit(int u, std::vector<float>& values) override { w_[static_cast<size_t>(u)] = std::move(values); }

  // Unit u's weights.
  const float* unit(int u) const { return w_[static_cast<size_t>(u)].data(); }

  std::vector<UnitLayout> units_;
  std::vector<KvCache> caches_;
  int seq_ = 0;

 private:
  std::vector<std::vector<float>> w_;
};

}  // namespace st
