// LoRA in the sharded engine (CPU backend, the in-process fake communicator): the frozen base is sharded and gathered
// but never reduced or updated, N ranks train what one process does with and without the host AdamW threads, and
// the adapters merged into the base decode as the adapted model computes.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "../common/rank_equivalence.h"
#include "../common/tiny_training.h"
#include "shardtrain/comm/communicator.h"
#include "shardtrain/comm/fake_communicator.h"
#include "shardtrain/model/decoder.h"
#include "shardtrain/model/lora.h"
#include "shardtrain/shard/shard_span.h"
#include "shardtrain/shard/sharded_model.h"
#include "shardtrain/train/step_engine.h"

namespace st {
namespace {

using testing::rel_norm_error;
using testing::Trace;

constexpr uint64_t kSeed = 5;

Config lora_gpt2() {
  Config c = testing::tiny_config();
  c.train.steps = 4;
  c.optim.warmup_steps = 1;
  c.optim.eps = 1e-6f;
  c.model.lora.rank = 3;
  c.model.lora.alpha = 6;
  c.model.lora.targets = "qkv,fc";
  return c;
}

Config lora_llama() {
  Config c = lora_gpt2();
  c.model.arch = ModelArch::kLlama;
  c.model.n_head = 4;
  c.model.n_kv_head = 2;
  c.model.ffn_dim = 40;
  c.model.tie_embeddings = false;
  c.model.qkv_bias = true;
  c.model.lora.targets = "k,v,o,up";
  c.model.lora.rslora = true;
  c.model.lora.dropout = 0.2f;  // one mask for any world size
  return c;
}

class LoraEngineTest : public ::testing::Test {
 protected:
  void SetUp() override { omp_set_num_threads(1); }  // N ranks already run as N threads
};

// The same bars as ShardedTest.NRanksEqualOneProcess (sharded_model_test.cc): reordered float32 sums over 4 steps.
TEST_F(LoraEngineTest, NRanksEqualOneProcessWithAndWithoutOffload) {
  for (Config c : {lora_gpt2(), lora_llama()}) {
    for (OffloadMode offload : {OffloadMode::kNone, OffloadMode::kOptimizer}) {
      c.optim.offload = offload;
      SCOPED_TRACE(to_string(c.model.arch) + std::string(" offload ") + to_string(offload));
      testing::expect_ranks_equal_one_process(c, kSeed, {2, 3});
    }
  }
}

// The embedding and the head are wholly frozen: gathered as the schedule says, never reduce-scattered; every block
// (its adapters) is. The frozen base is bit-identical after training and the state is 16 bytes a trainable element
// plus 4 a frozen one (fp32 on the CPU).
TEST_F(LoraEngineTest, FrozenUnitsAreGatheredButNeverReducedOrUpdated) {
  for (const Config& c : {lora_gpt2(), lora_llama()}) {
    SCOPED_TRACE(to_string(c.model.arch));
    fake::spawn(3, [&](Communicator& comm) {
      StepEngine e(c, comm);
      const int64_t accum = c.grad_accum_steps(3);
      std::vector<std::vector<float>> frozen_before;
      for (const UnitLayout& u : e.units()) frozen_before.push_back(e.sharded().gather_frozen(u.index));
      e.forward_backward(testing::corpus_batches(c, kSeed, 0, 3, comm.rank()), accum, 0);
      const CommCounters& k = e.sharded().counters();
      const int64_t L = c.model.n_layer;
      EXPECT_EQ(k.reduce_scatters.front(), 0);
      EXPECT_EQ(k.reduce_scatters.back(), 0);
      for (int64_t l = 1; l <= L; ++l) EXPECT_EQ(k.reduce_scatters[static_cast<size_t>(l)], accum);
      EXPECT_EQ(k.gathers.back(), accum);
      e.optimizer_step(0, 1.0f);
      for (int step = 1; step < 3; ++step) {
        e.forward_backward(testing::corpus_batches(c, kSeed, step, 3, comm.rank()), accum, step);
        e.optimizer_step(step, 1.0f);
      }
      int64_t want = 0;
      for (const UnitLayout& u : e.units()) {
        EXPECT_EQ(e.sharded().gather_frozen(u.index), frozen_before[static_cast<size_t>(u.index)]) << u.name;
        want += 16 * padded_shard_size(u.numel, 3) + 4 * padded_shard_size(u.frozen_numel, 3);
        if (u.kind != UnitKind::kBlock) EXPECT_EQ(u.numel, 0) << u.name;
      }
      EXPECT_EQ(e.sharded().memory().sharded_state_bytes, want);
    });
  }
}

// A decoder over merge_lora's weights (the base model with B A scaled into each adapted weight) gives the logits the
// adapted model computes in the engine, after training has made every adapter non-zero.
TEST_F(LoraEngineTest, MergedWeightsDecodeAsTheAdaptedModel) {
  for (const Config& c : {lora_gpt2(), lora_llama()}) {
    SCOPED_TRACE(to_string(c.model.arch));
    SoloCommunicator solo;
    StepEngine e(c, solo);
    Trace trace;
    testing::train_steps(e, c, solo, kSeed, 0, 3, &trace);
    const std::vector<int32_t> tokens = {3, 14, 15, 9, 2, 6, 5};
    std::vector<float> want;
    e.sharded().last_logits(tokens.data(), static_cast<int64_t>(tokens.size()), &want);
    Config base = c;
    base.model = base_model(c.model);
    const std::unique_ptr<Decoder> d = make_decoder(base, merge_lora(c.model, e.units(), e.gather_params()));
    const std::vector<float> got = d->prefill(tokens);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_LE(rel_norm_error(got, want), 1e-5);
    // With every adapter zeroed the logits are another model's: the merge is not a no-op.
    std::vector<std::vector<float>> no_adapters = e.gather_params();
    for (const UnitLayout& u : e.units()) std::fill_n(no_adapters[static_cast<size_t>(u.index)].begin(), u.numel, 0.0f);
    const std::vector<float> plain = make_decoder(base, merge_lora(c.model, e.units(), no_adapters))->prefill(tokens);
    EXPECT_GT(rel_norm_error(plain, want), 1e-3);
  }
}

}  // namespace
}  // namespace st
