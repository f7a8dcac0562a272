// init.from: a model starts from exported full weights, whatever the world size.
#include "shardtrain/ckpt/init_from.h"

#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <filesystem>

#include "shardtrain/ckpt/hf_export.h"
#include "shardtrain/ckpt/safetensors.h"
#include "shardtrain/comm/fake_communicator.h"
#include "shardtrain/core/error.h"
#include "shardtrain/train/step_engine.h"

namespace fs = std::filesystem;

namespace st {
namespace {

class InitFromTest : public ::testing::Test {
 protected:
  void SetUp() override {
    omp_set_num_threads(1);
    dir_ = fs::temp_directory_path() / ("shardtrain_init_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    cfg_.model.n_layer = 2;
    cfg_.model.n_embd = 16;
    cfg_.model.n_head = 2;
    cfg_.model.vocab_size = 50;  // padded to 128
    cfg_.model.seq_len = 8;
    cfg_.train.micro_batch = 1;
    cfg_.train.seed = 1;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The seed-1 model's full weights, and files holding them under HF names.
  std::vector<std::vector<float>> write_files(bool prefix, bool extra) {
    SoloCommunicator solo;
    StepEngine e(cfg_, solo);
    const auto full = e.gather_params();
    std::vector<const float*> ptrs;
    for (const auto& f : full) ptrs.push_back(f.data());
    write_hf_gpt2((dir_ / "w.h5").string(), cfg_.model, e.units(), ptrs);
    std::vector<SafetensorsTensor> decl;
    const auto map = hf_gpt2_tensor_map(cfg_.model, e.units());
    auto name_of = [&](const HfTensorMap& m) { return prefix ? m.hf_name : m.hf_name.substr(12); };
    for (const HfTensorMap& m : map) decl.push_back({name_of(m), m.hf_shape});
    if (extra) decl.push_back({"lm_head.weight", {cfg_.model.vocab_size, cfg_.model.n_embd}});
    SafetensorsWriter w((dir_ / "w.safetensors").string(), decl);
    std::vector<float> buf;
    for (const HfTensorMap& m : map) {
      const TensorSpec& t = *m.tensor;
      int64_t n = 1;
      for (int64_t d : m.hf_shape) n *= d;
      buf.assign(full[m.unit].begin() + t.offset, full[m.unit].begin() + t.offset + n);
      if (m.transpose) {  // ours [out, in] -> HF [in, out]
        std::vector<float> tr(buf.size());
        for (int64_t r = 0; r < t.shape[0]; ++r)
          for (int64_t c = 0; c < t.shape[1]; ++c) tr[c * t.shape[0] + r] = buf[r * t.shape[1] + c];
        buf = tr;
      }
      w.write(name_of(m), buf.data(), n);
    }
    if (extra) {
      buf.assign(static_cast<size_t>(cfg_.model.vocab_size * cfg_.model.n_embd), 0.5f);
      w.write("lm_head.weight", buf.data(), static_cast<int64_t>(buf.size()));
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

  fs::path dir_;
  Config cfg_;
};

TEST_F(InitFromTest, H5AndSafetensorsLoadBitExactAtAnyWorldSize) {
  const auto want = write_files(/*prefix=*/true, /*extra=*/false);
  for (int world : {1, 3}) {
    EXPECT_EQ(load((dir_ / "w.h5").string(), world, cfg_), want) << "h5, world " << world;
    EXPECT_EQ(load((dir_ / "w.safetensors").string(), world, cfg_), want) << "safetensors, world " << world;
  }
}

TEST_F(InitFromTest, HuggingFaceNamesWithoutPrefixAndExtraTensorsAreAccepted) {
  const auto want = write_files(/*prefix=*/false, /*extra=*/true);
  EXPECT_EQ(load((dir_ / "w.safetensors").string(), 2, cfg_), want);
}

TEST_F(InitFromTest, ShapeMismatchNamesTensorAndBothShapes) {
  write_files(true, false);
  Config other = cfg_;
  other.model.n_embd = 32;
  try {
    load((dir_ / "w.safetensors").string(), 1, other);
    ADD_FAILURE() << "a 16-wide file loaded into a 32-wide model";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_NE(msg.find("transformer.wte.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[50, 16]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[50, 32]"), std::string::npos) << msg;
  }
  try {
    load((dir_ / "w.bin").string(), 1, cfg_);
    ADD_FAILURE() << "an unknown suffix was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(".safetensors or .h5"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace st
