// The CUDA backend against the CPU reference, on one GPU: the same config, weights and batch give the
// same loss and gradients (fp32: 1e-4 relative; bf16: 2e-2 on the loss, 3e-2 on each unit's gradient),
// the same training trajectory, and checkpoints that either backend loads.
//
// Gradients and parameters are compared per unit by ||gpu - cpu|| / ||cpu||. Element by element, fp32
// gradients that are sums of many cancelling terms differ by ~1e-4 of their own (tiny) size between
// any two summation orders (measured 1.4e-4 on elements of 5e-5, against a unit's largest 5e-2), so a
// per-element bound would test the summation order, not the model.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "../common/gpu_test.h"
#include "../common/run_shardtrain.h"
#include "../common/temp_dir.h"
#include "../common/tiny_training.h"
#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/ckpt/checkpoint_saver.h"
#include "shardtrain/comm/communicator.h"
#include "shardtrain/core/config.h"
#include "shardtrain/core/error.h"
#include "shardtrain/optim/loss_scaler.h"
#include "shardtrain/shard/run_plan.h"
#include "shardtrain/train/step_engine.h"
#include "small_cuda_config.h"

namespace st {
namespace {

using testing::rel_norm_error;
using testing::Trace;

Config small(Device device, DType dtype) { return testing::small_config(device, dtype); }

constexpr uint64_t kSeed = 77;  // the corpus of testing::corpus_batches

// Step `step`'s micro-batches on one rank.
BatchFn batches(const Config& c, int64_t step) { return testing::corpus_batches(c, kSeed, step); }

// 0 .. steps - 1 on one rank, with the first step's gradients.
Trace train(const Config& c, int64_t steps, bool recompute = false) {
  Config cfg = c;
  cfg.train.recompute = recompute;
  SoloCommunicator comm;
  return testing::train(cfg, comm, kSeed, steps, /*record_grads=*/true);
}

// The largest |v[i]|.
double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}

// An fp32 GPU run against the CPU's: every step's loss and norm, the first step's gradients and the final parameters
// to 1e-4 relative (the gradients element by element to 1e-3 above a hundredth of the unit's largest).
void expect_fp32_matches(const Trace& gpu, const Trace& cpu) {
  for (size_t i = 0; i < cpu.losses.size(); ++i) {
    EXPECT_NEAR(gpu.losses[i], cpu.losses[i], 1e-4 * cpu.losses[i]) << "step " << i;
    EXPECT_NEAR(gpu.norms[i], cpu.norms[i], 1e-4 * cpu.norms[i]) << "step " << i;
  }
  for (size_t u = 0; u < cpu.grads0.size(); ++u) {
    EXPECT_LE(rel_norm_error(gpu.grads0[u], cpu.grads0[u]), 1e-4) << "gradient of unit " << u;
    EXPECT_LE(rel_norm_error(gpu.params[u], cpu.params[u]), 1e-4) << "parameters of unit " << u;
    EXPECT_TRUE(test::all_close(gpu.grads0[u], cpu.grads0[u], 1e-3, 1e-2 * max_abs(cpu.grads0[u])))
        << "gradient of unit " << u;
  }
}

TEST(CudaShardedModel, Fp32MatchesCpuLossGradientsAndTrajectory) {
  ST_SKIP_WITHOUT_GPU();
  expect_fp32_matches(train(small(Device::kCuda, DType::kF32), 5), train(small(Device::kCpu, DType::kF32), 5));
}

// bf16 and fp16 (with its loss scale divided back out of the gradients) track the fp32 CPU reference.
TEST(CudaShardedModel, HalfPrecisionTracksCpu) {
  ST_SKIP_WITHOUT_GPU();
  const Trace cpu = train(small(Device::kCpu, DType::kF32), 5);
  for (DType t : {DType::kBF16, DType::kF16}) {
    const Trace gpu = train(small(Device::kCuda, t), 5);
    for (size_t i = 0; i < cpu.losses.size(); ++i) {
      EXPECT_NEAR(gpu.losses[i], cpu.losses[i], 2e-2 * cpu.losses[i]) << to_string(t) << " step " << i;
      EXPECT_NEAR(gpu.norms[i], cpu.norms[i], 5e-2 * cpu.norms[i]) << to_string(t) << " step " << i;
    }
    // grads0 is what the shards hold: the gradient times the loss scale (2^16) in fp16.
    const double scale = t == DType::kF16 ? LossScaler::kInitialScale : 1.0;
    for (size_t u = 0; u < cpu.grads0.size(); ++u) {
      std::vector<float> g = gpu.grads0[u];
      for (float& x : g) x = static_cast<float>(x / scale);
      EXPECT_LT(rel_norm_error(g, cpu.grads0[u]), 3e-2) << to_string(t) << " gradient of unit " << u;
    }
  }
}

// configs/tiny-llama.ini (grouped-query attention, RoPE, RMSNorm, SwiGLU, a tied head) at two micro-batches of 4 x 64
// tokens; `overrides` as on the command line.
Config tiny_llama(Device device, DType dtype, std::vector<std::string> overrides = {}) {
  for (const char* o : {"--train.micro_batch=4", "--train.global_batch=8", "--model.seq_len=64", "--train.steps=8",
                        "--optim.warmup_steps=1", "--optim.lr=1e-3", "--optim.eps=1e-6"})
    overrides.insert(overrides.begin(), o);
  Config c = load_config(std::string(SHARDTRAIN_SOURCE_DIR) + "/configs/tiny-llama.ini", overrides);
  c.train.device = device;
  c.train.dtype = dtype;
  return c;
}

// The llama family trains on the GPU what it trains on the CPU, tied and untied with q/k/v biases: fp32 as
// expect_fp32_matches, bf16 to 2e-2 on the losses and 3e-2 on each unit's first gradient, with flash attention and
// with cuDNN's.
TEST(CudaShardedModel, LlamaMatchesCpu) {
  ST_SKIP_WITHOUT_GPU();
  for (const std::vector<std::string>& o :
       {std::vector<std::string>{},
        std::vector<std::string>{"--model.tie_embeddings=false", "--model.qkv_bias=true"}}) {
    SCOPED_TRACE(o.empty() ? "tied" : "untied, qkv bias");
    const Trace cpu = train(tiny_llama(Device::kCpu, DType::kF32, o), 5);
    expect_fp32_matches(train(tiny_llama(Device::kCuda, DType::kF32, o), 5), cpu);
    for (AttentionImpl a : {AttentionImpl::kFlash, AttentionImpl::kCudnn}) {
      Config h = tiny_llama(Device::kCuda, DType::kBF16, o);
      h.train.attention = a;
      const Trace half = train(h, 5);
      for (size_t i = 0; i < cpu.losses.size(); ++i)
        EXPECT_NEAR(half.losses[i], cpu.losses[i], 2e-2 * cpu.losses[i]) << to_string(a) << " step " << i;
      for (size_t u = 0; u < cpu.grads0.size(); ++u)
        EXPECT_LT(rel_norm_error(half.grads0[u], cpu.grads0[u]), 3e-2) << to_string(a) << " gradient of unit " << u;
    }
  }
}

// Recompute changes no bit for llama either, in every block or in the first train.recompute_blocks.
TEST(CudaShardedModel, LlamaRecomputeIsBitIdentical) {
  ST_SKIP_WITHOUT_GPU();
  const Config c = tiny_llama(Device::kCuda, DType::kBF16);
  ASSERT_GE(c.model.n_layer, 2);
  Config first = c;
  first.train.recompute = true;
  first.train.recompute_blocks = c.model.n_layer - 1;
  const Trace plain = train(c, 3), re = train(c, 3, /*recompute=*/true), partly = train(first, 3, /*recompute=*/true);
  EXPECT_EQ(plain.losses, re.losses);
  EXPECT_EQ(plain.params, re.params);
  EXPECT_EQ(plain.losses, partly.losses);
  EXPECT_EQ(plain.params, partly.params);
}

// cuDNN's fused attention and our flash attention compute the same function: the same 5 steps in bf16 and fp16
// land within half-precision rounding of each other, and the backend says which one it runs.
TEST(CudaShardedModel, CudnnAndFlashAttentionAgree) {
  ST_SKIP_WITHOUT_GPU();
  for (DType t : {DType::kBF16, DType::kF16}) {
    Config flash = small(Device::kCuda, t), cudnn = flash;
    flash.train.attention = AttentionImpl::kFlash;
    cudnn.train.attention = AttentionImpl::kCudnn;
    {
      SoloCommunicator comm;
      EXPECT_NE(StepEngine(cudnn, comm).sharded().describe().find("attention cudnn"), std::string::npos);
      EXPECT_NE(StepEngine(flash, comm).sharded().describe().find("attention flash"), std::string::npos);
    }
    const Trace a = train(flash, 5), b = train(cudnn, 5);
    for (size_t i = 0; i < a.losses.size(); ++i) {
      EXPECT_NEAR(b.losses[i], a.losses[i], 1e-2 * a.losses[i]) << to_string(t) << " step " << i;
      EXPECT_NEAR(b.norms[i], a.norms[i], 3e-2 * a.norms[i]) << to_string(t) << " step " << i;
    }
    for (size_t u = 0; u < a.grads0.size(); ++u)
      EXPECT_LT(rel_norm_error(b.grads0[u], a.grads0[u]), 2e-2) << to_string(t) << " gradient of unit " << u;
  }
}

// Deterministic kernels: recompute and keeping parameters gathered change nothing, bit for bit.
TEST(CudaShardedModel, RecomputeAndNoReshardAreBitIdentical) {
  ST_SKIP_WITHOUT_GPU();
  const Config c = small(Device::kCuda, DType::kBF16);
  const Trace plain = train(c, 3);
  EXPECT_EQ(plain.losses, train(c, 3).losses) << "two identical runs differ: a kernel is not deterministic";
  const Trace re = train(c, 3, /*recompute=*/true);
  EXPECT_EQ(plain.losses, re.losses);
  EXPECT_EQ(plain.params, re.params);
  Config keep = c;
  keep.dist.reshard_after_forward = false;
  const Trace kept = train(keep, 3);
  EXPECT_EQ(plain.losses, kept.losses);
  EXPECT_EQ(plain.params, kept.params);
  SoloCommunicator comm;
  StepEngine e(keep, comm);
  e.forward_backward(batches(keep, 0), 1);
  // The GPU keeps the tied embedding gathered from its forward to the head: one gather of it per micro-step.
  EXPECT_EQ(e.sharded().counters().gathers, (std::vector<int64_t>{1, 1, 1, 1}));
  // The compute stream's waits on communication were timed, and are reported once.
  EXPECT_GE(e.sharded().take_exposed_comm_ms(), 0.0);
  EXPECT_EQ(e.sharded().take_exposed_comm_ms(), 0.0);
}

// At one rank the units compute on their shards and the shards add the full gradients as they lie: no parameter
// buffer holds a copy. The steps train the bits of a run whose units gather copies (optim.offload=optimizer+params:
// each unit's compute copy staged from the host), in bf16 and with FP8 casts.
TEST(CudaShardedModel, OneRankComputesOnItsShards) {
  ST_SKIP_WITHOUT_GPU();
  for (const Fp8Recipe fp8 : {Fp8Recipe::kOff, Fp8Recipe::kDelayed}) {
    SCOPED_TRACE(to_string(fp8));
    Config in_place = small(Device::kCuda, DType::kBF16);
    in_place.train.fp8 = fp8;
    Config copied = in_place;
    copied.optim.offload = OffloadMode::kOptimizerParams;
    copied.optim.offload_speculative = Speculation::kOff;
    const Trace a = train(in_place, 3), b = train(copied, 3);
    EXPECT_EQ(a.losses, b.losses);
    EXPECT_EQ(a.params, b.params);
    SoloCommunicator comm;
    StepEngine e(in_place, comm), f(copied, comm);
    e.forward_backward(batches(in_place, 0), 1);
    f.forward_backward(batches(copied, 0), 1);
    EXPECT_EQ(e.sharded().counters().gathers, f.sharded().counters().gathers);
    // Only the full gradients' buffers are in use at the peak: the parameters' take no bytes.
    EXPECT_LT(e.sharded().memory().gathered_peak_bytes, f.sharded().memory().gathered_peak_bytes);
    EXPECT_LT(e.sharded().memory().gather_buffer_bytes, f.sharded().memory().gather_buffer_bytes);
  }
}

// SHARDTRAIN_PROFILE_OPS=1: the op profile is the training steps'. An evaluation after every step (3 micro-batches
// each, the same forward ops) adds no calls: one embedding forward and one head a step, as one micro-step makes.
TEST(CudaShardedModel, OpProfileLeavesEvaluationsOut) {
  ST_SKIP_WITHOUT_GPU();
  testing::TempDir dir;
  const std::string text = dir.file("text.txt");
  {
    std::ofstream f(text);
    for (int i = 0; i < 2000; ++i) f << "line " << i << ": the quick brown fox jumps over the lazy dog\n";
  }
  ASSERT_EQ(setenv("SHARDTRAIN_PROFILE_OPS", "1", 1), 0);
  const testing::CliResult r = testing::run_shardtrain(
      "train --config " SHARDTRAIN_SOURCE_DIR "/configs/tiny.ini --data.path=" + text +
      " --data.format=text --train.device=cuda --train.dtype=bf16 --train.steps=4 --train.micro_batch=2 "
      "--train.global_batch=2 --train.eval_every=1 --train.eval_batches=3 --train.sample_tokens=0 --log.every=1");
  unsetenv("SHARDTRAIN_PROFILE_OPS");
  ASSERT_EQ(r.code, 0) << r.output;
  ASSERT_NE(r.output.find("evaluations left out"), std::string::npos) << r.output;
  // Steps 2-4 are profiled (the first is left out); with the evaluations in, these rows would read 5.0 calls.
  for (const char* op : {"  fwd.embedding ", "  head.layernorm "}) {
    const size_t at = r.output.find(op);
    ASSERT_NE(at, std::string::npos) << op << r.output;
    const std::string row = r.output.substr(at, r.output.find('\n', at) - at);
    EXPECT_NE(row.find(" 1.0 calls"), std::string::npos) << row;
  }
}

TEST(CudaShardedModel, MemoryCapFailsBeforeAllocatingWithBreakdown) {
  ST_SKIP_WITHOUT_GPU();
  Config c = small(Device::kCuda, DType::kBF16);
  c.dist.max_gpu_mem_gib = 0.25;  // the runtime reserve alone is 0.75 GiB
  SoloCommunicator comm;
  try {
    StepEngine e(c, comm);
    FAIL() << "a 0.25 GiB cap was accepted";
  } catch (const Error& err) {
    const std::string msg = err.what();
    EXPECT_EQ(err.kind(), ErrorKind::kBadInput) << msg;
    for (const char* part :
         {"sharded state", "gather buffers", "activations", "workspace",
          "dist.max_gpu_mem_gib caps it at 0.25 GiB; no change in `shardtrain plan`'s search fits it"})
      EXPECT_NE(msg.find(part), std::string::npos) << part << " missing from: " << msg;
  }
}

// A checkpoint written by the GPU backend loads into the CPU backend (and back) with identical state.
TEST(CudaShardedModel, CheckpointsCrossBackends) {
  ST_SKIP_WITHOUT_GPU();
  testing::TempDir dir;
  Config g = small(Device::kCuda, DType::kBF16);
  g.ckpt.dir = dir.str();
  SoloCommunicator comm;
  StepEngine gpu(g, comm);
  for (int64_t s = 0; s < 2; ++s) gpu.optimizer_step(s, gpu.forward_backward(batches(g, s), 2));
  CheckpointState cs;
  cs.step = 2;
  cs.optimizer_updates = gpu.updates();
  const std::string where = save_checkpoint(g, gpu.sharded(), cs, comm);

  Config c = g;
  c.train.device = Device::kCpu;
  c.train.dtype = DType::kF32;
  StepEngine cpu(c, comm);
  load_checkpoint(where, c, cpu.sharded(), comm);
  EXPECT_EQ(cpu.gather_params(), gpu.gather_params());

  StepEngine back(g, comm);
  load_checkpoint(where, g, back.sharded(), comm);
  EXPECT_EQ(back.gather_params(), gpu.gather_params());
  // The restored bf16 compute copy is what the next forward uses: same loss as the original engine.
  EXPECT_EQ(back.forward_backward(batches(g, 2), 2), gpu.forward_backward(batches(g, 2), 2));
}

// What five steps of two micro-steps leave behind.
struct StepsRun {
  std::vector<StepStats> stats;
  std::vector<std::vector<float>> params;
  int64_t updates = 0;
  std::string gemm_plans;  // the cuBLASLt algorithm of every GEMM the run planned (for messages)
};

// Steps 0 .. 4 of two micro-steps on one rank, step s's batches and number of targets from step_batch(s, &n) (n left
// at kEveryPosition: every position), through train_step (`gated`: decided on the device, on a cuda backend without
// offload) or through forward_backward and optimizer_step (the host path).
template <typename StepBatch>
StepsRun run_steps(const Config& c, bool gated, StepBatch step_batch) {
  SoloCommunicator comm;
  StepEngine e(c, comm);
  if (c.train.device == Device::kCuda) EXPECT_TRUE(e.sharded().gates_on_device());
  StepsRun r;
  for (int64_t s = 0; s < 5; ++s) {
    int64_t n = kEveryPosition;
    const BatchFn batch = step_batch(s, &n);
    r.stats.push_back(gated ? e.train_step(batch, 2, s, n) : e.optimizer_step(s, e.forward_backward(batch, 2, s, n)));
  }
  r.params = e.gather_params();
  r.updates = e.updates();
  r.gemm_plans = e.sharded().gemm_algorithms().plans;
  return r;
}

// StepEngine::train_step decides the step's end on the device (norm, clip, skip: gpu::decide_step) and queues AdamW
// before the host reads the loss back. It gives the host path's bits: the losses, norms, skips, loss scales, update
// count and parameters, over steps that clip (optim.grad_clip 0.05), a skipped step (grad_inf at the third), and two
// micro-steps a step. With optimizer offload the backend does not gate, and train_step takes the host path.
TEST(CudaShardedModel, TrainStepGatedOnDeviceMatchesHostPath) {
  ST_SKIP_WITHOUT_GPU();
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    Config c = small(Device::kCuda, dt);
    c.optim.grad_clip = 0.05f;
    SCOPED_TRACE(::testing::Message() << "dtype " << static_cast<int>(dt));
    auto run = [&](bool gated) { return run_steps(c, gated, [&](int64_t s, int64_t*) { return batches(c, s); }); };
    ASSERT_EQ(setenv("SHARDTRAIN_FAULT", "grad_inf:0@3", 1), 0);
    const StepsRun host = run(false), device = run(true);
    unsetenv("SHARDTRAIN_FAULT");
    // When the two runs differ, whether their GEMMs ran the same cuBLASLt algorithms says where to look.
    SCOPED_TRACE(host.gemm_plans == device.gemm_plans ? std::string("both runs planned the same GEMM algorithms")
                                                      : "the runs planned different GEMM algorithms; host path:\n" +
                                                            host.gemm_plans + "gated:\n" + device.gemm_plans);
    ASSERT_EQ(host.stats.size(), device.stats.size());
    int clipped = 0;
    for (size_t i = 0; i < host.stats.size(); ++i) {
      const StepStats &h = host.stats[i], &d = device.stats[i];
      EXPECT_EQ(d.skipped, h.skipped) << "step " << i;
      EXPECT_EQ(d.skipped, i == 2) << "step " << i;
      EXPECT_EQ(d.loss_scale, h.loss_scale) << "step " << i;
      EXPECT_EQ(d.lr, h.lr) << "step " << i;
      if (!h.skipped) {
        EXPECT_EQ(d.loss, h.loss) << "step " << i;
        EXPECT_EQ(d.grad_norm, h.grad_norm) << "step " << i;
        clipped += h.grad_norm > 0.05 ? 1 : 0;
      } else {
        EXPECT_FALSE(std::isfinite(d.grad_norm)) << "step " << i;
      }
    }
    EXPECT_GE(clipped, 2) << "the steps should clip";
    EXPECT_EQ(device.updates, 4);
    EXPECT_EQ(host.updates, 4);
    ASSERT_EQ(device.params.size(), host.params.size());
    for (size_t u = 0; u < host.params.size(); ++u) EXPECT_EQ(device.params[u], host.params[u]) << "unit " << u;
  }
  Config off = small(Device::kCuda, DType::kBF16);
  off.optim.offload = OffloadMode::kOptimizer;
  SoloCommunicator comm;
  StepEngine e(off, comm);
  EXPECT_FALSE(e.sharded().gates_on_device());
  EXPECT_TRUE(std::isfinite(e.train_step(batches(off, 0), 2, 0).loss));
}

// Step `step`'s micro-batches with loss masks: the target at position t of sequence b of micro-step m is kept when
// (step + m + b + t) % 3 != 0, except that micro-step 1 of step 1 keeps none and step 3 none at all. *targets gets
// the step's count, as Sampler::step_targets gives it.
BatchFn masked_batches(const Config& c, int64_t step, int64_t* targets) {
  const int64_t B = c.train.micro_batch, T = c.model.seq_len, accum = c.grad_accum_steps(1);
  auto kept = [step](int64_t m, int64_t b, int64_t t) {
    return step != 3 && !(step == 1 && m == 1) && (step + m + b + t) % 3 != 0;
  };
  *targets = 0;
  for (int64_t m = 0; m < accum; ++m)
    for (int64_t i = 0; i < B * T; ++i) *targets += kept(m, i / T, i % T) ? 1 : 0;
  const BatchFn plain = batches(c, step);
  return [plain, kept, B, T](int64_t m, int32_t* in, int32_t* tgt) {
    plain(m, in, tgt);
    for (int64_t i = 0; i < B * T; ++i)
      if (!kept(m, i / T, i % T)) tgt[i] = -1;
  };
}

// Loss masks on the GPU, through the device-gated step and the host path, train what they train on the CPU: masked
// rows add no loss and no gradient (the softmax-cross-entropy kernel and the chunked classifier), the step's mean is
// over its kept targets (a micro-batch with none included), and the step with no target is skipped alike, without an
// update. fp32 to 1e-4 as expect_fp32_matches; bf16 and fp16 to 2e-2 on the losses.
TEST(CudaShardedModel, MaskedStepsMatchCpu) {
  ST_SKIP_WITHOUT_GPU();
  auto run = [](const Config& c, bool gated) {
    return run_steps(c, gated, [&](int64_t s, int64_t* n) { return masked_batches(c, s, n); });
  };
  const StepsRun cpu = run(small(Device::kCpu, DType::kF32), false);
  ASSERT_EQ(cpu.updates, 4);
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (bool gated : {true, false}) {
      SCOPED_TRACE(::testing::Message() << to_string(dt) << (gated ? ", gated on the device" : ", host path"));
      const StepsRun gpu = run(small(Device::kCuda, dt), gated);
      const double tol = dt == DType::kF32 ? 1e-4 : 2e-2;
      for (size_t i = 0; i < cpu.stats.size(); ++i) {
        EXPECT_EQ(gpu.stats[i].skipped, i == 3) << "step " << i;
        EXPECT_EQ(gpu.stats[i].no_targets, i == 3) << "step " << i;
        if (i == 3) {
          EXPECT_TRUE(std::isnan(gpu.stats[i].loss));
          continue;
        }
        EXPECT_NEAR(gpu.stats[i].loss, cpu.stats[i].loss, tol * cpu.stats[i].loss) << "step " << i;
      }
      EXPECT_EQ(gpu.updates, 4);
      if (dt == DType::kF32)
        for (size_t u = 0; u < cpu.params.size(); ++u)
          EXPECT_LE(rel_norm_error(gpu.params[u], cpu.params[u]), 1e-4) << "parameters of unit " << u;
    }
  }
}

// Optimizer offload on one GPU: the host AdamW trains what the device AdamW trains, bit for bit, whichever units it
// holds and whether all, some or none of them speculate, over steps that clip (the first step's speculative updates
// are redone, and the steps after a clipped one do not speculate) and over steps that do not (every speculative update
// kept); and a checkpoint of the host state loads into a run without offload, and back.
TEST(CudaShardedModel, OffloadTrainsWhatTheDeviceOptimizerTrains) {
  ST_SKIP_WITHOUT_GPU();
  Config base = small(Device::kCuda, DType::kBF16);
  base.optim.grad_clip = 0.05f;
  base.optim.offload_threads = 2;
  auto run = [](const Config& c, std::vector<std::vector<float>>* params) {
    SoloCommunicator comm;
    StepEngine e(c, comm);
    std::vector<float> losses;
    for (int64_t s = 0; s < 6; ++s) losses.push_back(e.train_step(batches(c, s), 2, s).loss);
    *params = e.gather_params();
    return losses;
  };
  // auto under a host budget halfway between the plans without and with every second copy: the last units
  // speculate, the ring carries the others.
  auto speculate_some = [](Config c) {
    c.optim.offload_speculative = Speculation::kAuto;
    const HostPlan none = plan_cuda_host(c, 1, 0);
    const int64_t half = (none.total() + plan_cuda_host(c, 1, kEveryOffloadedUnit).total()) / 2;
    c.dist.max_host_mem_gib = static_cast<double>(half) / static_cast<double>(int64_t{1} << 30);
    const int k = resolve_speculation(c, 1, HostMemoryBudget{half, "half"});
    EXPECT_GT(k, 0);
    EXPECT_LT(k, none.offloaded_units);
    return c;
  };
  std::vector<std::vector<float>> want_params;
  const std::vector<float> want = run(base, &want_params);
  struct Case {
    OffloadMode mode;
    float fraction;
    Speculation speculation;
    bool some = false;  // speculate_some
  };
  for (const Case& k : {Case{OffloadMode::kOptimizer, 1.0f, Speculation::kOff},
                        Case{OffloadMode::kOptimizerParams, 1.0f, Speculation::kOff},
                        Case{OffloadMode::kOptimizer, 1.0f, Speculation::kOn},
                        Case{OffloadMode::kOptimizerParams, 0.5f, Speculation::kOn},
                        Case{OffloadMode::kOptimizer, 1.0f, Speculation::kAuto, true},
                        Case{OffloadMode::kOptimizerParams, 1.0f, Speculation::kAuto, true}}) {
    Config c = base;
    c.optim.offload = k.mode;
    c.optim.offload_fraction = k.fraction;
    c.optim.offload_speculative = k.speculation;
    if (k.some) c = speculate_some(c);
    SCOPED_TRACE(::testing::Message() << "optim.offload=" << to_string(k.mode) << ", fraction " << k.fraction
                                      << ", speculation " << to_string(k.speculation) << (k.some ? " (some)" : ""));
    std::vector<std::vector<float>> params;
    EXPECT_EQ(run(c, &params), want);
    EXPECT_EQ(params, want_params);
  }
  Config unclipped = base;
  unclipped.optim.grad_clip = 0.0f;
  std::vector<std::vector<float>> plain_params, kept_params;
  const std::vector<float> plain_losses = run(unclipped, &plain_params);
  unclipped.optim.offload = OffloadMode::kOptimizer;
  unclipped.optim.offload_speculative = Speculation::kOn;
  EXPECT_EQ(run(unclipped, &kept_params), plain_losses) << "speculating, unclipped";
  EXPECT_EQ(kept_params, plain_params) << "speculating, unclipped";
  EXPECT_EQ(run(speculate_some(unclipped), &kept_params), plain_losses) << "some speculating, unclipped";
  EXPECT_EQ(kept_params, plain_params) << "some speculating, unclipped";

  testing::TempDir dir;
  Config off = base;
  off.optim.offload = OffloadMode::kOptimizerParams;
  off.optim.offload_fraction = 0.5f;
  off.ckpt.dir = dir.str();
  SoloCommunicator comm;
  StepEngine a(off, comm);
  for (int64_t s = 0; s < 2; ++s) a.train_step(batches(off, s), 2, s);
  CheckpointState cs;
  cs.step = 2;
  cs.optimizer_updates = a.updates();
  const std::string where = save_checkpoint(off, a.sharded(), cs, comm);
  Config plain = off;
  plain.optim.offload = OffloadMode::kNone;
  StepEngine b(plain, comm);
  load_checkpoint(where, plain, b.sharded(), comm);
  EXPECT_EQ(b.gather_params(), a.gather_params());
  StepEngine back(off, comm);
  load_checkpoint(where, off, back.sharded(), comm);
  EXPECT_EQ(back.gather_params(), a.gather_params());
  // The restored compute copies (on the device, and staged from the host) are what the next forward reads.
  EXPECT_EQ(back.forward_backward(batches(off, 2), 2), b.forward_backward(batches(off, 2), 2));
}

// The state a snapshot holds is its step's, bit for bit, although the copy runs behind the step's queued AdamW and the
// next step trains while it completes: with the optimizer on the device (copied), and with offloaded units (read in
// place: their host updates wait for the release; with and without speculation). A background save, loaded after one
// more step, gives the state of the step it was taken at.
TEST(CudaShardedModel, SnapshotHoldsTheStateOfItsStep) {
  ST_SKIP_WITHOUT_GPU();
  struct Case {
    OffloadMode mode;
    float fraction;
    Speculation speculation;
  };
  for (const Case& k :
       {Case{OffloadMode::kNone, 1.0f, Speculation::kOff}, Case{OffloadMode::kOptimizerParams, 0.5f, Speculation::kOff},
        Case{OffloadMode::kOptimizer, 1.0f, Speculation::kOn}}) {
    Config c = small(Device::kCuda, DType::kBF16);
    c.optim.offload = k.mode;
    c.optim.offload_fraction = k.fraction;
    c.optim.offload_speculative = k.speculation;
    c.optim.offload_threads = 2;
    SCOPED_TRACE(::testing::Message() << "optim.offload=" << to_string(k.mode) << ", fraction " << k.fraction);
    SoloCommunicator comm;
    // The state after steps 0 and 1, pulled while nothing runs.
    StepEngine ref(c, comm);
    for (int64_t s = 0; s < 2; ++s) ref.train_step(batches(c, s), 2, s);
    ref.sharded().pull_state();
    std::vector<float> want;
    for (const UnitLayout& u : ref.units()) {
      const UnitShard& sh = ref.sharded().shard(u.index);
      for (const std::vector<float>* v : {&sh.param, &sh.m, &sh.v})
        want.insert(want.end(), v->begin(), v->begin() + sh.span.count);
    }

    testing::TempDir dir;
    c.ckpt.dir = dir.str();
    c.ckpt.async = true;
    StepEngine e(c, comm);
    for (int64_t s = 0; s < 2; ++s) e.train_step(batches(c, s), 2, s);
    StateSnapshot snap;
    e.sharded().snapshot_state(&snap);
    // The next step trains beside the snapshot; its updates of offloaded units (read in place) wait for the release.
    std::thread next([&] { e.train_step(batches(c, 2), 2, 2); });
    snap.wait();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // room for an update that did not wait
    std::vector<float> got;
    for (const StateSnapshot::Unit& u : snap.units)
      for (const float* p : {u.param, u.exp_avg, u.exp_avg_sq}) got.insert(got.end(), p, p + u.span.count);
    EXPECT_EQ(got, want);
    if (snap.release) snap.release();
    next.join();
    ref.train_step(batches(c, 2), 2, 2);
    EXPECT_EQ(e.gather_params(), ref.gather_params());  // the snapshot did not change the training

    // A background save of step 3 while step 4 trains, loaded on the CPU backend.
    e.train_step(batches(c, 3), 2, 3);
    ref.train_step(batches(c, 3), 2, 3);
    const std::vector<std::vector<float>> want_saved = ref.gather_params();
    CheckpointSaver saver(c, e.sharded(), comm);
    CheckpointState cs;
    cs.step = 4;
    cs.optimizer_updates = e.updates();
    saver.save(cs);
    e.train_step(batches(c, 4), 2, 4);
    saver.drain();
    ASSERT_FALSE(saver.last_committed().empty());
    Config cpu = c;
    cpu.train.device = Device::kCpu;
    cpu.train.dtype = DType::kF32;
    cpu.optim.offload = OffloadMode::kNone;
    cpu.optim.offload_speculative = Speculation::kAuto;
    StepEngine loaded(cpu, comm);
    load_checkpoint(saver.last_committed(), cpu, loaded.sharded(), comm);
    EXPECT_EQ(loaded.gather_params(), want_saved);
  }
}

}  // namespace
}  // namespace st
