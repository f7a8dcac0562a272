#include "shardtrain/train/step_engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <set>
#include <vector>

#include "../common/forwarding_backend.h"
#include "../common/tiny_training.h"
#include "shardtrain/comm/communicator.h"
#include "shardtrain/data/sampler.h"

namespace st {
namespace {

Config small_config() {
  Config c;
  c.model.n_layer = 2;
  c.model.n_head = 2;
  c.model.n_embd = 32;
  c.model.vocab_size = 200;  // padded to 256
  c.model.seq_len = 16;
  c.train.micro_batch = 4;
  c.train.global_batch = 4;
  c.train.steps = 10;
  c.optim.warmup_steps = 0;
  return c;
}

// small_config() as a llama: 2 K/V heads for 4 query heads, SwiGLU, RoPE, untied head, q/k/v biases.
Config small_llama_config() {
  Config c = small_config();
  c.model.arch = ModelArch::kLlama;
  c.model.n_head = 4;
  c.model.n_kv_head = 2;
  c.model.ffn_dim = 88;
  c.model.tie_embeddings = false;
  c.model.qkv_bias = true;
  return c;
}

constexpr uint64_t kSeed = 9;  // the corpus of testing::fill_sequences

// Sequences first_seq .. first_seq + B - 1 of a fixed random corpus: inputs and shifted targets.
void fill_sequences(const Config& c, int64_t first_seq, int64_t B, int32_t* in, int32_t* tgt) {
  testing::fill_sequences(c, kSeed, first_seq, B, in, tgt);
}

class StepEngineFamily : public ::testing::TestWithParam<ModelArch> {
 protected:
  Config config() const { return GetParam() == ModelArch::kLlama ? small_llama_config() : small_config(); }
};
INSTANTIATE_TEST_SUITE_P(Families, StepEngineFamily, ::testing::Values(ModelArch::kGpt2, ModelArch::kLlama),
                         [](const auto& info) { return std::string(to_string(info.param)); });

TEST(StepEngine, InitialLossIsAboutLnVocab) {
  for (const Config& c : {small_config(), small_llama_config()}) {
    SoloCommunicator comm;
    StepEngine s(c, comm);
    const float loss = s.forward_backward(
        [&](int64_t micro, int32_t* in, int32_t* tgt) { fill_sequences(c, micro * 4, 4, in, tgt); }, 1);
    EXPECT_NEAR(loss, std::log(200.0), 0.05) << to_string(c.model.arch);
  }
}

// Where the bars of the one-step comparisons below come from: both sides compute the same per-position terms (with
// GEMMs of other shapes) and sum them in other orders. Losses are means of at most 64 positions summed in double
// from float32 terms, each a few u (2^-24) off: 1e-6 = 17 u relative covers them. A gradient element is a float32
// sum over at most 64 positions: n u = 3.8e-6 of the terms' magnitudes worst case, under the 1e-5 (168 u) of max|g|.
// A wrong normaliser is off by 1/64 = 1.6e-2 and a lost micro-batch by far more.
// Accumulating 2 micro-batches of 2 sequences gives the gradient of one batch of 4.
TEST_P(StepEngineFamily, GradientAccumulationMatchesOneBigBatch) {
  Config big = config();
  Config acc = config();
  acc.train.micro_batch = 2;
  SoloCommunicator comm;
  StepEngine a(big, comm), b(acc, comm);
  const float la =
      a.forward_backward([&](int64_t, int32_t* in, int32_t* tgt) { fill_sequences(big, 0, 4, in, tgt); }, 1);
  const float lb = b.forward_backward(
      [&](int64_t micro, int32_t* in, int32_t* tgt) { fill_sequences(acc, micro * 2, 2, in, tgt); }, 2);
  EXPECT_NEAR(la, lb, 1e-5 * la);
  const auto ga = a.gather_grads(), gb = b.gather_grads();
  for (size_t u = 0; u < ga.size(); ++u) {
    double max_ref = 0, max_diff = 0;
    for (int64_t i = 0; i < a.units()[u].numel; ++i) {
      max_ref = std::max(max_ref, std::fabs(static_cast<double>(ga[u][i])));
      max_diff = std::max(max_diff, std::fabs(static_cast<double>(ga[u][i]) - gb[u][i]));
    }
    EXPECT_LE(max_diff, 1e-5 * max_ref) << a.units()[u].name;
  }
}

TEST_P(StepEngineFamily, TrainingLowersTheLossOnARepeatedBatch) {
  Config c = config();
  c.optim.lr = 3e-3f;
  c.train.steps = 80;
  SoloCommunicator comm;
  StepEngine s(c, comm);
  auto batch = [&](int64_t, int32_t* in, int32_t* tgt) { fill_sequences(c, 0, 4, in, tgt); };
  const float first = s.forward_backward(batch, 1);
  s.optimizer_step(0, first);
  float last = first;
  for (int step = 1; step < 80; ++step) last = s.optimizer_step(step, s.forward_backward(batch, 1)).loss;
  EXPECT_LT(last, 0.5f * first);  // memorising one batch
  EXPECT_EQ(s.updates(), 80);
}

// optim.offload=optimizer on the cpu backend runs AdamW on the host engine's threads with the SIMD kernels, while
// the trainer thread goes on; none runs the reference loop in place. After 10 steps (clipping active, decay on
// the matrices only) every parameter is the same bits.
TEST_P(StepEngineFamily, OffloadedOptimizerGivesIdenticalWeights) {
  Config plain = config();
  plain.optim.grad_clip = 0.5f;
  Config offload = plain;
  offload.optim.offload = OffloadMode::kOptimizer;
  offload.optim.offload_threads = 3;
  SoloCommunicator comm;
  StepEngine a(plain, comm), b(offload, comm);
  EXPECT_NE(b.sharded().describe().find("host AdamW threads (3 threads"), std::string::npos) << b.sharded().describe();
  for (int step = 0; step < 10; ++step) {
    auto batch = [&](int64_t, int32_t* in, int32_t* tgt) { fill_sequences(plain, step * 4, 4, in, tgt); };
    const StepStats sa = a.optimizer_step(step, a.forward_backward(batch, 1));
    const StepStats sb = b.optimizer_step(step, b.forward_backward(batch, 1));
    ASSERT_EQ(sa.loss, sb.loss) << "step " << step;
    ASSERT_EQ(sa.grad_norm, sb.grad_norm) << "step " << step;
  }
  const auto pa = a.gather_params(), pb = b.gather_params();
  for (size_t u = 0; u < pa.size(); ++u) EXPECT_EQ(pa[u], pb[u]) << a.units()[u].name;
  for (size_t u = 0; u < pa.size(); ++u) {  // and the moments
    EXPECT_EQ(a.sharded().shard(static_cast<int>(u)).m, b.sharded().shard(static_cast<int>(u)).m);
    EXPECT_EQ(a.sharded().shard(static_cast<int>(u)).v, b.sharded().shard(static_cast<int>(u)).v);
  }
}

TEST(StepEngine, NonFiniteLossSkipsTheUpdate) {
  const Config c = small_config();
  SoloCommunicator comm;
  StepEngine s(c, comm);
  s.sharded().shard(c.model.n_layer + 1).param[0] = std::numeric_limits<float>::quiet_NaN();  // lnf.weight[0]
  const std::vector<float> before = s.gather_params()[1];
  const float loss =
      s.forward_backward([&](int64_t, int32_t* in, int32_t* tgt) { fill_sequences(c, 0, 4, in, tgt); }, 1);
  ASSERT_TRUE(std::isnan(loss));
  const StepStats st = s.optimizer_step(0, loss);
  EXPECT_TRUE(st.skipped);
  EXPECT_EQ(s.updates(), 0);
  const std::vector<float> after = s.gather_params()[1];
  EXPECT_EQ(before, after);
}

// A backend that says it speculates (optim.offload_speculative, which only the cuda backend does) and records, step
// by step, whether the engine handed it a speculative update; the wrapped CPU backend trains as it would.
class Speculating : public testing::ForwardingBackend {
 public:
  explicit Speculating(std::unique_ptr<ModelBackend> model) : ForwardingBackend(*model), own_(std::move(model)) {}
  bool speculates() const override { return true; }
  void speculate_optimizer(std::vector<std::vector<AdamWRun>> runs) override { handed.push_back(!runs.empty()); }
  std::vector<bool> handed;

 private:
  std::unique_ptr<ModelBackend> own_;
};

// Speculation pays only when the step applies its update unclipped: after a clipped or a skipped step the next one
// speculates nothing, and after an unclipped one it speculates again.
TEST(StepEngine, SpeculatesOnlyAfterAStepThatKeptItsUpdate) {
  struct Case {
    float grad_clip;
    bool nan_at_step_1;
    std::vector<bool> handed;
  };
  const std::vector<Case> cases = {
      {0.0f, false, {true, true, true, true}},      // never clipped
      {1e-6f, false, {true, false, false, false}},  // every step clipped
      {0.0f, true, {true, true, false, true}},      // step 1 skipped (non-finite gradients), step 2 applied
  };
  for (const Case& k : cases) {
    Config c = small_config();
    c.optim.grad_clip = k.grad_clip;
    SoloCommunicator comm;
    auto backend = std::make_unique<Speculating>(make_model_backend(c, comm));
    Speculating* watched = backend.get();
    StepEngine s(c, comm, std::move(backend));
    // Step 1 (1-based 2) of rank 0 with an infinite loss gradient: non-finite gradients, a skipped step.
    struct Fault {  // unset however the steps end
      explicit Fault(bool on) {
        if (on) setenv("SHARDTRAIN_FAULT", "grad_inf:0@2", 1);
      }
      ~Fault() { unsetenv("SHARDTRAIN_FAULT"); }
    } fault(k.nan_at_step_1);
    std::vector<StepStats> stats;
    for (int64_t step = 0; step < 4; ++step)
      stats.push_back(
          s.train_step([&](int64_t, int32_t* in, int32_t* tgt) { fill_sequences(c, step * 4, 4, in, tgt); }, 1, step));
    EXPECT_EQ(watched->handed, k.handed) << "grad_clip " << k.grad_clip;
    EXPECT_EQ(stats[1].skipped, k.nan_at_step_1);
    if (k.grad_clip > 0) EXPECT_GT(stats[0].grad_norm, k.grad_clip);  // the clip the case is about
  }
}

// Sequences as fill_sequences, with the targets at masked positions set to kNoTarget (-1): position p of the batch
// (p = b * T + t, over the whole step: micro-step m's batch of B sequences holds positions [m*B*T, (m+1)*B*T)) is kept
// when keep(p). Returns the batch function; *targets gets the number kept.
template <typename Keep>
BatchFn masked_batches(const Config& c, int64_t B, Keep keep, int64_t* targets = nullptr) {
  const int64_t T = c.model.seq_len;
  if (targets != nullptr) {
    *targets = 0;
    for (int64_t p = 0; p < 4 * T; ++p) *targets += keep(p) ? 1 : 0;
  }
  return [c, B, T, keep](int64_t micro, int32_t* in, int32_t* tgt) {
    fill_sequences(c, micro * B, B, in, tgt);
    for (int64_t i = 0; i < B * T; ++i)
      if (!keep(micro * B * T + i)) tgt[i] = kNoTarget;
  };
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b, double* max_ref) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
    *max_ref = std::max(*max_ref, std::fabs(static_cast<double>(b[i])));
  }
  return d;
}

// The masked mean is PyTorch's ignore_index mean: the mean over the kept targets of each one's loss, and its gradient
// the mean of their gradients. Each single-target step (one kept position: a causal model's loss there does not
// depend on the other targets) gives one term; the masked step over all of them must be their mean.
TEST_P(StepEngineFamily, MaskedLossIsTheMeanOverTheKeptTargets) {
  const Config c = config();
  SoloCommunicator comm;
  StepEngine s(c, comm);
  const std::vector<int64_t> kept = {0, 5, 17, 30, 47, 63};  // positions in the 4 x 16 batch
  double loss_sum = 0;
  std::vector<std::vector<double>> grad_sum;
  for (int64_t p : kept) {
    const float l = s.forward_backward(masked_batches(c, 4, [p](int64_t q) { return q == p; }), 1, -1, 1);
    loss_sum += l;
    const auto g = s.gather_grads();
    grad_sum.resize(g.size());
    for (size_t u = 0; u < g.size(); ++u) {
      grad_sum[u].resize(g[u].size(), 0.0);
      for (size_t i = 0; i < g[u].size(); ++i) grad_sum[u][i] += g[u][i];
    }
  }
  int64_t n = 0;
  const auto keep = [&](int64_t q) { return std::find(kept.begin(), kept.end(), q) != kept.end(); };
  const BatchFn batch = masked_batches(c, 4, keep, &n);
  const float loss = s.forward_backward(batch, 1, -1, n);
  ASSERT_EQ(n, 6);
  EXPECT_NEAR(loss, loss_sum / 6, 1e-6 * loss);
  const auto g = s.gather_grads();
  for (size_t u = 0; u < g.size(); ++u) {
    std::vector<float> mean(g[u].size());
    for (size_t i = 0; i < mean.size(); ++i) mean[i] = static_cast<float>(grad_sum[u][i] / 6);
    double max_ref = 0;
    const double diff = max_abs_diff(g[u], mean, &max_ref);
    EXPECT_LE(diff, 1e-5 * max_ref) << s.units()[u].name;
  }
  // The evaluation of the same batch is the same masked mean.
  EXPECT_NEAR(s.evaluate(masked_batches(c, 4, keep), 1), loss, 1e-6 * loss);
}

// The normaliser is the step's count over every micro-step, not each micro-batch's: accumulating 4 micro-batches of
// 1 sequence, one of them with no target at all, gives the loss and gradient of one batch of 4.
TEST_P(StepEngineFamily, MaskedAccumulationMatchesOneBigBatch) {
  Config big = config();
  Config acc = config();
  acc.train.micro_batch = 1;
  const int64_t T = big.model.seq_len;
  // Sequence 1 entirely masked; elsewhere every third position.
  const auto keep = [T](int64_t p) { return p / T != 1 && p % 3 != 0; };
  SoloCommunicator comm;
  StepEngine a(big, comm), b(acc, comm);
  int64_t n = 0;
  const BatchFn one = masked_batches(big, 4, keep, &n);
  ASSERT_EQ(n, 10 + 11 + 10);  // sequences 0, 2 and 3: the positions of [0, 16), [32, 48), [48, 64) not % 3
  const float la = a.forward_backward(one, 1, -1, n);
  const float lb = b.forward_backward(masked_batches(acc, 1, keep), 4, -1, n);
  EXPECT_NEAR(la, lb, 1e-6 * la);
  const auto ga = a.gather_grads(), gb = b.gather_grads();
  for (size_t u = 0; u < ga.size(); ++u) {
    double max_ref = 0;
    const double diff = max_abs_diff(gb[u], ga[u], &max_ref);
    EXPECT_LE(diff, 1e-5 * max_ref) << a.units()[u].name;
  }
}

// A step whose batch holds no target computes nothing and applies nothing: zero gradient, no update (count, weights
// and moments unchanged), no change of the loss scale; loss NaN, skipped and no_targets. Through train_step as well.
TEST_P(StepEngineFamily, AStepWithNoTargetIsSkippedWithoutAnUpdate) {
  const Config c = config();
  SoloCommunicator comm;
  StepEngine s(c, comm);
  const BatchFn all = masked_batches(c, 4, [](int64_t) { return true; });
  s.optimizer_step(0, s.forward_backward(all, 1));  // one applied step: moments are non-zero
  ASSERT_EQ(s.updates(), 1);
  const auto params = s.gather_params();
  const std::vector<float> m = s.sharded().shard(1).m;
  const BatchFn none = masked_batches(c, 4, [](int64_t) { return false; });
  const float loss = s.forward_backward(none, 1, 1, 0);
  EXPECT_TRUE(std::isnan(loss));
  for (const auto& g : s.gather_grads()) EXPECT_EQ(std::count(g.begin(), g.end(), 0.0f), static_cast<long>(g.size()));
  const StepStats st = s.optimizer_step(1, loss);
  EXPECT_TRUE(st.skipped);
  EXPECT_TRUE(st.no_targets);
  EXPECT_TRUE(std::isnan(st.loss));
  EXPECT_EQ(st.grad_norm, 0.0);
  const StepStats st2 = s.train_step(none, 1, 2, 0);
  EXPECT_TRUE(st2.skipped && st2.no_targets);
  EXPECT_EQ(s.updates(), 1);
  EXPECT_EQ(s.gather_params(), params);
  EXPECT_EQ(s.sharded().shard(1).m, m);
  // The next step with targets is update 2.
  const StepStats st3 = s.train_step(all, 1, 3);
  EXPECT_FALSE(st3.skipped);
  EXPECT_EQ(s.updates(), 2);
}

// The count the caller gives must be the batches' own: a wrong one is a bug, found at the step's loss all-reduce.
TEST(StepEngine, ATargetCountThatDisagreesWithTheBatchesIsAnInternalError) {
  const Config c = small_config();
  SoloCommunicator comm;
  StepEngine s(c, comm);
  int64_t n = 0;
  const auto even = [](int64_t p) { return p % 2 == 0; };
  const BatchFn half = masked_batches(c, 4, even, &n);
  try {
    s.forward_backward(half, 1, -1, n + 1);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInternal);
    EXPECT_NE(std::string(e.what()).find("the step's batches hold 32 targets over every rank, but its loss was "
                                         "normalised by 33"),
              std::string::npos)
        << e.what();
  }
  // Every position counts unless told otherwise: masked batches need their count.
  EXPECT_THROW(s.forward_backward(half, 1), Error);
}

TEST(StepEngine, EvaluationWithNoTargetIsBadInput) {
  const Config c = small_config();
  SoloCommunicator comm;
  StepEngine s(c, comm);
  try {
    s.evaluate(masked_batches(c, 4, [](int64_t) { return false; }), 2);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_NE(std::string(e.what()).find("found no target"), std::string::npos) << e.what();
  }
}

TEST(StepEngine, GenerateIsDeterministicAndInVocab) {
  const Config c = small_config();
  SoloCommunicator comm;
  StepEngine s(c, comm);
  const std::vector<int32_t> prompt = {1, 2, 3};
  SamplingOptions o;
  o.seed = 5;
  const auto a = s.generate(prompt, 40, o);  // longer than seq_len: the context slides
  const auto b = s.generate(prompt, 40, o);
  ASSERT_EQ(a.size(), 40u);
  EXPECT_EQ(a, b);
  for (int32_t t : a) EXPECT_TRUE(t >= 0 && t < 200) << t;
}

// Greedy generation through the engine's decoder picks, token after token, the argmax of the sharded model's
// last_logits over the whole prefix (the full recompute).
TEST_P(StepEngineFamily, GreedyGenerationEqualsTheArgmaxOfLastLogits) {
  const Config c = config();
  SoloCommunicator comm;
  StepEngine s(c, comm);
  testing::Trace trace;
  testing::train_steps(s, c, comm, kSeed, 0, 3, &trace);  // weights past initialisation
  std::vector<int32_t> seq = {5, 6, 7};
  SamplingOptions greedy;
  greedy.temperature = 0;
  GenerationStats stats;
  const std::vector<int32_t> got = s.generate(seq, c.model.seq_len - 3, greedy, &stats);  // fills the window
  EXPECT_EQ(stats.slides, 0);
  EXPECT_GT(std::set<int32_t>(got.begin(), got.end()).size(), 2u);  // a real sequence, not one token repeated
  std::vector<float> logits;
  for (int32_t t : got) {
    s.sharded().last_logits(seq.data(), static_cast<int64_t>(seq.size()), &logits);
    ASSERT_EQ(t, argmax_token(logits)) << "after " << seq.size() << " tokens";
    seq.push_back(t);
  }
}

}  // namespace
}  // namespace st
