// Starting a run from full weights instead of GPT-2's random initialisation (fine-tuning).
//
// `path` is a .safetensors file (from `shardtrain ckpt export`, or Hugging Face's own GPT-2
// model.safetensors, whose names lack the "transformer." prefix; F32, F16 or BF16) or an .h5 file with
// the same names (ckpt.export, `ckpt export --out x.h5`). Every GPT-2 tensor must be present with
// Hugging Face's shape (the error names the tensor, the file and both shapes). Each rank reads every tensor once
// and keeps only the part inside its own spans; AdamW moments stay zero.
//
// `path` may also be a Hugging Face llama or qwen2 model directory (model.safetensors, or shards listed by
// model.safetensors.index.json; F32, F16 or BF16, converted exactly): the tensors of model/llama/llama_hf.h, every
// one required with its Hugging Face shape, lm_head.weight among them when untied. The embedding's shape must be
// config.json's [vocab_size, hidden_size] (the error names config.json and the tensor's shape). Each rank reads only
// the elements inside its own spans, straight from the files. The model keys come from the directory's config.json
// (core/hf_config.h), applied by load_config.
//
// Nothing in the files goes unused, and nothing non-finite is loaded (both kBadInput, before step 1):
//  * every tensor of the file(s) must be one the model loads, except rotary caches
//    (model.rotary_emb.inv_freq, model.layers.N.self_attn.rotary_emb.inv_freq), GPT-2's causal-mask buffers
//    ([transformer.]h.N.attn.bias and .attn.masked_bias), both only for layers N the model has, and lm_head.weight
//    where the model ties it to the embedding, which must then be an exact copy of the embedding (compared value by
//    value). Anything else is refused naming the first few tensors and their count (a config.json with fewer
//    layers than the files: the layers it would drop);
//  * a NaN or infinity in any tensor is refused naming the tensor, its file, the first such element and its value.
//    The check runs on the host data as read, before its unit is pushed (a unit with such a value is not), so it
//    holds for every backend. Ranks that read different parts agree through one all-reduce over model.comm(), so
//    every rank refuses alike.
// The state goes through the host one unit at a time (HostViews::pull_unit / push_unit, in the tensor map's order):
// a device backend holds one unit's host view at once, besides what the reader needs for one tensor.
// A path that does not exist is refused as such ("no such file or directory"), whatever its suffix. Headers are
// validated by SafetensorsReader (no overlapping or unindexed bytes) and, for .h5, h5_check_disjoint.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/kernels/adamw_host.h"
#include "shardtrain/shard/host_views.h"

namespace st {

// Loads the weights into `model`'s views: a backend's shards, or one process's full weights (collective over
// model.comm(): every rank calls it).
void init_from_weights(const std::string& path, const ModelConfig& cfg, HostViews& model);

// A llama-family directory's weights for a decoder that keeps them in 16-bit `kind` (bf16 or fp16; model.lora off):
// each unit of cfg's list that `held` names (empty: every unit), in order, as its full flat buffer in `kind`, handed
// to `sink`. A tensor stored in `kind` is copied as its bits, any other rounded (round_to_half), and the elements
// the directory does not hold (the vocabulary's padding rows) are drawn from `seed` and rounded: what
// init_from_weights loads, rounded to `kind`, without the fp32 buffers. The same checks and refusals as
// init_from_weights, for one process; a value's refusal comes when its unit is read and the tied head's after every
// unit, so units handed to `sink` before it are the caller's to drop.
using HalfUnitSink = std::function<void(int unit, const std::vector<uint16_t>& values)>;
void init_from_hf_dir_half(const std::string& dir, const ModelConfig& cfg, uint64_t seed, HalfKind kind,
                           const std::vector<bool>& held, const HalfUnitSink& sink);

// Everything the headers of a llama-family directory show, without reading tensor data or building a model: the
// embedding against config.json's vocab_size and hidden_size, every tensor's presence, shape and dtype, and no
// unused tensor. Anything but a directory for a llama model is left to init_from_weights, which runs only when the
// run does not resume (a directory's config.json has set the model already, resumed or not). Called before the data
// is opened, so that a config.json that disagrees with its own weights is named as such rather than through the
// data's token ids.
void check_init_from(const std::string& path, const ModelConfig& cfg);

}  // namespace st
