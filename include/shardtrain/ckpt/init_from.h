// Starting a run from full weights instead of GPT-2's random initialisation (fine-tuning).
//
// `path` is a .safetensors file (from `shardtrain ckpt export`, or Hugging Face's own GPT-2
// model.safetensors, whose names lack the "transformer." prefix; F32, F16 or BF16) or an .h5 file with
// the same names (ckpt.export, `ckpt export --out x.h5`). Every GPT-2 tensor must be present with
// Hugging Face's shape (the error names the tensor, the file and both shapes); other tensors in the file
// (lm_head.weight, which is tied, or the attn.bias causal masks of old exports) are ignored. Each rank
// reads every tensor once and keeps only the part inside its own spans; AdamW moments stay zero.
//
// `path` may also be a Hugging Face llama or qwen2 model directory (model.safetensors, or shards listed by
// model.safetensors.index.json; F32, F16 or BF16, converted exactly): the tensors of
// model/llama/llama_hf.h, every one required with its Hugging Face shape (lm_head.weight only when untied; when
// tied it is ignored if present). Each rank reads only the elements inside its own spans, straight from the
// files. The model keys come from the directory's config.json (core/hf_config.h), applied by load_config.
#pragma once

#include <string>

#include "shardtrain/core/config.h"
#include "shardtrain/shard/model_backend.h"

namespace st {

void init_from_weights(const std::string& path, const ModelConfig& cfg, ModelBackend& model);

}  // namespace st
