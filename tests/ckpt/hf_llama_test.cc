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

#include "../common/nf4_round_trip.h"
#include "ckpt_test_util.h"
#include "hf_dir_test_util.h"
#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/ckpt/init_from.h"
#include "shardtrain/ckpt/safetensors_reader.h"
#include "shardtrain/ckpt/tools.h"
#include "shardtrain/comm/fake_communicator.h"
#include "shardtrain/core/hf_config.h"
#include "shardtrain/model/lora.h"
#include "shardtrain/train/step_engine.h"

namespace fs = std::filesystem;

namespace st {
namespace {

using testing::bad_input_message;
using testing::contains;

using testing::config_json;
using testing::expected_units;
using testing::find;
using testing::hf_tensors;
using testing::kFfn;
using testing::kHeads;
using testing::kHidden;
using testing::kLayers;
using testing::kVocab;
using testing::Tensor;
using testing::tensor_bytes;
using testing::Variant;
using testing::write_hf_dir;
using testing::write_safetensors;

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
  // ckpt.export writes a llama's Hugging Face names: accepted.
  EXPECT_EQ(config_for(dir_.file("hf"), {"--ckpt.export=w.h5"}).ckpt.export_path, "w.h5");
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

// transformers 5 writes the RoPE settings as rope_parameters {rope_theta, rope_type, factors}, without rope_theta or
// rope_scaling at the top level: the same model keys result.
TEST_F(HfLlamaTest, RopeParametersOfTransformers5AreRead) {
  Variant v;
  v.llama3 = true;
  write_hf_dir(dir_.file("hf"), v);
  const std::string path = dir_.file("hf") + "/config.json";
  const ModelConfig want = read_hf_config(path).model;
  nlohmann::json j = nlohmann::json::parse(config_json(v));
  nlohmann::json params = j.at("rope_scaling");
  params["rope_theta"] = j.at("rope_theta");
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j["rope_parameters"] = params;
  std::ofstream(path) << j.dump();
  const ModelConfig got = read_hf_config(path).model;
  EXPECT_EQ(got.rope_theta, 500000.0f);
  EXPECT_EQ(got.rope_scaling, RopeScaling::kLlama3);
  EXPECT_EQ(got.rope_scaling_factor, want.rope_scaling_factor);
  EXPECT_EQ(got.rope_scaling_original_max_position, want.rope_scaling_original_max_position);
  // No scaling: rope_type "default".
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000000.0}};
  std::ofstream(path) << j.dump();
  EXPECT_EQ(read_hf_config(path).model.rope_theta, 1000000.0f);
  EXPECT_EQ(read_hf_config(path).model.rope_scaling, RopeScaling::kNone);
  // Both forms in one file must agree.
  j["rope_theta"] = 10000.0;
  std::ofstream(path) << j.dump();
  const std::string msg = bad_input_message([&] { read_hf_config(path); });
  EXPECT_TRUE(contains(msg, path + ": field rope_parameters disagrees with rope_theta / rope_scaling")) << msg;
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
      const std::string step =
          load_and_save(cfg, w, want, dir_.file("ck" + std::to_string(i) + "_" + std::to_string(w)));
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

// A LoRA model takes the directory (two files and an index here) into its frozen base, at any world size: in the
// compute dtype as the directory holds it; as NF4 (QLoRA) each block matrix (the stacked q/k/v, o, the stacked
// gate/up, down) as the NF4 round trip of the directory's tensors, and every other frozen tensor (the embedding, the
// untied head, norms, q/k/v biases) as the directory holds it.
TEST_F(HfLlamaTest, ALoraModelLoadsTheDirectoryIntoItsFrozenBase) {
  Variant v;
  v.qwen2 = true;
  v.tied = false;
  v.files = 2;
  const std::vector<Tensor> tensors = write_hf_dir(dir_.file("hf"), v);
  for (LoraBase dtype : {LoraBase::kBf16, LoraBase::kNf4}) {
    const Config cfg = config_for(
        dir_.file("hf"), {"--lora.rank=2", "--lora.targets=q,v,down", str_cat("--lora.base_dtype=", to_string(dtype))});
    const ModelConfig base = base_model(cfg.model);
    const auto want = expected_units(build_units(base), tensors, base);
    const bool nf4 = dtype == LoraBase::kNf4;
    for (int world : {1, 3}) {
      fake::spawn(world, [&](Communicator& comm) {
        StepEngine e(cfg, comm);
        init_from_weights(cfg.init.from, cfg.model, e.sharded());
        for (const UnitLayout& u : e.units()) {
          const std::vector<float> frozen = e.sharded().gather_frozen(u.index);
          if (comm.rank() != 0) continue;
          const std::string what = str_cat(u.name, ", ", to_string(dtype), ", world ", world);
          const std::vector<float> as_dir = testing::frozen_segment(u, want[static_cast<size_t>(u.index)]);
          EXPECT_EQ(testing::bits(frozen), testing::bits(nf4 ? testing::nf4_round_trip(u, as_dir) : as_dir)) << what;
          EXPECT_EQ(frozen == as_dir, !nf4 || u.kind != UnitKind::kBlock) << what << ": NF4 changes a block's weights";
        }
      });
    }
  }
}

// A tied model's directory may also hold lm_head.weight (a copy of embed_tokens): it is accepted and not read.
TEST_F(HfLlamaTest, ATiedModelAcceptsAnLmHeadTensor) {
  std::vector<Tensor> tensors = write_hf_dir(dir_.file("hf"), Variant{});
  Tensor head = find(tensors, "model.embed_tokens.weight");
  head.name = "lm_head.weight";
  std::vector<const Tensor*> all;
  for (const Tensor& t : tensors) all.push_back(&t);
  all.push_back(&head);
  write_safetensors(dir_.file("hf") + "/model.safetensors", all, "F32");
  const Config cfg = config_for(dir_.file("hf"));
  EXPECT_TRUE(cfg.model.tie_embeddings);
  load_and_save(cfg, 2, expected_units(build_units(cfg.model), tensors, cfg.model), dir_.file("ck"));
}

TEST_F(HfLlamaTest, ExportShardsPastTheLimitWithAnIndex) {
  Variant v;
  v.tied = false;
  const std::vector<Tensor> tensors = write_hf_dir(dir_.file("hf"), v);
  const Config cfg = config_for(dir_.file("hf"));
  const std::string step =
      load_and_save(cfg, 2, expected_units(build_units(cfg.model), tensors, cfg.model), dir_.file("ck"));
  HfDirExportOptions o;
  o.max_shard_bytes = 30000;  // embed_tokens alone is 25600 bytes
  const HfDirExportReport r = export_checkpoint_hf_dir(step, dir_.file("out"), o);
  EXPECT_GT(r.files, 2);
  const nlohmann::json index = nlohmann::json::parse(std::ifstream(dir_.file("out") + "/model.safetensors.index.json"));
  int64_t total = 0;
  for (const Tensor& t : tensors) total += static_cast<int64_t>(t.raw.size());
  EXPECT_EQ(index.at("metadata").at("total_size").get<int64_t>(), total);
  EXPECT_EQ(index.at("weight_map").size(), tensors.size());
  char first[64];
  std::snprintf(first, sizeof(first), "model-00001-of-%05d.safetensors", r.files);
  EXPECT_EQ(index.at("weight_map").at("model.embed_tokens.weight").get<std::string>(), first);
  EXPECT_FALSE(fs::exists(dir_.file("out") + "/model.safetensors"));
  for (const auto& e : fs::directory_iterator(dir_.str()))
    EXPECT_NE(e.path().filename().string().rfind("out.tmp", 0), 0u) << "left behind: " << e.path();
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
  index["weight_map"]["model.norm.weight"] =
      index["weight_map"]["model.embed_tokens.weight"] == index["weight_map"]["model.norm.weight"]
          ? "model-00002-of-00002.safetensors"
          : index["weight_map"]["model.embed_tokens.weight"];
  std::ofstream(dir_.file("hf2") + "/model.safetensors.index.json") << index.dump();
  msg = bad_input_message([&] { load(dir_.file("hf2")); });
  EXPECT_TRUE(contains(msg, "tensor model.norm.weight is missing") && contains(msg, "places it in this file")) << msg;
}

}  // namespace
}  // namespace st
