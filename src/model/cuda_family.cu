#include "shardtrain/model/cuda_family.h"

#include "shardtrain/core/error.h"
#include "shardtrain/model/gpt2/cuda_gpt_decoder.h"
#include "shardtrain/model/gpt2/cuda_gpt_model.h"
#include "shardtrain/model/llama/cuda_llama_decoder.h"
#include "shardtrain/model/llama/cuda_llama_model.h"

namespace st {
namespace {

template <typename T, typename Model>
std::unique_ptr<CudaUnitModel<T>> make(const ModelConfig& cfg, int64_t max_batch, Recompute recompute,
                                       bool cudnn_attention, const gpu::GpuContext& ctx,
                                       gpu::CudnnBackwardMode attention_backward, const Fp8Policy& fp8) {
  return std::make_unique<Model>(cfg, max_batch, recompute, cudnn_attention, ctx, attention_backward, fp8);
}

template <typename T, typename D>
std::unique_ptr<Decoder> make_decoder(const ModelConfig& cfg, int device, int max_batch, const DecoderStage& stage) {
  return std::make_unique<D>(cfg, device, max_batch, stage);
}

}  // namespace

template <typename T>
const CudaModelFamily<T>& cuda_model_family(ModelArch arch) {
  static const CudaModelFamily<T> gpt2{ModelArch::kGpt2, &make<T, CudaGpt<T>>, &make_decoder<T, CudaGptDecoder<T>>};
  static const CudaModelFamily<T> llama{ModelArch::kLlama, &make<T, CudaLlama<T>>,
                                        &make_decoder<T, CudaLlamaDecoder<T>>};
  switch (arch) {
    case ModelArch::kGpt2:
      return gpt2;
    case ModelArch::kLlama:
      return llama;
  }
  ST_CHECK(false, "unknown model family ", static_cast<int>(arch));
}

template const CudaModelFamily<float>& cuda_model_family<float>(ModelArch);
template const CudaModelFamily<bf16>& cuda_model_family<bf16>(ModelArch);
template const CudaModelFamily<fp16>& cuda_model_family<fp16>(ModelArch);

}  // namespace st
