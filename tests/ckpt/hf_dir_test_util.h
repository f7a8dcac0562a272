// Small Hugging Face llama-family model directories written byte by byte for the tests (config.json by hand,
// safetensors files per the format's specification, independent of the writer under test), and what they hold.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "shardtrain/model/units.h"

namespace st::testing {

namespace fs = std::filesystem;

constexpr int kLayers = 2, kHidden = 32, kHeads = 4, kFfn = 48, kVocab = 300;  // vocab padded to 384

struct Variant {
  bool tied = true;
  bool qwen2 = false;  // q/k/v biases
  int kv_heads = 2;
  bool llama3 = false;
  int files = 1;  // > 1: an index over that many files
  std::string dtype = "F32";
};

// One tensor as written: raw little-endian bytes in its dtype and the exact fp32 values they hold.
struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
  std::string raw;
  std::vector<float> values;
};

// Deterministic values exact in the dtype, magnitudes 2^-10 .. 2^3, both signs.
inline Tensor make_tensor(const std::string& name, std::vector<int64_t> shape, const std::string& dtype, uint32_t salt) {
  Tensor t{name, std::move(shape), {}, {}};
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ (salt * 0x9e3779b9u);
    x ^= x >> 15;
    x *= 0x85ebca6bu;
    x ^= x >> 13;
    const uint32_t sign = x >> 31, exp = 117 + (x >> 8) % 13;  // fp32 exponent 2^-10 .. 2^2
    uint32_t bits;
    if (dtype == "BF16") {
      bits = sign << 31 | exp << 23 | (x & 0x7fu) << 16;
      const uint16_t h = static_cast<uint16_t>(bits >> 16);
      t.raw.append(reinterpret_cast<const char*>(&h), 2);
    } else if (dtype == "F16") {
      bits = sign << 31 | exp << 23 | (x & 0x3ffu) << 13;
      const uint16_t h = static_cast<uint16_t>(sign << 15 | (exp - 127 + 15) << 10 | (x & 0x3ffu));
      t.raw.append(reinterpret_cast<const char*>(&h), 2);
    } else {
      bits = sign << 31 | exp << 23 | (x & 0x7fffffu);
      t.raw.append(reinterpret_cast<const char*>(&bits), 4);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    t.values.push_back(f);
  }
  return t;
}

// A safetensors file written byte by byte as the format's specification says, independent of the writer under test.
inline void write_safetensors(const std::string& path, const std::vector<const Tensor*>& tensors, const std::string& dtype) {
  nlohmann::ordered_json h;
  size_t at = 0;
  for (const Tensor* t : tensors) {
    h[t->name] = {{"dtype", dtype}, {"shape", t->shape}, {"data_offsets", {at, at + t->raw.size()}}};
    at += t->raw.size();
  }
  const std::string header = h.dump();
  const uint64_t n = header.size();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header;
  for (const Tensor* t : tensors) out << t->raw;
}

inline std::string config_json(const Variant& v) {
  nlohmann::ordered_json j;
  j["architectures"] = {v.qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM"};
  j["model_type"] = v.qwen2 ? "qwen2" : "llama";
  j["hidden_size"] = kHidden;
  j["num_hidden_layers"] = kLayers;
  j["num_attention_heads"] = kHeads;
  j["num_key_value_heads"] = v.kv_heads;
  j["intermediate_size"] = kFfn;
  j["vocab_size"] = kVocab;
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = 64;
  j["rope_theta"] = 500000.0;
  j["rms_norm_eps"] = 1e-05;
  j["tie_word_embeddings"] = v.tied;
  j["torch_dtype"] = "bfloat16";
  if (v.llama3)
    j["rope_scaling"] = {{"factor", 32.0}, {"high_freq_factor", 4.0}, {"low_freq_factor", 1.0},
                         {"original_max_position_embeddings", 16}, {"rope_type", "llama3"}};
  else
    j["rope_scaling"] = nullptr;
  return j.dump(2);
}

// The directory's tensors, named and shaped as Hugging Face's (written out here, not taken from the code under test).
inline std::vector<Tensor> hf_tensors(const Variant& v) {
  const int64_t C = kHidden, D = kHidden / kHeads, KV = v.kv_heads;
  std::vector<Tensor> out;
  uint32_t salt = 1;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    out.push_back(make_tensor(name, std::move(shape), v.dtype, salt++));
  };
  add("model.embed_tokens.weight", {kVocab, C});
  for (int l = 0; l < kLayers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {C});
    add(p + "self_attn.q_proj.weight", {C, C});
    add(p + "self_attn.k_proj.weight", {KV * D, C});
    add(p + "self_attn.v_proj.weight", {KV * D, C});
    if (v.qwen2) {
      add(p + "self_attn.q_proj.bias", {C});
      add(p + "self_attn.k_proj.bias", {KV * D});
      add(p + "self_attn.v_proj.bias", {KV * D});
    }
    add(p + "self_attn.o_proj.weight", {C, C});
    add(p + "post_attention_layernorm.weight", {C});
    add(p + "mlp.gate_proj.weight", {kFfn, C});
    add(p + "mlp.up_proj.weight", {kFfn, C});
    add(p + "mlp.down_proj.weight", {C, kFfn});
  }
  add("model.norm.weight", {C});
  if (!v.tied) add("lm_head.weight", {kVocab, C});
  return out;
}

// Writes the directory; with v.files > 1 the tensors go round-robin into that many files and an index.
inline std::vector<Tensor> write_hf_dir(const std::string& dir, const Variant& v) {
  fs::create_directories(dir);
  std::vector<Tensor> tensors = hf_tensors(v);
  std::ofstream(dir + "/config.json") << config_json(v);
  if (v.files == 1) {
    std::vector<const Tensor*> all;
    for (const Tensor& t : tensors) all.push_back(&t);
    write_safetensors(dir + "/model.safetensors", all, v.dtype);
    return tensors;
  }
  nlohmann::json index;
  index["metadata"] = {{"total_size", 0}};
  std::vector<std::vector<const Tensor*>> files(static_cast<size_t>(v.files));
  for (size_t i = 0; i < tensors.size(); ++i) files[i % files.size()].push_back(&tensors[i]);
  for (size_t f = 0; f < files.size(); ++f) {
    const std::string name = "model-0000" + std::to_string(f + 1) + "-of-0000" + std::to_string(v.files) + ".safetensors";
    write_safetensors(dir + "/" + name, files[f], v.dtype);
    for (const Tensor* t : files[f]) index["weight_map"][t->name] = name;
  }
  std::ofstream(dir + "/model.safetensors.index.json") << index.dump();
  return tensors;
}

inline const Tensor& find(const std::vector<Tensor>& ts, const std::string& name) {
  for (const Tensor& t : ts)
    if (t.name == name) return t;
  ADD_FAILURE() << "no tensor " << name;
  return ts.front();
}

// The model's full unit buffers the directory should load into: our layout filled from the HF tensors.
inline std::vector<std::vector<float>> expected_units(const std::vector<UnitLayout>& units, const std::vector<Tensor>& ts,
                                               const ModelConfig& m) {
  std::vector<std::vector<float>> out;
  for (const UnitLayout& u : units) {
    std::vector<float> buf(static_cast<size_t>(u.numel), 0.0f);
    // Concatenates the named HF tensors into our tensor `ours`.
    auto put = [&](const std::string& ours, const std::vector<std::string>& hf) {
      size_t at = static_cast<size_t>(u.tensor(ours).offset);
      for (const std::string& name : hf) {
        const Tensor& t = find(ts, name);
        std::copy(t.values.begin(), t.values.end(), buf.begin() + static_cast<std::ptrdiff_t>(at));
        at += t.values.size();
      }
    };
    if (u.kind == UnitKind::kEmbedding) put("embed_tokens", {"model.embed_tokens.weight"});
    if (u.kind == UnitKind::kHead) {
      put("norm.weight", {"model.norm.weight"});
      if (!m.tie_embeddings) put("lm_head", {"lm_head.weight"});
    }
    if (u.kind == UnitKind::kBlock) {
      const std::string p = "model.layers." + std::to_string(u.layer) + ".";
      put("attn_norm.weight", {p + "input_layernorm.weight"});
      put("attn.qkv.weight", {p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight", p + "self_attn.v_proj.weight"});
      if (m.qkv_bias)
        put("attn.qkv.bias", {p + "self_attn.q_proj.bias", p + "self_attn.k_proj.bias", p + "self_attn.v_proj.bias"});
      put("attn.o.weight", {p + "self_attn.o_proj.weight"});
      put("mlp_norm.weight", {p + "post_attention_layernorm.weight"});
      put("mlp.gate_up.weight", {p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"});
      put("mlp.down.weight", {p + "mlp.down_proj.weight"});
    }
    out.push_back(std::move(buf));
  }
  return out;
}

// The raw data bytes of every tensor of a Hugging Face directory (any number of files), by name.
inline std::map<std::string, std::string> tensor_bytes(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    std::ifstream in(e.path(), std::ios::binary);
    const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    uint64_t n = 0;
    std::memcpy(&n, file.data(), 8);
    const nlohmann::json h = nlohmann::json::parse(file.substr(8, n));
    for (auto it = h.begin(); it != h.end(); ++it) {
      if (it.key() == "__metadata__") continue;
      const auto off = it.value().at("data_offsets").get<std::vector<size_t>>();
      out[it.key()] = it.value().at("dtype").get<std::string>() + ":" + file.substr(8 + n + off[0], off[1] - off[0]);
    }
  }
  return out;
}

}  // namespace st::testing
