// Test tool for the PyTorch parity test (tests/model/parity_test.py).
//
// Runs `steps` optimizer steps of the single-process StepEngine on seeded random batches and writes, into --out DIR:
//   init.h5     the initial weights, Hugging Face GPT-2 names and layouts
//   batches.h5  "tokens" [steps, accum, micro_batch, seq_len + 1] int32
//   grads0.h5   the gradient of step 0 (before clipping), HF names and layouts
//   final.h5    the weights after the last step
//   trace.json  per step: loss, grad_norm, lr; and the optimizer settings the test must mirror
//
//   parity_dump --config configs/tiny.ini --out /tmp/p --steps 5 [--train.micro_batch=2 ...]
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "shardtrain/ckpt/h5.h"
#include "shardtrain/ckpt/hf_export.h"
#include "shardtrain/core/config.h"
#include "shardtrain/core/rng.h"
#include "shardtrain/comm/communicator.h"
#include "shardtrain/train/step_engine.h"

int main(int argc, char** argv) {
  std::optional<std::string> config;
  std::string out;
  int64_t steps = 5;
  std::vector<std::string> overrides;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--config" && i + 1 < argc) {
      config = argv[++i];
    } else if (a == "--out" && i + 1 < argc) {
      out = argv[++i];
    } else if (a == "--steps" && i + 1 < argc) {
      steps = std::stoll(argv[++i]);
    } else {
      overrides.push_back(a);
    }
  }
  if (out.empty()) {
    std::fprintf(stderr, "usage: parity_dump --config FILE --out DIR [--steps N] [--section.key=value ...]\n");
    return 2;
  }
  try {
    const st::Config cfg = st::load_config(config, overrides);
    const int64_t accum = cfg.grad_accum_steps(1);
    const int64_t B = cfg.train.micro_batch, T = cfg.model.seq_len;
    st::SoloCommunicator comm;
    st::StepEngine s(cfg, comm);
    const auto& units = s.units();
    auto write = [&](const std::string& path, const std::vector<std::vector<float>>& full) {
      std::vector<const float*> ptrs;
      for (const auto& f : full) ptrs.push_back(f.data());
      st::write_hf_gpt2(path, cfg.model, units, ptrs);
    };
    write(out + "/init.h5", s.gather_params());

    std::vector<int32_t> tokens(static_cast<size_t>(steps * accum * B * (T + 1)));
    st::Rng rng(cfg.train.seed, /*stream=*/0xBA7C4);
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng.next_below(static_cast<uint64_t>(cfg.model.vocab_size)));
    {
      st::H5File f = st::H5File::create(out + "/batches.h5");
      st::h5_write_i32(f, "tokens", {steps, accum, B, T + 1}, tokens.data());
      f.close();
    }

    std::ofstream trace(out + "/trace.json");
    trace << std::setprecision(9) << "{\"lr\": " << cfg.optim.lr << ", \"min_lr\": " << cfg.optim.min_lr
          << ", \"warmup_steps\": " << cfg.optim.warmup_steps << ", \"total_steps\": " << cfg.train.steps
          << ", \"weight_decay\": " << cfg.optim.weight_decay << ", \"beta1\": " << cfg.optim.beta1
          << ", \"beta2\": " << cfg.optim.beta2 << ", \"eps\": " << cfg.optim.eps
          << ", \"grad_clip\": " << cfg.optim.grad_clip << ", \"n_head\": " << cfg.model.n_head << ", \"steps\": [";
    for (int64_t step = 0; step < steps; ++step) {
      auto batch = [&](int64_t micro, int32_t* in, int32_t* tgt) {
        const int32_t* base = tokens.data() + ((step * accum + micro) * B) * (T + 1);
        for (int64_t b = 0; b < B; ++b)
          for (int64_t t = 0; t < T; ++t) {
            in[b * T + t] = base[b * (T + 1) + t];
            tgt[b * T + t] = base[b * (T + 1) + t + 1];
          }
      };
      const float loss = s.forward_backward(batch, accum);
      if (step == 0) write(out + "/grads0.h5", s.gather_grads());
      const st::StepStats stats = s.optimizer_step(step, loss);
      trace << (step ? ", " : "") << "{\"loss\": " << stats.loss << ", \"grad_norm\": " << stats.grad_norm
            << ", \"lr\": " << stats.lr << "}";
    }
    trace << "]}\n";
    write(out + "/final.h5", s.gather_params());
  } catch (const st::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return st::exit_code_for(e.kind());
  }
  return 0;
}
