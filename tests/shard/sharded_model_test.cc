// ZeRO-3 on the in-process fake communicator: N ranks (threads) against one process.
#include "shardtrain/shard/sharded_model.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include "../common/tiny_training.h"
#include "shardtrain/comm/communicator.h"
#include "shardtrain/comm/fake_communicator.h"
#include "shardtrain/core/process_memory.h"
#include "shardtrain/shard/memory_plan.h"
#include "shardtrain/train/step_engine.h"

namespace st {
namespace {

using testing::rel_norm_error;
using testing::Trace;

constexpr uint64_t kSeed = 5;  // the corpus of testing::corpus_batches

Config small(int n_layer = 2, int n_embd = 16, int n_head = 2, int vocab = 50) {
  Config c = testing::tiny_config();
  c.model.n_layer = n_layer;
  c.model.n_embd = n_embd;
  c.model.n_head = n_head;
  c.model.vocab_size = vocab;  // padded to 128
  c.train.steps = 4;
  c.optim.warmup_steps = 1;
  c.optim.eps = 1e-6f;  // see tests/shard/mpi_equivalence_test.py
  return c;
}

// The same size as a llama: grouped-query attention (4 query heads on 2 K/V heads), SwiGLU, RoPE with llama3
// scaling, an untied head, q/k/v biases.
Config small_llama() {
  Config c = small();
  c.model.arch = ModelArch::kLlama;
  c.model.n_head = 4;
  c.model.n_kv_head = 2;
  c.model.ffn_dim = 40;
  c.model.rope_scaling = RopeScaling::kLlama3;
  c.model.rope_scaling_original_max_position = 8;
  c.model.tie_embeddings = false;
  c.model.qkv_bias = true;
  return c;
}

Trace train(const Config& c, Communicator& comm) { return testing::train(c, comm, kSeed, c.train.steps); }

// Where the bars come from: the N-rank run computes the same float32 terms as one process and sums each gradient
// over ranks (reduce-scatter) instead of over one batch, so the runs differ by reordered sums, which grow through 4
// AdamW steps (eps 1e-6 keeps AdamW from magnifying gradients that are rounding noise). A sum of n float32 terms in
// another order moves by at most n u of the sum of their magnitudes (u = 2^-24); 1e-5 is that bound for n = 168,
// above the 64 positions a gradient element sums here, and about 10x the sqrt(n) u growth of random rounding over 4
// steps. A rank that loses a micro-batch or a shard is off by 1e-2 or more. Every OpenBLAS core type passes
// (tests/numeric_per_coretype.sh, label numeric).
void expect_close(const Trace& ref, const Trace& got, const std::string& what) {
  ASSERT_EQ(ref.losses.size(), got.losses.size());
  for (size_t i = 0; i < ref.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], ref.losses[i], 1e-5 * std::fabs(ref.losses[i])) << what << " step " << i;
    EXPECT_NEAR(got.norms[i], ref.norms[i], 1e-5 * ref.norms[i]) << what << " step " << i;
  }
  ASSERT_EQ(ref.params.size(), got.params.size());
  for (size_t u = 0; u < ref.params.size(); ++u)
    EXPECT_LE(rel_norm_error(got.params[u], ref.params[u]), 1e-5) << what << " unit " << u;
}

class ShardedTest : public ::testing::Test {
 protected:
  void SetUp() override { omp_set_num_threads(1); }  // N ranks already run as N threads
};

TEST_F(ShardedTest, NRanksEqualOneProcess) {
  for (const Config& c : {small(), small_llama()}) {
    SCOPED_TRACE(to_string(c.model.arch));
    SoloCommunicator solo;
    const Trace ref = train(c, solo);
    for (int world : {2, 3, 4}) {
      Trace got;
      fake::spawn(world, [&](Communicator& comm) {
        Trace t = train(c, comm);
        if (comm.rank() == 0) got = std::move(t);
      });
      expect_close(ref, got, "world " + std::to_string(world));
    }
  }
}

// More ranks than elements in the head unit (lnf weight+bias: 2 x n_embd = 4): ranks 4 and 5 own
// empty spans of it and still take part in every collective.
TEST_F(ShardedTest, RanksWithEmptySpansStillTrain) {
  const Config c = small(/*n_layer=*/1, /*n_embd=*/2, /*n_head=*/1);
  SoloCommunicator solo;
  const Trace ref = train(c, solo);
  Trace got;
  std::vector<ShardSpan> head_spans(6);
  fake::spawn(6, [&](Communicator& comm) {
    Config c6 = c;
    c6.train.global_batch = 12;
    Trace t = train(c6, comm);
    ShardedModel m(c6, comm);
    head_spans[static_cast<size_t>(comm.rank())] = m.shard(2).span;
    if (comm.rank() == 0) got = std::move(t);
  });
  EXPECT_EQ(head_spans[4], (ShardSpan{4, 0}));
  EXPECT_EQ(head_spans[5], (ShardSpan{4, 0}));
  expect_close(ref, got, "world 6");
}

TEST_F(ShardedTest, ShardedStateIs16BytesPerPaddedElement) {
  const Config c = small(/*n_layer=*/3, /*n_embd=*/24, /*n_head=*/3, /*vocab=*/77);
  for (int world = 1; world <= 5; ++world) {
    fake::spawn(world, [&](Communicator& comm) {
      ShardedModel m(c, comm);
      int64_t want = 0, P = 0;
      for (const UnitLayout& u : m.units()) {
        want += 16 * ((u.numel + world - 1) / world);
        P += u.numel;
      }
      const MemoryStats mem = m.memory();
      EXPECT_EQ(mem.sharded_state_bytes, want) << "world " << world;
      // 16 P / N plus at most 16 (N - 1) bytes of padding per unit.
      EXPECT_GE(mem.sharded_state_bytes * world, 16 * P);
      EXPECT_LE(mem.sharded_state_bytes,
                16 * P / world + 16 * (world - 1) * static_cast<int64_t>(m.units().size()) + 16);
    });
  }
}

// The CPU backend's peak memory is the process's peak resident set: at least its own state and buffers, which
// are all resident (written at construction), and never lower at a later call.
TEST_F(ShardedTest, PeakMemoryIsTheProcessPeakResidentSet) {
  const Config c = small(/*n_layer=*/2, /*n_embd=*/256, /*n_head=*/4, /*vocab=*/1000);
  SoloCommunicator solo;
  ShardedModel m(c, solo);
  const MemoryStats mem = m.memory();
  const int64_t peak = m.peak_memory_bytes();
  EXPECT_GE(peak, mem.sharded_state_bytes + mem.gather_buffer_bytes);
  EXPECT_LE(peak, process_peak_rss_bytes());
  EXPECT_GE(m.peak_memory_bytes(), peak);
}

// The host plan's gather buffers are what the model allocates, at one rank (where the units compute on their shards
// and only LoRA's frozen base brings the parameter slots back) and at two: plain, LoRA, offloaded, kept gathered.
TEST_F(ShardedTest, GatherBuffersAreWhatTheHostPlanSays) {
  for (const char* variant : {"plain", "lora", "offload", "no_reshard"}) {
    Config c = small(/*n_layer=*/2);
    if (std::string(variant) == "lora") c.model.lora.rank = 4;
    if (std::string(variant) == "offload") {
      c.optim.offload = OffloadMode::kOptimizer;
      c.optim.offload_fraction = 0.5f;
    }
    c.dist.reshard_after_forward = std::string(variant) != "no_reshard";
    for (int world : {1, 2}) {
      SCOPED_TRACE(std::string(variant) + " at " + std::to_string(world) + " ranks");
      fake::spawn(world, [&](Communicator& comm) {
        ShardedModel m(c, comm);
        EXPECT_EQ(m.memory().gather_buffer_bytes, plan_host_memory(c, world, 0).gather_buffers);
      });
    }
  }
}

// Each micro-step gathers the embedding twice (forward and tied head), each block twice (forward and
// backward), the head once, and reduce-scatters every unit once: nothing more.
TEST_F(ShardedTest, GathersAndReduceScattersFollowTheSchedule) {
  const Config c = small(/*n_layer=*/2);
  fake::spawn(2, [&](Communicator& comm) {
    StepEngine e(c, comm);
    const int64_t accum = c.grad_accum_steps(2);  // 6
    e.forward_backward(testing::corpus_batches(c, kSeed, 0, 2, comm.rank()), accum);
    // Time inside the collectives is reported once: taking it again right away gives exactly zero.
    EXPECT_GE(e.sharded().take_exposed_comm_ms(), 0.0);
    EXPECT_EQ(e.sharded().take_exposed_comm_ms(), 0.0);
    const CommCounters& k = e.sharded().counters();
    EXPECT_EQ(k.gathers, (std::vector<int64_t>{2 * accum, 2 * accum, 2 * accum, accum}));
    EXPECT_EQ(k.reduce_scatters, (std::vector<int64_t>{accum, accum, accum, accum}));
    // The most in use at once: at the head, the embedding and head parameters and both their gradients.
    const MemoryStats mem = e.sharded().memory();
    EXPECT_GT(mem.gathered_peak_bytes, 0);
    EXPECT_LE(mem.gathered_peak_bytes, mem.gather_buffer_bytes);
  });
}

// Recomputing activations in backward gives bit-identical results: in every block, or in the first
// train.recompute_blocks of them.
TEST_F(ShardedTest, RecomputeIsBitIdentical) {
  Config llama = small_llama();
  llama.model.n_layer = 3;
  Config lora = llama;  // the adapters keep their h where their block keeps its activations
  lora.model.lora.rank = 2;
  lora.model.lora.dropout = 0.1f;
  for (Config c : {small(/*n_layer=*/3), llama, lora}) {
    SCOPED_TRACE(std::string(to_string(c.model.arch)) + (c.model.lora.rank > 0 ? " with LoRA" : ""));
    SoloCommunicator solo;
    const Trace plain = train(c, solo);
    c.train.recompute = true;
    for (const int64_t blocks : {int64_t{0}, int64_t{1}, int64_t{c.model.n_layer - 1}, int64_t{c.model.n_layer}}) {
      SCOPED_TRACE(blocks);
      c.train.recompute_blocks = blocks;
      const Trace re = train(c, solo);
      EXPECT_EQ(plain.losses, re.losses);
      EXPECT_EQ(plain.params, re.params);
    }
  }
}

// Keeping blocks gathered from forward to backward (dist.reshard_after_forward = false) changes only the
// communication: the results are bit-identical, each block is gathered once per micro-step, and more
// gather buffers are held (at two ranks; at one the units compute on their shards, with no buffer either way).
TEST_F(ShardedTest, NoReshardAfterForwardIsBitIdenticalWithFewerGathers) {
  Config c = small(/*n_layer=*/3);
  fake::spawn(2, [&](Communicator& comm) {
    const Trace zero3 = train(c, comm);
    Config keep = c;
    keep.dist.reshard_after_forward = false;
    const Trace zero2 = train(keep, comm);
    EXPECT_EQ(zero3.losses, zero2.losses);
    EXPECT_EQ(zero3.params, zero2.params);
    StepEngine e(keep, comm);
    e.forward_backward(testing::corpus_batches(keep, kSeed, 0, 2, comm.rank()), 1);
    EXPECT_EQ(e.sharded().counters().gathers, (std::vector<int64_t>{2, 1, 1, 1, 1}));
    StepEngine z(c, comm);
    EXPECT_GT(e.sharded().memory().gather_buffer_bytes, z.sharded().memory().gather_buffer_bytes);
  });
  // At one rank the units compute on their shards: the same bits again, and no buffer either way.
  SoloCommunicator solo;
  Config keep = c;
  keep.dist.reshard_after_forward = false;
  const Trace zero3 = train(c, solo), zero2 = train(keep, solo);
  EXPECT_EQ(zero3.losses, zero2.losses);
  EXPECT_EQ(zero3.params, zero2.params);
  EXPECT_EQ(StepEngine(keep, solo).sharded().memory().gather_buffer_bytes,
            StepEngine(c, solo).sharded().memory().gather_buffer_bytes);
}

}  // namespace
}  // namespace st
