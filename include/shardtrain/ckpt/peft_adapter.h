// LoRA adapters in and out of Hugging Face PEFT's adapter layout: a LoRA checkpoint exported as one, and a run's
// adapters started from one (lora.from). The layout, which peft.PeftModel.from_pretrained(base, DIR) loads onto
// the transformers model of the same base:
//   adapter_config.json        peft_type LORA, task_type CAUSAL_LM, r, lora_alpha, lora_dropout, use_rslora,
//                              target_modules (the Hugging Face modules: self_attn.q_proj, ..., attn.c_attn),
//                              base_model_name_or_path (the run's init.from), bias none; fan_in_fan_out for GPT-2's
//                              Conv1D layers
//   adapter_model.safetensors  F32, per adapted module of each layer L:
//                              base_model.model.model.layers.L.<module>.lora_A.weight [r, in] and .lora_B.weight
//                              [out, r] (GPT-2: base_model.model.transformer.h.L.<module>...)
// (The merged model, the base with every adapter added in, is what `ckpt export --out` writes for a LoRA checkpoint:
// tools.h.)
#pragma once

#include <cstdint>
#include <string>

#include "shardtrain/ckpt/manifest.h"
#include "shardtrain/core/config.h"
#include "shardtrain/shard/model_backend.h"

namespace st {

struct AdapterExportReport {
  std::string dir;
  int tensors = 0;
  int64_t bytes = 0;  // adapter_model.safetensors
};

// Writes the checkpoint's adapters into out_dir, which must be new or empty (its parent must exist), renamed into
// place once complete. kBadInput for a checkpoint without LoRA.
AdapterExportReport export_peft_adapter(const std::string& step_dir, const std::string& out_dir);

// adapter_config.json's text for a LoRA checkpoint's manifest.
std::string peft_adapter_config_json(const Manifest& m);

// Loads the adapters of PEFT adapter directory `dir` into `model` (collective over model.comm(); each rank reads the
// elements of its own spans). adapter_config.json must be a LORA adapter whose r, lora_alpha, use_rslora and
// target_modules (each a module of cfg's targets, by its full name or its last part: "self_attn.q_proj" or "q_proj")
// are cfg.lora's; adapter_model.safetensors must hold exactly the A and B of every adapted module of every layer with
// their shapes, in F32, F16 or BF16. kBadInput naming the file, the field or tensor, expected and actual.
void load_peft_adapter(const std::string& dir, const ModelConfig& cfg, ModelBackend& model);

}  // namespace st
