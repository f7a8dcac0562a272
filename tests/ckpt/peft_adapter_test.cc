// LoRA adapters in and out of PEFT's layout (ckpt/peft_adapter.h): what a checkpoint exports, a run loads back bit
// for bit at any world size (lora.from); an adapter for other keys is refused naming the field.
#include "shardtrain/ckpt/peft_adapter.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

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

TEST_F(PeftAdapterTest, ExportedAdaptersLoadBackBitForBitAtAnyWorldSize) {
  const std::string dir = tmp_.file("adapter");
  const std::vector<std::vector<float>> want = train_and_export(dir);
  for (int world : {1, 3}) {
    fake::spawn(world, [&](Communicator& comm) {
      StepEngine e(cfg_, comm);
      load_peft_adapter(dir, cfg_.model, e.sharded());
      for (const UnitLayout& u : e.units()) {
        const std::vector<float> got = e.sharded().gather_params(u.index);
        if (comm.rank() == 0) EXPECT_EQ(got, want[static_cast<size_t>(u.index)]) << u.name << ", world " << world;
      }
    });
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
// adapter added in, bit for bit what merge_lora gives from the trained model, in Hugging Face's names and layouts.
TEST_F(PeftAdapterTest, MergedGpt2ExportIsTheBaseWithTheAdaptersAdded) {
  Config base_cfg = cfg_;
  base_cfg.model.lora = LoraConfig{};
  const std::string base_file = tmp_.file("base.h5");
  std::vector<std::vector<float>> merged;
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
    merged = merge_lora(c.model, e.units(), e.gather_params());
  });
  const std::string out = tmp_.file("merged.safetensors");
  export_checkpoint(step, out);
  const SafetensorsReader file(out);
  const std::vector<UnitLayout> units = build_units(base_cfg.model);
  for (const HfTensorMap& t : hf_gpt2_tensor_map(base_cfg.model, units)) {
    std::vector<float> got(testing::hf_tensor_values(t, merged).size());
    file.read(t.hf_name, t.hf_shape, got.data());
    EXPECT_EQ(got, testing::hf_tensor_values(t, merged)) << t.hf_name;
  }
}

}  // namespace
}  // namespace st
