// CudaLlama against LlamaModel, the CPU fp32 reference, one micro-batch through every unit: the same config,
// parameters and batch give the same loss, every unit's gradient and the sampling logits. fp32: 1e-5 on the loss,
// 1e-4 on each unit's gradient by ||gpu - cpu|| / ||cpu|| (and element by element to 1e-3 above a hundredth of the
// unit's largest); bf16 (the CPU run on the bf16-rounded parameters): 2e-2 on the loss, 3e-2 on each unit's gradient.
// Two configs: grouped-query attention with llama3 RoPE scaling and a tied head; q/k/v biases with an untied head.
// The block and head gradients are poisoned before the step: the model writes every element of them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "../common/gpu_test.h"
#include "../common/tiny_training.h"
#include "cpu_step_test_util.h"
#include "shardtrain/core/rng.h"
#include "shardtrain/kernels/gpu/cudnn_attention.h"
#include "shardtrain/kernels/gpu/matmul.h"
#include "shardtrain/model/llama/cuda_llama_model.h"

namespace st {
namespace {

using testing::rel_norm_error;

constexpr int64_t kB = 3;

// 4 query heads of 16 on 2 K/V heads; llama3 scaling with bands at wavelengths 16 and 64, inside the head's range
// (2 pi .. 2 pi 10000^(7/8)), so every branch of the rule turns some pair; a tied head; vocab 300 (padded to 384).
ModelConfig gqa_llama3_tied() {
  ModelConfig c;
  c.arch = ModelArch::kLlama;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.n_embd = 64;
  c.ffn_dim = 96;
  c.vocab_size = 300;
  c.seq_len = 24;
  c.rope_scaling = RopeScaling::kLlama3;
  c.rope_scaling_factor = 8;
  c.rope_scaling_low_freq_factor = 1;
  c.rope_scaling_high_freq_factor = 4;
  c.rope_scaling_original_max_position = 64;
  c.tie_embeddings = true;
  return c;
}

// Multi-head attention (n_kv_head = n_head) with q/k/v biases and an untied lm_head.
ModelConfig bias_untied() {
  ModelConfig c = gqa_llama3_tied();
  c.n_kv_head = 4;
  c.rope_scaling = RopeScaling::kNone;
  c.tie_embeddings = false;
  c.qkv_bias = true;
  return c;
}

// Every unit's parameters: the model's initialisation plus uniform noise of +-0.02, so that RMSNorm weights are not
// all 1 and biases not 0; rounded through T.
template <typename T>
std::vector<std::vector<float>> make_params(const ModelConfig& c) {
  std::vector<std::vector<float>> p;
  Rng rng(11, 0);
  for (const UnitLayout& u : build_units(c)) {
    std::vector<float> v(static_cast<size_t>(u.numel));
    init_unit_range(u, c, /*seed=*/5, 0, u.numel, v.data());
    for (float& x : v) x += static_cast<float>(0.04 * (rng.next_uniform() - 0.5));
    p.push_back(test::round_through<T>(std::move(v)));
  }
  return p;
}

using testing::Batch;
using testing::max_abs;
using Result = testing::StepResult;

Batch make_batch(const ModelConfig& c) { return testing::random_batch(c, kB, 12); }
float dloss_of(const ModelConfig& c) { return testing::dloss_of(c, kB); }
Result cpu_run(const ModelConfig& c, const std::vector<std::vector<float>>& p, const Batch& b) {
  return testing::cpu_step(c, kB, p, b);
}

template <typename T>
Result gpu_run(const ModelConfig& c, const std::vector<std::vector<float>>& p, const Batch& b, Recompute recompute,
               bool cudnn) {
  CudaStream stream;
  gpu::Blas blas;
  gpu::Cudnn cudnn_handle;
  gpu::GpuContext ctx{stream.get(), &blas, nullptr, 0, &cudnn_handle};
  const int B = static_cast<int>(kB), Tn = c.seq_len, NH = c.n_head, KV = c.kv_heads(), D = c.head_dim();
  int64_t attention_scratch = 0;
  if (cudnn) {
    ST_CHECK(gpu::cudnn_attention_supported<T>(B, Tn, NH, KV, D, ctx), "cuDNN has no engine for this attention");
    attention_scratch =
        static_cast<int64_t>(std::max(gpu::cudnn_attention_forward_scratch_bytes<T>(B, Tn, NH, KV, D, ctx),
                                      gpu::cudnn_attention_backward_scratch_bytes<T>(B, Tn, NH, KV, D, ctx)));
  }
  DeviceBuffer<unsigned char> scratch(
      cuda_llama_footprint(c, kB, recompute, sizeof(T), attention_scratch).scratch_bytes);
  ctx.scratch = scratch.data();
  ctx.scratch_bytes = scratch.bytes();
  CudaLlama<T> m(c, kB, recompute, cudnn, ctx);
  const int L = c.n_layer;
  std::vector<DeviceBuffer<T>> P, G;
  for (size_t u = 0; u < p.size(); ++u) {
    P.push_back(test::to_device<T>(p[u]));
    G.push_back(test::to_device<T>(std::vector<float>(p[u].size(), 0.0f)));
    if (u > 0) test::poison(G.back());  // written, not added to
  }
  m.embedding_forward(P[0].data(), b.tokens.data(), kB, c.seq_len);
  for (int l = 0; l < L; ++l) m.block_forward(l, P[1 + l].data());
  m.head_forward_backward(P[L + 1].data(), P[0].data(), b.targets.data(), dloss_of(c), G[L + 1].data(), G[0].data());
  for (int l = L - 1; l >= 0; --l) m.block_backward(l, P[1 + l].data(), G[1 + l].data());
  m.embedding_backward(G[0].data());
  Result r;
  r.loss = m.take_loss_sum() / static_cast<double>(kB * c.seq_len);
  for (const DeviceBuffer<T>& g : G) r.grads.push_back(test::to_host(g));
  m.head_logits(P[L + 1].data(), P[0].data(), c.seq_len - 1, &r.logits);
  return r;
}

void expect_fp32_match(const Result& gpu, const Result& cpu) {
  EXPECT_NEAR(gpu.loss, cpu.loss, 1e-5 * cpu.loss);
  ASSERT_EQ(gpu.grads.size(), cpu.grads.size());
  for (size_t u = 0; u < cpu.grads.size(); ++u) {
    EXPECT_LE(rel_norm_error(gpu.grads[u], cpu.grads[u]), 1e-4) << "gradient of unit " << u;
    EXPECT_TRUE(test::all_close(gpu.grads[u], cpu.grads[u], 1e-3, 1e-2 * max_abs(cpu.grads[u])))
        << "gradient of unit " << u;
  }
  EXPECT_TRUE(test::all_close(gpu.logits, cpu.logits, 1e-4, 1e-3 * max_abs(cpu.logits)));
}

void expect_half_tracks(const Result& gpu, const Result& cpu, const char* what) {
  EXPECT_NEAR(gpu.loss, cpu.loss, 2e-2 * cpu.loss) << what;
  ASSERT_EQ(gpu.grads.size(), cpu.grads.size()) << what;
  for (size_t u = 0; u < cpu.grads.size(); ++u)
    EXPECT_LT(rel_norm_error(gpu.grads[u], cpu.grads[u]), 3e-2) << what << ": gradient of unit " << u;
  EXPECT_LT(rel_norm_error(gpu.logits, cpu.logits), 3e-2) << what;
}

TEST(CudaLlama, Fp32MatchesCpuWithGqaLlama3RopeAndTiedHead) {
  ST_SKIP_WITHOUT_GPU();
  const ModelConfig c = gqa_llama3_tied();
  const std::vector<std::vector<float>> p = make_params<float>(c);
  const Batch b = make_batch(c);
  expect_fp32_match(gpu_run<float>(c, p, b, /*recompute=*/false, /*cudnn=*/false), cpu_run(c, p, b));
}

TEST(CudaLlama, Fp32MatchesCpuWithQkvBiasAndUntiedHead) {
  ST_SKIP_WITHOUT_GPU();
  const ModelConfig c = bias_untied();
  const std::vector<std::vector<float>> p = make_params<float>(c);
  const Batch b = make_batch(c);
  expect_fp32_match(gpu_run<float>(c, p, b, false, false), cpu_run(c, p, b));
}

// bf16 through flash attention and through cuDNN's fused attention, on both configs.
TEST(CudaLlama, Bf16TracksCpuWithFlashAndCudnnAttention) {
  ST_SKIP_WITHOUT_GPU();
  for (const ModelConfig& c : {gqa_llama3_tied(), bias_untied()}) {
    SCOPED_TRACE(c.tie_embeddings ? "gqa, llama3 rope, tied" : "qkv bias, untied");
    const std::vector<std::vector<float>> p = make_params<bf16>(c);
    const Batch b = make_batch(c);
    const Result cpu = cpu_run(c, p, b);
    const Result flash = gpu_run<bf16>(c, p, b, false, /*cudnn=*/false);
    const Result fused = gpu_run<bf16>(c, p, b, false, /*cudnn=*/true);
    expect_half_tracks(flash, cpu, "flash");
    expect_half_tracks(fused, cpu, "cudnn");
  }
}

// Deterministic kernels: recomputing each block's forward in its backward changes no bit, in fp32 and bf16, with
// either attention, nor does recomputing all blocks but the last.
TEST(CudaLlama, RecomputeGivesTheSameBits) {
  ST_SKIP_WITHOUT_GPU();
  const ModelConfig c = gqa_llama3_tied();
  const Batch b = make_batch(c);
  auto same = [](const Result& x, const Result& y, const char* what) {
    EXPECT_EQ(x.loss, y.loss) << what;
    EXPECT_EQ(x.grads, y.grads) << what;
    EXPECT_EQ(x.logits, y.logits) << what;
  };
  const std::vector<std::vector<float>> p32 = make_params<float>(c);
  same(gpu_run<float>(c, p32, b, false, false), gpu_run<float>(c, p32, b, true, false), "fp32, flash");
  const std::vector<std::vector<float>> p16 = make_params<bf16>(c);
  same(gpu_run<bf16>(c, p16, b, false, false), gpu_run<bf16>(c, p16, b, true, false), "bf16, flash");
  same(gpu_run<bf16>(c, p16, b, false, true), gpu_run<bf16>(c, p16, b, true, true), "bf16, cudnn");
  // All but the last block recompute, sharing one set of activations; the last keeps its own from the one forward.
  ASSERT_GE(c.n_layer, 2);
  same(gpu_run<bf16>(c, p16, b, false, true), gpu_run<bf16>(c, p16, b, Recompute::first(c.n_layer - 1), true),
       "bf16, all but the last block");
}

}  // namespace
}  // namespace st
