// init.from: a model starts from exported full weights, whatever the world size, into a LoRA model's frozen base too
// (compute dtype or NF4).
#include "shardtrain/ckpt/init_from.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <vector>

#include "../common/nf4_round_trip.h"
#include "../common/tiny_training.h"
#include "ckpt_test_util.h"
#include "shardtrain/ckpt/hf_export.h"
#include "shardtrain/ckpt/safetensors.h"
#include "shardtrain/comm/fake_communicator.h"
#include "shardtrain/core/error.h"
#include "shardtrain/model/units.h"
#include "shardtrain/train/step_engine.h"

namespace st {
namespace {

class InitFromTest : public ::testing::Test {
 protected:
  void SetUp() override {
    omp_set_num_threads(1);
    cfg_ = testing::tiny_config();  // vocabulary 50, padded to 128
    cfg_.train.seed = 1;
  }

  // The seed-1 model's full weights, and files holding them under HF names. `extra` adds lm_head.weight: a copy of
  // wte (as old GPT2LMHeadModel exports hold it), or with `head_differs` another matrix.
  std::vector<std::vector<float>> write_files(bool prefix, bool extra, bool head_differs = false) {
    SoloCommunicator solo;
    StepEngine e(cfg_, solo);
    const auto full = e.gather_params();
    std::vector<const float*> ptrs;
    for (const auto& f : full) ptrs.push_back(f.data());
    write_hf_gpt2(dir_.file("w.h5"), cfg_.model, e.units(), ptrs);
    std::vector<SafetensorsTensor> decl;
    const auto map = hf_gpt2_tensor_map(cfg_.model, e.units());
    auto name_of = [&](const HfTensorMap& m) { return prefix ? m.hf_name : m.hf_name.substr(12); };
    for (const HfTensorMap& m : map) decl.push_back({name_of(m), m.hf_shape});
    if (extra) decl.push_back({"lm_head.weight", {cfg_.model.vocab_size, cfg_.model.n_embd}});
    SafetensorsWriter w(dir_.file("w.safetensors"), decl);
    for (const HfTensorMap& m : map) {
      const std::vector<float> values = testing::hf_tensor_values(m, full);
      w.write(name_of(m), values.data(), static_cast<int64_t>(values.size()));
    }
    if (extra) {
      std::vector<float> head = testing::hf_tensor_values(map.front(), full);  // transformer.wte.weight
      if (head_differs) head[17] += 1.0f;
      w.write("lm_head.weight", head.data(), static_cast<int64_t>(head.size()));
    }
    w.finish();
    return full;
  }

  std::vector<std::vector<float>> load(const std::string& file, int world, Config c) {
    c.train.seed = 2;  // a different random init, overwritten by the load
    std::vector<std::vector<float>> out;
    fake::spawn(world, [&](Communicator& comm) {
      StepEngine e(c, comm);
      init_from_weights(file, c.model, e.sharded());
      auto full = e.gather_params();
      if (comm.rank() == 0) out = std::move(full);
    });
    return out;
  }

  testing::TempDir dir_;
  Config cfg_;
};

// A LoRA model takes the file into its frozen base, from either format at any world size: in the compute dtype as
// the file holds it; as NF4 (QLoRA) each block matrix as the NF4 round trip of the file's tensor, and every other
// frozen tensor (the embeddings, norms and biases) as the file holds it.
TEST_F(InitFromTest, ALoraModelLoadsTheFileIntoItsFrozenBase) {
  const auto want = write_files(/*prefix=*/true, /*extra=*/false);
  for (LoraBase dtype : {LoraBase::kBf16, LoraBase::kNf4}) {
    Config c = cfg_;
    c.model.lora.rank = 2;
    c.model.lora.targets = "qkv,fc";
    c.model.lora.base_dtype = dtype;
    const bool nf4 = dtype == LoraBase::kNf4;
    const std::vector<UnitLayout> units = build_units(c.model);
    for (const char* file : {"w.h5", "w.safetensors"}) {
      for (int world : {1, 3}) {
        const auto got = load(dir_.file(file), world, c);  // per unit: the adapters, then the frozen segment
        for (const UnitLayout& u : units) {
          const auto i = static_cast<size_t>(u.index);
          const std::string what = str_cat(u.name, ", ", to_string(dtype), ", ", file, ", world ", world);
          const std::vector<float> frozen(got[i].begin() + u.numel, got[i].end());
          const std::vector<float> as_file = testing::frozen_segment(u, want[i]);
          EXPECT_EQ(frozen, nf4 ? testing::nf4_round_trip(u, as_file) : as_file) << what;
          EXPECT_EQ(frozen == as_file, !nf4 || u.kind != UnitKind::kBlock) << what << ": NF4 changes a block's weights";
        }
      }
    }
  }
}

TEST_F(InitFromTest, H5AndSafetensorsLoadBitExactAtAnyWorldSize) {
  const auto want = write_files(/*prefix=*/true, /*extra=*/false);
  for (int world : {1, 3}) {
    EXPECT_EQ(load(dir_.file("w.h5"), world, cfg_), want) << "h5, world " << world;
    EXPECT_EQ(load(dir_.file("w.safetensors"), world, cfg_), want) << "safetensors, world " << world;
  }
}

TEST_F(InitFromTest, HuggingFaceNamesWithoutPrefixAndATiedHeadCopyAreAccepted) {
  const auto want = write_files(/*prefix=*/false, /*extra=*/true);
  EXPECT_EQ(load(dir_.file("w.safetensors"), 2, cfg_), want);
}

// GPT-2 ties its head to wte: an lm_head.weight that is not wte's copy would be dropped, so it is refused, on every
// rank alike, naming the first element that differs.
TEST_F(InitFromTest, AHeadThatIsNotTheEmbeddingsCopyIsRefused) {
  ASSERT_EQ(hf_gpt2_tensor_map(cfg_.model, build_units(cfg_.model)).front().hf_name, "transformer.wte.weight");
  write_files(/*prefix=*/true, /*extra=*/true, /*head_differs=*/true);
  const std::string msg = testing::bad_input_message([&] { load(dir_.file("w.safetensors"), 3, cfg_); });
  EXPECT_TRUE(testing::contains(msg, "tensor lm_head.weight in " + dir_.file("w.safetensors") +
                                         " differs from transformer.wte.weight at element 17 (index [1, 1])"))
      << msg;
}

TEST_F(InitFromTest, ShapeMismatchNamesTensorAndBothShapes) {
  write_files(true, false);
  Config other = cfg_;
  other.model.n_embd = 32;
  try {
    load(dir_.file("w.safetensors"), 1, other);
    ADD_FAILURE() << "a 16-wide file loaded into a 32-wide model";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_NE(msg.find("transformer.wte.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[50, 16]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[50, 32]"), std::string::npos) << msg;
  }
  testing::write_bytes(dir_.file("w.bin"), "weights?");  // there, but of no known format
  try {
    load(dir_.file("w.bin"), 1, cfg_);
    ADD_FAILURE() << "an unknown suffix was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(".safetensors or .h5"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace st
