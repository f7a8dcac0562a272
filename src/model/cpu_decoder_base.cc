#include "shardtrain/model/cpu_decoder_base.h"

namespace st {

CpuDecoderBase::CpuDecoderBase(const ModelConfig& cfg)
    : Decoder(cfg), units_(build_units(cfg)), cache_(cfg), w_(units_.size()) {}

}  // namespace st
