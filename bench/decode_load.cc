// The host's part of a GPU decoder's load, on any machine: a Hugging Face directory read as `shardtrain generate
// --init.from DIR` reads it (ckpt/decode_weights.h: the tensors read and widened, the non-finite check, the padding
// rows drawn), each unit then rounded to bf16 into a buffer as CudaDecoderBase rounds it before the upload; and read
// straight into bf16 units (init_from_hf_dir_half, what generate reads for a bf16 GPU decoder), each copied as
// CudaDecoderBase copies it into its pinned chunks. Median of `reps` loads each, after one to warm the page cache.
//
//   /usr/bin/python3 bench/random_hf_llama.py /tmp/llama1b
//   ./build/bench_decode_load /tmp/llama1b [--reps 5]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.h"
#include "shardtrain/ckpt/decode_weights.h"
#include "shardtrain/ckpt/init_from.h"
#include "shardtrain/core/config.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/stats.h"
#include "shardtrain/kernels/adamw_host.h"

namespace st {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Load {
  double seconds = 0, handing = 0;
};

int run(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]).rfind("--", 0) == 0)
    ST_BAD_INPUT("usage: bench_decode_load DIR [--reps N] (DIR: a Hugging Face llama directory)");
  int reps = 5;
  bench::parse_int_flags(argc - 1, argv + 1, "bench_decode_load", {{"--reps", &reps}});
  const Config cfg = load_config(std::nullopt, {"--init.from=" + std::string(argv[1])});
  std::vector<uint16_t> half;
  // The fp32 read, each unit rounded to bf16 as CudaDecoderBase::store_unit rounds it.
  auto fp32_read = [&] {
    Load l;
    const auto t = Clock::now();
    read_init_from_weights(cfg, [&](int, std::vector<float>& values) {
      const auto r = Clock::now();
      half.resize(std::max(half.size(), values.size()));
      round_to_half(values.data(), static_cast<int64_t>(values.size()), HalfKind::kBF16, half.data());
      l.handing += since(r);
    });
    l.seconds = since(t);
    return l;
  };
  // The 16-bit read, each unit copied as CudaDecoderBase::store_unit_half copies it into the pinned chunks.
  auto half_read = [&] {
    Load l;
    const auto t = Clock::now();
    init_from_hf_dir_half(cfg.init.from, cfg.model, cfg.train.seed, HalfKind::kBF16, {},
                          [&](int, const std::vector<uint16_t>& values) {
                            const auto r = Clock::now();
                            half.resize(std::max(half.size(), values.size()));
                            const int64_t n = static_cast<int64_t>(values.size());
                            constexpr int64_t kPiece = int64_t{1} << 18;
#pragma omp parallel for schedule(static)
                            for (int64_t p = 0; p < n; p += kPiece)
                              std::memcpy(half.data() + p, values.data() + p,
                                          sizeof(uint16_t) * static_cast<size_t>(std::min(kPiece, n - p)));
                            l.handing += since(r);
                          });
    l.seconds = since(t);
    return l;
  };
  fp32_read();  // the page cache
  std::printf("%s: %s, %d layers; the host's part of a load, median of %d\n", argv[1], to_string(cfg.model.arch),
              cfg.model.n_layer, reps);
  for (const bool direct : {false, true}) {
    std::vector<double> total, handing;
    for (int r = 0; r < reps; ++r) {
      const Load l = direct ? half_read() : fp32_read();
      total.push_back(l.seconds);
      handing.push_back(l.handing);
    }
    std::printf("  %-44s %.3f s, of which handing over %.3f s\n",
                direct ? "read as bf16, copied (init_from_hf_dir_half):" : "read as fp32, rounded to bf16:",
                median(total), median(handing));
  }
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
