// A LoRA checkpoint in Hugging Face PEFT's adapter layout, which peft.PeftModel.from_pretrained(base, DIR) loads onto
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

}  // namespace st
