// Hugging Face llama-family directories: init.from reads them (config.json into model keys, per-rank slices of the
// tensors) and `ckpt export` writes them; import then export is bit-identical.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt_test_util.h"
#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/ckpt/init_from.h"
#include "shardtrain/ckpt/safetensors_reader.h"
#include "shardtrain/ckpt/tools.h"
#include "shardtrain/comm/fake_communicator.h"
#include "shardtrain/core/hf_config.h"
#include "shardtrain/train/step_engine.h"

namespace fs = std::filesystem;

namespace st {
namespace {

using testing::bad_input_message;
using testing::contains;

constexpr int kLayers = 2, kHidden = 32, kHeads = 4, kFfn = 48, kVocab = 200;  // vocab padded to 256

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
Tensor make_tensor(const std::string& name, std::vector<int64_t> shape, const std::string& dtype, uint32_t salt) {
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
void write_safetensors(const std::string& path, const std::vector<const Tensor*>& tensors, const std::string& dtype) {
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

std::string config_json(const Variant& v) {
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
std::vector<Tensor> hf_tensors(const Variant& v) {
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
std::vector<Tensor> write_hf_dir(const std::string& dir, const Variant& v) {
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

const Tensor& find(const std::vector<Tensor>& ts, const std::string& name) {
  for (const Tensor& t : ts)
    if (t.name == name) return t;
  ADD_FAILURE() << "no tensor " << name;
  return ts.front();
}

// The model's full unit buffers the directory should load into: our layout filled from the HF tensors.
std::vector<std::vector<float>> expected_units(const std::vector<UnitLayout>& units, const std::vector<Tensor>& ts,
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
std::map<std::string, std::string> tensor_bytes(const std::string& dir) {
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

class HfLlamaTest : public ::testing::Test {
 protected:
  void SetUp() override { omp_set_num_threads(1); }

  Config config_for(const std::string& hf_dir, std::vector<std::string> extra = {}) {
    std::vector<std::string> o = {"--init.from=" + hf_dir, "--model.seq_len=16", "--train.micro_batch=1",
                                  "--train.global_batch=6"};
    o.insert(o.end(), extra.begin(), extra.end());
    return load_config(std::nullopt, o);
  }

  // Loads the directory at `world` ranks, checks the gathered model against `want`, and saves a checkpoint under
  // ckpt_dir; returns its step directory.
  std::string load_and_save(const Config& cfg, int world, const std::vector<std::vector<float>>& want,
                            const std::string& ckpt_dir) {
    Config c = cfg;
    c.ckpt.dir = ckpt_dir;
    std::string where;
    fake::spawn(world, [&](Communicator& comm) {
      StepEngine e(c, comm);
      init_from_weights(c.init.from, c.model, e.sharded());
      const auto full = e.gather_params();
      CheckpointState cs;
      cs.step = 1;
      const std::string w = save_checkpoint(c, e.sharded(), cs, comm);
      if (comm.rank() != 0) return;
      where = w;
      ASSERT_EQ(full.size(), want.size());
      for (size_t u = 0; u < want.size(); ++u)
        EXPECT_EQ(testing::bits(full[u]), testing::bits(want[u])) << "unit " << u << ", world " << world;
    });
    return where;
  }

  testing::TempDir dir_;
};

TEST_F(HfLlamaTest, ConfigJsonFillsTheModelKeys) {
  Variant v;
  v.tied = false;
  v.qwen2 = true;
  v.llama3 = true;
  write_hf_dir(dir_.file("hf"), v);
  const Config c = config_for(dir_.file("hf"));
  EXPECT_EQ(c.model.arch, ModelArch::kLlama);
  EXPECT_EQ(c.model.n_layer, kLayers);
  EXPECT_EQ(c.model.n_embd, kHidden);
  EXPECT_EQ(c.model.n_head, kHeads);
  EXPECT_EQ(c.model.n_kv_head, 2);
  EXPECT_EQ(c.model.ffn_dim, kFfn);
  EXPECT_EQ(c.model.vocab_size, kVocab);
  EXPECT_EQ(c.model.seq_len, 16);  // the run's, not max_position_embeddings
  EXPECT_EQ(c.model.rope_theta, 500000.0f);
  EXPECT_EQ(c.model.rms_norm_eps, 1e-5f);
  EXPECT_FALSE(c.model.tie_embeddings);
  EXPECT_TRUE(c.model.qkv_bias);
  EXPECT_EQ(c.model.rope_scaling, RopeScaling::kLlama3);
  EXPECT_EQ(c.model.rope_scaling_factor, 32.0f);
  EXPECT_EQ(c.model.rope_scaling_low_freq_factor, 1.0f);
  EXPECT_EQ(c.model.rope_scaling_high_freq_factor, 4.0f);
  EXPECT_EQ(c.model.rope_scaling_original_max_position, 16);
  // A key set to config.json's own value is accepted.
  EXPECT_EQ(config_for(dir_.file("hf"), {"--model.n_kv_head=2", "--model.arch=llama"}).model.n_kv_head, 2);
}

TEST_F(HfLlamaTest, AKeySetToAnotherValueIsRefusedNamingBothSources) {
  write_hf_dir(dir_.file("hf"), Variant{});
  const std::string json = dir_.file("hf") + "/config.json";
  std::string msg = bad_input_message([&] { config_for(dir_.file("hf"), {"--model.n_kv_head=4"}); });
  EXPECT_TRUE(contains(msg, "model.n_kv_head = 4 in the command line, 2 in " + json)) << msg;

  std::ofstream(dir_.file("x.ini")) << "[model]\nn_layer = 3\n[init]\nfrom = " << dir_.file("hf") << "\n";
  msg = bad_input_message([&] { load_config(dir_.file("x.ini"), {}); });
  EXPECT_TRUE(contains(msg, "model.n_layer = 3 in " + dir_.file("x.ini") + ", 2 in " + json)) << msg;

  msg = bad_input_message([&] { load_config(std::nullopt, {"--init.from=" + dir_.file("hf"), "--model.seq_len=65"}); });
  EXPECT_TRUE(contains(msg, "model.seq_len = 65 exceeds max_position_embeddings = 64 in " + json)) << msg;
}

TEST_F(HfLlamaTest, UnsupportedConfigFieldsAreRefusedByName) {
  write_hf_dir(dir_.file("hf"), Variant{});
  const std::string path = dir_.file("hf") + "/config.json";
  const nlohmann::json base = nlohmann::json::parse(config_json(Variant{}));
  const std::vector<std::pair<nlohmann::json, std::string>> cases = {
      {{{"model_type", "mistral"}}, "field model_type is 'mistral'"},
      {{{"head_dim", 16}}, "field head_dim is 16"},
      {{{"hidden_act", "gelu"}}, "field hidden_act is 'gelu', expected silu"},
      {{{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}}}, "rope_type 'yarn'"},
      {{{"attention_bias", true}}, "field attention_bias is true"},
      {{{"num_key_value_heads", "8"}}, "field num_key_value_heads is \"8\""},
      {{{"architectures", {"MistralForCausalLM"}}}, "field architectures holds \"MistralForCausalLM\""},
  };
  for (const auto& [patch, want] : cases) {
    nlohmann::json j = base;
    j.update(patch);
    std::ofstream(path) << j.dump();
    const std::string msg = bad_input_message([&] { read_hf_config(path); });
    EXPECT_TRUE(contains(msg, path) && contains(msg, want)) << msg;
  }
}

TEST_F(HfLlamaTest, EveryVariantLoadsAtOneAndThreeRanksAndExportsBitIdentically) {
  std::vector<Variant> variants(7);
  variants[1].tied = false;
  variants[2].qwen2 = true;
  variants[2].tied = false;
  variants[3].kv_heads = 4;  // no grouping
  variants[3].llama3 = true;
  variants[4].files = 3;
  variants[4].dtype = "BF16";
  variants[5].dtype = "F16";
  variants[5].files = 2;
  variants[6].dtype = "BF16";
  variants[6].qwen2 = true;
  for (size_t i = 0; i < variants.size(); ++i) {
    const Variant& v = variants[i];
    SCOPED_TRACE("variant " + std::to_string(i) + " " + v.dtype);
    const std::string hf = dir_.file("hf" + std::to_string(i));
    const std::vector<Tensor> tensors = write_hf_dir(hf, v);
    const Config cfg = config_for(hf);
    const auto want = expected_units(build_units(cfg.model), tensors, cfg.model);
    HfDirExportOptions o;
    o.dtype = v.dtype == "BF16" ? SafetensorsDtype::kBF16 : SafetensorsDtype::kF32;
    std::map<std::string, std::string> exported[2];
    for (int w : {1, 3}) {
      const std::string step = load_and_save(cfg, w, want, dir_.file("ck" + std::to_string(i) + "_" + std::to_string(w)));
      const std::string out = dir_.file("out" + std::to_string(i) + "_" + std::to_string(w));
      export_checkpoint_hf_dir(step, out, o);
      exported[w == 3] = tensor_bytes(out);
    }
    EXPECT_EQ(exported[0], exported[1]) << "the exports at 1 and 3 ranks differ";
    ASSERT_EQ(exported[0].size(), tensors.size());
    for (const Tensor& t : tensors) {
      if (v.dtype == "F16") {  // exported as F32: the exact values
        const std::string& got = exported[0][t.name];
        ASSERT_EQ(got.size(), 4 + 4 * t.values.size());
        EXPECT_EQ(got.substr(4), std::string(reinterpret_cast<const char*>(t.values.data()), 4 * t.values.size()))
            << t.name;
      } else {
        EXPECT_EQ(exported[0][t.name], v.dtype + ":" + t.raw) << t.name << " is not bit-identical";
      }
    }
    // The exported config.json reads back to the same model keys.
    const HfModelConfig back = read_hf_config(dir_.file("out" + std::to_string(i) + "_1") + "/config.json");
    Config again = cfg;
    again.model = back.model;
    again.model.seq_len = cfg.model.seq_len;
    EXPECT_EQ(to_ini(again), to_ini(cfg));
  }
}

TEST_F(HfLlamaTest, ExportShardsPastTheLimitWithAnIndex) {
  Variant v;
  v.tied = false;
  const std::vector<Tensor> tensors = write_hf_dir(dir_.file("hf"), v);
  const Config cfg = config_for(dir_.file("hf"));
  const std::string step = load_and_save(cfg, 2, expected_units(build_units(cfg.model), tensors, cfg.model),
                                         dir_.file("ck"));
  HfDirExportOptions o;
  o.max_shard_bytes = 30000;  // embed_tokens alone is 25600 bytes
  const HfDirExportReport r = export_checkpoint_hf_dir(step, dir_.file("out"), o);
  EXPECT_GT(r.files, 2);
  const nlohmann::json index =
      nlohmann::json::parse(std::ifstream(dir_.file("out") + "/model.safetensors.index.json"));
  int64_t total = 0;
  for (const Tensor& t : tensors) total += static_cast<int64_t>(t.raw.size());
  EXPECT_EQ(index.at("metadata").at("total_size").get<int64_t>(), total);
  EXPECT_EQ(index.at("weight_map").size(), tensors.size());
  char first[64];
  std::snprintf(first, sizeof(first), "model-00001-of-%05d.safetensors", r.files);
  EXPECT_EQ(index.at("weight_map").at("model.embed_tokens.weight").get<std::string>(), first);
  EXPECT_FALSE(fs::exists(dir_.file("out") + "/model.safetensors"));
  EXPECT_FALSE(fs::exists(dir_.file("out.tmp")));
  for (const auto& [name, bytes] : tensor_bytes(dir_.file("out")))
    EXPECT_EQ(bytes, "F32:" + find(tensors, name).raw) << name;
  // Each file holds at most the limit, or one tensor larger than it.
  for (const auto& e : fs::directory_iterator(dir_.file("out"))) {
    if (e.path().extension() != ".safetensors") continue;
    const SafetensorsReader rd(e.path().string());
    int64_t bytes = 0;
    for (const std::string& n : rd.names()) bytes += static_cast<int64_t>(find(tensors, n).raw.size());
    EXPECT_TRUE(bytes <= o.max_shard_bytes || rd.names().size() == 1) << e.path();
  }
  // The export config names the class and the fields.
  const nlohmann::json cj = nlohmann::json::parse(std::ifstream(dir_.file("out") + "/config.json"));
  EXPECT_EQ(cj.at("architectures"), nlohmann::json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(cj.at("model_type"), "llama");
  EXPECT_EQ(cj.at("num_key_value_heads"), 2);
  EXPECT_EQ(cj.at("intermediate_size"), kFfn);
  EXPECT_EQ(cj.at("tie_word_embeddings"), false);
  EXPECT_EQ(cj.at("torch_dtype"), "float32");
  EXPECT_EQ(cj.at("rms_norm_eps").dump(), "1e-05");
  EXPECT_EQ(cj.at("rope_theta").dump(), "500000");
  EXPECT_TRUE(cj.at("rope_scaling").is_null());
  // A second export into the now non-empty directory is refused.
  const std::string msg = bad_input_message([&] { export_checkpoint_hf_dir(step, dir_.file("out"), o); });
  EXPECT_TRUE(contains(msg, "exists and is not empty")) << msg;
}

TEST_F(HfLlamaTest, BadTensorsAreRefusedNamingFileAndTensor) {
  write_hf_dir(dir_.file("hf"), Variant{});
  const Config cfg = config_for(dir_.file("hf"));
  auto load = [&](const std::string& dir) {
    SoloCommunicator solo;
    StepEngine e(cfg, solo);
    init_from_weights(dir, cfg.model, e.sharded());
  };
  const std::string file = dir_.file("hf") + "/model.safetensors";
  std::vector<Tensor> ts = hf_tensors(Variant{});
  auto rewrite = [&](const std::vector<Tensor>& list, const std::string& dtype) {
    std::vector<const Tensor*> all;
    for (const Tensor& t : list) all.push_back(&t);
    write_safetensors(file, all, dtype);
  };
  // Missing.
  std::vector<Tensor> fewer(ts.begin(), ts.end());
  fewer.erase(fewer.begin() + 3);  // model.layers.0.self_attn.k_proj.weight
  rewrite(fewer, "F32");
  std::string msg = bad_input_message([&] { load(dir_.file("hf")); });
  EXPECT_TRUE(contains(msg, "tensor model.layers.0.self_attn.k_proj.weight is missing") && contains(msg, file)) << msg;
  // Wrong shape.
  std::vector<Tensor> reshaped = ts;
  reshaped[1].shape = {kHidden / 2, 2};
  rewrite(reshaped, "F32");
  msg = bad_input_message([&] { load(dir_.file("hf")); });
  EXPECT_TRUE(contains(msg, file + ": tensor model.layers.0.input_layernorm.weight has shape [16, 2], expected [32]"))
      << msg;
  // Unknown dtype (8-byte elements: the header is consistent, the dtype is not one we read).
  std::vector<Tensor> wide = ts;
  for (Tensor& t : wide) t.raw += t.raw;
  rewrite(wide, "F64");
  msg = bad_input_message([&] { load(dir_.file("hf")); });
  EXPECT_TRUE(contains(msg, file + ": tensor model.embed_tokens.weight has dtype F64")) << msg;
  // An index naming a file that lacks the tensor.
  Variant sharded;
  sharded.files = 2;
  write_hf_dir(dir_.file("hf2"), sharded);
  nlohmann::json index = nlohmann::json::parse(std::ifstream(dir_.file("hf2") + "/model.safetensors.index.json"));
  index["weight_map"]["model.norm.weight"] = index["weight_map"]["model.embed_tokens.weight"] ==
                                                     index["weight_map"]["model.norm.weight"]
                                                 ? "model-00002-of-00002.safetensors"
                                                 : index["weight_map"]["model.embed_tokens.weight"];
  std::ofstream(dir_.file("hf2") + "/model.safetensors.index.json") << index.dump();
  msg = bad_input_message([&] { load(dir_.file("hf2")); });
  EXPECT_TRUE(contains(msg, "tensor model.norm.weight is missing") && contains(msg, "places it in this file")) << msg;
}

}  // namespace
}  // namespace st
