// CudaLlama and CudaGpt with LoRA (rank 3, alpha 5) against the CPU fp32 models (LlamaModel, GptModel) on the same
// frozen base, adapters and batch, one micro-batch through every unit: fp32 gives the same loss (1e-5), the same
// gradient of every adapter's A and B (1e-4 by ||gpu - cpu|| / ||cpu||, and element by element to 1e-3 above a
// hundredth of the tensor's largest) and the same sampling logits; bf16 (the CPU run on the bf16-rounded parameters)
// tracks them to 2e-2 on the loss and 3e-2 on each block's adapter gradients. Three blocks: the adapters of blocks 0
// and 1 are trained from the input gradients of blocks 1 and 2, adapters' parts included, so those are held too.
// Every gradient buffer is the unit's full flat size and poisoned: the trainable segment is written in full, and the
// frozen segment (no gradient) is never written. Llama: grouped-query attention, q/k/v biases and an untied head,
// with adapters on q and v (row slices of the stacked qkv), o, up (a row slice of gate_up) and down. GPT-2: adapters
// on all four layers (fc's ahead of the GELU), or on qkv and fc only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "../common/gpu_test.h"
#include "../common/tiny_training.h"
#include "cpu_step_test_util.h"
#include "shardtrain/core/rng.h"
#include "shardtrain/kernels/gpu/matmul.h"
#include "shardtrain/model/cuda_family.h"
#include "shardtrain/model/cuda_footprint.h"
#include "shardtrain/model/family.h"

namespace st {
namespace {

using testing::rel_norm_error;

constexpr int64_t kB = 2;

ModelConfig lora_on(ModelConfig c, const char* targets) {
  c.lora.rank = 3;
  c.lora.alpha = 5;
  c.lora.targets = targets;
  return c;
}

// 4 query heads of 16 on 2 K/V heads, q/k/v biases, an untied lm_head; vocab 300 (padded to 384).
ModelConfig llama_gqa_bias_untied() {
  ModelConfig c;
  c.arch = ModelArch::kLlama;
  c.n_layer = 3;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.n_embd = 64;
  c.ffn_dim = 96;
  c.vocab_size = 300;
  c.seq_len = 24;
  c.qkv_bias = true;
  c.tie_embeddings = false;
  return lora_on(c, "q,v,o,up,down");
}

ModelConfig gpt2(const char* targets) {
  ModelConfig c;
  c.n_layer = 3;
  c.n_head = 4;
  c.n_embd = 64;
  c.vocab_size = 300;
  c.seq_len = 24;
  return lora_on(c, targets);
}

// Every unit's full flat buffer (trainable segment, then frozen): the initialisation plus uniform noise, +-0.02 on
// the base (RMSNorm weights not all 1, biases not 0) and +-0.1 on the adapters (B is not zero, so they matter);
// rounded through T.
template <typename T>
std::vector<std::vector<float>> make_params(const ModelConfig& c) {
  std::vector<std::vector<float>> p;
  Rng rng(21, 0);
  for (const UnitLayout& u : build_units(c)) {
    std::vector<float> v(static_cast<size_t>(u.numel + u.frozen_numel));
    init_unit_range(u, c, /*seed=*/5, 0, u.numel, v.data());
    init_unit_range(u, c, 5, 0, u.frozen_numel, v.data() + u.numel, Segment::kFrozen);
    for (const TensorSpec& t : u.tensors) {
      const double noise = t.frozen ? 0.04 : 0.2;
      for (int64_t i = t.offset; i < t.offset + t.numel; ++i)
        v[static_cast<size_t>(i)] += static_cast<float>(noise * (rng.next_uniform() - 0.5));
    }
    p.push_back(test::round_through<T>(std::move(v)));
  }
  return p;
}

using testing::Batch;
using testing::max_abs;
using Result = testing::StepResult;

float dloss_of(const ModelConfig& c) { return testing::dloss_of(c, kB); }

// With null_frozen_units, the wholly frozen units (the embedding and the head) get no gradient buffer at all.
template <typename T>
Result gpu_run(const ModelConfig& c, const std::vector<std::vector<float>>& p, const Batch& b, Recompute recompute,
               bool null_frozen_units = false) {
  CudaStream stream;
  gpu::Blas blas;
  const DType dtype = std::is_same_v<T, float> ? DType::kF32 : DType::kBF16;
  DeviceBuffer<unsigned char> scratch(cuda_model_footprint(c, kB, recompute, dtype, 0).scratch_bytes);
  gpu::GpuContext ctx{stream.get(), &blas, scratch.data(), scratch.bytes()};
  const std::unique_ptr<CudaUnitModel<T>> m = cuda_model_family<T>(c.arch).make_model(
      c, kB, recompute, /*cudnn_attention=*/false, ctx, gpu::CudnnBackwardMode::kDeterministic, Fp8Policy{});
  const std::vector<UnitLayout>& units = m->units();
  const int L = c.n_layer;
  std::vector<DeviceBuffer<T>> P, G;
  std::vector<T*> g;
  for (size_t u = 0; u < p.size(); ++u) {
    P.push_back(test::to_device<T>(p[u]));
    G.emplace_back(static_cast<int64_t>(p[u].size()));
    test::poison(G.back());
    g.push_back(null_frozen_units && units[u].numel == 0 ? nullptr : G.back().data());
  }
  m->embedding_forward(P[0].data(), b.tokens.data(), kB, c.seq_len);
  for (int l = 0; l < L; ++l) m->block_forward(l, P[1 + l].data());
  m->head_forward_backward(P[L + 1].data(), P[0].data(), b.targets.data(), dloss_of(c), g[L + 1], g[0]);
  for (int l = L - 1; l >= 0; --l) m->block_backward(l, P[1 + l].data(), g[1 + l]);
  m->embedding_backward(g[0]);
  Result r;
  r.loss = m->take_loss_sum() / static_cast<double>(kB * c.seq_len);
  for (size_t u = 0; u < G.size(); ++u) {
    const std::vector<float> full = test::to_host(G[u]);
    const auto frozen = full.begin() + units[u].numel;
    EXPECT_TRUE(std::all_of(frozen, full.end(), [](float x) { return std::isnan(x); }))
        << units[u].name << ": the frozen segment was written";
    r.grads.emplace_back(full.begin(), frozen);
  }
  m->head_logits(P[L + 1].data(), P[0].data(), c.seq_len - 1, &r.logits);
  return r;
}

// Each adapter tensor of each block, by name.
void expect_fp32_match(const ModelConfig& c, const Result& gpu, const Result& cpu) {
  EXPECT_NEAR(gpu.loss, cpu.loss, 1e-5 * cpu.loss);
  const std::vector<UnitLayout> units = build_units(c);
  ASSERT_EQ(gpu.grads.size(), units.size());
  int adapters = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    ASSERT_EQ(gpu.grads[u].size(), cpu.grads[u].size()) << units[u].name;
    for (const TensorSpec& t : units[u].tensors) {
      if (t.frozen) continue;
      ++adapters;
      const auto at = [&](const std::vector<float>& g) {
        return std::vector<float>(g.begin() + t.offset, g.begin() + t.offset + t.numel);
      };
      const std::vector<float> got = at(gpu.grads[u]), want = at(cpu.grads[u]);
      EXPECT_GT(max_abs(want), 0.0) << units[u].name << "." << t.name;  // the adapter is exercised
      EXPECT_LE(rel_norm_error(got, want), 1e-4) << units[u].name << "." << t.name;
      EXPECT_TRUE(test::all_close(got, want, 1e-3, 1e-2 * max_abs(want))) << units[u].name << "." << t.name;
    }
  }
  EXPECT_EQ(adapters, 2 * c.n_layer * static_cast<int>(lora_targets(c).size()));
  // Logits element by element: 1e-3 relative above a thousandth of the largest (measured 2.3e-4 on an H200: the
  // adapters add a reordered sum to every block's output).
  EXPECT_TRUE(test::all_close(gpu.logits, cpu.logits, 1e-3, 1e-3 * max_abs(cpu.logits)));
}

void expect_half_tracks(const Result& gpu, const Result& cpu) {
  EXPECT_NEAR(gpu.loss, cpu.loss, 2e-2 * cpu.loss);
  ASSERT_EQ(gpu.grads.size(), cpu.grads.size());
  for (size_t u = 0; u < cpu.grads.size(); ++u)
    if (!cpu.grads[u].empty()) EXPECT_LT(rel_norm_error(gpu.grads[u], cpu.grads[u]), 3e-2) << "unit " << u;
  EXPECT_LT(rel_norm_error(gpu.logits, cpu.logits), 3e-2);
}

std::vector<ModelConfig> configs() { return {llama_gqa_bias_untied(), gpt2("qkv,proj,fc,fc_proj"), gpt2("qkv,fc")}; }

std::string name_of(const ModelConfig& c) { return std::string(model_family(c.arch).name) + " " + c.lora.targets; }

TEST(CudaLoraModel, Fp32MatchesCpu) {
  ST_SKIP_WITHOUT_GPU();
  for (const ModelConfig& c : configs()) {
    SCOPED_TRACE(name_of(c));
    const std::vector<std::vector<float>> p = make_params<float>(c);
    const Batch b = testing::random_batch(c, kB, 22);
    expect_fp32_match(c, gpu_run<float>(c, p, b, /*recompute=*/false), testing::cpu_step(c, kB, p, b));
  }
}

// bf16 runs the GEMMs' fused epilogues where no adapter needs their input (GPT-2's fc + GELU without an fc_proj
// adapter, for one).
TEST(CudaLoraModel, Bf16TracksCpu) {
  ST_SKIP_WITHOUT_GPU();
  for (const ModelConfig& c : configs()) {
    SCOPED_TRACE(name_of(c));
    const std::vector<std::vector<float>> p = make_params<bf16>(c);
    const Batch b = testing::random_batch(c, kB, 22);
    expect_half_tracks(gpu_run<bf16>(c, p, b, false), testing::cpu_step(c, kB, p, b));
  }
}

// Recompute refills each block's h from its saved input: the same bits, in every block or all but the last. Wholly
// frozen units may have no gradient buffer: the backward still runs (the blocks' adapters need it), with the same
// bits.
TEST(CudaLoraModel, RecomputeAndMissingFrozenBuffersGiveTheSameBits) {
  ST_SKIP_WITHOUT_GPU();
  for (const ModelConfig& c : configs()) {
    SCOPED_TRACE(name_of(c));
    const std::vector<std::vector<float>> p = make_params<float>(c);
    const Batch b = testing::random_batch(c, kB, 22);
    const Result base = gpu_run<float>(c, p, b, false);
    // Also with all but the last block recomputed: the last keeps its h in a slot of its own.
    for (const Result& other : {gpu_run<float>(c, p, b, /*recompute=*/true), gpu_run<float>(c, p, b, false, true),
                                gpu_run<float>(c, p, b, Recompute::first(c.n_layer - 1))}) {
      EXPECT_EQ(other.loss, base.loss);
      EXPECT_EQ(other.grads, base.grads);
      EXPECT_EQ(other.logits, base.logits);
    }
  }
}

}  // namespace
}  // namespace st
