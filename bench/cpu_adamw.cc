// Host AdamW throughput for optimizer offload (HostAdamW, kernels/adamw_host.h) beside a STREAM-style copy
// roofline measured by the same binary, nccl-tests style: one row per thread count, medians of --iters runs.
//
//   build/bench_cpu_adamw [--params 67108864] [--iters 7] [--max-threads 16]
//
// Each AdamW element reads param, m, v and grad (16 bytes) and writes param, m, v and the bf16 copy (14 bytes):
// 30 bytes. The roofline is a STREAM-style kernel with exactly that traffic and no arithmetic to speak of
// (p += g, m += g, v += g, out = p's top half) on the same pinned CPUs: bytes per second / 30. (A plain copy
// would misjudge it: its stores pay a read-for-ownership that AdamW's in-place updates do not.) bench/cpu_adamw_torch.py times torch's fused CPU AdamW on the same sizes for the side-by-side row.
#include <pthread.h>
#include <sched.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "bench_util.h"
#include "shardtrain/core/elapsed.h"
#include "shardtrain/core/stats.h"
#include "shardtrain/optim/host_adamw.h"

namespace {

using Clock = std::chrono::steady_clock;

template <typename Fn>
double median_seconds(int iters, Fn fn) {
  std::vector<double> t;
  fn();  // warm-up: first touch, thread start
  for (int i = 0; i < iters; ++i) {
    const auto t0 = Clock::now();
    fn();
    t.push_back(st::seconds_since(t0));
  }
  return st::median(std::move(t));
}

// The memory roofline of the update: the same arrays and bytes as AdamW (read param, m, v, grad; write param, m, v
// and the 16-bit copy: 30 bytes an element) with next to no arithmetic, on `threads` threads pinned to the CPUs
// HostAdamW's workers take (the allowed CPUs but the first). Returns bytes moved per second.
double update_bandwidth(std::vector<float>& p, std::vector<float>& m, std::vector<float>& v,
                        const std::vector<float>& g, std::vector<uint16_t>& out, int threads, int iters) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  sched_getaffinity(0, sizeof(allowed), &allowed);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  const int64_t n = static_cast<int64_t>(p.size());
  const double s = median_seconds(iters, [&] {
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
      ts.emplace_back([&, t] {
        if (cpus.size() > 1) {
          cpu_set_t one;
          CPU_ZERO(&one);
          CPU_SET(cpus[1 + static_cast<size_t>(t) % (cpus.size() - 1)], &one);
          pthread_setaffinity_np(pthread_self(), sizeof(one), &one);
        }
        const int64_t lo = n * t / threads, hi = n * (t + 1) / threads;
        for (int64_t i = lo; i < hi; ++i) {
          const float gi = g[i];
          p[i] += gi;
          m[i] += gi;
          v[i] += gi;
          uint32_t bits;
          std::memcpy(&bits, &p[i], sizeof(bits));
          out[i] = static_cast<uint16_t>(bits >> 16);
        }
      });
    for (std::thread& th : ts) th.join();
  });
  return 30.0 * static_cast<double>(n) / s;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t params = int64_t{1} << 26;
  int iters = 7, max_threads = static_cast<int>(std::thread::hardware_concurrency());
  st::bench::parse_int_flags(argc, argv, "bench_cpu_adamw",
                             {{"--params", &params}, {"--iters", &iters}, {"--max-threads", &max_threads}});
  std::vector<float> p(params, 0.01f), m(params, 0.0f), v(params, 0.0f), g(params, 0.001f);
  std::vector<uint16_t> out(params);
  std::vector<float> p2(params), m2(params), v2(params);  // out-of-place outputs (optim.offload_speculative)
  st::AdamWParams ap;
  ap.lr = 1e-4f;
  ap.weight_decay = 0.1f;
  std::printf("# host AdamW, %lld params (%.2f GB moved per step), median of %d; widest ISA %s, training uses %s\n",
              static_cast<long long>(params), 30.0 * params / 1e9, iters, st::to_string(st::best_simd_isa()),
              st::to_string(st::fastest_simd_isa()));
  std::printf("%8s %8s %14s %16s %17s %11s %20s\n", "threads", "isa", "adamw Gparam/s", "roofline GB/s",
              "roofline Gparam/s", "of roofline", "out-of-place Gparam/s");
  std::vector<int> counts;
  for (int t = 1; t < max_threads; t *= 2) counts.push_back(t);
  counts.push_back(max_threads);
  for (int threads : counts) {
    for (st::SimdIsa isa : {st::SimdIsa::kScalar, st::SimdIsa::kAvx2, st::SimdIsa::kAvx512}) {
      if (!st::simd_isa_supported(isa)) continue;
      if (isa == st::SimdIsa::kScalar && threads != max_threads) continue;  // the reference, once
      st::HostAdamW::Options o;
      o.threads = threads;
      o.isa = isa;
      st::HostAdamW engine(o);
      int64_t step = 0;
      const double s = median_seconds(iters, [&] {
        ap.step = ++step;
        engine.wait(engine.submit(st::HostAdamW::Job{p.data(), m.data(), v.data(), g.data(),
                                                     {st::AdamWRun{0, params, ap}}, st::HalfKind::kBF16, out.data()}));
      });
      // Out of place, as a speculative step writes: the state goes to a second copy.
      const double s_oop = median_seconds(iters, [&] {
        ap.step = ++step;
        st::HostAdamW::Job job{p.data(), m.data(), v.data(), g.data(), {st::AdamWRun{0, params, ap}},
                               st::HalfKind::kBF16, out.data()};
        job.param_out = p2.data();
        job.m_out = m2.data();
        job.v_out = v2.data();
        engine.wait(engine.submit(std::move(job)));
      });
      const double bw = update_bandwidth(p, m, v, g, out, threads, iters);
      const double gps = params / s / 1e9, roof = bw / 30.0 / 1e9;
      std::printf("%8d %8s %14.2f %16.1f %17.2f %10.0f%% %20.2f\n", threads, st::to_string(isa), gps, bw / 1e9, roof,
                  100.0 * gps / roof, params / s_oop / 1e9);
    }
  }
  return 0;
}
