#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "shardtrain/core/rng.h"
#include "shardtrain/kernels/adamw.h"
#include "shardtrain/optim/adamw_optimizer.h"
#include "shardtrain/optim/lr_schedule.h"

namespace st {
namespace {

TEST(LrSchedule, WarmupThenCosineToMin) {
  OptimConfig o;
  o.lr = 1e-3f;
  o.min_lr = 1e-4f;
  o.warmup_steps = 10;
  EXPECT_FLOAT_EQ(lr_at(o, 0, 110), 1e-4f);
  EXPECT_FLOAT_EQ(lr_at(o, 4, 110), 5e-4f);
  EXPECT_FLOAT_EQ(lr_at(o, 9, 110), 1e-3f);
  EXPECT_FLOAT_EQ(lr_at(o, 10, 110), 1e-3f);
  EXPECT_FLOAT_EQ(lr_at(o, 60, 110), 5.5e-4f);  // half way: the mean of lr and min_lr
  EXPECT_FLOAT_EQ(lr_at(o, 110, 110), 1e-4f);
  o.warmup_steps = 0;
  EXPECT_FLOAT_EQ(lr_at(o, 0, 100), 1e-3f);
}

// The decay's shapes over the steps after the warmup: linear 1 - p, sqrt 1 - sqrt(p), as torchtitan's schedules.
TEST(LrSchedule, LinearAndSqrtDecays) {
  OptimConfig o;
  o.lr = 1e-3f;
  o.min_lr = 1e-4f;
  o.warmup_steps = 10;
  o.decay = LrDecay::kLinear;
  EXPECT_FLOAT_EQ(lr_at(o, 9, 110), 1e-3f);
  EXPECT_FLOAT_EQ(lr_at(o, 10, 110), 1e-3f);
  EXPECT_FLOAT_EQ(lr_at(o, 35, 110), 7.75e-4f);  // a quarter of the way: lr - 0.25 (lr - min_lr)
  EXPECT_FLOAT_EQ(lr_at(o, 60, 110), 5.5e-4f);
  EXPECT_FLOAT_EQ(lr_at(o, 109, 110), 1.09e-4f);  // the last step: p = 99 / 100
  EXPECT_FLOAT_EQ(lr_at(o, 110, 110), 1e-4f);
  o.decay = LrDecay::kSqrt;
  EXPECT_FLOAT_EQ(lr_at(o, 10, 110), 1e-3f);
  EXPECT_FLOAT_EQ(lr_at(o, 35, 110), 5.5e-4f);  // p = 1/4: sqrt 1/2, half way down
  EXPECT_FLOAT_EQ(lr_at(o, 110, 110), 1e-4f);
  o.min_lr = o.lr;  // a constant rate after the warmup, whatever the shape
  for (int64_t step : {10, 47, 109}) EXPECT_FLOAT_EQ(lr_at(o, step, 110), 1e-3f) << step;
}

// Warmup-stable-decay (optim.decay_steps): the warmup, optim.lr held, then the decay over the last decay_steps steps
// only, the same curve as a schedule whose warmup ended where the decay starts.
TEST(LrSchedule, WarmupStableDecay) {
  OptimConfig o;
  o.lr = 1e-3f;
  o.min_lr = 0.0f;
  o.warmup_steps = 10;
  o.decay_steps = 20;
  o.decay = LrDecay::kLinear;
  EXPECT_FLOAT_EQ(lr_at(o, 4, 100), 5e-4f);  // the warmup is as without a stable phase
  for (int64_t step : {10, 50, 79}) EXPECT_FLOAT_EQ(lr_at(o, step, 100), 1e-3f) << step;
  EXPECT_FLOAT_EQ(lr_at(o, 80, 100), 1e-3f);  // the decay's first step: p = 0
  EXPECT_FLOAT_EQ(lr_at(o, 90, 100), 5e-4f);
  EXPECT_FLOAT_EQ(lr_at(o, 99, 100), 5e-5f);
  OptimConfig late = o;
  late.decay_steps = 0;
  late.warmup_steps = 80;
  for (LrDecay d : {LrDecay::kCosine, LrDecay::kLinear, LrDecay::kSqrt}) {
    o.decay = late.decay = d;
    for (int64_t step = 80; step <= 100; ++step) EXPECT_EQ(lr_at(o, step, 100), lr_at(late, step, 100)) << step;
  }
  // A decay that spans every step after the warmup is the default schedule.
  o.decay_steps = 90;
  OptimConfig all = o;
  all.decay_steps = 0;
  for (int64_t step = 0; step <= 100; ++step) EXPECT_EQ(lr_at(o, step, 100), lr_at(all, step, 100)) << step;
}

TEST(Clip, CoefficientFollowsTorchRule) {
  OptimConfig o;
  o.grad_clip = 1.0f;
  EXPECT_FLOAT_EQ(clip_coefficient(o, 0.5), 1.0f);
  EXPECT_FLOAT_EQ(clip_coefficient(o, 4.0), static_cast<float>(1.0 / (4.0 + 1e-6)));
  o.grad_clip = 0.0f;
  EXPECT_FLOAT_EQ(clip_coefficient(o, 1e9), 1.0f);
}

// decide_step: the norm unscaled, the clip over the loss scale (float(clip / loss_scale), the scale StepEngine's
// runs carried before), and a skip on a non-finite loss or norm.
TEST(DecideStep, NormClipAndSkip) {
  StepGate g = decide_step(16.0, 3.5, 1.0, 1.0f);  // norm 4: clipped to 1
  EXPECT_EQ(g.grad_norm, 4.0);
  EXPECT_EQ(g.skip, 0);
  EXPECT_EQ(g.grad_scale, static_cast<float>(1.0 / (4.0 + 1e-6)));
  g = decide_step(0.25, 3.5, 1.0, 1.0f);  // norm 0.5: not clipped
  EXPECT_EQ(g.grad_norm, 0.5);
  EXPECT_EQ(g.grad_scale, 1.0f);
  g = decide_step(16.0 * 1024.0 * 1024.0, 3.5, 1024.0, 1.0f);  // fp16: the norm of the unscaled gradient is 4
  EXPECT_EQ(g.grad_norm, 4.0);
  const float clip = static_cast<float>(1.0 / (4.0 + 1e-6));
  EXPECT_EQ(g.grad_scale, static_cast<float>(static_cast<double>(clip) / 1024.0));
  g = decide_step(16.0, 3.5, 1.0, 0.0f);  // optim.grad_clip = 0: no clipping
  EXPECT_EQ(g.grad_scale, 1.0f);
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(decide_step(inf, 3.5, 1.0, 1.0f).skip, 1);
  EXPECT_EQ(decide_step(nan, 3.5, 1.0, 1.0f).skip, 1);
  EXPECT_EQ(decide_step(16.0, inf, 1.0, 1.0f).skip, 1);
  EXPECT_EQ(decide_step(16.0, nan, 1.0, 1.0f).skip, 1);
  EXPECT_EQ(decide_step(16.0, -3.5, 1.0, 1.0f).skip, 0);
  OptimConfig o;
  o.grad_clip = 0.7f;
  for (double norm : {0.1, 0.7, 0.71, 3.0, 1e6}) EXPECT_EQ(clip_factor(0.7f, norm), clip_coefficient(o, norm)) << norm;
}

TEST(SumOfSquares, MatchesDouble) {
  std::vector<float> g(10001);
  double want = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    g[i] = static_cast<float>(normal_at(3, 0, i));
    want += static_cast<double>(g[i]) * g[i];
  }
  EXPECT_NEAR(sum_of_squares(g.data(), static_cast<int64_t>(g.size())), want, 1e-9 * want);
}

// A span that crosses tensor boundaries gets each tensor's own decay: the same result as updating
// tensor by tensor with the kernel, and the same whichever way the unit is cut into spans.
TEST(AdamwSpan, DecayFollowsTensorsAndSpansCompose) {
  ModelConfig mc;
  mc.n_layer = 1;
  mc.n_embd = 8;
  mc.n_head = 2;
  mc.vocab_size = 256;
  mc.seq_len = 4;
  const UnitLayout u = build_units(mc)[1];
  OptimConfig oc;
  oc.weight_decay = 0.5f;
  OptimizerStep os;
  os.lr = 0.01f;
  os.t = 3;
  os.grad_scale = 0.7f;
  std::vector<float> p0(u.numel), g(u.numel), m0(u.numel), v0(u.numel);
  for (int64_t i = 0; i < u.numel; ++i) {
    p0[i] = static_cast<float>(normal_at(1, 0, i));
    g[i] = static_cast<float>(normal_at(1, 1, i));
    m0[i] = static_cast<float>(0.1 * normal_at(1, 2, i));
    v0[i] = static_cast<float>(std::fabs(0.1 * normal_at(1, 3, i)));
  }
  // Reference: the kernel, tensor by tensor.
  std::vector<float> pr = p0, mr = m0, vr = v0;
  for (const TensorSpec& t : u.tensors) {
    AdamWParams ap;
    ap.lr = os.lr;
    ap.beta1 = oc.beta1;
    ap.beta2 = oc.beta2;
    ap.eps = oc.eps;
    ap.step = os.t;
    ap.grad_scale = os.grad_scale;
    ap.weight_decay = t.weight_decay ? oc.weight_decay : 0.0f;
    adamw_update(pr.data() + t.offset, mr.data() + t.offset, vr.data() + t.offset, g.data() + t.offset, t.numel, ap);
  }
  for (int64_t cut : {int64_t{1}, int64_t{13}, u.numel / 3, u.numel}) {
    std::vector<float> p = p0, m = m0, v = v0;
    for (int64_t b = 0; b < u.numel; b += cut) {
      const int64_t e = std::min(u.numel, b + cut);
      adamw_step_span(u, b, e, oc, os, p.data() + b, m.data() + b, v.data() + b, g.data() + b);
    }
    EXPECT_EQ(p, pr) << "cut " << cut;
    EXPECT_EQ(m, mr) << "cut " << cut;
    EXPECT_EQ(v, vr) << "cut " << cut;
  }
  // And decay really differs between a bias and a matrix: with zero gradient state only decay moves p.
  const TensorSpec& w = u.tensor("attn.qkv.weight");
  const TensorSpec& b = u.tensor("attn.qkv.bias");
  std::vector<float> p = p0, m(u.numel, 0.0f), v(u.numel, 0.0f), zero(u.numel, 0.0f);
  adamw_step_span(u, 0, u.numel, oc, os, p.data(), m.data(), v.data(), zero.data());
  EXPECT_FLOAT_EQ(p[w.offset], p0[w.offset] * (1.0f - 0.01f * 0.5f));
  EXPECT_FLOAT_EQ(p[b.offset], p0[b.offset]);
}

}  // namespace
}  // namespace st
