// Hugging Face's config.json for the llama family (model_type llama: LlamaForCausalLM; model_type qwen2:
// Qwen2ForCausalLM), read into model.* keys and written from them.
//
// When init.from names a directory, load_config() takes the model from DIR/config.json: every key that file
// determines is filled in, and a key the config file or the command line sets to another value is refused (exit 2)
// naming the key, both values and both sources. model.seq_len stays the run's; it may not exceed
// max_position_embeddings.
//
//   config.json field                      model key
//   model_type llama | qwen2               arch = llama (qwen2: qkv_bias = true)
//   hidden_size                            n_embd
//   num_hidden_layers                      n_layer
//   num_attention_heads                    n_head
//   num_key_value_heads                    n_kv_head (absent: num_attention_heads)
//   intermediate_size                      ffn_dim
//   vocab_size                             vocab_size
//   rope_theta                             rope_theta (absent: 10000)
//   rope_scaling {rope_type "llama3", ...} rope_scaling = llama3 and its four factors (null, absent or rope_type
//                                          "default": none; any other rope_type is refused)
//   rope_parameters {rope_theta, rope_type, ...}  the same, as transformers 5 writes it (a file with both forms
//                                          must agree)
//   rms_norm_eps                           rms_norm_eps (absent: 1e-6, as Hugging Face's)
//   tie_word_embeddings                    tie_embeddings (absent: false, as Hugging Face's)
//   attention_bias (llama)                 must be false: Hugging Face's also puts a bias on o_proj
// Refused, naming the field: head_dim other than hidden_size / num_attention_heads, hidden_act other than silu,
// mlp_bias true, use_sliding_window true, an architectures entry other than the model_type's class.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/core/config.h"

namespace st {

struct HfModelConfig {
  std::string path;                     // the config.json read
  std::string model_type;               // "llama" or "qwen2"
  ModelConfig model;                    // the fields config.json determines; the rest at their defaults
  std::vector<std::string> keys;        // those fields as keys: "model.arch", "model.n_layer", ...
  int64_t max_position_embeddings = 0;  // 0: absent
};

// Parses `path`; kBadInput naming the file and the field for anything missing, mistyped or unsupported.
HfModelConfig read_hf_config(const std::string& path);

// The config.json text for a llama-family model: LlamaForCausalLM, or Qwen2ForCausalLM when model.qkv_bias.
// max_position_embeddings is the model's seq_len; torch_dtype is "float32" or "bfloat16".
std::string hf_llama_config_json(const ModelConfig& model, const std::string& torch_dtype);

}  // namespace st
