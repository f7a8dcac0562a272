// config.json <-> model.* keys for the llama family. Every field is checked for its JSON type and range before it is
// used, so a mistyped file is refused naming the field rather than read as a default.
#include "shardtrain/core/hf_config.h"

#include <cmath>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

#include "config_ini.h"
#include "config_keys.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/excerpt.h"

namespace st {
namespace {

using nlohmann::json;

class Fields {
 public:
  Fields(const json& j, const std::string& path) : j_(j), path_(path) {}

  bool has(const char* name) const { return j_.contains(name) && !j_.at(name).is_null(); }

  [[noreturn]] void bad(const char* name, const std::string& why) const {
    ST_BAD_INPUT(path_, ": field ", name, " ", why);
  }

  // A positive integer that fits an int.
  int positive_int(const char* name) const {
    if (!has(name)) bad(name, "is missing (expected a positive integer)");
    const json& v = j_.at(name);
    if (!v.is_number_integer() || v.get<int64_t>() <= 0 || v.get<int64_t>() > std::numeric_limits<int>::max())
      bad(name, "is " + excerpt(v.dump()) + ", expected a positive integer below 2^31");
    return v.get<int>();
  }
  int positive_int_or(const char* name, int fallback) const { return has(name) ? positive_int(name) : fallback; }

  // A finite number that fits a float (the model keys are floats).
  float number(const char* name, const json& v) const {
    if (v.is_null()) bad(name, "is missing (expected a finite number)");
    if (!v.is_number() || !std::isfinite(v.get<double>()) ||
        std::fabs(v.get<double>()) > std::numeric_limits<float>::max())
      bad(name, "is " + excerpt(v.dump()) + ", expected a finite number");
    return static_cast<float>(v.get<double>());
  }
  float number_or(const char* name, float fallback) const { return has(name) ? number(name, j_.at(name)) : fallback; }

  bool boolean_or(const char* name, bool fallback) const {
    if (!has(name)) return fallback;
    if (!j_.at(name).is_boolean()) bad(name, "is " + excerpt(j_.at(name).dump()) + ", expected true or false");
    return j_.at(name).get<bool>();
  }

  std::string string(const char* name) const {
    if (!has(name)) bad(name, "is missing");
    if (!j_.at(name).is_string()) bad(name, "is " + excerpt(j_.at(name).dump()) + ", expected a string");
    return j_.at(name).get<std::string>();
  }

  const json& at(const char* name) const { return j_.at(name); }

 private:
  const json& j_;
  const std::string& path_;
};

// The class Hugging Face instantiates for each supported model_type.
const char* architecture_of(const std::string& model_type) {
  return model_type == "qwen2" ? "Qwen2ForCausalLM" : "LlamaForCausalLM";
}

// The shortest decimal that reads back to exactly `v` as a float, as a JSON number ("1e-05", not
// 9.999999747378752e-06), so that config.json reads as written and imports back to the same key value.
json float_json(float v) { return json::parse(config_internal::format_number(v)); }

}  // namespace

HfModelConfig read_hf_config(const std::string& path) {
  const std::string text = config_internal::read_config_file(path);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    ST_BAD_INPUT(path, ": not valid JSON: ", excerpt(e.what()));
  }
  if (!j.is_object()) ST_BAD_INPUT(path, ": expected a JSON object");
  const Fields f(j, path);

  HfModelConfig hf;
  hf.path = path;
  hf.model_type = f.string("model_type");
  if (hf.model_type != "llama" && hf.model_type != "qwen2")
    f.bad("model_type", "is '" + excerpt(hf.model_type) +
                            "': supported are llama (LlamaForCausalLM) and qwen2 (Qwen2ForCausalLM); a GPT-2 model is "
                            "loaded from its model.safetensors file");
  if (f.has("architectures")) {
    const json& a = f.at("architectures");
    if (!a.is_array()) f.bad("architectures", "is " + excerpt(a.dump()) + ", expected a list");
    for (const json& name : a)
      if (!name.is_string() || name.get<std::string>() != architecture_of(hf.model_type))
        f.bad("architectures", "holds " + excerpt(name.dump()) + "; model_type " + hf.model_type + " is " +
                                   architecture_of(hf.model_type));
  }

  ModelConfig& m = hf.model;
  m.arch = ModelArch::kLlama;
  m.n_embd = f.positive_int("hidden_size");
  m.n_layer = f.positive_int("num_hidden_layers");
  m.n_head = f.positive_int("num_attention_heads");
  m.n_kv_head = f.positive_int_or("num_key_value_heads", m.n_head);
  m.ffn_dim = f.positive_int("intermediate_size");
  m.vocab_size = f.positive_int("vocab_size");
  m.rope_theta = f.number_or("rope_theta", 10000.0f);
  m.rms_norm_eps = f.number_or("rms_norm_eps", 1e-6f);
  m.tie_embeddings = f.boolean_or("tie_word_embeddings", false);
  m.qkv_bias = hf.model_type == "qwen2";
  if (hf.model_type == "llama" && f.boolean_or("attention_bias", false))
    f.bad("attention_bias", "is true: Hugging Face's llama then has biases on q, k, v and o_proj; supported are "
                            "biases on q, k and v only (model_type qwen2)");
  if (f.boolean_or("mlp_bias", false)) f.bad("mlp_bias", "is true; the MLP has no biases here");
  if (f.boolean_or("use_sliding_window", false)) f.bad("use_sliding_window", "is true; attention here is full causal");
  if (f.has("hidden_act") && f.string("hidden_act") != "silu")
    f.bad("hidden_act", "is '" + excerpt(f.string("hidden_act")) + "', expected silu (SwiGLU)");
  if (f.has("head_dim")) {
    const int head_dim = f.positive_int("head_dim");
    if (m.n_embd % m.n_head != 0 || head_dim != m.n_embd / m.n_head)
      f.bad("head_dim", "is " + std::to_string(head_dim) + "; the head dimension here is hidden_size / " +
                            "num_attention_heads = " + std::to_string(m.n_embd) + " / " + std::to_string(m.n_head));
  }
  hf.max_position_embeddings = f.positive_int_or("max_position_embeddings", 0);

  hf.keys = {"model.arch",       "model.n_embd",     "model.n_layer",        "model.n_head",
             "model.n_kv_head",  "model.ffn_dim",    "model.vocab_size",     "model.rope_theta",
             "model.rms_norm_eps", "model.tie_embeddings", "model.qkv_bias", "model.rope_scaling"};
  // RoPE: transformers 4 writes rope_theta and rope_scaling {rope_type, factors} (null: none); transformers 5 writes
  // rope_parameters {rope_theta, rope_type, factors} instead. Either is read; a file with both must agree.
  auto read_rope = [&](const char* field, const json& rs, ModelConfig& out) {
    if (!rs.is_object()) f.bad(field, "is " + excerpt(rs.dump()) + ", expected an object or null");
    const Fields s(rs, path);
    const std::string prefix = std::string(field) + ".";
    auto number_at = [&](const char* key) {
      const std::string name = prefix + key;
      return s.number(name.c_str(), s.has(key) ? rs.at(key) : json());
    };
    if (s.has("rope_theta")) out.rope_theta = number_at("rope_theta");
    // Older files spell rope_type as "type".
    const char* type_field = s.has("rope_type") ? "rope_type" : "type";
    const std::string type = s.has(type_field) ? s.string(type_field) : std::string("default");
    out.rope_scaling = RopeScaling::kNone;
    if (type == "llama3") {
      out.rope_scaling = RopeScaling::kLlama3;
      out.rope_scaling_factor = number_at("factor");
      out.rope_scaling_low_freq_factor = number_at("low_freq_factor");
      out.rope_scaling_high_freq_factor = number_at("high_freq_factor");
      out.rope_scaling_original_max_position = s.positive_int("original_max_position_embeddings");
    } else if (type != "default") {
      f.bad(field, "has rope_type '" + excerpt(type) + "'; supported are llama3 and default (none)");
    }
  };
  m.rope_scaling = RopeScaling::kNone;
  if (f.has("rope_scaling")) read_rope("rope_scaling", f.at("rope_scaling"), m);
  if (f.has("rope_parameters")) {
    ModelConfig v5 = m;
    read_rope("rope_parameters", f.at("rope_parameters"), v5);
    const bool same = v5.rope_theta == m.rope_theta && v5.rope_scaling == m.rope_scaling &&
                      (m.rope_scaling == RopeScaling::kNone ||
                       (v5.rope_scaling_factor == m.rope_scaling_factor &&
                        v5.rope_scaling_low_freq_factor == m.rope_scaling_low_freq_factor &&
                        v5.rope_scaling_high_freq_factor == m.rope_scaling_high_freq_factor &&
                        v5.rope_scaling_original_max_position == m.rope_scaling_original_max_position));
    if ((f.has("rope_theta") || f.has("rope_scaling")) && !same)
      f.bad("rope_parameters", "disagrees with rope_theta / rope_scaling in the same file");
    m = v5;
  }
  if (m.rope_scaling == RopeScaling::kLlama3)
    hf.keys.insert(hf.keys.end(), {"model.rope_scaling_factor", "model.rope_scaling_low_freq_factor",
                                   "model.rope_scaling_high_freq_factor", "model.rope_scaling_original_max_position"});
  return hf;
}

std::string hf_llama_config_json(const ModelConfig& m, const std::string& torch_dtype) {
  const bool qwen2 = m.qkv_bias;
  nlohmann::ordered_json j;
  j["architectures"] = {qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM"};
  j["model_type"] = qwen2 ? "qwen2" : "llama";
  j["vocab_size"] = m.vocab_size;
  j["hidden_size"] = m.n_embd;
  j["intermediate_size"] = m.mlp_dim();
  j["num_hidden_layers"] = m.n_layer;
  j["num_attention_heads"] = m.n_head;
  j["num_key_value_heads"] = m.kv_heads();
  j["head_dim"] = m.head_dim();
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = m.seq_len;
  j["rms_norm_eps"] = float_json(m.rms_norm_eps);
  j["rope_theta"] = float_json(m.rope_theta);
  if (m.rope_scaling == RopeScaling::kLlama3) {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", float_json(m.rope_scaling_factor)},
                         {"low_freq_factor", float_json(m.rope_scaling_low_freq_factor)},
                         {"high_freq_factor", float_json(m.rope_scaling_high_freq_factor)},
                         {"original_max_position_embeddings", m.rope_scaling_original_max_position}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  if (qwen2) {
    j["use_sliding_window"] = false;
  } else {
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
  }
  j["attention_dropout"] = 0.0;
  j["initializer_range"] = 0.02;
  j["tie_word_embeddings"] = m.tie_embeddings;
  j["use_cache"] = true;
  j["torch_dtype"] = torch_dtype;
  return j.dump(2) + "\n";
}

}  // namespace st
