// Checkpoint save and load and init.from go through a device backend's host views one unit at a time: run through
// HostViewBackend (a device backend's views, on the CPU), each holds at most one unit's view at once, pulls or pushes
// every unit once, leaves none held, and gives the state the whole-model path gives, bit for bit.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "../common/tiny_training.h"
#include "ckpt_test_util.h"
#include "hf_dir_test_util.h"
#include "host_view_backend.h"
#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/ckpt/hf_export.h"
#include "shardtrain/ckpt/init_from.h"
#include "shardtrain/comm/fake_communicator.h"
#include "shardtrain/core/config.h"
#include "shardtrain/model/llama/llama_hf.h"
#include "shardtrain/model/units.h"
#include "shardtrain/shard/shard_span.h"
#include "shardtrain/shard/sharded_model.h"
#include "shardtrain/train/step_engine.h"
#include "tiny_ckpt_test.h"

namespace st {
namespace {

using testing::HostViewBackend;

class StreamedStateTest : public testing::TinyCkptTest {};

// The config of a run that starts from the llama directory `hf` (its config.json sets the model).
Config llama_config(const std::string& hf) {
  return load_config(std::nullopt,
                     {"--init.from=" + hf, "--model.seq_len=16", "--train.micro_batch=1", "--train.global_batch=6"});
}

void expect_streamed_one_unit(const HostViewBackend& viewed, int64_t units, const std::string& what) {
  EXPECT_EQ(viewed.most_held(), 1) << what;
  EXPECT_EQ(viewed.held_unit_views(), 0) << what;
  EXPECT_GE(viewed.pulls(), units) << what;
}

// A synchronous save pulls each unit and releases it before the next; a load (resharding 2 -> 3 and 3 -> 1) pulls and
// pushes each unit once. The state loaded equals the state saved in every bit of param, m and v.
TEST_F(StreamedStateTest, SyncSaveAndLoadHoldOneUnitAndAreBitExact) {
  cfg_.ckpt.async = false;
  for (auto [from, to] : {std::pair{2, 3}, {3, 1}}) {
    const std::string trace = std::to_string(from) + " -> " + std::to_string(to);
    std::vector<std::vector<float>> saved, loaded;
    std::string where;
    fake::spawn(from, [&](Communicator& comm) {
      StepEngine e(cfg_, comm);
      testing::Trace tr;
      testing::train_steps(e, cfg_, comm, 11, 0, 3, &tr);
      CheckpointState cs;
      cs.step = 3;
      cs.optimizer_updates = e.updates();
      HostViewBackend viewed(e.sharded());
      const std::string w = save_checkpoint(cfg_, viewed, cs, comm);
      const int64_t units = static_cast<int64_t>(e.units().size());
      expect_streamed_one_unit(viewed, units, "save " + trace);
      EXPECT_EQ(viewed.pulls(), units) << trace;
      EXPECT_EQ(viewed.pushes(), 0) << trace;  // a save changes nothing
      std::vector<std::vector<float>> s = testing::full_state(e.sharded());
      if (comm.rank() == 0) {
        saved = std::move(s);
        where = w;
      }
    });
    fake::spawn(to, [&](Communicator& comm) {
      StepEngine e(cfg_, comm);
      HostViewBackend viewed(e.sharded());
      const CheckpointState cs = load_checkpoint(where, cfg_, viewed, comm);
      EXPECT_EQ(cs.step, 3);
      const int64_t units = static_cast<int64_t>(e.units().size());
      expect_streamed_one_unit(viewed, units, "load " + trace);
      EXPECT_EQ(viewed.pulls(), units) << trace;
      EXPECT_EQ(viewed.pushes(), units) << trace;
      std::vector<std::vector<float>> s = testing::full_state(e.sharded());
      if (comm.rank() == 0) loaded = std::move(s);
    });
    ASSERT_EQ(saved.size(), loaded.size()) << trace;
    for (size_t i = 0; i < saved.size(); ++i)
      EXPECT_EQ(testing::bits(saved[i].data(), saved[i].size()), testing::bits(loaded[i].data(), loaded[i].size()))
          << trace << ": unit " << i / 3 << ", state " << i % 3;
  }
}

// A checkpoint of 70 files loaded by one rank: the files are opened 64 at a time, each unit pulled and pushed once per
// batch that holds part of it (its second pull brings back what the first batch pushed), one unit in hand at a time,
// every bit loaded.
TEST_F(StreamedStateTest, ALoadOfMoreFilesThanItOpensAtOnceGoesOverTheUnitsPerBatch) {
  constexpr int kWorld = 70;
  std::vector<std::vector<float>> saved;
  std::string where;
  fake::spawn(kWorld, [&](Communicator& comm) {
    ShardedModel model(cfg_, comm);
    for (const UnitLayout& u : model.units()) {  // moments as a trained model's, unlike each other and the params
      UnitShard& sh = model.shard(u.index);
      for (int64_t i = 0; i < sh.span.count; ++i) {
        sh.m[static_cast<size_t>(i)] = 1e-3f * static_cast<float>(sh.span.offset + i + u.index);
        sh.v[static_cast<size_t>(i)] = 1e-6f * static_cast<float>(sh.span.offset + 2 * i + 1);
      }
    }
    CheckpointState cs;
    cs.step = 1;
    const std::string w = save_checkpoint(cfg_, model, cs, comm);
    std::vector<std::vector<float>> s = testing::full_state(model);
    if (comm.rank() == 0) {
      saved = std::move(s);
      where = w;
    }
  });
  SoloCommunicator solo;
  ShardedModel model(cfg_, solo);
  HostViewBackend viewed(model);
  load_checkpoint(where, cfg_, viewed, solo);
  const int64_t units = static_cast<int64_t>(model.units().size());
  expect_streamed_one_unit(viewed, units, "70 files");
  int64_t in_second_batch = 0;  // units with elements in files 64 .. 69 (a small unit's last spans are empty)
  for (const UnitLayout& u : model.units()) in_second_batch += shard_span(u.numel, 64, kWorld).count > 0 ? 1 : 0;
  EXPECT_GT(in_second_batch, 0);
  EXPECT_EQ(viewed.pulls(), units + in_second_batch);
  EXPECT_EQ(viewed.pushes(), units + in_second_batch);
  const std::vector<std::vector<float>> loaded = testing::full_state(model);
  ASSERT_EQ(saved.size(), loaded.size());
  for (size_t i = 0; i < saved.size(); ++i)
    EXPECT_EQ(testing::bits(saved[i].data(), saved[i].size()), testing::bits(loaded[i].data(), loaded[i].size()))
        << "unit " << i / 3 << ", state " << i % 3;
}

// init.from a GPT-2 file at three ranks: one unit in hand at a time, and the weights the file holds.
TEST_F(StreamedStateTest, InitFromAGpt2FileHoldsOneUnit) {
  std::vector<std::vector<float>> want;
  const std::string file = tmp_.file("w.h5");
  {
    SoloCommunicator solo;
    StepEngine e(cfg_, solo);
    want = e.gather_params();
    std::vector<const float*> ptrs;
    for (const std::vector<float>& f : want) ptrs.push_back(f.data());
    write_hf_gpt2(file, cfg_.model, e.units(), ptrs);
  }
  Config c = cfg_;
  c.train.seed = cfg_.train.seed + 1;  // another random init, which the file overwrites
  fake::spawn(3, [&](Communicator& comm) {
    StepEngine e(c, comm);
    HostViewBackend viewed(e.sharded());
    init_from_weights(file, c.model, viewed);
    expect_streamed_one_unit(viewed, 0, "init.from " + file);
    EXPECT_EQ(viewed.pushes(), viewed.pulls());
    const std::vector<std::vector<float>> got = e.gather_params();
    if (comm.rank() == 0) EXPECT_EQ(got, want);
  });
}

// init.from a Hugging Face llama directory (two safetensors files) at three ranks: one unit in hand at a time, and the
// values the files hold.
TEST_F(StreamedStateTest, InitFromALlamaDirectoryHoldsOneUnit) {
  testing::Variant v;
  v.files = 2;
  const std::string hf = tmp_.file("hf");
  const std::vector<testing::Tensor> tensors = testing::write_hf_dir(hf, v);
  const Config c = llama_config(hf);
  const std::vector<std::vector<float>> want = testing::expected_units(build_units(c.model), tensors, c.model);
  fake::spawn(3, [&](Communicator& comm) {
    StepEngine e(c, comm);
    HostViewBackend viewed(e.sharded());
    init_from_weights(c.init.from, c.model, viewed);
    expect_streamed_one_unit(viewed, 0, "init.from " + hf);
    EXPECT_EQ(viewed.pushes(), viewed.pulls());
    const std::vector<std::vector<float>> got = e.gather_params();
    if (comm.rank() == 0) EXPECT_EQ(got, want);
  });
}

// A NaN in one tensor of a llama directory: init.from is refused naming the tensor, the unit that holds it is never
// pushed (its state stays the random init, every bit), the units before it were pushed from the file, and no view is
// left held.
TEST_F(StreamedStateTest, AUnitHoldingANonFiniteValueIsNotPushed) {
  const std::string hf = tmp_.file("hf");
  testing::write_hf_dir(hf, testing::Variant{});
  std::vector<testing::Tensor> tensors = testing::hf_tensors(testing::Variant{});
  const std::string bad = "model.layers.1.mlp.up_proj.weight";
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (testing::Tensor& t : tensors)
    if (t.name == bad) std::memcpy(&t.raw[4 * 5], &nan, 4);  // element 5
  std::vector<const testing::Tensor*> all;
  for (const testing::Tensor& t : tensors) all.push_back(&t);
  testing::write_safetensors(hf + "/model.safetensors", all, "F32");
  const Config c = llama_config(hf);
  const std::vector<UnitLayout> units = build_units(c.model);
  const std::vector<std::vector<float>> from_file = testing::expected_units(units, tensors, c.model);
  int bad_unit = -1;
  for (const HfRange& r : llama_hf_tensor_map(c.model, units))
    if (r.hf_name == bad) bad_unit = r.unit;
  ASSERT_GT(bad_unit, 0);
  SoloCommunicator solo;
  StepEngine e(c, solo);
  const std::vector<std::vector<float>> before = e.gather_params();
  HostViewBackend viewed(e.sharded());
  const std::string msg = testing::bad_input_message([&] { init_from_weights(hf, c.model, viewed); });
  EXPECT_TRUE(testing::contains(msg, bad)) << msg;
  EXPECT_EQ(viewed.held_unit_views(), 0);
  EXPECT_EQ(viewed.most_held(), 1);
  const std::vector<std::vector<float>> after = e.gather_params();
  const auto& b = before[static_cast<size_t>(bad_unit)];
  const auto& a = after[static_cast<size_t>(bad_unit)];
  EXPECT_EQ(testing::bits(a.data(), a.size()), testing::bits(b.data(), b.size()));
  for (int u = 0; u < bad_unit; ++u) EXPECT_EQ(after[static_cast<size_t>(u)], from_file[static_cast<size_t>(u)]);
}

}  // namespace
}  // namespace st
