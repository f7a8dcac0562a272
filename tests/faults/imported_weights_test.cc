// Imported weights (init.from) a user can get wrong: an overlapping tensor in a model directory, files holding tensors
// the model would silently drop (extra tensors, more layers than config.json says, a tied head that is not the
// embedding's copy), NaN and inf weights, HDF5 datasets that share bytes, a config.json whose vocab_size disagrees
// with its embedding, and a path that is not there. Each is bad input: kBadInput from the loader, exit 2 from the CLI,
// naming the file, the tensor and expected against actual, before step 1. (The format's rules for every safetensors
// reader: safetensors_spans_test.cc.)
#include <gtest/gtest.h>
#include <hdf5.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../ckpt/ckpt_test_util.h"
#include "../ckpt/hf_dir_test_util.h"
#include "../common/run_shardtrain.h"
#include "../common/tiny_training.h"
#include "shardtrain/ckpt/h5.h"
#include "shardtrain/ckpt/hf_export.h"
#include "shardtrain/ckpt/init_from.h"
#include "shardtrain/ckpt/safetensors.h"
#include "shardtrain/comm/fake_communicator.h"
#include "shardtrain/core/config.h"
#include "shardtrain/train/step_engine.h"

namespace st {
namespace {

using st::testing::bad_input_message;
using st::testing::CliResult;
using st::testing::contains;
using st::testing::run_shardtrain;
using st::testing::TempDir;
using st::testing::write_bytes;

// ---- Hugging Face llama directories (tests/ckpt/hf_dir_test_util.h), through the CLI ----

using st::testing::Tensor;
using st::testing::Variant;

std::string train_args(const std::string& hf) {
  return "train --init.from=" + hf +
         " --model.seq_len=16 --train.steps=1 --train.global_batch=2 --train.micro_batch=1 --train.eval_every=0 "
         "--train.eval_batches=1 --train.sample_tokens=0 --ckpt.dir=";
}

// Runs `shardtrain train` from `hf` with one thread; the run must exit 2 before step 1 and its output hold every one
// of `want`.
CliResult expect_refused(const std::string& hf, const std::vector<std::string>& want) {
  const CliResult r = run_shardtrain(train_args(hf), "OMP_NUM_THREADS=1");
  EXPECT_EQ(r.code, 2) << r.output;
  for (const std::string& w : want) EXPECT_TRUE(contains(r.output, w)) << "expected: " << w << "\n" << r.output;
  EXPECT_FALSE(contains(r.output, "| loss ")) << "a step ran:\n" << r.output;
  return r;
}

std::vector<const Tensor*> pointers(const std::vector<Tensor>& ts) {
  std::vector<const Tensor*> out;
  for (const Tensor& t : ts) out.push_back(&t);
  return out;
}

// The data_offsets of every tensor of a safetensors file, as its header holds them.
nlohmann::ordered_json header_of(const std::string& path, std::string* file = nullptr) {
  const std::string bytes = testing::read_bytes(path);
  if (file) *file = bytes;
  return nlohmann::ordered_json::parse(bytes.substr(8, testing::safetensors_header_len(bytes)));
}

// Rewrites a file's header, keeping its data section byte for byte.
void rewrite_header(const std::string& path, const nlohmann::ordered_json& header) {
  const std::string file = testing::read_bytes(path);
  const std::string data = file.substr(8 + testing::safetensors_header_len(file));
  write_bytes(path, testing::safetensors_file(header.dump().size(), header.dump(), data));
}

// Sets element `i` of an F32 tensor of the file to `v`.
void poke_f32(const std::string& path, const std::string& tensor, int64_t i, float v) {
  std::string file;
  const nlohmann::ordered_json h = header_of(path, &file);
  const uint64_t at = 8 + testing::safetensors_header_len(file) + h.at(tensor).at("data_offsets")[0].get<uint64_t>() +
                      4 * static_cast<uint64_t>(i);
  std::memcpy(&file[at], &v, 4);
  write_bytes(path, file);
}

// The case: model.norm.weight pointed at the embedding's first bytes. It loaded and trained before.
TEST(ImportedWeights, AnOverlappingTensorInADirectoryExitsTwoBeforeStepOne) {
  TempDir tmp;
  testing::write_hf_dir(tmp.file("hf"), Variant{});
  const std::string file = tmp.file("hf") + "/model.safetensors";
  nlohmann::ordered_json h = header_of(file);
  h["model.norm.weight"]["data_offsets"] = {0, 4 * testing::kHidden};
  rewrite_header(file, h);
  expect_refused(tmp.file("hf"),
                 {file + ": tensor model.embed_tokens.weight has data_offsets [0, 38400], which overlap tensor "
                         "model.norm.weight's [0, 128]: every tensor's bytes must be its own"});
}

std::vector<Tensor> layer_tensors(int l) {
  const int64_t C = testing::kHidden, KV = 2 * (testing::kHidden / testing::kHeads);
  const std::string p = "model.layers." + std::to_string(l) + ".";
  std::vector<Tensor> out;
  uint32_t salt = 1000 + 10 * static_cast<uint32_t>(l);
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    out.push_back(testing::make_tensor(p + name, std::move(shape), "F32", salt++));
  };
  add("input_layernorm.weight", {C});
  add("self_attn.q_proj.weight", {C, C});
  add("self_attn.k_proj.weight", {KV, C});
  add("self_attn.v_proj.weight", {KV, C});
  add("self_attn.o_proj.weight", {C, C});
  add("post_attention_layernorm.weight", {C});
  add("mlp.gate_proj.weight", {testing::kFfn, C});
  add("mlp.up_proj.weight", {testing::kFfn, C});
  add("mlp.down_proj.weight", {C, testing::kFfn});
  return out;
}

// config.json says 2 layers over a file of 4: layers 2 and 3 would be dropped without a word.
TEST(ImportedWeights, AFileWithMoreLayersThanConfigJsonExitsTwoNamingThem) {
  TempDir tmp;
  std::vector<Tensor> ts = testing::write_hf_dir(tmp.file("hf"), Variant{});
  for (int l : {2, 3})
    for (Tensor& t : layer_tensors(l)) ts.push_back(std::move(t));
  testing::write_safetensors(tmp.file("hf") + "/model.safetensors", pointers(ts), "F32");
  const std::string file = tmp.file("hf") + "/model.safetensors";
  expect_refused(tmp.file("hf"),
                 {"init.from " + tmp.file("hf") + ": 18 tensor(s) would be left unused (this model is llama with 2 "
                  "layers): model.layers.2.input_layernorm.weight (" + file + ")",
                  " and 13 more. The file(s) hold layers up to 3 (4 layers), the model has 2 (num_hidden_layers in " +
                      tmp.file("hf") + "/config.json)"});
}

TEST(ImportedWeights, AnExtraTensorExitsTwoNamingIt) {
  TempDir tmp;
  std::vector<Tensor> ts = testing::write_hf_dir(tmp.file("hf"), Variant{});
  ts.push_back(testing::make_tensor("model.vision_tower.proj.weight", {4, 4}, "F32", 99));
  testing::write_safetensors(tmp.file("hf") + "/model.safetensors", pointers(ts), "F32");
  expect_refused(tmp.file("hf"), {"1 tensor(s) would be left unused (this model is llama with 2 layers): "
                                  "model.vision_tower.proj.weight (" + tmp.file("hf") + "/model.safetensors). Only "
                                  "rotary caches (*.rotary_emb.inv_freq)"});
}

// Loads `hf` into a fresh model on `world` fake ranks (init.from's own path, without the CLI).
void load_dir(const std::string& hf, int world) {
  const Config cfg = load_config(std::nullopt, {"--init.from=" + hf, "--model.seq_len=16", "--train.global_batch=6",
                                                "--train.micro_batch=1", "--ckpt.dir="});
  fake::spawn(world, [&](Communicator& comm) {
    StepEngine e(cfg, comm);
    init_from_weights(hf, cfg.model, e.sharded());
  });
}

// The documented exceptions: rotary caches of the model's layers, and a tied head's exact copy.
TEST(ImportedWeights, RotaryCachesAndATiedHeadCopyMayGoUnusedButNothingElse) {
  TempDir tmp;
  std::vector<Tensor> ts = testing::write_hf_dir(tmp.file("hf"), Variant{});
  ts.push_back(testing::make_tensor("model.layers.1.self_attn.rotary_emb.inv_freq", {4}, "F32", 7));
  ts.push_back(testing::make_tensor("model.rotary_emb.inv_freq", {4}, "F32", 8));
  Tensor head = testing::find(ts, "model.embed_tokens.weight");
  head.name = "lm_head.weight";
  ts.push_back(head);
  const std::string file = tmp.file("hf") + "/model.safetensors";
  testing::write_safetensors(file, pointers(ts), "F32");
  load_dir(tmp.file("hf"), 2);
  // A cache of a layer the model does not have is a sign of the same mismatch as its weights.
  std::vector<Tensor> more = ts;
  more.push_back(testing::make_tensor("model.layers.5.self_attn.rotary_emb.inv_freq", {4}, "F32", 9));
  testing::write_safetensors(file, pointers(more), "F32");
  std::string msg = bad_input_message([&] { load_dir(tmp.file("hf"), 1); });
  EXPECT_TRUE(contains(msg, ": 1 tensor(s) would be left unused") &&
              contains(msg, "model.layers.5.self_attn.rotary_emb.inv_freq") &&
              contains(msg, "the model has 2 (num_hidden_layers in"))
      << msg;
  // A tied head that is not the embedding's copy: the model would train on the embedding alone.
  for (Tensor& t : ts)
    if (t.name == "lm_head.weight") std::memcpy(&t.raw[4 * (3 * testing::kHidden + 2)], "\0\0\x80\x3f", 4);  // 1.0f
  testing::write_safetensors(file, pointers(ts), "F32");
  msg = bad_input_message([&] { load_dir(tmp.file("hf"), 3); });
  EXPECT_TRUE(contains(msg, "tensor lm_head.weight in " + file + " differs from model.embed_tokens.weight at element " +
                                std::to_string(3 * testing::kHidden + 2) + " (index [3, 2]): 1 against "))
      << msg;
  EXPECT_TRUE(contains(msg, "config.json has tie_word_embeddings true")) << msg;
}

// A NaN in the weights: every step would be skipped and the run would "finish" with loss nan.
TEST(ImportedWeights, NanWeightsExitTwoBeforeStepOneNamingTensorAndElement) {
  TempDir tmp;
  testing::write_hf_dir(tmp.file("hf"), Variant{});
  const std::string file = tmp.file("hf") + "/model.safetensors";
  poke_f32(file, "model.layers.1.mlp.down_proj.weight", 50, std::numeric_limits<float>::quiet_NaN());
  expect_refused(tmp.file("hf"),
                 {"init.from " + tmp.file("hf") + ": tensor model.layers.1.mlp.down_proj.weight in " + file +
                  " holds a non-finite value: element 50 (index [1, 2]) is nan (bits 0x7fc00000); weights with NaN or "
                  "inf give a non-finite loss at every step, so they are refused before step 1"});
}

// The ranks read different spans: the one rank that reads the bad element finds it, and every rank refuses alike.
TEST(ImportedWeights, AnInfOnlyOneRankReadsIsRefusedOnEveryRank) {
  TempDir tmp;
  testing::write_hf_dir(tmp.file("hf"), Variant{});
  const std::string file = tmp.file("hf") + "/model.safetensors";
  const int64_t last = int64_t{testing::kVocab} * testing::kHidden - 1;  // on the last rank of 3 only
  poke_f32(file, "model.embed_tokens.weight", last, -std::numeric_limits<float>::infinity());
  std::vector<std::string> messages(3);
  const Config cfg = load_config(std::nullopt, {"--init.from=" + tmp.file("hf"), "--model.seq_len=16",
                                                "--train.global_batch=6", "--train.micro_batch=1", "--ckpt.dir="});
  fake::spawn(3, [&](Communicator& comm) {
    StepEngine e(cfg, comm);
    messages[static_cast<size_t>(comm.rank())] =
        bad_input_message([&] { init_from_weights(tmp.file("hf"), cfg.model, e.sharded()); });
  });
  for (const std::string& msg : messages)
    EXPECT_TRUE(contains(msg, "tensor model.embed_tokens.weight in " + file + " holds a non-finite value: element " +
                                  std::to_string(last) + " (index [299, 31]) is -inf (found by rank 2)"))
        << msg;
}

TEST(ImportedWeights, ABf16InfIsRefusedToo) {
  TempDir tmp;
  Variant v;
  v.dtype = "BF16";
  testing::write_hf_dir(tmp.file("hf"), v);
  const std::string file = tmp.file("hf") + "/model.safetensors";
  std::string bytes = testing::read_bytes(file);
  const nlohmann::ordered_json h = header_of(file);
  const uint64_t at = 8 + testing::safetensors_header_len(bytes) +
                      h.at("model.norm.weight").at("data_offsets")[0].get<uint64_t>() + 2 * 7;
  bytes[at] = '\x80';
  bytes[at + 1] = '\x7f';  // 0x7f80: +inf
  write_bytes(file, bytes);
  const std::string msg = bad_input_message([&] { load_dir(tmp.file("hf"), 1); });
  EXPECT_TRUE(contains(msg, "tensor model.norm.weight in " + file +
                                " holds a non-finite value: element 7 (index [7]) is inf"))
      << msg;
}

// config.json's vocab_size against the embedding's rows: named at load, not through the data's token ids.
TEST(ImportedWeights, AConfigJsonVocabSizeThatDisagreesWithTheEmbeddingIsNamed) {
  TempDir tmp;
  testing::write_hf_dir(tmp.file("hf"), Variant{});
  nlohmann::json cj = nlohmann::json::parse(testing::read_bytes(tmp.file("hf") + "/config.json"));
  cj["vocab_size"] = 250;  // the byte-level data holds ids up to 255
  write_bytes(tmp.file("hf") + "/config.json", cj.dump(2));
  const CliResult r = expect_refused(tmp.file("hf"), {"init.from " + tmp.file("hf") + ": " + tmp.file("hf") +
                                                      "/config.json has vocab_size 250 and hidden_size 32, but tensor "
                                                      "model.embed_tokens.weight in " + tmp.file("hf") +
                                                      "/model.safetensors has shape [300, 32] (expected [250, 32])"});
  EXPECT_FALSE(contains(r.output, "model.vocab_size >=")) << "the data check spoke first:\n" << r.output;
}

// ---- GPT-2 files (.safetensors and .h5) ----

class Gpt2Files : public ::testing::Test {
 protected:
  void SetUp() override { cfg_ = testing::tiny_config(); }

  // The tiny model's weights under HF names, with `extra` tensors after them.
  void write(const std::string& path, const std::vector<std::pair<std::string, std::vector<float>>>& extra = {},
             const std::string& poisoned = "", float poison = 0.0f) {
    SoloCommunicator solo;
    StepEngine e(cfg_, solo);
    const auto full = e.gather_params();
    std::vector<SafetensorsTensor> decl;
    std::vector<std::vector<float>> values;
    for (const HfTensorMap& m : hf_gpt2_tensor_map(cfg_.model, e.units())) {
      decl.push_back({m.hf_name, m.hf_shape});
      values.push_back(testing::hf_tensor_values(m, full));
      if (m.hf_name == poisoned) values.back()[3] = poison;
    }
    for (const auto& [name, v] : extra) {
      decl.push_back({name, {static_cast<int64_t>(v.size())}});
      values.push_back(v);
    }
    if (path.size() > 3 && path.substr(path.size() - 3) == ".h5") {
      H5File f = H5File::create(path);
      for (size_t i = 0; i < decl.size(); ++i) h5_write_f32(f, decl[i].name, decl[i].shape, values[i].data());
      f.close();
      return;
    }
    SafetensorsWriter w(path, decl);
    for (size_t i = 0; i < decl.size(); ++i)
      w.write(decl[i].name, values[i].data(), static_cast<int64_t>(values[i].size()));
    w.finish();
  }

  std::string load_error(const std::string& path) {
    return bad_input_message([&] {
      fake::spawn(2, [&](Communicator& comm) {
        StepEngine e(cfg_, comm);
        init_from_weights(path, cfg_.model, e.sharded());
      });
    });
  }

  TempDir dir_;
  Config cfg_;
};

TEST_F(Gpt2Files, NanAndInfAreRefusedInEitherFormat) {
  for (const char* name : {"w.safetensors", "w.h5"}) {
    const std::string path = dir_.file(name);
    write(path, {}, "transformer.h.1.attn.c_attn.weight", std::numeric_limits<float>::infinity());
    std::string msg = load_error(path);
    EXPECT_TRUE(contains(msg, "init.from " + path + ": tensor transformer.h.1.attn.c_attn.weight in " + path +
                                  " holds a non-finite value: element 3 (index [0, 3]) is inf"))
        << msg;
    write(path, {}, "transformer.ln_f.bias", std::numeric_limits<float>::quiet_NaN());
    msg = load_error(path);
    EXPECT_TRUE(contains(msg, ": tensor transformer.ln_f.bias in " + path +
                                  " holds a non-finite value: element 3 (index [3]) is nan"))
        << msg;
  }
}

TEST_F(Gpt2Files, UnusedTensorsAreRefusedButTheCausalMasksOfTheModelsLayersAreNot) {
  for (const char* name : {"w.safetensors", "w.h5"}) {
    const std::string path = dir_.file(name);
    // Old GPT2LMHeadModel exports carry each layer's causal mask and masked_bias: buffers, not weights.
    write(path, {{"transformer.h.0.attn.bias", std::vector<float>(64, 1.0f)},
                 {"transformer.h.1.attn.masked_bias", {-1e4f}}});
    fake::spawn(1, [&](Communicator& comm) {
      StepEngine e(cfg_, comm);
      init_from_weights(path, cfg_.model, e.sharded());
    });
    // The tiny model has 2 layers: a third layer's tensors would be dropped.
    write(path, {{"transformer.h.2.ln_1.weight", std::vector<float>(16, 1.0f)},
                 {"transformer.h.2.attn.bias", std::vector<float>(64, 1.0f)},
                 {"extra.scale", {2.0f}}});
    const std::string msg = load_error(path);
    EXPECT_TRUE(contains(msg, "init.from " + path + ": 3 tensor(s) would be left unused (this model is gpt2 with 2 "
                                                    "layers): extra.scale (" + path + "), transformer.h.2.attn.bias"))
        << msg;
    EXPECT_TRUE(contains(msg, "The file(s) hold layers up to 2 (3 layers), the model has 2 (model.n_layer)")) << msg;
  }
}

// Two names for the same bytes in an .h5 file: one tensor would be read as another.
TEST_F(Gpt2Files, Hdf5DatasetsSharingBytesAreRefused) {
  const std::string path = dir_.file("w.h5");
  write(path);
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  ASSERT_GE(H5Ldelete(f, "transformer.ln_f.bias", H5P_DEFAULT), 0);
  ASSERT_GE(H5Lcreate_hard(f, "transformer.ln_f.weight", f, "transformer.ln_f.bias", H5P_DEFAULT, H5P_DEFAULT), 0);
  H5Fclose(f);
  const std::string msg = load_error(path);
  EXPECT_TRUE(contains(msg, path + ": datasets transformer.ln_f.bias (bytes [") &&
              contains(msg, ")) and transformer.ln_f.weight (bytes [") &&
              contains(msg, ")) overlap: every dataset's bytes must be its own"))
      << msg;
}

// ---- a path that is not there ----

TEST(ImportedWeights, AMissingInitFromIsCalledMissing) {
  TempDir tmp;
  for (const std::string& path : {tmp.file("nope.safetensors"), tmp.file("nope.h5"), tmp.file("nope"),
                                  tmp.file("nodir/model.safetensors")}) {
    const CliResult r = run_shardtrain(
        std::string("train --config ") + SHARDTRAIN_SOURCE_DIR +
            "/configs/tiny.ini --model.n_layer=1 --model.n_embd=32 --model.n_head=2 --model.seq_len=16 "
            "--train.micro_batch=1 --train.global_batch=1 --train.steps=1 --train.eval_every=0 --init.from=" + path,
        "OMP_NUM_THREADS=1");
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_TRUE(contains(r.output, "init.from " + path + ": no such file or directory")) << r.output;
  }
}

}  // namespace
}  // namespace st
