// What differs between model families, in one place per family: src/model/gpt2/ and src/model/llama/ each define
// their unit list (tensor layout, initialisation, weight-decay rule), their CPU model, their CPU decoder, their FLOP
// count and the linear layers LoRA can target. The engine (sharding, schedules, collectives, offload, checkpoints, the
// memory plan) sees only the unit list and the UnitModel calls, and so is the same for every family. The GPU side of a
// family (its CUDA model, that model's device footprint and its CUDA decoder) is cuda_model_family() in cuda_family.h,
// apart so that CPU-only builds see no CUDA type.
//
//   const ModelFamily& f = model_family(cfg.model.arch);
//   std::vector<UnitLayout> units = f.build_units(cfg.model);
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/model/decoder.h"
#include "shardtrain/model/lora.h"
#include "shardtrain/model/recompute.h"
#include "shardtrain/model/unit_model.h"
#include "shardtrain/model/units.h"

namespace st {

struct ModelFamily {
  ModelArch arch;
  const char* name;  // as model.arch spells it, and as checkpoints record it
  // The unit list: embedding, n_layer blocks, head (units.h).
  std::vector<UnitLayout> (*build_units)(const ModelConfig& cfg);
  // P in the FLOP count 6 P + 6 L C T per token (train/mfu.h). gpt2: every parameter (llm.c's convention); llama:
  // the parameters of matrix products, the embedding lookup excluded and a tied head counted once (the convention
  // of Hugging Face / torchtitan peers).
  int64_t (*flop_params)(const ModelConfig& cfg);
  // The CPU fp32 model, and the bytes it would allocate (for the memory plan, before it exists).
  std::unique_ptr<UnitModel> (*make_cpu_model)(const ModelConfig& cfg, int64_t max_batch, Recompute recompute);
  int64_t (*cpu_footprint_bytes)(const ModelConfig& cfg, int64_t max_batch, Recompute recompute);
  // The CPU fp32 decoder with a key/value cache for each of max_batch sequences (decoder.h), without weights yet
  // (load_unit or load_decoder); stage: its stage of a layer split (decoder_stage.h; {}: the whole model).
  std::unique_ptr<Decoder> (*make_cpu_decoder)(const ModelConfig& cfg, int max_batch, const DecoderStage& stage);
  // The linear layers of a block that LoRA can target (model/lora.h), in the family's order.
  std::vector<LoraLinear> (*lora_linears)(const ModelConfig& cfg);
};

const ModelFamily& model_family(ModelArch arch);
const ModelFamily& gpt2_family();
const ModelFamily& llama_family();

}  // namespace st
