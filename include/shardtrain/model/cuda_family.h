// The CUDA side of ModelFamily (family.h): per family, its GPU model and its GPU decoder (the device memory that
// model needs is host arithmetic: cuda_footprint.h). Apart from family.h so that CPU-only builds
// see no CUDA type.
//
//   const CudaModelFamily<bf16>& f = cuda_model_family<bf16>(cfg.model.arch);
//   const CudaModelFootprint need =
//       cuda_model_footprint(cfg.model, B, recompute, DType::kBF16, attention.scratch_bytes);  // cuda_footprint.h
//   std::unique_ptr<CudaUnitModel<bf16>> m = f.make_model(cfg.model, B, recompute, attention.cudnn, ctx,
//                                                         attention.backward, Fp8Policy{});
//                                                         // ctx.scratch >= need.scratch_bytes
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/kernels/gpu/context.h"
#include "shardtrain/kernels/gpu/cudnn_attention.h"
#include "shardtrain/model/cuda_unit_model.h"
#include "shardtrain/model/decoder.h"

namespace st {

template <typename T>
struct CudaModelFamily {
  ModelArch arch;
  // The model for micro-batches of up to max_batch sequences. With cudnn_attention, passes at the full shape
  // (max_batch x seq_len) run cuDNN's fused attention (ctx.cudnn, plans already built), others flash attention;
  // attention_backward picks cuDNN's deterministic backward or not; fp8, the precision of the blocks' linear layers
  // (train.fp8's policy, model/fp8_policy.h; Fp8Policy{}: the compute type). ctx must outlive the model.
  std::unique_ptr<CudaUnitModel<T>> (*make_model)(const ModelConfig& cfg, int64_t max_batch, Recompute recompute,
                                                  bool cudnn_attention, const gpu::GpuContext& ctx,
                                                  gpu::CudnnBackwardMode attention_backward, const Fp8Policy& fp8);
  // The decoder with a key/value cache for each of max_batch sequences (decoder.h) on CUDA device `device`, without
  // weights yet: load_unit rounds each unit's fp32 buffer to T. stage: its stage of a layer split (decoder_stage.h).
  std::unique_ptr<Decoder> (*make_decoder)(const ModelConfig& cfg, int device, int max_batch,
                                           const DecoderStage& stage);
};

template <typename T>
const CudaModelFamily<T>& cuda_model_family(ModelArch arch);

}  // namespace st
