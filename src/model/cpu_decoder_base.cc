#include "shardtrain/model/cpu_decoder_base.h"

namespace st {

CpuDecoderBase::CpuDecoderBase(const ModelConfig& cfg, std::vector<std::vector<float>> weights)
    : Decoder(cfg), units_(build_units(cfg)), cache_(cfg), w_(std::move(weights)) {
  check_decoder_weights(cfg, w_);
}

}  // namespace st
