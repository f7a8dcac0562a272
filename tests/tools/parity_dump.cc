// Test tool for the PyTorch parity test (tests/model/parity_test.py).
//
// Runs `steps` optimizer steps of the StepEngine on seeded random batches and writes, into --out DIR (rank 0):
//   init.h5     the initial weights: gpt2, Hugging Face GPT-2 names and layouts; llama, shardtrain's own tensors
//               ("<unit>.<tensor>", e.g. "block.0.attn.qkv.weight", layouts of model/units.h, padded vocabulary)
//   batches.h5  "tokens" [steps, accum, world x micro_batch, seq_len + 1] int32: rank r trains rows
//               [r x micro_batch, (r + 1) x micro_batch) of each micro-step; with --mask also
//               "mask" [steps, accum, world x micro_batch, seq_len] int32: 1 where the target (tokens[..., t + 1]) is
//               trained on, 0 where it is not (it goes in as -1, kNoTarget): random, half of them, and rank 0's
//               whole micro-batch of micro-step 1 of step 0 (rows [0, micro_batch)) 0 (with accum >= 2)
//   grads0.h5   the gradient of step 0 (before clipping), named as init.h5
//   final.h5    the weights after the last step
//   trace.json  per step: loss, grad_norm, lr; the optimizer settings and model keys the test must mirror
// With LoRA (lora.rank > 0) init.h5 and final.h5 hold the frozen base in the same names (final.h5: to check that it
// did not change), adapters_init.h5 and adapters_final.h5 the adapters ("<unit>.lora.<target>.A" and ".B"), grads0.h5
// the adapters' step-0 gradients, and trace.json the lora keys and the adapters (name, Hugging Face module, rows of
// the weight, rank). Every B starts at N(0, 0.02) instead of zero, so that the step-0 gradient of every A is not zero.
// With lora.base_dtype = nf4 init.h5 holds the base as the model computes with it (each block's matrices dequantised
// from NF4), and init_unquantised.h5 the same tensors as drawn from the seed, before quantisation.
// Under mpirun (or the env bootstrap) every rank trains its share of the same global batches, as the trainer does.
//
//   parity_dump --config configs/tiny.ini --out /tmp/p --steps 5 [--mask] [--train.micro_batch=2 ...]
//   mpirun -np 3 parity_dump --config configs/tiny-llama.ini --out /tmp/p --steps 5
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "shardtrain/ckpt/h5.h"
#include "shardtrain/ckpt/hf_export.h"
#include "shardtrain/comm/communicator.h"
#include "shardtrain/comm/launcher.h"
#include "shardtrain/core/config.h"
#include "shardtrain/core/rng.h"
#include "shardtrain/data/sampler.h"
#include "shardtrain/model/lora.h"
#include "shardtrain/model/units.h"
#include "shardtrain/train/step_engine.h"

namespace {

// One h5 file of every unit's full flat buffer, in the family's names (see the header comment).
void write_weights(const std::string& path, const st::ModelConfig& model, const std::vector<st::UnitLayout>& units,
                   const std::vector<std::vector<float>>& full) {
  std::vector<const float*> ptrs;
  for (const auto& f : full) ptrs.push_back(f.data());
  if (model.arch == st::ModelArch::kGpt2) {
    st::write_hf_gpt2(path, model, units, ptrs);
    return;
  }
  st::H5File f = st::H5File::create(path);
  for (const st::UnitLayout& u : units)
    for (const st::TensorSpec& t : u.tensors)
      st::h5_write_f32(f, u.name + "." + t.name, t.shape, ptrs[u.index] + t.offset);
  f.close();
}

// Adapter tensors as "<unit>.<tensor>" from the full buffers; the rest (the frozen base) as the base model's buffers.
void write_adapters(const std::string& path, const std::vector<st::UnitLayout>& units,
                    const std::vector<std::vector<float>>& full) {
  st::H5File f = st::H5File::create(path);
  for (const st::UnitLayout& u : units)
    for (const st::TensorSpec& t : u.tensors)
      if (!t.frozen) st::h5_write_f32(f, u.name + "." + t.name, t.shape, full[u.index].data() + t.offset);
  f.close();
}

std::vector<std::vector<float>> base_of(const st::ModelConfig& model, const std::vector<st::UnitLayout>& units,
                                        const std::vector<std::vector<float>>& full) {
  const std::vector<st::UnitLayout> base = st::build_units(st::base_model(model));
  std::vector<std::vector<float>> out;
  for (const st::UnitLayout& u : units) {
    out.emplace_back(static_cast<size_t>(base[u.index].numel), 0.0f);
    for (const st::TensorSpec& t : u.tensors)
      if (t.frozen) std::copy_n(full[u.index].begin() + t.offset, t.numel, out.back().begin() + t.init_index);
  }
  return out;
}

// `full` with each NF4 unit's frozen segment as drawn from the seed, before quantisation: init_unit_range is a pure
// function of the seed, which the engine quantised at construction.
std::vector<std::vector<float>> unquantised(const st::Config& cfg, const std::vector<st::UnitLayout>& units,
                                            std::vector<std::vector<float>> full) {
  for (const st::UnitLayout& u : units)
    if (u.nf4_base)
      st::init_unit_range(u, cfg.model, cfg.train.seed, 0, u.frozen_numel, full[u.index].data() + u.numel,
                          st::Segment::kFrozen);
  return full;
}

// Every B of every adapter from N(0, 0.02), on this rank's span of it.
void perturb_adapters(st::ModelBackend& m, uint64_t seed) {
  for (const st::UnitLayout& u : m.units()) {
    m.pull_unit(u.index);
    st::UnitShard& sh = m.shard(u.index);
    for (const st::TensorSpec& t : u.tensors) {
      if (t.frozen || t.init != st::InitKind::kZeros || t.name.rfind("lora.", 0) != 0) continue;
      for (int64_t i = std::max(t.offset, sh.span.offset); i < std::min(t.offset + t.numel, sh.span.end()); ++i)
        sh.param[static_cast<size_t>(i - sh.span.offset)] = static_cast<float>(
            0.02 * st::normal_at(seed, 0xADA97E5 + static_cast<uint64_t>(u.index), static_cast<uint64_t>(i)));
    }
    m.push_unit(u.index);
  }
}

std::string lora_json(const st::ModelConfig& m) {
  std::ostringstream o;
  o << std::setprecision(9) << ", \"lora_rank\": " << m.lora.rank << ", \"lora_alpha\": " << m.lora.alpha
    << ", \"lora_rslora\": " << (m.lora.rslora ? "true" : "false") << ", \"lora_dropout\": " << m.lora.dropout
    << ", \"lora_base_dtype\": \"" << st::to_string(m.lora.base_dtype) << "\""
    << ", \"seq_len\": " << m.seq_len << ", \"adapters\": [";
  if (m.lora.enabled()) {
    const std::vector<st::LoraLinear> targets = st::lora_targets(m);
    for (size_t i = 0; i < targets.size(); ++i)
      o << (i ? ", " : "") << "{\"name\": \"" << targets[i].name << "\", \"hf_module\": \"" << targets[i].hf_module
        << "\", \"weight\": \"" << targets[i].weight << "\", \"row0\": " << targets[i].row0
        << ", \"rows\": " << targets[i].rows << ", \"rank\": " << m.lora.rank << "}";
  }
  o << "]";
  return o.str();
}

std::string model_json(const st::ModelConfig& m) {
  std::ostringstream o;
  o << std::setprecision(9) << "\"arch\": \"" << st::to_string(m.arch) << "\", \"n_head\": " << m.n_head
    << ", \"n_kv_head\": " << m.kv_heads() << ", \"vocab_size\": " << m.vocab_size
    << ", \"rope_theta\": " << m.rope_theta << ", \"rope_scaling\": \"" << st::to_string(m.rope_scaling)
    << "\", \"rope_scaling_factor\": " << m.rope_scaling_factor
    << ", \"rope_scaling_low_freq_factor\": " << m.rope_scaling_low_freq_factor
    << ", \"rope_scaling_high_freq_factor\": " << m.rope_scaling_high_freq_factor
    << ", \"rope_scaling_original_max_position\": " << m.rope_scaling_original_max_position
    << ", \"rms_norm_eps\": " << m.rms_norm_eps << ", \"tie_embeddings\": " << (m.tie_embeddings ? "true" : "false")
    << lora_json(m);
  return o.str();
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<std::string> config;
  std::string out;
  int64_t steps = 5;
  bool masked = false;
  std::vector<std::string> overrides;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--config" && i + 1 < argc) {
      config = argv[++i];
    } else if (a == "--out" && i + 1 < argc) {
      out = argv[++i];
    } else if (a == "--steps" && i + 1 < argc) {
      steps = std::stoll(argv[++i]);
    } else if (a == "--mask") {
      masked = true;
    } else {
      overrides.push_back(a);
    }
  }
  if (out.empty()) {
    std::fprintf(stderr, "usage: parity_dump --config FILE --out DIR [--steps N] [--section.key=value ...]\n");
    return 2;
  }
  std::optional<st::MpiSession> mpi;
  try {
    const std::unique_ptr<st::Communicator> comm =
        st::join_world(&argc, &argv, st::world_options_from_args(argc, argv, std::nullopt), &mpi);
    const st::Config cfg = st::load_config(config, overrides);
    const int64_t world = comm->world_size(), rank = comm->rank();
    const bool lead = rank == 0;
    const int64_t accum = cfg.grad_accum_steps(static_cast<int>(world));
    const int64_t B = cfg.train.micro_batch, T = cfg.model.seq_len, rows = world * B;
    st::StepEngine s(cfg, *comm);
    const auto& units = s.units();
    const bool lora = cfg.model.lora.enabled();
    if (lora) perturb_adapters(s.sharded(), cfg.train.seed);
    // Parameters: the base (the whole model without LoRA) in the family's names, and the adapters apart.
    const st::ModelConfig base = st::base_model(cfg.model);
    auto write_base = [&](const std::string& name, const std::vector<std::vector<float>>& full) {
      write_weights(out + "/" + name, base, st::build_units(base), base_of(cfg.model, units, full));
    };
    auto write = [&](const std::string& name, const std::vector<std::vector<float>>& full) {
      if (!lead) return;
      if (!lora) return write_weights(out + "/" + name, cfg.model, units, full);
      write_base(name, full);
      write_adapters(out + "/adapters_" + name, units, full);
    };
    const std::vector<std::vector<float>> init = s.gather_params();
    write("init.h5", init);
    if (lead && lora && cfg.model.lora.base_dtype == st::LoraBase::kNf4)
      write_base("init_unquantised.h5", unquantised(cfg, units, init));

    std::vector<int32_t> tokens(static_cast<size_t>(steps * accum * rows * (T + 1)));
    st::Rng rng(cfg.train.seed, /*stream=*/0xBA7C4);
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng.next_below(static_cast<uint64_t>(cfg.model.vocab_size)));
    // mask[((step * accum + micro) * rows + row) * T + t]; every target is trained on without --mask.
    std::vector<int32_t> mask(static_cast<size_t>(steps * accum * rows * T), 1);
    std::vector<int64_t> step_targets(static_cast<size_t>(steps), accum * rows * T);
    if (masked) {
      st::Rng mask_rng(cfg.train.seed, /*stream=*/0x3A5C);
      for (int32_t& m : mask) m = static_cast<int32_t>(mask_rng.next_below(2));
      if (accum >= 2) std::fill(mask.begin() + rows * T, mask.begin() + rows * T + B * T, 0);  // rank 0's micro 1
      for (int64_t step = 0; step < steps; ++step)
        step_targets[static_cast<size_t>(step)] = std::accumulate(
            mask.begin() + step * accum * rows * T, mask.begin() + (step + 1) * accum * rows * T, int64_t{0});
    }
    if (lead) {
      st::H5File f = st::H5File::create(out + "/batches.h5");
      st::h5_write_i32(f, "tokens", {steps, accum, rows, T + 1}, tokens.data());
      if (masked) st::h5_write_i32(f, "mask", {steps, accum, rows, T}, mask.data());
      f.close();
    }

    std::ostringstream trace;
    trace << std::setprecision(9) << "{\"lr\": " << cfg.optim.lr << ", \"min_lr\": " << cfg.optim.min_lr
          << ", \"warmup_steps\": " << cfg.optim.warmup_steps << ", \"total_steps\": " << cfg.train.steps
          << ", \"weight_decay\": " << cfg.optim.weight_decay << ", \"beta1\": " << cfg.optim.beta1
          << ", \"beta2\": " << cfg.optim.beta2 << ", \"eps\": " << cfg.optim.eps
          << ", \"grad_clip\": " << cfg.optim.grad_clip << ", \"world\": " << world << ", \"seed\": " << cfg.train.seed
          << ", " << model_json(cfg.model) << ", \"steps\": [";
    for (int64_t step = 0; step < steps; ++step) {
      auto batch = [&](int64_t micro, int32_t* in, int32_t* tgt) {
        const int64_t row0 = (step * accum + micro) * rows + rank * B;
        const int32_t* base = tokens.data() + row0 * (T + 1);
        const int32_t* keep = mask.data() + row0 * T;
        for (int64_t b = 0; b < B; ++b)
          for (int64_t t = 0; t < T; ++t) {
            in[b * T + t] = base[b * (T + 1) + t];
            tgt[b * T + t] = keep[b * T + t] != 0 ? base[b * (T + 1) + t + 1] : st::kNoTarget;
          }
      };
      const float loss = s.forward_backward(batch, accum, step, step_targets[static_cast<size_t>(step)]);
      if (step == 0) {
        const std::vector<std::vector<float>> grads = s.gather_grads();
        if (lead && lora) write_adapters(out + "/grads0.h5", units, grads);
        if (lead && !lora) write_weights(out + "/grads0.h5", cfg.model, units, grads);
      }
      const st::StepStats stats = s.optimizer_step(step, loss);
      trace << (step ? ", " : "") << "{\"loss\": " << stats.loss << ", \"grad_norm\": " << stats.grad_norm
            << ", \"lr\": " << stats.lr << "}";
    }
    trace << "]}\n";
    write("final.h5", s.gather_params());
    if (lead) std::ofstream(out + "/trace.json") << trace.str();
  } catch (const st::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return st::fail_world(mpi, e.kind());
  }
  return 0;
}
