// LoRA adapters in and out of PEFT's layout (ckpt/peft_adapter.h): what a checkpoint exports, a run loads back bit
// for bit at any world size (lora.from), leaving the base (compute dtype or NF4) as it was; an adapter for other keys
// is refused naming the field; the merged export adds the adapters to the init.from file's weights.
#include "shardtrain/ckpt/peft_adapter.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../common/nf4_round_trip.h"
#include "../common/tiny_training.h"
#include "ckpt_test_util.h"
#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/ckpt/hf_export.h"
#include "shardtrain/ckpt/init_from.h"
#include "shardtrain/ckpt/lora_base.h"
#include "shardtrain/ckpt/safetensors_reader.h"
#include "shardtrain/ckpt/tools.h"
#include "shardtrain/comm/fake_communicator.h"
#include "shardtrain/core/error.h"
#include "shardtrain/model/lora.h"
#include "shardtrain/train/step_engine.h"
#include "tiny_ckpt_test.h"

namespace st {
namespace {

class PeftAdapterTest : public testing::TinyCkptTest {
 protected:
  void SetUp() override {
    TinyCkptTest::SetUp();
    cfg_.model.lora.rank = 3;
    cfg_.model.lora.alpha = 6;
    cfg_.model.lora.targets = "qkv,fc_proj";
  }

  // Two trained steps, saved and exported; returns the trained adapters (every unit's trainable tensors).
  std::vector<std::vector<float>> train_and_export(const std::string& out) {
    std::vector<std::vector<float>> adapters;
    fake::spawn(2, [&](Communicator& comm) {
      StepEngine e(cfg_, comm);
      testing::Trace tr;
      testing::train_steps(e, cfg_, comm, 5, 0, 2, &tr);
      CheckpointState cs;
      cs.step = 2;
      const std::string where = save_checkpoint(cfg_, e.sharded(), cs, comm);
      std::vector<std::vector<float>> mine;
      for (const UnitLayout& u : e.units()) mine.push_back(e.sharded().gather_params(u.index));
      if (comm.rank() != 0) return;
      adapters = std::move(mine);
      export_peft_adapter(where, out);
    });
    return adapters;
  }

  std::string refusal(const Config& c, const std::string& dir) {
    std::string what;
    fake::spawn(1, [&](Communicator& comm) {
      StepEngine e(c, comm);
      try {
        load_peft_adapter(dir, c.model, e.sharded());
      } catch (const Error& err) {
        EXPECT_EQ(err.kind(), ErrorKind::kBadInput);
        what = err.what();
      }
    });
    return what;
  }
};

// The load writes the adapters only: the base stays as it was, an NF4 base (QLoRA) too, whose storage the load pulls
// with the adapters and must not quantise again.
TEST_F(PeftAdapterTest, ExportedAdaptersLoadBackBitForBitAtAnyWorldSize) {
  for (LoraBase base : {LoraBase::kBf16, LoraBase::kNf4}) {
    cfg_.model.lora.base_dtype = base;
    const std::string dir = tmp_.file(str_cat("adapter_", to_string(base)));
    const std::vector<std::vector<float>> want = train_and_export(dir);
    for (int world : {1, 3}) {
      fake::spawn(world, [&](Communicator& comm) {
        StepEngine e(cfg_, comm);
        std::vector<std::vector<float>> frozen, storage;
        for (const UnitLayout& u : e.units()) {
          frozen.push_back(e.sharded().gather_frozen(u.index));
          storage.push_back(e.sharded().shard(u.index).nf4_words);
        }
        load_peft_adapter(dir, cfg_.model, e.sharded());
        for (const UnitLayout& u : e.units()) {
          const auto i = static_cast<size_t>(u.index);
          const std::string what = str_cat(u.name, ", ", to_string(base), ", world ", world);
          const std::vector<float> got = e.sharded().gather_params(u.index);
          EXPECT_EQ(testing::bits(e.sharded().gather_frozen(u.index)), testing::bits(frozen[i])) << what;
          EXPECT_EQ(testing::bits(e.sharded().shard(u.index).nf4_words), testing::bits(storage[i])) << what;
          EXPECT_EQ(storage[i].empty(), base == LoraBase::kBf16 || u.kind != UnitKind::kBlock) << what;
          if (comm.rank() == 0) EXPECT_EQ(got, want[i]) << what;
        }
      });
    }
    std::filesystem::remove_all(cfg_.ckpt.dir);
  }
}

TEST_F(PeftAdapterTest, AnAdapterForOtherKeysIsRefusedNamingTheField) {
  const std::string dir = tmp_.file("adapter");
  train_and_export(dir);
  Config c = cfg_;
  c.model.lora.rank = 4;
  EXPECT_NE(refusal(c, dir).find("r is 3, lora.rank is 4"), std::string::npos) << refusal(c, dir);
  c = cfg_;
  c.model.lora.alpha = 7;
  EXPECT_NE(refusal(c, dir).find("lora_alpha"), std::string::npos);
  c = cfg_;
  c.model.lora.targets = "qkv";
  const std::string targets = refusal(c, dir);
  EXPECT_NE(targets.find("target_modules adapt attn.c_attn, mlp.c_proj"), std::string::npos) << targets;
  // PEFT's short module names are taken for the full ones.
  std::ofstream(dir + "/adapter_config.json")
      << R"({"peft_type": "LORA", "r": 3, "lora_alpha": 6, "target_modules": ["c_attn", "mlp.c_proj"]})";
  EXPECT_EQ(refusal(cfg_, dir), "");
}

// A GPT-2 LoRA checkpoint's merged export (ckpt export --out FILE): its base read again from init.from with every
// adapter added in, bit for bit what merge_lora gives from the trained adapters on the file's weights, in Hugging
// Face's names and layouts. With an NF4 base (QLoRA) too: the file's weights, not the dequantised ones the adapters
// trained against, so the block matrices differ from a merge onto those.
TEST_F(PeftAdapterTest, MergedGpt2ExportIsTheBaseWithTheAdaptersAdded) {
  for (LoraBase dtype : {LoraBase::kBf16, LoraBase::kNf4}) {
    cfg_.model.lora.base_dtype = dtype;
    Config base_cfg = cfg_;
    base_cfg.model.lora = LoraConfig{};
    const std::string base_file = tmp_.file(str_cat("base_", to_string(dtype), ".h5"));
    std::vector<std::vector<float>> merged, on_dequantised;
    std::string step;
    fake::spawn(1, [&](Communicator& comm) {
      StepEngine b(base_cfg, comm);
      std::vector<const float*> ptrs;
      const auto full = b.gather_params();
      for (const auto& f : full) ptrs.push_back(f.data());
      write_hf_gpt2(base_file, base_cfg.model, b.units(), ptrs);
      Config c = cfg_;
      c.init.from = base_file;
      StepEngine e(c, comm);
      init_from_weights(base_file, c.model, e.sharded());
      testing::Trace tr;
      testing::train_steps(e, c, comm, 5, 0, 2, &tr);
      CheckpointState cs;
      cs.step = 2;
      cs.base = describe_lora_base(base_file);
      step = save_checkpoint(c, e.sharded(), cs, comm);
      std::vector<std::vector<float>> trained = e.gather_params();  // per unit: the adapters, then the frozen base
      on_dequantised = merge_lora(c.model, e.units(), trained);
      for (const UnitLayout& u : e.units()) {
        const std::vector<float> as_file = testing::frozen_segment(u, full[static_cast<size_t>(u.index)]);
        std::copy(as_file.begin(), as_file.end(), trained[static_cast<size_t>(u.index)].begin() + u.numel);
      }
      merged = merge_lora(c.model, e.units(), trained);
    });
    const std::string out_dir = tmp_.file(str_cat("merged_", to_string(dtype)));  // the export's config.json beside it
    std::filesystem::create_directories(out_dir);
    const std::string out = out_dir + "/merged.safetensors";
    export_checkpoint(step, out);
    const SafetensorsReader file(out);
    const std::vector<UnitLayout> units = build_units(base_cfg.model);
    int off_dequantised = 0;
    for (const HfTensorMap& t : hf_gpt2_tensor_map(base_cfg.model, units)) {
      std::vector<float> got(testing::hf_tensor_values(t, merged).size());
      file.read(t.hf_name, t.hf_shape, got.data());
      EXPECT_EQ(got, testing::hf_tensor_values(t, merged)) << t.hf_name << ", " << to_string(dtype);
      off_dequantised += got != testing::hf_tensor_values(t, on_dequantised) ? 1 : 0;
    }
    // NF4: every block matrix (4 a layer); bf16: the base as trained on is the file's.
    EXPECT_EQ(off_dequantised, dtype == LoraBase::kNf4 ? 4 * cfg_.model.n_layer : 0);
    std::filesystem::remove_all(cfg_.ckpt.dir);
  }
}

}  // namespace
}  // namespace st
