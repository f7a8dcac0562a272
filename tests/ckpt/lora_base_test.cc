// A LoRA checkpoint's base (ckpt/lora_base.h): the files it names and their digests, and the refusal of a base
// that changed, naming the file.
#include "shardtrain/ckpt/lora_base.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "../common/temp_dir.h"
#include "shardtrain/ckpt/digest.h"
#include "shardtrain/ckpt/manifest.h"
#include "shardtrain/core/error.h"

namespace st {
namespace {

void write(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

std::string refusal(const ManifestBase& recorded, const ManifestBase& now) {
  try {
    check_lora_base(recorded, now, "m.json");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    return e.what();
  }
  return "";
}

TEST(LoraBase, AFileIsNamedByItsNameAndItsSha256) {
  testing::TempDir dir;
  write(dir.file("w.safetensors"), "abc");
  const ManifestBase b = describe_lora_base(dir.file("w.safetensors"));
  EXPECT_EQ(b.init_from, dir.file("w.safetensors"));
  ASSERT_EQ(b.files.size(), 1u);
  EXPECT_EQ(b.files[0].name, "w.safetensors");
  // sha256("abc"), as sha256sum prints it.
  EXPECT_EQ(b.files[0].sha256, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_TRUE(describe_lora_base("").files.empty());  // the seed's base
}

TEST(LoraBase, AChangedMissingOrExtraFileIsRefusedByName) {
  ManifestBase a;
  a.init_from = "/m/llama";
  a.files = {{"config.json", std::string(64, 'a')}, {"model.safetensors", std::string(64, 'b')}};
  EXPECT_EQ(refusal(a, a), "");
  ManifestBase changed = a;
  changed.files[1].sha256 = std::string(64, 'c');
  const std::string e = refusal(a, changed);
  EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find(std::string(64, 'b')), std::string::npos) << e;
  EXPECT_NE(e.find(std::string(64, 'c')), std::string::npos) << e;
  EXPECT_NE(e.find("m.json"), std::string::npos) << e;
  ManifestBase missing = a;
  missing.files.pop_back();
  EXPECT_NE(refusal(a, missing).find("model.safetensors"), std::string::npos);
  ManifestBase extra = a;
  extra.files.push_back({"model-00002.safetensors", std::string(64, 'd')});
  EXPECT_NE(refusal(a, extra).find("model-00002.safetensors"), std::string::npos);
  ManifestBase seed;
  EXPECT_NE(refusal(a, seed).find("random base"), std::string::npos);
}

// The manifest carries the adapters' settings and the base; a full fine-tuning manifest carries neither.
TEST(LoraBase, ManifestRoundTripsTheLoraFields) {
  Manifest m;
  m.world_size = 1;
  m.model.lora.rank = 4;
  m.model.lora.alpha = 12;
  m.model.lora.targets = "qkv,fc";
  m.model.lora.rslora = true;
  m.model.lora.base_dtype = LoraBase::kNf4;
  m.base.init_from = "/w.h5";
  m.base.files = {{"w.h5", sha256_hex("x", 1)}};
  m.rng_counters = {0};
  m.global_batch = 1;
  ManifestFile f;
  f.name = "rank_00000.h5";
  f.digest = sha256_hex("y", 1);
  m.files.push_back(f);
  const Manifest back = manifest_from_json(manifest_to_json(m), "m.json");
  EXPECT_EQ(back.model.lora.rank, 4);
  EXPECT_EQ(back.model.lora.alpha, 12.0f);
  EXPECT_EQ(back.model.lora.targets, "qkv,fc");
  EXPECT_TRUE(back.model.lora.rslora);
  EXPECT_EQ(back.model.lora.base_dtype, LoraBase::kNf4);
  EXPECT_EQ(back.base.init_from, "/w.h5");
  EXPECT_EQ(back.base.files, m.base.files);
  check_model_matches(back, m.model, "m.json");
  ModelConfig other = m.model;
  other.lora.rank = 8;
  try {
    check_model_matches(back, other, "m.json");
    ADD_FAILURE() << "another rank was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lora.rank is 4 in the checkpoint, 8 in the config"), std::string::npos)
        << e.what();
  }
  // Adapters trained on an NF4 base resume on that base only.
  other = m.model;
  other.lora.base_dtype = LoraBase::kBf16;
  try {
    check_model_matches(back, other, "m.json");
    ADD_FAILURE() << "a bf16 base was taken for adapters trained on an NF4 one";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("m.json: lora.base_dtype is nf4 in the checkpoint, bf16 in the config"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace st
