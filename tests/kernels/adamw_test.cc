#include "shardtrain/kernels/adamw.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "grad_check.h"

namespace st {
namespace {

using testing::max_rel_diff;
using testing::randn;

// The header's formula in double, for one step.
void adamw_ref(std::vector<double>& p, std::vector<double>& m, std::vector<double>& v, const std::vector<float>& g,
               const AdamWParams& a) {
  const double lr = a.lr, b1 = a.beta1, b2 = a.beta2, eps = a.eps, wd = a.weight_decay, gs = a.grad_scale;
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(a.step));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(a.step));
  for (size_t i = 0; i < p.size(); ++i) {
    const double gi = g[i] * gs;
    p[i] *= 1.0 - lr * wd;
    m[i] = b1 * m[i] + (1.0 - b1) * gi;
    v[i] = b2 * v[i] + (1.0 - b2) * gi * gi;
    p[i] -= (lr / bc1) * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + eps);
  }
}

struct AdamState {
  std::vector<float> p, m, v;
};

// Runs `steps` updates with fresh gradients each step, in float (kernel) and double (reference), and
// compares p, m and v after every step as max|diff| / max|ref|. Parameters start at scale 0.05 so that
// each update (~lr) is a large fraction of p: an error in the update is not hidden under p's rounding.
// Measured <= 2.5e-7 (a few ulps); 1e-5 still catches a missing bias correction, the decay applied after
// the Adam step, or eps inside the sqrt (each >= 1e-3 here).
void check_against_reference(AdamWParams a, int steps, uint64_t stream) {
  const int64_t n = 37;
  AdamState k{randn(n, stream, 0.05f), std::vector<float>(n, 0.0f), std::vector<float>(n, 0.0f)};
  std::vector<double> p(k.p.begin(), k.p.end()), m(n, 0.0), v(n, 0.0);
  for (int s = 1; s <= steps; ++s) {
    a.step = s;
    const auto g = randn(n, stream + s, 0.1f * s);
    adamw_update(k.p.data(), k.m.data(), k.v.data(), g.data(), n, a);
    adamw_ref(p, m, v, g, a);
    EXPECT_LE(max_rel_diff(k.p, p), 1e-5) << "step " << s;
    EXPECT_LE(max_rel_diff(k.m, m), 1e-5) << "step " << s;
    EXPECT_LE(max_rel_diff(k.v, v), 1e-5) << "step " << s;
  }
}

TEST(AdamW, MatchesDoubleReferenceNoDecay) {
  AdamWParams a;
  a.lr = 1e-2f;
  check_against_reference(a, 6, 700);
}

TEST(AdamW, MatchesDoubleReferenceWithDecayAndGradScale) {
  AdamWParams a;
  a.lr = 3e-2f;
  a.beta1 = 0.8f;
  a.beta2 = 0.99f;
  a.eps = 1e-3f;  // comparable to sqrt(v): where eps goes matters
  a.weight_decay = 0.1f;
  a.grad_scale = 0.37f;
  check_against_reference(a, 6, 710);
}

TEST(AdamW, FirstStepMovesByLrTimesSign) {
  // With m = v = 0 at step 1, bias correction makes the update lr * g / (|g| + eps'): ~lr * sign(g).
  // Without the bias corrections it would be lr * 0.1 / sqrt(0.05) = 0.45 lr; 1e-6 is a few ulps of p.
  const int64_t n = 16;
  auto p = randn(n, 720);
  const auto p0 = p;
  auto g = randn(n, 721);
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  AdamWParams a;
  a.lr = 1e-3f;
  a.step = 1;
  adamw_update(p.data(), m.data(), v.data(), g.data(), n, a);
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(p0[i] - p[i], (g[i] > 0 ? 1e-3 : -1e-3), 1e-6) << i;
}

TEST(AdamW, ZeroGradientOnlyDecays) {
  const int64_t n = 9;
  auto p = randn(n, 730);
  const auto p0 = p;
  std::vector<float> m(n, 0.0f), v(n, 0.0f), g(n, 0.0f);
  AdamWParams a;
  a.lr = 0.5f;
  a.weight_decay = 0.1f;
  a.step = 3;
  adamw_update(p.data(), m.data(), v.data(), g.data(), n, a);
  // 1 - 0.05 and p * 0.95f are exact float operations; the Adam term is 0 / eps = 0.
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(p[i], p0[i] * 0.95f) << i;
  a.weight_decay = 0.0f;
  const auto p1 = p;
  adamw_update(p.data(), m.data(), v.data(), g.data(), n, a);
  EXPECT_EQ(p, p1);
}

// adamw_update_runs with a gate: its grad_scale replaces the runs' (the same bits as runs that carry it), and a
// skipping gate leaves param, m and v as they were.
TEST(AdamW, GateReplacesGradScaleOrSkips) {
  const int64_t n = 37;
  const auto g = randn(n, 750);
  AdamWParams a;
  a.lr = 1e-2f;
  a.weight_decay = 0.1f;
  a.step = 3;
  a.grad_scale = 1.0f;
  AdamState gated{randn(n, 751), randn(n, 752, 0.1f), randn(n, 753, 0.1f)};
  for (float& x : gated.v) x = x * x;
  AdamState plain = gated;
  const AdamState before = gated;
  AdamWParams decayless = a;
  decayless.weight_decay = 0.0f;
  const std::vector<AdamWRun> runs = {{0, 20, a}, {20, 17, decayless}};
  StepGate gate;
  gate.grad_scale = 0.3f;
  adamw_update_runs(gated.p.data(), gated.m.data(), gated.v.data(), g.data(), runs, &gate);
  std::vector<AdamWRun> scaled = runs;
  for (AdamWRun& r : scaled) r.params.grad_scale = 0.3f;
  adamw_update_runs(plain.p.data(), plain.m.data(), plain.v.data(), g.data(), scaled);
  EXPECT_EQ(gated.p, plain.p);
  EXPECT_EQ(gated.m, plain.m);
  EXPECT_EQ(gated.v, plain.v);
  EXPECT_NE(gated.p, before.p);
  AdamState skipped = before;
  gate.skip = 1;
  adamw_update_runs(skipped.p.data(), skipped.m.data(), skipped.v.data(), g.data(), runs, &gate);
  EXPECT_EQ(skipped.p, before.p);
  EXPECT_EQ(skipped.m, before.m);
  EXPECT_EQ(skipped.v, before.v);
}

TEST(AdamW, GradScaleMultipliesGradient) {
  // grad_scale = 2 on g is the same as grad_scale = 1 on 2g (scaling by 2 is exact in float).
  const int64_t n = 21;
  const auto g = randn(n, 740);
  std::vector<float> g2(n);
  for (int64_t i = 0; i < n; ++i) g2[i] = 2.0f * g[i];
  AdamWParams a;
  a.lr = 1e-2f;
  a.weight_decay = 0.1f;
  a.step = 4;
  AdamState r1{randn(n, 741), randn(n, 742, 0.1f), randn(n, 743, 0.1f)};
  for (float& x : r1.v) x = x * x;
  AdamState r2 = r1;
  a.grad_scale = 2.0f;
  adamw_update(r1.p.data(), r1.m.data(), r1.v.data(), g.data(), n, a);
  a.grad_scale = 1.0f;
  adamw_update(r2.p.data(), r2.m.data(), r2.v.data(), g2.data(), n, a);
  EXPECT_EQ(r1.p, r2.p);
  EXPECT_EQ(r1.m, r2.m);
  EXPECT_EQ(r1.v, r2.v);
  // ... and differs from not scaling at all.
  AdamState r3{randn(n, 741), randn(n, 742, 0.1f), randn(n, 743, 0.1f)};
  for (float& x : r3.v) x = x * x;
  adamw_update(r3.p.data(), r3.m.data(), r3.v.data(), g.data(), n, a);
  EXPECT_NE(r1.m, r3.m);
}

}  // namespace
}  // namespace st
