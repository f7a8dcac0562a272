// Fp8Policy::producer_maxima: under train.fp8 = tensorwise the kernels that write a linear layer's input or output
// gradient (the norms, SwiGLU, GELU, RoPE's backward) fold its maximum in as they write it (CudaLinear::input_maxima),
// and the layer's casts take it from there instead of a pass of their own. Three steps of each family's CUDA model, two
// micro-batches a step and a plain SGD update on the host, give the same bits either way: every step's loss and every
// unit's gradient, and the parameters after the steps. In bf16 and fp32, with and without recompute, with the weight
// gradients in FP8 (64 tokens a micro-batch: dy cast both ways in one pass) and in the compute type (24 tokens: dy cast
// for the input gradient alone). The same steps without FP8 give other losses: the casts are on. CudaLinear hands a
// producer a slot, zeroed, only where a tensorwise cast takes it.
// Fp8Policy::keep_input_codes likewise: blocks keeping the x^T codes of their forwards' casts in place of the inputs of
// llama's q/k/v, gate/up and down, GPT-2's qkv, fc and MLP proj (at 64 tokens a micro-batch; at 24 the weight
// gradients run in the compute type and the blocks keep x) give the bits of casting x^T in the backward. Under
// train.fp8 = delayed, llama's RMSNorms and SwiGLU writing the codes of the q/k/v, gate/up and down projections' inputs
// themselves (Fp8Policy::fuse_casts) give the bits of casting their outputs, and the SwiGLU's backward writing the
// gate/up projection's dy codes those of casting d(gate_up).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "../common/fp8_gpu_test.h"
#include "../common/gpu_test.h"
#include "cpu_step_test_util.h"
#include "shardtrain/core/error.h"
#include "shardtrain/kernels/gpu/matmul.h"
#include "shardtrain/model/cuda_family.h"
#include "shardtrain/model/cuda_footprint.h"
#include "shardtrain/model/cuda_linear.h"
#include "shardtrain/model/fp8_policy.h"
#include "shardtrain/model/units.h"

namespace st {
namespace {

constexpr int64_t kB = 2;
constexpr int kSteps = 3, kMicroSteps = 2;
constexpr float kLr = 0.05f;

// Every block matrix a multiple of 16 on both sides, so that each takes FP8. Llama: 4 query heads of 16 on 2 K/V heads
// (q/k/v 128 x 64), gate/up 192 x 64, down 64 x 96, with q/k/v biases. GPT-2: 4 heads of 16.
ModelConfig llama(int seq_len) {
  ModelConfig c;
  c.arch = ModelArch::kLlama;
  c.n_layer = 3;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.n_embd = 64;
  c.ffn_dim = 96;
  c.vocab_size = 300;
  c.seq_len = seq_len;
  c.qkv_bias = true;
  c.tie_embeddings = false;
  return c;
}

ModelConfig gpt2(int seq_len) {
  ModelConfig c;
  c.n_layer = 3;
  c.n_head = 4;
  c.n_embd = 64;
  c.vocab_size = 300;
  c.seq_len = seq_len;
  return c;
}

// What the steps leave: each step's summed loss, each step's gradient of every unit (summed over its micro-batches),
// and every unit's parameters after the last step.
struct Run {
  std::vector<double> losses;
  std::vector<std::vector<std::vector<float>>> grads;
  std::vector<std::vector<float>> params;
};

// kSteps steps of kMicroSteps micro-batches on the CUDA model with `policy` (kOff: no FP8), each followed by
// p = round_T(p - kLr * g) on the host.
template <typename T>
Run train(const ModelConfig& c, const Fp8Policy& policy, bool recompute) {
  CudaStream stream;
  gpu::Blas blas;
  const DType dtype = std::is_same_v<T, float> ? DType::kF32 : DType::kBF16;
  DeviceBuffer<unsigned char> scratch(cuda_model_footprint(c, kB, recompute, dtype, 0, policy.recipe).scratch_bytes);
  gpu::GpuContext ctx{stream.get(), &blas, scratch.data(), scratch.bytes()};
  const std::unique_ptr<CudaUnitModel<T>> m = cuda_model_family<T>(c.arch).make_model(
      c, kB, recompute, /*cudnn_attention=*/false, ctx, gpu::CudnnBackwardMode::kDeterministic, policy);
  const std::vector<UnitLayout>& units = m->units();
  const int L = c.n_layer;
  CudaFp8History* const history = m->fp8_history();  // train.fp8=delayed: each step's maxima pushed after it
  if (history != nullptr) history->set_recording(true);
  Run r;
  for (const UnitLayout& u : units) {
    std::vector<float> p(static_cast<size_t>(u.numel));
    init_unit_range(u, c, /*seed=*/5, 0, u.numel, p.data());
    r.params.push_back(test::round_through<T>(std::move(p)));
  }
  for (int step = 0; step < kSteps; ++step) {
    std::vector<DeviceBuffer<T>> P;
    for (const std::vector<float>& p : r.params) P.push_back(test::to_device<T>(p));
    std::vector<std::vector<float>> sum;
    for (const UnitLayout& u : units) sum.emplace_back(static_cast<size_t>(u.numel), 0.0f);
    double loss = 0;
    for (int micro = 0; micro < kMicroSteps; ++micro) {
      const testing::Batch b = testing::random_batch(c, kB, static_cast<uint64_t>(100 + step * kMicroSteps + micro));
      std::vector<DeviceBuffer<T>> G;
      G.push_back(test::to_device<T>(std::vector<float>(r.params[0].size(), 0.0f)));  // the embedding's accumulates
      for (size_t u = 1; u < units.size(); ++u) G.emplace_back(units[u].numel);       // the others' are written
      m->embedding_forward(P[0].data(), b.tokens.data(), kB, c.seq_len);
      for (int l = 0; l < L; ++l) m->block_forward(l, P[1 + l].data());
      m->head_forward_backward(P[L + 1].data(), P[0].data(), b.targets.data(), testing::dloss_of(c, kB),
                               G[L + 1].data(), G[0].data());
      for (int l = L - 1; l >= 0; --l) m->block_backward(l, P[1 + l].data(), G[1 + l].data());
      m->embedding_backward(G[0].data());
      loss += m->take_loss_sum();
      for (size_t u = 0; u < units.size(); ++u) {
        const std::vector<float> g = test::to_host(G[u]);
        for (size_t i = 0; i < g.size(); ++i) sum[u][i] += g[i];
      }
    }
    for (size_t u = 0; u < units.size(); ++u) {
      for (size_t i = 0; i < sum[u].size(); ++i) r.params[u][i] -= kLr * sum[u][i];
      r.params[u] = test::round_through<T>(std::move(r.params[u]));
    }
    r.losses.push_back(loss);
    r.grads.push_back(std::move(sum));
    if (history != nullptr) history->push(history->step_maxima(), ctx);
  }
  return r;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void expect_same_bits(const Run& got, const Run& want) {
  EXPECT_EQ(got.losses, want.losses);
  ASSERT_EQ(got.grads.size(), want.grads.size());
  for (size_t s = 0; s < want.grads.size(); ++s)
    for (size_t u = 0; u < want.grads[s].size(); ++u)
      EXPECT_TRUE(same_bits(got.grads[s][u], want.grads[s][u])) << "step " << s << ", gradient of unit " << u;
  for (size_t u = 0; u < want.params.size(); ++u)
    EXPECT_TRUE(same_bits(got.params[u], want.params[u])) << "parameters of unit " << u;
}

Fp8Policy tensorwise(bool producer_maxima, bool input_codes = true) {
  Fp8Policy p = fp8_policy(Fp8Recipe::kTensorwise);
  p.producer_maxima = producer_maxima;
  p.keep_input_codes = input_codes;
  return p;
}

template <typename T>
void expect_producers_change_no_bit(const ModelConfig& c) {
  for (const bool recompute : {false, true}) {
    SCOPED_TRACE(::testing::Message() << to_string(c.arch) << " seq_len " << c.seq_len << " recompute " << recompute);
    const Run fused = train<T>(c, tensorwise(true), recompute), apart = train<T>(c, tensorwise(false), recompute);
    expect_same_bits(fused, apart);
    {
      SCOPED_TRACE("x^T cast in the backward");
      expect_same_bits(train<T>(c, tensorwise(true, false), recompute), fused);
    }
    if (!recompute) EXPECT_NE(fused.losses, train<T>(c, fp8_policy(Fp8Recipe::kOff), false).losses);
  }
}

Fp8Policy delayed(bool fuse_casts) {
  Fp8Policy p = fp8_policy(Fp8Recipe::kDelayed, 4);
  p.fuse_casts = fuse_casts;
  return p;
}

// train.fp8=delayed (Fp8Policy::fuse_casts): from the second step on, llama's RMSNorms write the q/k/v and gate/up
// projections' codes and its SwiGLU the down projection's with the history's maximum instead of their outputs, its
// backward the gate/up projection's dy and dy^T codes instead of d(gate_up), and every other cast whose maximum no
// producer took scales by the history's and folds its own in as it reads (gpu::fp8_quantize_ahead_async, no pass for
// the maximum): the bits of writing the tensors and casting them, with and without recompute, at 32 tokens (the blocks
// keep the x^T codes, and the weight gradients run in FP8) and 12 (nothing is fused). The steps after the first differ
// from tensorwise's.
template <typename T>
void expect_fused_producers_change_no_bit() {
  for (const int seq_len : {32, 12})
    for (const bool recompute : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "seq_len " << seq_len << " recompute " << recompute);
      const Run fused = train<T>(llama(seq_len), delayed(true), recompute);
      expect_same_bits(fused, train<T>(llama(seq_len), delayed(false), recompute));
      const Run tensor = train<T>(llama(seq_len), tensorwise(true), recompute);
      EXPECT_EQ(fused.losses[0], tensor.losses[0]);
      EXPECT_NE(fused.losses, tensor.losses);
    }
}

TEST(CudaFp8ProducerMaxima, DelayedFusedProducersGiveTheBitsOfTheirCasts) {
  ST_SKIP_WITHOUT_FP8();
  expect_fused_producers_change_no_bit<bf16>();
  expect_fused_producers_change_no_bit<float>();
}

TEST(CudaFp8ProducerMaxima, TensorwiseStepsGiveTheSameBitsAsTheCastsOwnPassesInBf16) {
  ST_SKIP_WITHOUT_FP8();
  for (const int seq_len : {32, 12}) {
    expect_producers_change_no_bit<bf16>(llama(seq_len));
    expect_producers_change_no_bit<bf16>(gpt2(seq_len));
  }
}

TEST(CudaFp8ProducerMaxima, TensorwiseStepsGiveTheSameBitsAsTheCastsOwnPassesInFp32) {
  ST_SKIP_WITHOUT_FP8();
  for (const int seq_len : {32, 12}) {
    expect_producers_change_no_bit<float>(llama(seq_len));
    expect_producers_change_no_bit<float>(gpt2(seq_len));
  }
}

// A slot for every named site's x and dy where the layer is in FP8 and the recipe tensorwise, each its own, zeroed
// when handed out; none for an unnamed site, a layer off FP8 (down's 40 inputs), rowwise, FP8 off or the producers
// turned off; a name of no linear layer, or a layer past the model's, is refused.
TEST(CudaFp8ProducerMaxima, SlotsOnlyWhereATensorwiseCastTakesThem) {
  ST_SKIP_WITHOUT_GPU();
  ModelConfig c = llama(32);
  c.ffn_dim = 40;  // gate/up 80 x 64 in FP8; down 64 x 40 not
  const int64_t rows = kB * c.seq_len;
  CudaStream stream;
  const gpu::GpuContext ctx{stream.get(), nullptr, nullptr, 0};
  CudaLinear<bf16> t(tensorwise(true), c, rows);
  const LinearSite qkv0{0, "attn.qkv.weight"}, qkv1{1, "attn.qkv.weight"}, up0{0, "mlp.gate_up.weight"};
  unsigned* const x = t.input_maxima(qkv0, LinearInput::kX, ctx);
  ASSERT_NE(x, nullptr);
  const std::vector<unsigned*> others = {
      t.input_maxima(qkv0, LinearInput::kDy, ctx), t.input_maxima(qkv1, LinearInput::kX, ctx),
      t.input_maxima(up0, LinearInput::kX, ctx), t.input_maxima(up0, LinearInput::kDy, ctx)};
  for (unsigned* o : others) {
    EXPECT_NE(o, nullptr);
    EXPECT_NE(o, x);
  }
  stream.synchronize();
  ST_CUDA_CHECK(cudaMemset(x, 0x7f, sizeof(unsigned)));
  ST_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(t.input_maxima(qkv0, LinearInput::kX, ctx), x);
  stream.synchronize();
  unsigned held = 1;
  ST_CUDA_CHECK(cudaMemcpy(&held, x, sizeof(held), cudaMemcpyDeviceToHost));
  EXPECT_EQ(held, 0u) << "zeroed when handed out";

  for (const LinearInput in : {LinearInput::kX, LinearInput::kDy}) {
    EXPECT_EQ(t.input_maxima({-1, "attn.qkv.weight"}, in, ctx), nullptr) << "unnamed";
    EXPECT_EQ(t.input_maxima({0, "mlp.down.weight"}, in, ctx), nullptr) << "not in FP8";
  }
  CudaLinear<bf16> rowwise(fp8_policy(Fp8Recipe::kRowwise), c, rows), apart(tensorwise(false), c, rows),
      off(fp8_policy(Fp8Recipe::kOff), c, rows);
  for (CudaLinear<bf16>* l : {&rowwise, &apart, &off})
    for (const LinearInput in : {LinearInput::kX, LinearInput::kDy})
      EXPECT_EQ(l->input_maxima(qkv0, in, ctx), nullptr) << to_string(l->policy().recipe);
  EXPECT_THROW(t.input_maxima({0, "attn.nope.weight"}, LinearInput::kX, ctx), Error);
  EXPECT_THROW(t.input_maxima({c.n_layer, "attn.qkv.weight"}, LinearInput::kX, ctx), Error);
}

}  // namespace
}  // namespace st
