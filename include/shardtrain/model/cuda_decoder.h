// The GPU decoders (decoder.h) by compute type, for make_decoder: CudaGptDecoder and CudaLlamaDecoder
// (cuda_decoder_base.h), through cuda_model_family(). Free of CUDA types, so that decoder.cc can call it; built only
// with the CUDA backend.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/model/decoder.h"

namespace st {

// The decoder of model's family on CUDA device `device` in `dtype` (kF32, kBF16 or kF16), without weights yet
// (load_unit rounds each unit's fp32 buffer to dtype), holding max_batch sequences; stage: its stage of a layer split
// (decoder_stage.h; {}: the whole model). kBadInput when no such device is visible.
std::unique_ptr<Decoder> make_cuda_decoder(const ModelConfig& model, DType dtype, int device, int max_batch = 1,
                                           const DecoderStage& stage = {});

// The free memory of CUDA device `device` and its name (kBadInput when it is not visible), for the decoder's memory
// check before it allocates.
int64_t cuda_device_free_bytes(int device);
std::string cuda_device_name_of(int device);

}  // namespace st
