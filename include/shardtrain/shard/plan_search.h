// The smallest change of a config that makes its run plan (run_plan.h) fit a target, for `shardtrain plan`. Searched
// over five knobs, each from its current value in one direction:
//   dist.fp8_gather_keep false, where it is on (the gathers cast again instead of keeping their codes through a step)
//   train.recompute     true, over the first train.recompute_blocks blocks, fewest first, then all (one block's
//                       activations at a time in backward; about a third more compute where all blocks recompute)
//   train.micro_batch   halved, down to 1, while it divides the global batch over the world
//   optim.offload       none -> optimizer -> optimizer+params, each at optim.offload_fraction 0.05 ... 1 (cuda only;
//                       and back towards none, a step at a time, when the host is what does not fit)
//   world size          doubled, up to 64 times, where the global batch still divides
// A change of fewer knobs is smaller; among as many, the one that costs least: the kept codes, then recompute, then
// micro-batch, then offload, then more GPUs; and on one knob, the step nearest the current value.
//
//   const std::optional<PlanChange> c = smallest_fitting_change(cfg, target);
//   if (c) std::puts(c->overrides.c_str());   // "--optim.offload=optimizer --optim.offload_fraction=0.50"
#pragma once

#include <optional>
#include <string>

#include "shardtrain/core/config.h"
#include "shardtrain/shard/run_plan.h"

namespace st {

struct PlanChange {
  Config config;          // cfg with the change
  RunTarget target;       // the target with the change (its world)
  RunPlan plan;           // the plan that fits
  std::string overrides;  // the change as command-line flags, e.g. "--train.recompute=true --world 4"
};

// nullopt when cfg already fits, or when no change in the searched space does.
std::optional<PlanChange> smallest_fitting_change(const Config& cfg, const RunTarget& target);

// Where cfg recomputes and fits: the fewest recomputed blocks that fit too ("--train.recompute=false" where none
// need to, else "--train.recompute_blocks=K"), the compute a run can take back. nullopt where cfg does not recompute,
// does not fit, or needs every block it recomputes.
std::optional<PlanChange> fewest_recomputed_blocks(const Config& cfg, const RunTarget& target);

// Where full fine-tuning (no lora.rank) does not fit `target`: the adapters that do at the same settings and world,
// trained on a frozen base (docs/lora.md) with the shipped 7-8B adapter configs' settings: LoRA (rank 16, alpha 32,
// every linear layer; no optimizer offload, which a base without optimizer state does not need), else QLoRA (the same
// over an NF4 base). Another way to train the model, not a smaller change of this run: nullopt where cfg fits, already
// trains adapters, or neither fits.
std::optional<PlanChange> adapters_that_fit(const Config& cfg, const RunTarget& target);

// What start-up's memory checks say to change where cfg's plan exceeds its budget (the device plan on cuda:
// cuda_memory_plan.h; the host plan on cpu: sharded_model.cc): "it fits with FLAGS" for the smallest change that fits
// `target`, as `shardtrain plan` finds it; where none in the search does, the knobs that would lower the plan and are
// not at their end yet.
std::string misfit_advice(const Config& cfg, const RunTarget& target);

}  // namespace st
