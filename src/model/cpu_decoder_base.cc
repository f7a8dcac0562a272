#include "shardtrain/model/cpu_decoder_base.h"

namespace st {

CpuDecoderBase::CpuDecoderBase(const ModelConfig& cfg, int max_batch)
    : Decoder(cfg, max_batch),
      units_(build_units(cfg)),
      caches_(static_cast<size_t>(max_batch), KvCache(cfg)),
      w_(units_.size()) {}

}  // namespace st
