// QLoRA in the sharded engine (CPU backend, the in-process fake communicator): lora.base_dtype = nf4 stores each
// block's frozen matrices as NF4, shards that storage and dequantises it after each gather. The base is the NF4 round
// trip of the full model's initialisation, tensor by tensor, whatever the world size; training leaves it bit-identical
// and computes exactly what a compute-dtype base holding those dequantised weights computes; N ranks give one rank's
// result; a loader writes the base through the unit's host view, and a pull for the adapters alone keeps it.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "../common/nf4_round_trip.h"
#include "../common/rank_equivalence.h"
#include "../common/tiny_training.h"
#include "shardtrain/comm/communicator.h"
#include "shardtrain/comm/fake_communicator.h"
#include "shardtrain/core/error.h"
#include "shardtrain/model/nf4_base.h"
#include "shardtrain/shard/shard_span.h"
#include "shardtrain/train/step_engine.h"

namespace st {
namespace {

using testing::rel_norm_error;
using testing::Trace;

constexpr uint64_t kSeed = 5;

Config qlora(ModelArch arch) {
  Config c = testing::tiny_config();
  c.train.steps = 4;
  c.optim.warmup_steps = 1;
  c.optim.eps = 1e-6f;
  c.model.lora.rank = 3;
  c.model.lora.alpha = 6;
  c.model.lora.base_dtype = LoraBase::kNf4;
  if (arch == ModelArch::kLlama) {
    c.model.arch = arch;
    c.model.n_head = 4;
    c.model.n_kv_head = 2;
    c.model.ffn_dim = 40;
    c.model.tie_embeddings = false;
    c.model.qkv_bias = true;
    c.model.lora.targets = "q,v,down";
    c.model.lora.dropout = 0.1f;
  } else {
    c.model.lora.targets = "qkv,proj";
  }
  return c;
}

// The frozen segment of `u` as NF4 storage holds it: each matrix quantised whole and dequantised (kernels/nf4.h),
// every other frozen tensor as drawn.
std::vector<float> round_trip(const UnitLayout& u, const Config& c) {
  std::vector<float> segment(static_cast<size_t>(u.frozen_numel));
  init_unit_range(u, c.model, c.train.seed, 0, u.frozen_numel, segment.data(), Segment::kFrozen);
  return testing::nf4_round_trip(u, std::move(segment));
}

// Each Hugging Face layer is its own NF4 tensor, as bitsandbytes quantises it: llama's stacked q, k, v and gate, up
// are five parts of two matrices, GPT-2's c_attn one; and quantising a stacked matrix whole would give other weights.
TEST(Nf4Base, QuantisesEachHuggingFaceLayerOnItsOwn) {
  const Config llama = qlora(ModelArch::kLlama), gpt2 = qlora(ModelArch::kGpt2);
  const UnitLayout l = build_units(llama.model)[1], g = build_units(gpt2.model)[1];
  auto part_sizes = [](const UnitLayout& u, const char* name) {
    std::vector<int64_t> n;
    for (const Nf4Part& p : nf4_unit_storage(u).parts)
      if (u.tensors[static_cast<size_t>(p.tensor)].name == name) n.push_back(p.numel);
    return n;
  };
  const int64_t C = llama.model.n_embd, kv = llama.model.n_kv_head * llama.model.head_dim(), F = llama.model.ffn_dim;
  EXPECT_EQ(part_sizes(l, "attn.qkv.weight"), (std::vector<int64_t>{C * C, kv * C, kv * C}));
  EXPECT_EQ(part_sizes(l, "mlp.gate_up.weight"), (std::vector<int64_t>{F * C, F * C}));
  EXPECT_EQ(part_sizes(l, "attn.qkv.bias"), (std::vector<int64_t>{C + 2 * kv}));
  EXPECT_EQ(part_sizes(g, "attn.qkv.weight"), (std::vector<int64_t>{3 * C * C}));
  std::vector<float> segment(static_cast<size_t>(l.frozen_numel));
  init_unit_range(l, llama.model, llama.train.seed, 0, l.frozen_numel, segment.data(), Segment::kFrozen);
  const TensorSpec& qkv = l.tensor("attn.qkv.weight");
  std::vector<float> whole(segment.begin() + (qkv.offset - l.numel),
                           segment.begin() + (qkv.offset - l.numel) + qkv.numel);
  nf4_dequantize(nf4_quantize(whole.data(), qkv.numel, qkv.name).view(), whole.data());
  const std::vector<float> per_layer = testing::nf4_round_trip(l, segment);
  EXPECT_FALSE(std::equal(whole.begin(), whole.end(), per_layer.begin() + (qkv.offset - l.numel)));
}

class QloraEngineTest : public ::testing::Test {
 protected:
  void SetUp() override { omp_set_num_threads(1); }  // N ranks already run as N threads
};

TEST_F(QloraEngineTest, TheBaseIsTheNf4RoundTripOfTheInitAndTrainingKeepsIt) {
  for (ModelArch arch : {ModelArch::kGpt2, ModelArch::kLlama}) {
    const Config c = qlora(arch);
    Config bf16 = c;
    bf16.model.lora.base_dtype = LoraBase::kBf16;
    SCOPED_TRACE(to_string(arch));
    for (int world : {1, 3}) {
      fake::spawn(world, [&](Communicator& comm) {
        StepEngine e(c, comm), plain(bf16, comm);
        int64_t nf4_units = 0, want_state = 0;
        std::vector<std::vector<float>> before;
        for (const UnitLayout& u : e.units()) {
          before.push_back(e.sharded().gather_frozen(u.index));
          const std::vector<float> want =
              u.nf4_base ? round_trip(u, c) : plain.sharded().gather_frozen(u.index);  // embedding, head: as drawn
          EXPECT_EQ(before.back(), want) << u.name << " world " << world;
          nf4_units += u.nf4_base ? 1 : 0;
          EXPECT_EQ(u.nf4_base, u.kind == UnitKind::kBlock) << u.name;
          want_state += 16 * padded_shard_size(u.numel, world) +
                        4 * (u.nf4_base ? padded_shard_size(nf4_unit_storage(u).words, world)
                                        : padded_shard_size(u.frozen_numel, world));
        }
        EXPECT_EQ(nf4_units, c.model.n_layer);
        EXPECT_EQ(e.sharded().memory().sharded_state_bytes, want_state);
        Trace t;
        testing::train_steps(e, c, comm, kSeed, 0, 3, &t);
        for (const UnitLayout& u : e.units())
          EXPECT_EQ(e.sharded().gather_frozen(u.index), before[static_cast<size_t>(u.index)]) << u.name;
      });
    }
  }
}

// Bit for bit: the engine dequantises into the gathered buffer what the model then computes with, nothing else. The
// compute-dtype base gets the dequantised weights through the host view, as init.from writes a base.
TEST_F(QloraEngineTest, TrainsAsABf16BaseHoldingTheDequantisedWeights) {
  for (ModelArch arch : {ModelArch::kGpt2, ModelArch::kLlama}) {
    const Config c = qlora(arch);
    Config bf16 = c;
    bf16.model.lora.base_dtype = LoraBase::kBf16;
    SCOPED_TRACE(to_string(arch));
    SoloCommunicator solo;
    StepEngine e(c, solo), plain(bf16, solo);
    for (const UnitLayout& u : plain.units()) {
      if (u.frozen_numel == 0) continue;
      const std::vector<float> base = e.sharded().gather_frozen(u.index);
      plain.sharded().pull_unit(u.index);
      std::copy(base.begin(), base.end(), plain.sharded().shard(u.index).frozen.begin());
      plain.sharded().push_unit(u.index);
    }
    Trace want, got;
    testing::train_steps(plain, bf16, solo, kSeed, 0, 3, &want);
    testing::train_steps(e, c, solo, kSeed, 0, 3, &got);
    EXPECT_EQ(got.losses, want.losses);
    EXPECT_EQ(e.gather_params(), plain.gather_params());
  }
}

TEST_F(QloraEngineTest, NRanksEqualOneProcessWithAndWithoutOffload) {
  for (ModelArch arch : {ModelArch::kGpt2, ModelArch::kLlama}) {
    for (OffloadMode offload : {OffloadMode::kNone, OffloadMode::kOptimizer}) {
      Config c = qlora(arch);
      c.optim.offload = offload;
      SCOPED_TRACE(to_string(arch) + std::string(" offload ") + to_string(offload));
      testing::expect_ranks_equal_one_process(c, kSeed, {2, 3});
    }
  }
}

// The host view of an NF4 unit is its whole frozen segment: a loader that writes the adapters alone leaves the base
// as it was; one that writes every frozen tensor gets those weights quantised, on every rank alike; one that writes
// some of them is refused.
TEST_F(QloraEngineTest, AViewPushQuantisesOnlyAWrittenBase) {
  const Config c = qlora(ModelArch::kLlama);
  fake::spawn(2, [&](Communicator& comm) {
    StepEngine e(c, comm);
    ModelBackend& m = e.sharded();
    const UnitLayout& u = e.units()[1];
    const std::vector<float> base = m.gather_frozen(u.index);
    m.pull_unit(u.index);
    UnitShard& view = m.shard(u.index);
    EXPECT_EQ(view.frozen_span.offset, 0);
    EXPECT_EQ(view.frozen_span.count, u.frozen_numel);
    ASSERT_EQ(static_cast<int64_t>(view.frozen.size()), u.frozen_numel);
    for (int64_t i = 0; i < view.span.count; ++i) view.param[static_cast<size_t>(i)] = 0.25f;
    m.push_unit(u.index);
    EXPECT_EQ(m.gather_frozen(u.index), base);
    EXPECT_EQ(m.gather_params(u.index), std::vector<float>(static_cast<size_t>(u.numel), 0.25f));

    std::vector<float> fresh(static_cast<size_t>(u.frozen_numel));
    for (size_t i = 0; i < fresh.size(); ++i) fresh[i] = 0.01f * static_cast<float>((i * 7919) % 201) - 1.0f;
    m.pull_unit(u.index);
    std::copy(fresh.begin(), fresh.end(), m.shard(u.index).frozen.begin());
    m.push_unit(u.index);
    ASSERT_EQ(u.kind, UnitKind::kBlock);
    fresh = testing::nf4_round_trip(u, fresh);
    EXPECT_EQ(m.gather_frozen(u.index), fresh);

    m.pull_unit(u.index);
    const TensorSpec& norm = u.tensor("attn_norm.weight");
    std::fill_n(m.shard(u.index).frozen.begin() + (norm.offset - u.numel), norm.numel, 1.0f);
    EXPECT_THROW(m.push_unit(u.index), Error);
    m.release_unit(u.index);
    EXPECT_EQ(m.gather_frozen(u.index), fresh);
  });
}

}  // namespace
}  // namespace st
