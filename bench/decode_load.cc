// The host's part of a GPU decoder's load, on any machine: a Hugging Face directory read as `shardtrain generate
// --init.from DIR` reads it (ckpt/decode_weights.h: the tensors read and widened, the non-finite check, the padding
// rows drawn), each unit then rounded to bf16 into a buffer as CudaDecoderBase rounds it before the upload. Median of
// `reps` loads, after one to warm the page cache.
//
//   /usr/bin/python3 bench/random_hf_llama.py /tmp/llama1b
//   ./build/bench_decode_load /tmp/llama1b [--reps 5]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_util.h"
#include "shardtrain/ckpt/decode_weights.h"
#include "shardtrain/core/config.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/stats.h"
#include "shardtrain/kernels/adamw_host.h"

namespace st {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Load {
  double seconds = 0, rounding = 0;
};

int run(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]).rfind("--", 0) == 0)
    ST_BAD_INPUT("usage: bench_decode_load DIR [--reps N] (DIR: a Hugging Face llama directory)");
  int reps = 5;
  bench::parse_int_flags(argc - 1, argv + 1, "bench_decode_load", {{"--reps", &reps}});
  const Config cfg = load_config(std::nullopt, {"--init.from=" + std::string(argv[1])});
  std::vector<uint16_t> half;
  auto load = [&] {
    Load l;
    const auto t = Clock::now();
    read_init_from_weights(cfg, [&](int, std::vector<float>& values) {
      const auto r = Clock::now();
      half.resize(std::max(half.size(), values.size()));
      round_to_half(values.data(), static_cast<int64_t>(values.size()), HalfKind::kBF16, half.data());
      l.rounding += since(r);
    });
    l.seconds = since(t);
    return l;
  };
  load();  // the page cache
  std::vector<double> total, rounding;
  for (int r = 0; r < reps; ++r) {
    const Load l = load();
    total.push_back(l.seconds);
    rounding.push_back(l.rounding);
  }
  std::printf("%s: %s, %d layers: the host's part of a load %.3f s, of which rounding to bf16 %.3f s (median of %d)\n",
              argv[1], to_string(cfg.model.arch), cfg.model.n_layer, median(total), median(rounding), reps);
  return 0;
}

}  // namespace
}  // namespace st

int main(int argc, char** argv) {
  try {
    return st::run(argc, argv);
  } catch (const st::Error& e) {
    std::fprintf(stderr, "bench_decode_load: %s\n", e.what());
    return st::exit_code_for(e.kind());
  }
}
