// CPU training-step throughput of shardtrain's fp32 single-process path (StepEngine on a solo
// communicator), for bench/cpu_train.sh,
// which runs it side by side with PyTorch CPU on the same model.
//
//   bench_cpu_train --config configs/tiny.ini [--warmup 3] [--iters 10] [--section.key=value ...]
// Prints one line: key=value pairs with the median step time and tokens/s.
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "shardtrain/comm/communicator.h"
#include "shardtrain/core/config.h"
#include "shardtrain/core/elapsed.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/rng.h"
#include "shardtrain/core/stats.h"
#include "shardtrain/model/units.h"
#include "shardtrain/train/step_engine.h"

int main(int argc, char** argv) {
  std::optional<std::string> config;
  int warmup = 3, iters = 10;
  std::vector<std::string> overrides;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--config" && i + 1 < argc) {
      config = argv[++i];
    } else if (a == "--warmup" && i + 1 < argc) {
      warmup = std::stoi(argv[++i]);
    } else if (a == "--iters" && i + 1 < argc) {
      iters = std::stoi(argv[++i]);
    } else {
      overrides.push_back(a);
    }
  }
  try {
    const st::Config cfg = st::load_config(config, overrides);
    const int64_t accum = cfg.grad_accum_steps(1);
    st::SoloCommunicator comm;
    st::StepEngine s(cfg, comm);
    st::Rng rng(cfg.train.seed, 0xBE7C);
    const auto V = static_cast<uint64_t>(cfg.model.vocab_size);
    auto batch = [&](int64_t, int32_t* in, int32_t* tgt) {
      for (int64_t i = 0; i < cfg.train.micro_batch * cfg.model.seq_len; ++i) {
        in[i] = static_cast<int32_t>(rng.next_below(V));
        tgt[i] = static_cast<int32_t>(rng.next_below(V));
      }
    };
    std::vector<double> ms;
    float loss = 0;
    for (int it = 0; it < warmup + iters; ++it) {
      const auto t0 = std::chrono::steady_clock::now();
      loss = s.optimizer_step(it, s.forward_backward(batch, accum)).loss;
      const double dt = st::seconds_since(t0) * 1e3;
      if (it >= warmup) ms.push_back(dt);
    }
    const double med = st::median(ms);
    const double tokens = static_cast<double>(cfg.train.global_batch * cfg.model.seq_len);
    std::printf("system=shardtrain-cpu params=%lld L=%d C=%d T=%d B=%lld median_step_ms=%.2f tokens_per_s=%.0f loss=%.4f\n",
                static_cast<long long>(st::count_params(s.units())), cfg.model.n_layer, cfg.model.n_embd,
                cfg.model.seq_len, static_cast<long long>(cfg.train.global_batch), med, tokens / (med / 1e3), loss);
  } catch (const st::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return st::exit_code_for(e.kind());
  }
  return 0;
}
