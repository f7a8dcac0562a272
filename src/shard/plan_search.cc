#include "shardtrain/shard/plan_search.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "shardtrain/core/error.h"
#include "shardtrain/core/format.h"
#include "shardtrain/model/recompute.h"

namespace st {
namespace {

// One knob's settings in the order the search tries them: the current value first (no change), then each step
// further from it. `apply` sets step i on a config and target and returns its flags ("" for the current value), or
// nullopt where the step is invalid (a micro-batch that does not divide the global batch).
struct Knob {
  int steps = 1;
  std::function<std::optional<std::string>(int step, Config& c, RunTarget& t)> apply;
};

constexpr int kFractionSteps = 20;  // optim.offload_fraction in steps of 0.05

std::string fraction_text(int k) {
  char f[16];
  std::snprintf(f, sizeof(f), "%.2f", k / double(kFractionSteps));
  return f;
}

// optim.offload as one line of settings: 0 none, then optimizer at 0.05 ... 1, then optimizer+params likewise.
int offload_index(const OptimConfig& o) {
  if (o.offload == OffloadMode::kNone) return 0;
  const int k =
      std::max(1, std::min(kFractionSteps, static_cast<int>(std::lround(o.offload_fraction * kFractionSteps))));
  return (o.offload == OffloadMode::kOptimizer ? 0 : kFractionSteps) + k;
}

// Makes c recompute its first `blocks` blocks (0: none; n_layer: all) and returns the flags of that change ("" where
// c already does).
std::string recompute_first(Config& c, int blocks) {
  const bool on = blocks > 0;
  const int64_t count = on && blocks < c.model.n_layer ? blocks : 0;
  std::string flags;
  if (c.train.recompute != on) flags = str_cat("--train.recompute=", on ? "true" : "false");
  if (c.train.recompute_blocks != count) flags += str_cat(flags.empty() ? "" : " ", "--train.recompute_blocks=", count);
  c.train.recompute = on;
  c.train.recompute_blocks = count;
  return flags;
}

std::vector<Knob> knobs(const Config& cfg) {
  std::vector<Knob> out;
  // dist.fp8_gather_keep: off
  out.push_back({cfg.dist.fp8_gather_keep ? 2 : 1, [](int step, Config& c, RunTarget&) -> std::optional<std::string> {
                   if (step == 0) return std::string();
                   c.dist.fp8_gather_keep = false;
                   return std::string("--dist.fp8_gather_keep=false");
                 }});
  // recompute: more blocks than now, fewest first (train.recompute_blocks), then all of them
  const int recomputed = recompute_of(cfg.train).count(static_cast<int>(cfg.model.n_layer));
  out.push_back({1 + static_cast<int>(cfg.model.n_layer) - recomputed,
                 [recomputed](int step, Config& c, RunTarget&) -> std::optional<std::string> {
                   return step == 0 ? std::string() : recompute_first(c, recomputed + step);
                 }});
  // micro-batch: halved while even
  int halvings = 0;
  for (int64_t m = cfg.train.micro_batch; m % 2 == 0; m /= 2) ++halvings;
  out.push_back({1 + halvings, [](int step, Config& c, RunTarget& t) -> std::optional<std::string> {
                   if (step == 0) return std::string();
                   c.train.micro_batch >>= step;
                   if (c.train.global_batch % (c.train.micro_batch * t.world) != 0) return std::nullopt;
                   return str_cat("--train.micro_batch=", c.train.micro_batch);
                 }});
  // offload: every other setting, nearest first (alternating up and down the line of settings)
  if (cfg.train.device == Device::kCuda) {
    const int here = offload_index(cfg.optim), last = 2 * kFractionSteps;
    std::vector<int> order{here};
    for (int d = 1; d <= last; ++d) {
      if (here + d <= last) order.push_back(here + d);
      if (here - d >= 0) order.push_back(here - d);
    }
    out.push_back(
        {static_cast<int>(order.size()), [order](int step, Config& c, RunTarget&) -> std::optional<std::string> {
           if (step == 0) return std::string();
           const int i = order[static_cast<size_t>(step)];
           if (i == 0) {
             c.optim.offload = OffloadMode::kNone;
             return std::string("--optim.offload=none");
           }
           c.optim.offload = i <= kFractionSteps ? OffloadMode::kOptimizer : OffloadMode::kOptimizerParams;
           const int k = i <= kFractionSteps ? i : i - kFractionSteps;
           c.optim.offload_fraction = static_cast<float>(k / double(kFractionSteps));
           return str_cat("--optim.offload=", to_string(c.optim.offload),
                          " --optim.offload_fraction=", fraction_text(k));
         }});
  }
  // world: doubled up to 64 times, with as many ranks per node (more nodes)
  out.push_back({7, [](int step, Config& c, RunTarget& t) -> std::optional<std::string> {
                   if (step == 0) return std::string();
                   t.world <<= step;
                   if (c.train.global_batch % (c.train.micro_batch * t.world) != 0) return std::nullopt;
                   return str_cat("--world ", t.world);
                 }});
  return out;
}

}  // namespace

std::optional<PlanChange> smallest_fitting_change(const Config& cfg, const RunTarget& target) {
  if (plan_run(cfg, target).fits()) return std::nullopt;
  const std::vector<Knob> ks = knobs(cfg);
  const int n = static_cast<int>(ks.size());
  // Combinations with `changed` knobs moved, in the order of the knobs (cheapest first), each knob's steps nearest
  // first; the first that fits is the smallest change.
  for (int changed = 1; changed <= n; ++changed) {
    // An odometer over every knob's steps, least significant digit the first knob (so cheaper knobs and nearer steps
    // come first), taking the settings with exactly `changed` knobs moved.
    std::vector<int> steps(static_cast<size_t>(n), 0);
    for (;;) {
      int moved = 0;
      for (int s : steps) moved += s > 0;
      if (moved == changed) {
        PlanChange c{cfg, target, {}, {}};
        bool valid = true;
        for (int k = 0; k < n && valid; ++k) {  // world last: it checks the global batch with the final micro-batch
          const std::optional<std::string> flags =
              ks[static_cast<size_t>(k)].apply(steps[static_cast<size_t>(k)], c.config, c.target);
          if (!flags)
            valid = false;
          else if (!flags->empty())
            c.overrides += (c.overrides.empty() ? "" : " ") + *flags;
        }
        if (valid) {
          c.plan = plan_run(c.config, c.target);
          if (c.plan.fits()) return c;
        }
      }
      int d = 0;
      while (d < n && ++steps[static_cast<size_t>(d)] == ks[static_cast<size_t>(d)].steps)
        steps[static_cast<size_t>(d++)] = 0;
      if (d == n) break;  // every setting seen
    }
  }
  return std::nullopt;
}

std::optional<PlanChange> fewest_recomputed_blocks(const Config& cfg, const RunTarget& target) {
  if (!cfg.train.recompute || !plan_run(cfg, target).fits()) return std::nullopt;
  const int recomputed = recompute_of(cfg.train).count(static_cast<int>(cfg.model.n_layer));
  for (int k = 0; k < recomputed; ++k) {
    PlanChange c{cfg, target, {}, {}};
    c.overrides = recompute_first(c.config, k);
    c.plan = plan_run(c.config, c.target);
    if (c.plan.fits()) return c;
  }
  return std::nullopt;
}

std::optional<PlanChange> adapters_that_fit(const Config& cfg, const RunTarget& target) {
  if (cfg.model.lora.enabled() || plan_run(cfg, target).fits()) return std::nullopt;
  for (const LoraBase base : {LoraBase::kBf16, LoraBase::kNf4}) {
    PlanChange c{cfg, target, {}, {}};
    LoraConfig& l = c.config.model.lora;
    l.rank = 16;
    l.alpha = 32.0f;
    l.targets = "all";
    l.base_dtype = base;
    c.config.optim.offload = OffloadMode::kNone;
    c.overrides = str_cat("--lora.rank=", l.rank, " --lora.alpha=", l.alpha, " --lora.targets=", l.targets,
                          base == LoraBase::kNf4 ? " --lora.base_dtype=nf4" : "",
                          cfg.optim.offload != OffloadMode::kNone ? " --optim.offload=none" : "");
    try {
      c.plan = plan_run(c.config, c.target);
    } catch (const Error&) {  // a setting adapters do not take: no advice
      return std::nullopt;
    }
    if (c.plan.fits()) return c;
  }
  return std::nullopt;
}

std::string misfit_advice(const Config& cfg, const RunTarget& target) {
  try {
    if (const std::optional<PlanChange> c = smallest_fitting_change(cfg, target)) {
      const std::optional<PlanChange> a =
          c->target.world != target.world ? adapters_that_fit(cfg, target) : std::nullopt;
      return str_cat("it fits with ", c->overrides, " (`shardtrain plan` prints that plan)",
                     a ? str_cat("; at this world size adapters on a frozen base fit: ", a->overrides) : "");
    }
    if (const std::optional<PlanChange> a = adapters_that_fit(cfg, target))
      return str_cat("no change in `shardtrain plan`'s search fits it; adapters on a frozen base do: ", a->overrides);
  } catch (const Error&) {  // a config the search cannot plan: the refusal it advises on still stands, with the knobs
  }
  std::vector<std::string> knobs;
  if (cfg.train.micro_batch > 1) knobs.emplace_back("lower train.micro_batch");
  if (!cfg.train.recompute)
    knobs.emplace_back("set train.recompute=true");
  else if (cfg.train.recompute_blocks > 0)
    knobs.emplace_back("recompute more blocks (train.recompute_blocks; 0: all)");
  if (cfg.train.device == Device::kCuda &&
      (cfg.optim.offload != OffloadMode::kOptimizerParams || cfg.optim.offload_fraction < 1))
    knobs.emplace_back("offload more (optim.offload, optim.offload_fraction)");
  knobs.emplace_back("use more ranks");
  std::string out = "no change in `shardtrain plan`'s search fits it; ";
  for (size_t i = 0; i < knobs.size(); ++i) out += (i == 0 ? "" : i + 1 == knobs.size() ? ", or " : ", ") + knobs[i];
  return out;
}

}  // namespace st
