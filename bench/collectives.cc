// All-gather and reduce-scatter bus bandwidth of shardtrain's NcclCommunicator, beside raw NCCL calls
// made by this same binary on a second communicator, over 1 MiB .. 1 GiB (nccl-tests style).
//
//   mpirun --bind-to none -np 2 ./build/bench_collectives [--dtype bf16|fp32] [--max-mib 1024] [--iters 20]
//                                                         [--exchange]
//
// For each size (bytes of the full, gathered buffer, doubling): 5 warm-up and `iters` timed calls of each,
// wrapper and raw alternating, each call timed with CUDA events on its stream; the median per rank, then the
// slowest rank. algbw = bytes / time, busbw =
// algbw (n-1)/n (both collectives move (n-1)/n of the buffer through each rank's links). The last column
// is the wrapper's busbw over raw NCCL's.
//
// --exchange adds a second table, the two ways training can reduce-scatter a unit's gradient into its fp32 shard
// (dist.reduce_engine): NCCL's reduce-scatter kernels on at most 4 CTAs (a communicator split with maxCTAs, the
// NVLink default) then gpu::accumulate, against NCCL's zero-CTA all-to-all between symmetric windows (the copy
// engines, NCCL 2.28+) then gpu::accumulate_parts. Timed interleaved, as above; "ratio" is the first's time over
// the second's.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "shardtrain/comm/launcher.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/stats.h"

#ifdef SHARDTRAIN_HAVE_CUDA
#include "shardtrain/comm/nccl_communicator.h"
#include "shardtrain/core/cuda.h"
#include "shardtrain/kernels/gpu/reduce.h"

namespace st {
namespace {

struct Options {
  bool bf16 = true;
  int64_t max_mib = 1024;
  int iters = 20;
  bool exchange = false;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) ST_BAD_INPUT("bench_collectives: ", a, " needs a value");
      return argv[++i];
    };
    if (a == "--dtype") {
      const std::string v = value();
      if (v != "bf16" && v != "fp32") ST_BAD_INPUT("bench_collectives: --dtype ", v, ": expected bf16 or fp32");
      o.bf16 = v == "bf16";
    } else if (a == "--max-mib") {
      o.max_mib = std::atoll(value().c_str());
    } else if (a == "--iters") {
      o.iters = std::atoi(value().c_str());
    } else if (a == "--exchange") {
      o.exchange = true;
    } else {
      ST_BAD_INPUT("bench_collectives: unknown argument ", a, " (--dtype, --max-mib, --iters, --exchange)");
    }
  }
  if (o.max_mib < 1 || o.iters < 1) ST_BAD_INPUT("bench_collectives: --max-mib and --iters must be >= 1");
  return o;
}

// Median milliseconds of `iters` calls of `a` and of `b` on `stream`, after 5 warm-up calls of each. The
// calls alternate (a, b, a, b, ...), so both see the same clocks, link state and neighbours: a drift during
// the run cannot favour the one timed first.
template <typename A, typename B>
std::pair<double, double> interleaved_median_ms(cudaStream_t stream, int iters, A a, B b) {
  for (int i = 0; i < 5; ++i) {
    a();
    b();
  }
  std::vector<double> ms_a, ms_b;
  CudaEvent start(true), stop(true);
  auto time = [&](auto& fn) {
    start.record(stream);
    fn();
    stop.record(stream);
    stop.synchronize();
    float t = 0;
    ST_CUDA_CHECK(cudaEventElapsedTime(&t, start.get(), stop.get()));
    return static_cast<double>(t);
  };
  for (int i = 0; i < iters; ++i) {
    ms_a.push_back(time(a));
    ms_b.push_back(time(b));
  }
  return {median(ms_a), median(ms_b)};
}

// The slowest rank's value of `ms`.
double slowest(Communicator& host, double ms) {
  std::vector<double> all(static_cast<size_t>(host.world_size()), 0.0);
  all[static_cast<size_t>(host.rank())] = ms;
  host.all_reduce(all.data(), host.world_size());
  return *std::max_element(all.begin(), all.end());
}

// --exchange: see the header.
template <typename T>
void run_exchange(Communicator& host, NcclCommunicator& parent, const Options& o, cudaStream_t stream) {
  const int n = host.world_size();
  if (n < 2 || !nccl_has_copy_engine_collectives()) {
    if (host.rank() == 0) std::printf("# --exchange: needs 2+ ranks and NCCL 2.28+; skipped\n");
    return;
  }
  NcclSplitOptions capped, zero;
  capped.max_ctas = 4;
  zero.zero_cta = true;
  NcclCommunicator rs_comm(parent, host, 0, host.rank(), capped), ce_comm(parent, host, 0, host.rank(), zero);
  const int64_t max_elems = (o.max_mib << 20) / static_cast<int64_t>(sizeof(T));
  // Both collectives' buffers in ce_comm's symmetric windows (the all-to-all's copy-engine path needs them).
  const size_t window = static_cast<size_t>(max_elems) * sizeof(T);
  T* send = static_cast<T*>(ce_comm.window_alloc(window));
  T* recv = static_cast<T*>(ce_comm.window_alloc(window));
  ST_CUDA_CHECK(cudaMemset(send, 0x3c, window));
  DeviceBuffer<T> shard(max_elems / n + 1);
  DeviceBuffer<float> acc(max_elems / n + 1);
  ST_CUDA_CHECK(cudaMemset(acc.data(), 0, acc.bytes()));
  const gpu::GpuContext ctx{stream, nullptr, nullptr, 0, nullptr};
  if (host.rank() == 0) std::printf("\n%12s %-34s %10s | %-34s %10s | %s\n", "bytes", "op", "us", "op", "us", "ratio");
  for (int64_t bytes = int64_t{1} << 20; bytes <= (o.max_mib << 20); bytes *= 2) {
    const int64_t count = bytes / static_cast<int64_t>(sizeof(T)) / n;
    auto [kernels, copies] = interleaved_median_ms(
        stream, o.iters,
        [&] {
          rs_comm.reduce_scatter<T>(send, count, shard.data(), stream);
          gpu::accumulate<T>(acc.data(), shard.data(), count, ctx, GradWrite::kOverwrite);
        },
        [&] {
          ce_comm.all_to_all<T>(send, count, recv, stream);
          gpu::accumulate_parts<T>(acc.data(), recv, n, count, count, ctx, GradWrite::kOverwrite);
        });
    kernels = slowest(host, kernels);
    copies = slowest(host, copies);
    if (host.rank() == 0)
      std::printf("%12lld %-34s %10.1f | %-34s %10.1f | %.3f\n", static_cast<long long>(count * n * sizeof(T)),
                  "reduce_scatter (4 CTAs) + accumulate", kernels * 1e3, "all_to_all (copy) + accumulate_parts",
                  copies * 1e3, kernels / copies);
  }
}

template <typename T>
void run(Communicator& host, const Options& o) {
  NcclCommunicator wrapped(host);  // binds the GPU
  ncclUniqueId id{};
  if (host.rank() == 0) ST_NCCL_CHECK(ncclGetUniqueId(&id));
  host.broadcast(&id, sizeof(id), 0);
  ncclComm_t raw = nullptr;
  ST_NCCL_CHECK(ncclCommInitRank(&raw, host.world_size(), id, host.rank()));
  const int n = host.world_size();
  CudaStream stream;
  const int64_t max_bytes = o.max_mib << 20;
  const int64_t max_elems = max_bytes / static_cast<int64_t>(sizeof(T));
  DeviceBuffer<T> full(max_elems), shard(max_elems / n + 1);
  ST_CUDA_CHECK(cudaMemset(full.data(), 0x3c, full.bytes()));  // finite values in both types, never zeros
  ST_CUDA_CHECK(cudaMemset(shard.data(), 0x3c, shard.bytes()));
  if (host.rank() == 0) {
    std::printf("# %d ranks, %s, %d timed iterations, median per rank then max over ranks\n", n,
                sizeof(T) == 2 ? "bf16" : "fp32", o.iters);
    std::printf("%12s %-14s %10s %10s %10s | %10s %10s | %s\n", "bytes", "op", "wrap us", "wrap algbw", "busbw",
                "raw us", "raw busbw", "wrap/raw");
  }
  for (int64_t bytes = int64_t{1} << 20; bytes <= max_bytes; bytes *= 2) {
    const int64_t count = bytes / static_cast<int64_t>(sizeof(T)) / n;  // per-rank shard elements
    for (int op = 0; op < 2; ++op) {
      const bool gather = op == 0;
      auto [wrap, raw_ms] = interleaved_median_ms(
          stream.get(), o.iters,
          [&] {
            if (gather)
              wrapped.all_gather<T>(shard.data(), count, full.data(), stream.get());
            else
              wrapped.reduce_scatter<T>(full.data(), count, shard.data(), stream.get());
          },
          [&] {
            if (gather)
              ST_NCCL_CHECK(ncclAllGather(shard.data(), full.data(), static_cast<size_t>(count), nccl_type<T>(), raw,
                                          stream.get()));
            else
              ST_NCCL_CHECK(ncclReduceScatter(full.data(), shard.data(), static_cast<size_t>(count), nccl_type<T>(),
                                              ncclSum, raw, stream.get()));
          });
      // The slowest rank's medians: each rank fills its own slots, the sum over ranks assembles them.
      std::vector<double> all(static_cast<size_t>(2 * n), 0.0);
      all[static_cast<size_t>(2 * host.rank())] = wrap;
      all[static_cast<size_t>(2 * host.rank() + 1)] = raw_ms;
      host.all_reduce(all.data(), 2 * n);
      for (int r = 0; r < n; ++r) {
        wrap = std::max(wrap, all[static_cast<size_t>(2 * r)]);
        raw_ms = std::max(raw_ms, all[static_cast<size_t>(2 * r + 1)]);
      }
      const double moved = static_cast<double>(count * n * static_cast<int64_t>(sizeof(T)));
      const double algbw = moved / (wrap * 1e-3) / 1e9;
      const double busbw = algbw * (n - 1) / n;
      const double raw_bus = moved / (raw_ms * 1e-3) / 1e9 * (n - 1) / n;
      if (host.rank() == 0)
        std::printf("%12lld %-14s %10.1f %10.1f %10.1f | %10.1f %10.1f | %.3f\n", static_cast<long long>(moved),
                    gather ? "all_gather" : "reduce_scatter", wrap * 1e3, algbw, busbw, raw_ms * 1e3, raw_bus,
                    raw_bus > 0 ? busbw / raw_bus : 0.0);
    }
  }
  ncclCommDestroy(raw);
  if (o.exchange) run_exchange<T>(host, wrapped, o, stream.get());
}

}  // namespace
}  // namespace st
#endif

int main(int argc, char** argv) {
  std::optional<st::MpiSession> mpi;
  try {
    auto comm = st::join_world(&argc, &argv, st::WorldOptions{}, &mpi);
#ifdef SHARDTRAIN_HAVE_CUDA
    const st::Options o = st::parse(argc, argv);
    if (o.bf16)
      st::run<st::bf16>(*comm, o);
    else
      st::run<float>(*comm, o);
#else
    ST_BAD_INPUT("bench_collectives needs the CUDA backend; this build has none");
#endif
    return 0;
  } catch (const st::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return st::fail_world(mpi, e.kind());
  }
}
