// The weights decoding reads (decode_weights.h) against a training engine that loads the same source, gathers its
// weights and merges its adapters (load_checkpoint or init_from_weights, StepEngine::gather_params, merge_lora): bit
// for bit, for checkpoints written at 1 and 3 ranks, LoRA bases of every kind, and init.from; a layer split's stage
// reading its units alone; and the refusals of what is missing or changed, each naming the file.
#include "shardtrain/ckpt/decode_weights.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "../common/tiny_training.h"
#include "ckpt_test_util.h"
#include "hf_dir_test_util.h"
#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/ckpt/hf_export.h"
#include "shardtrain/ckpt/init_from.h"
#include "shardtrain/ckpt/lora_base.h"
#include "shardtrain/comm/fake_communicator.h"
#include "shardtrain/kernels/adamw_host.h"
#include "shardtrain/model/decoder_stage.h"
#include "shardtrain/model/lora.h"
#include "shardtrain/train/step_engine.h"
#include "tiny_ckpt_test.h"

namespace fs = std::filesystem;

namespace st {
namespace {

using testing::bad_input_message;
using testing::bits;
using testing::contains;

constexpr uint64_t kSeed = 11;  // the corpus of testing::corpus_batches

class DecodeWeightsTest : public testing::TinyCkptTest {
 protected:
  // The tiny model as a llama with grouped K/V heads and an untied head.
  Config llama() const {
    Config c = cfg_;
    c.model.arch = ModelArch::kLlama;
    c.model.n_kv_head = 1;
    c.model.ffn_dim = 24;
    c.model.tie_embeddings = false;
    return c;
  }
  // A Hugging Face directory's model (the tiny one of hf_dir_test_util.h), with `extra` keys.
  Config from_hf(const std::string& dir, std::vector<std::string> extra = {}) const {
    std::vector<std::string> o = {"--init.from=" + dir, "--model.seq_len=16", "--train.micro_batch=1",
                                  "--train.global_batch=6", "--ckpt.dir=" + tmp_.file("ckpt_hf")};
    o.insert(o.end(), extra.begin(), extra.end());
    return load_config(std::nullopt, o);
  }
  // A GPT-2 file at `path` holding another seed's random model of c.model (so that the seed's own base could not pass
  // for it).
  static void write_gpt2_base(const Config& c, const std::string& path) {
    Config other = c;
    other.train.seed = c.train.seed + 1;
    testing::write_seed_model(other, path);
  }
};

Config with_lora(Config c, LoraBase base_dtype) {
  c.model.lora.rank = 3;
  c.model.lora.alpha = 5;
  c.model.lora.targets = c.model.is_llama() ? "q,v,down" : "qkv,fc_proj";
  c.model.lora.base_dtype = base_dtype;
  return c;
}

// c trained for 3 steps at `world` fake ranks from its start (its base read from init.from first, as the trainer
// reads it) and saved into c.ckpt.dir: the step directory.
std::string train_and_save(const Config& c, int world) {
  std::string where;
  fake::spawn(world, [&](Communicator& comm) {
    StepEngine e(c, comm);
    if (!c.init.from.empty()) init_from_weights(c.init.from, c.model, e.sharded());
    testing::Trace tr;
    testing::train_steps(e, c, comm, kSeed, 0, 3, &tr);
    CheckpointState cs;
    cs.step = 3;
    cs.optimizer_updates = e.updates();
    if (c.model.lora.enabled()) cs.base = describe_lora_base(c.init.from);
    const std::string w = save_checkpoint(c, e.sharded(), cs, comm);
    if (comm.rank() == 0) where = w;
  });
  return where;
}

// What a one-rank engine of c holds after loading step_dir, gathered and merged: what generate decoded from.
std::vector<std::vector<float>> engine_weights(const std::string& step_dir, Config c) {
  c.train.micro_batch = c.train.global_batch = 1;
  SoloCommunicator solo;
  StepEngine e(c, solo);
  load_checkpoint(step_dir, c, e.sharded(), solo, CheckpointLoad::kRead);
  return merge_lora(c.model, e.units(), e.gather_params());
}

void expect_same_bits(const std::vector<std::vector<float>>& got, const std::vector<std::vector<float>>& want,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t u = 0; u < want.size(); ++u) {
    ASSERT_EQ(got[u].size(), want[u].size()) << what << ", unit " << u;
    EXPECT_EQ(bits(got[u]), bits(want[u])) << what << ", unit " << u;
  }
}

TEST_F(DecodeWeightsTest, CheckpointWeightsAreTheEnginesAtAnyWriterWorldSize) {
  for (const Config& c : {cfg_, llama()}) {
    for (int world : {1, 3}) {
      const std::string what = str_cat(to_string(c.model.arch), ", written by ", world);
      const std::string step = train_and_save(c, world);
      const CheckpointWeights w = read_checkpoint_weights(step, c);
      EXPECT_EQ(w.manifest.step, 3) << what;
      EXPECT_EQ(w.manifest.world_size, world) << what;
      ASSERT_EQ(w.units.size(), static_cast<size_t>(c.model.n_layer + 2)) << what;
      expect_same_bits(w.units, engine_weights(step, c), what);
      fs::remove_all(c.ckpt.dir);
    }
  }
}

// A LoRA checkpoint decodes as its base with the adapters merged in: the base drawn from the seed, read from a GPT-2
// file or from a Hugging Face directory, stored in the compute dtype or as NF4.
TEST_F(DecodeWeightsTest, LoraCheckpointsMergeTheBaseTheEngineHolds) {
  const std::string hf = tmp_.file("hf");
  testing::Variant v;
  v.tied = false;
  v.files = 2;
  testing::write_hf_dir(hf, v);
  const std::string gpt2 = tmp_.file("base.h5");
  write_gpt2_base(cfg_, gpt2);
  std::vector<Config> cases;
  for (LoraBase dtype : {LoraBase::kBf16, LoraBase::kNf4}) {
    cases.push_back(with_lora(cfg_, dtype));  // the seed's base
    Config file_base = with_lora(cfg_, dtype);
    file_base.init.from = gpt2;
    cases.push_back(file_base);
    cases.push_back(with_lora(from_hf(hf), dtype));
  }
  for (const Config& c : cases) {
    for (int world : {1, 3}) {
      const std::string what =
          str_cat(to_string(c.model.arch), " base ", c.init.from.empty() ? std::string("from the seed") : c.init.from,
                  " in ", to_string(c.model.lora.base_dtype), ", written by ", world);
      const std::string step = train_and_save(c, world);
      const CheckpointWeights w = read_checkpoint_weights(step, c);
      const std::vector<std::vector<float>> want = engine_weights(step, c);
      expect_same_bits(w.units, want, what);
      // The merged units are the base model's: a block as large as the model without adapters.
      EXPECT_EQ(static_cast<int64_t>(w.units[1].size()), build_units(base_model(c.model))[1].numel) << what;
      fs::remove_all(c.ckpt.dir);
    }
  }
}

// On a GPU the backend keeps a bf16 base in the compute dtype, and so does the read for train.device = cuda: each
// frozen weight rounded to nearest even before the adapters are merged in.
TEST_F(DecodeWeightsTest, AGpuBaseIsTheComputeTypes) {
  const Config c = with_lora(cfg_, LoraBase::kBf16);
  const std::string step = train_and_save(c, 2);
  Config cuda = c;
  cuda.train.device = Device::kCuda;
  cuda.train.dtype = DType::kBF16;
  const CheckpointWeights w = read_checkpoint_weights(step, cuda);

  Config load = c;
  load.train.micro_batch = load.train.global_batch = 1;
  SoloCommunicator solo;
  StepEngine e(load, solo);
  load_checkpoint(step, load, e.sharded(), solo, CheckpointLoad::kRead);
  std::vector<std::vector<float>> full = e.gather_params();
  int64_t changed = 0;
  for (const UnitLayout& u : e.units())
    for (int64_t i = u.numel; i < u.numel + u.frozen_numel; ++i) {
      float& x = full[static_cast<size_t>(u.index)][static_cast<size_t>(i)];
      const float rounded = bf16_to_float(round_to_bf16(x));
      changed += rounded != x;
      x = rounded;
    }
  EXPECT_GT(changed, 1000);  // the seed's fp32 draws are not bf16 values
  expect_same_bits(w.units, merge_lora(c.model, e.units(), std::move(full)), "cuda/bf16");
}

// init.from decodes as a model started from it: a Hugging Face directory (F32 and BF16, tied and untied, q/k/v biases)
// and a GPT-2 file.
TEST_F(DecodeWeightsTest, InitFromWeightsAreTheEngines) {
  std::vector<testing::Variant> variants(3);
  variants[1].tied = false;
  variants[1].qwen2 = true;
  variants[2].dtype = "BF16";
  variants[2].files = 3;
  std::vector<Config> cases;
  for (size_t i = 0; i < variants.size(); ++i) {
    const std::string dir = tmp_.file("hf" + std::to_string(i));
    const std::vector<testing::Tensor> tensors = testing::write_hf_dir(dir, variants[i]);
    cases.push_back(from_hf(dir));
    // The directory's tensors in our layout, worked out apart from the loader (padding rows zero).
    const std::vector<std::vector<float>> as_dir =
        testing::expected_units(build_units(cases.back().model), tensors, cases.back().model);
    expect_same_bits(read_init_from_weights(cases.back()), as_dir, "variant " + std::to_string(i));
  }
  Config gpt2 = cfg_;
  gpt2.init.from = tmp_.file("gpt2.h5");
  write_gpt2_base(cfg_, gpt2.init.from);
  cases.push_back(gpt2);
  for (const Config& c : cases) {
    SoloCommunicator solo;
    StepEngine e(c, solo);
    init_from_weights(c.init.from, c.model, e.sharded());
    expect_same_bits(read_init_from_weights(c), e.gather_params(), c.init.from);
  }
}

// A stage of a layer split (model/decoder_stage.h) reads its units alone: each one it holds as the whole read gives it,
// the others never handed over; for checkpoints, a LoRA checkpoint on a Hugging Face directory's base, and init.from
// (a directory and a GPT-2 file).
TEST_F(DecodeWeightsTest, AStageOfALayerSplitReadsItsUnitsAlone) {
  using Read = std::function<void(const UnitSink&, const std::vector<bool>&)>;
  auto expect_stages = [](const Config& c, const Read& read, const std::string& what) {
    const ModelConfig base = base_model(c.model);
    std::vector<std::vector<float>> whole(static_cast<size_t>(base.n_layer) + 2);
    read([&](int u, std::vector<float>& v) { whole[static_cast<size_t>(u)] = v; }, {});
    const std::vector<UnitRange> ranges = split_units(base, 1, 2);
    for (int s = 0; s < 2; ++s) {
      const std::vector<bool> held = held_units(base, DecoderStage{s, 2, ranges[static_cast<size_t>(s)], nullptr});
      std::vector<std::vector<float>> got(whole.size());
      read([&](int u, std::vector<float>& v) { got[static_cast<size_t>(u)] = v; }, held);
      for (size_t u = 0; u < whole.size(); ++u) {
        EXPECT_EQ(bits(got[u]), held[u] ? bits(whole[u]) : bits(std::vector<float>()))
            << what << ", stage " << s << ", unit " << u;
      }
    }
  };
  const std::string hf = tmp_.file("hf");
  testing::write_hf_dir(hf, testing::Variant{});
  for (const Config& c : {cfg_, llama(), with_lora(from_hf(hf), LoraBase::kBf16)}) {
    const std::string step = train_and_save(c, 2);
    expect_stages(
        c,
        [&](const UnitSink& sink, const std::vector<bool>& held) {
          read_checkpoint_weights(step, c, LoraBaseCheck::kCheck, sink, held);
        },
        step);
    fs::remove_all(c.ckpt.dir);
  }
  Config gpt2 = cfg_;
  gpt2.init.from = tmp_.file("gpt2.h5");
  write_gpt2_base(cfg_, gpt2.init.from);
  for (const Config& c : {from_hf(hf), gpt2})
    expect_stages(
        c, [&](const UnitSink& sink, const std::vector<bool>& held) { read_init_from_weights(c, sink, held); },
        c.init.from);
}

// A GPU decoder of bf16 or fp16 reads a llama directory straight into 16-bit units (init_from_hf_dir_half): each unit
// is the fp32 read rounded to that type, bit for bit, whatever the files store (F32, F16, BF16 over three files; tied,
// and untied with q/k/v biases), the padding rows drawn alike; a stage's units alone.
TEST_F(DecodeWeightsTest, AHalfReadIsTheFp32ReadRounded) {
  std::vector<testing::Variant> variants(4);
  variants[1].tied = false;
  variants[1].qwen2 = true;
  variants[2].dtype = "BF16";
  variants[2].files = 3;
  variants[3].dtype = "F16";
  for (size_t i = 0; i < variants.size(); ++i) {
    const std::string dir = tmp_.file("hf" + std::to_string(i));
    testing::write_hf_dir(dir, variants[i]);
    const Config c = from_hf(dir);
    const std::vector<std::vector<float>> fp32 = read_init_from_weights(c);
    for (const HalfKind kind : {HalfKind::kBF16, HalfKind::kF16}) {
      const std::string what = "variant " + std::to_string(i) + (kind == HalfKind::kBF16 ? ", bf16" : ", fp16");
      std::vector<std::vector<uint16_t>> got(fp32.size());
      init_from_hf_dir_half(dir, c.model, c.train.seed, kind, {},
                            [&](int u, const std::vector<uint16_t>& v) { got[static_cast<size_t>(u)] = v; });
      for (size_t u = 0; u < fp32.size(); ++u) {
        std::vector<uint16_t> want(fp32[u].size());
        round_to_half(fp32[u].data(), static_cast<int64_t>(want.size()), kind, want.data());
        EXPECT_TRUE(got[u] == want) << what << ", unit " << u;
      }
    }
  }
  const Config c = from_hf(tmp_.file("hf1"));
  const std::vector<UnitRange> ranges = split_units(c.model, 1, 2);
  const std::vector<bool> held = held_units(c.model, DecoderStage{1, 2, ranges[1], nullptr});
  std::vector<int> handed;
  init_from_hf_dir_half(tmp_.file("hf1"), c.model, c.train.seed, HalfKind::kBF16, held,
                        [&](int u, const std::vector<uint16_t>&) { handed.push_back(u); });
  std::vector<int> want;
  for (size_t u = 0; u < held.size(); ++u)
    if (held[u]) want.push_back(static_cast<int>(u));
  EXPECT_EQ(handed, want);
}

// What the fp32 read refuses, the half read refuses with the same message: a non-finite value (even one that only a
// 16-bit tensor's bits show), and a tied head that is not the embedding's copy.
TEST_F(DecodeWeightsTest, AHalfReadRefusesWhatTheFp32ReadRefuses) {
  for (const std::string dtype : {"F32", "BF16"}) {
    testing::Variant v;
    v.dtype = dtype;
    const std::string dir = tmp_.file("bad" + dtype);
    testing::write_hf_dir(dir, v);
    std::vector<testing::Tensor> ts = testing::hf_tensors(v);
    testing::Tensor& norm = ts[1];  // model.layers.0.input_layernorm.weight
    const uint32_t inf = 0x7f800000u;
    if (dtype == "F32")
      std::memcpy(norm.raw.data() + 4 * 5, &inf, 4);
    else
      std::memcpy(norm.raw.data() + 2 * 5, reinterpret_cast<const char*>(&inf) + 2, 2);
    std::vector<const testing::Tensor*> all;
    for (const testing::Tensor& t : ts) all.push_back(&t);
    testing::write_safetensors(dir + "/model.safetensors", all, dtype);
    const Config c = from_hf(dir);
    const std::string fp32 = testing::bad_input_message([&] { read_init_from_weights(c); });
    const std::string half = testing::bad_input_message([&] {
      init_from_hf_dir_half(dir, c.model, c.train.seed, HalfKind::kBF16, {}, [](int, const std::vector<uint16_t>&) {});
    });
    EXPECT_TRUE(testing::contains(fp32, "holds a non-finite value: element 5")) << fp32;
    EXPECT_EQ(half, fp32);
  }
  // A tied directory whose lm_head.weight differs from the embedding in one element.
  const std::string dir = tmp_.file("head");
  testing::write_hf_dir(dir, testing::Variant{});
  std::vector<testing::Tensor> ts = testing::hf_tensors(testing::Variant{});
  testing::Tensor head = ts[0];
  head.name = "lm_head.weight";
  head.raw[4 * 7] ^= 1;
  std::vector<const testing::Tensor*> all;
  for (const testing::Tensor& t : ts) all.push_back(&t);
  all.push_back(&head);
  testing::write_safetensors(dir + "/model.safetensors", all, "F32");
  const Config c = from_hf(dir);
  const std::string fp32 = testing::bad_input_message([&] { read_init_from_weights(c); });
  const std::string half = testing::bad_input_message([&] {
    init_from_hf_dir_half(dir, c.model, c.train.seed, HalfKind::kF16, {}, [](int, const std::vector<uint16_t>&) {});
  });
  EXPECT_TRUE(testing::contains(fp32, "differs from model.embed_tokens.weight at element 7")) << fp32;
  EXPECT_EQ(half, fp32);
}

TEST_F(DecodeWeightsTest, MissingFilesAndDatasetsAreRefusedNamingThem) {
  const std::string step = train_and_save(cfg_, 3);
  // A rank file's parameter dataset gone (its link removed; the file keeps the manifest's size).
  const std::string file1 = step + "/rank_00001.h5";
  testing::remove_dataset_keeping_size(file1, "/units/block.0/param");
  std::string msg = bad_input_message([&] { read_checkpoint_weights(step, cfg_); });
  EXPECT_TRUE(contains(msg, file1 + ": dataset /units/block.0/param is missing")) << msg;
  // A rank file gone.
  fs::remove(step + "/rank_00002.h5");
  msg = bad_input_message([&] { read_checkpoint_weights(step, cfg_); });
  EXPECT_TRUE(contains(msg, step + "/rank_00002.h5: missing (the manifest lists it as rank 2's file")) << msg;
  // Not a checkpoint at all.
  msg = bad_input_message([&] { read_checkpoint_weights(tmp_.file("nope"), cfg_); });
  EXPECT_TRUE(contains(msg, tmp_.file("nope") + " is not a committed checkpoint")) << msg;
}

// A LoRA checkpoint's base file replaced by other weights under the same name: the adapters no longer apply, and the
// refusal names the file and both digests. A rank that leaves the check to another (LoraBaseCheck::kSkip) reads on.
TEST_F(DecodeWeightsTest, AChangedLoraBaseIsRefusedNamingTheFile) {
  Config c = with_lora(cfg_, LoraBase::kBf16);
  c.init.from = tmp_.file("base.h5");
  write_gpt2_base(cfg_, c.init.from);
  const std::string step = train_and_save(c, 1);
  const std::string recorded = describe_lora_base(c.init.from).files.at(0).sha256;
  fs::remove(c.init.from);
  Config other = cfg_;
  other.train.seed += 7;
  write_gpt2_base(other, c.init.from);
  const std::string msg = bad_input_message([&] { read_checkpoint_weights(step, c); });
  EXPECT_TRUE(contains(msg, step + "/manifest.json: the base file base.h5 in init.from " + c.init.from +
                                " changed since the adapters were trained on it"))
      << msg;
  EXPECT_TRUE(contains(msg, "the checkpoint recorded " + recorded)) << msg;
  EXPECT_EQ(read_checkpoint_weights(step, c, LoraBaseCheck::kSkip).units.size(), 4u);
  // A base drawn from the seed needs the checkpoint's seed.
  const Config seeded = with_lora(cfg_, LoraBase::kBf16);
  fs::remove_all(c.ckpt.dir);
  const std::string step2 = train_and_save(seeded, 1);
  Config reseeded = seeded;
  reseeded.train.seed += 1;
  const std::string seed_msg = bad_input_message([&] { read_checkpoint_weights(step2, reseeded); });
  EXPECT_TRUE(contains(seed_msg,
                       "the adapters were trained on the random base of train.seed 1337, and this run's is "
                       "train.seed 1338"))
      << seed_msg;
}

TEST_F(DecodeWeightsTest, InitFromRefusesALoraModel) {
  Config c = with_lora(cfg_, LoraBase::kBf16);
  c.init.from = tmp_.file("base.h5");
  write_gpt2_base(cfg_, c.init.from);
  const std::string msg = bad_input_message([&] { read_init_from_weights(c); });
  EXPECT_TRUE(contains(msg, "lora.rank = 3: init.from " + c.init.from + " holds a whole model")) << msg;
}

}  // namespace
}  // namespace st
