// Llama decoding with a key/value cache on one GPU (the Decoder of decoder.h): LlamaDecoder's forward
// (llama_decoder.h), op for op, in the compute type T (float, bf16 or fp16) with the CUDA kernels of CudaLlama
// (cuda_llama_model.h): RoPE from rows pos .. of the device tables, the grouped-query attention reading the cache
// through gpu::decode_attention. Activations for up to seq_len new positions are allocated once.
#pragma once

#include <cstdint>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/core/cuda.h"
#include "shardtrain/model/cuda_decoder_base.h"

namespace st {

template <typename T>
class CudaLlamaDecoder final : public CudaDecoderBase<T> {
 public:
  // Without weights (load_unit gives them, decoder.h); `device` becomes the current CUDA device.
  CudaLlamaDecoder(const ModelConfig& cfg, int device);

 protected:
  void forward(const int32_t* tokens, int64_t n, int64_t pos, std::vector<float>* logits) override;
  void forward_step(const int32_t* token, const int32_t* pos) override;

 private:
  // n tokens at the positions in device memory (a prompt's pos .. pos + n - 1, or a step's one), through the
  // classifier of the last into the logits row; never synchronises, so that a step can be captured.
  void run(const int32_t* tokens, const int32_t* positions, int64_t n);

 private:
  DeviceBuffer<float> rope_cos_, rope_sin_;               // [seq_len, hs/2]
  DeviceBuffer<T> x_, norm_, qkv_, att_, gate_up_, mlp_;  // [seq_len rows]
  DeviceBuffer<float> rstd_;
};

}  // namespace st
