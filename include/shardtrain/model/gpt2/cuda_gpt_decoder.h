// GPT-2 decoding with a key/value cache on one GPU (the Decoder of decoder.h): GptDecoder's forward (gpt_decoder.h),
// op for op, in the compute type T (float, bf16 or fp16) with the CUDA kernels of CudaGpt (cuda_gpt_model.h), the
// attention reading the cache through gpu::decode_attention. Activations for up to seq_len new positions are
// allocated once.
#pragma once

#include <cstdint>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/core/cuda.h"
#include "shardtrain/model/cuda_decoder_base.h"

namespace st {

template <typename T>
class CudaGptDecoder final : public CudaDecoderBase<T> {
 public:
  // Without weights (load_unit gives them, decoder.h), for max_batch sequences of a stage of a layer split
  // (decoder_stage.h; {}: the whole model); `device` becomes the current CUDA device.
  CudaGptDecoder(const ModelConfig& cfg, int device, int max_batch = 1, const DecoderStage& stage = {});

 protected:
  void embed(const int32_t* tokens, const int32_t* positions, int64_t n) override;
  void block(int layer, const int32_t* positions, int64_t n, bool batch) override;
  void head(int64_t first, int64_t rows) override;

 private:
  DeviceBuffer<T> norm_, qkv_, att_, fch_, fch_gelu_;  // [seq_len rows]
  DeviceBuffer<float> mean_, rstd_;
};

}  // namespace st
