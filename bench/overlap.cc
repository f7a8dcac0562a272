// Does GPU 0 <-> GPU 1 traffic slow a concurrent GEMM less when the copy engines move the bytes
// (cudaMemcpyPeerAsync, no SMs) than when NCCL's kernels do? A ZeRO-3 step's GEMMs run slower on 2 GPUs than on 1
// while all-gathers and reduce-scatters run beside them (docs/performance.md, "How to measure"); this separates the
// two kinds of mover.
//
//   NCCL_NVLS_ENABLE=0 ./build/bench_overlap [--mode all|alone|nccl|ce|ce-only-copy] [--m 16384] [--n 4096]
//       [--k 1024] [--calls 50] [--rounds 5] [--mib 25]
//
// One process, GPUs 0 and 1 (peer access enabled both ways). The GEMM: C[m,n] = A[m,k] B[k,n], bf16 row-major,
// gpu::Blas on GPU 0's compute stream. A round times `calls` back-to-back calls between one pair of CUDA events;
// a mode reports the median of `rounds` rounds, after one untimed round. The traffic runs on each GPU's own
// comm stream for the whole timed window:
//   nccl          an all-gather of --mib MiB of bf16 (each rank gives half) alternating with a reduce-scatter of
//                 the same size, both ranks in one ncclGroup (a 2-rank communicator from ncclCommInitAll);
//   ce            the same bytes by copy engine: each GPU pulls its peer's half with cudaMemcpyPeerAsync and, on
//                 the reduce-scatter turns, adds it into an fp32 accumulator (gpu::accumulate): the SM work a
//                 copy-engine reduce-scatter would need;
//   ce-only-copy  the copies without the add.
// The host keeps kDepth operations in flight on each GPU until the GEMMs' end event has fired, so the traffic
// covers the window whatever the speeds. comm GB/s: bytes into GPU 0 from GPU 1 per second over the operations
// that ended inside the window (for 2 ranks, nccl-tests' busbw); "alone" beside it is the same traffic with no
// GEMM. Default modes: alone, nccl, ce, ce-only-copy, then alone again (the drift). Slowdown is against the
// first alone; spread is (max - min) / median of the rounds.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_util.h"
#include "shardtrain/core/error.h"

#ifdef SHARDTRAIN_HAVE_CUDA
#include <memory>
#include <optional>

#include "shardtrain/comm/nccl_communicator.h"
#include "shardtrain/core/cuda.h"
#include "shardtrain/kernels/gpu/context.h"
#include "shardtrain/kernels/gpu/matmul.h"
#include "shardtrain/kernels/gpu/reduce.h"

namespace st {
namespace {

constexpr int kDevices = 2;
// Traffic operations in flight per GPU: enough that the comm streams never run dry between the host's polls, few
// enough that they stop soon after the GEMMs do (docs/performance.md, "How to measure", has their time on NVLink).
constexpr int64_t kDepth = 16;
// Operations finished before the GEMMs are enqueued, so the GEMMs meet traffic already in its steady state.
constexpr int64_t kLead = 2;
// Operations of the "alone" traffic measurement (the first kLead are not counted).
constexpr int64_t kAloneOps = 40;

enum class Traffic { kNone, kNccl, kCe, kCeCopyOnly };

struct Mode {
  const char* name;
  Traffic traffic;
};
constexpr Mode kModes[] = {
    {"alone", Traffic::kNone}, {"nccl", Traffic::kNccl}, {"ce", Traffic::kCe}, {"ce-only-copy", Traffic::kCeCopyOnly}};

struct Options {
  int64_t m = 16384, n = 4096, k = 1024;
  int64_t mib = 25;  // all-gather output per rank, bf16
  int calls = 50, rounds = 5;
  std::vector<Mode> modes;
};

Options parse(int argc, char** argv) {
  Options o;
  std::string mode = "all";
  std::vector<char*> ints = bench::take_text_flag(argc, argv, "--mode", &mode);  // the rest are integers
  bench::parse_int_flags(
      static_cast<int>(ints.size()), ints.data(), "bench_overlap",
      {{"--m", &o.m}, {"--n", &o.n}, {"--k", &o.k}, {"--mib", &o.mib}, {"--calls", &o.calls}, {"--rounds", &o.rounds}});
  if (o.m < 1 || o.n < 1 || o.k < 1 || o.mib < 1 || o.calls < 1 || o.rounds < 1)
    ST_BAD_INPUT("bench_overlap: --m, --n, --k, --mib, --calls and --rounds must be >= 1");
  if (mode == "all") {
    o.modes = {kModes[0], kModes[1], kModes[2], kModes[3], kModes[0]};
    return o;
  }
  const Mode* m = std::find_if(std::begin(kModes), std::end(kModes), [&](const Mode& x) { return mode == x.name; });
  if (m == std::end(kModes))
    ST_BAD_INPUT("bench_overlap: --mode ", mode, ": expected all, alone, nccl, ce or ce-only-copy");
  o.modes = {kModes[0]};  // the baseline of the slowdown column
  if (m->traffic != Traffic::kNone) o.modes.push_back(*m);
  return o;
}

// Makes `device` current until the end of the scope, then the one that was.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    ST_CUDA_CHECK(cudaGetDevice(&prev_));
    ST_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceScope() { cudaSetDevice(prev_); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int prev_ = 0;
};

// True once the work before `e` has run; a poll, never a wait.
bool finished(const CudaEvent& e) {
  const cudaError_t r = cudaEventQuery(e.get());
  if (r == cudaErrorNotReady) {
    (void)cudaGetLastError();  // not an error, but it must not surface at the next launch check
    return false;
  }
  ST_CUDA_CHECK(r);
  return true;
}

// Both ranks of a 2-GPU NCCL communicator made in this process (ncclCommInitAll over devices 0 and 1).
class NcclPair {
 public:
  NcclPair() {
    int devices[kDevices] = {0, 1};
    ST_NCCL_CHECK(ncclCommInitAll(comms_, kDevices, devices));
  }
  ~NcclPair() {
    // Finalizing waits for every rank, and this one thread drives both: one group, then the local frees.
    ncclGroupStart();
    for (ncclComm_t c : comms_) ncclCommFinalize(c);
    ncclGroupEnd();
    for (ncclComm_t c : comms_) ncclCommDestroy(c);
  }
  NcclPair(const NcclPair&) = delete;
  NcclPair& operator=(const NcclPair&) = delete;
  ncclComm_t comm(int device) const { return comms_[device]; }

 private:
  ncclComm_t comms_[kDevices] = {};
};

// One GPU's end of the traffic. Built and freed with its device current (TrafficLoop sees to it).
struct Side {
  Side(int64_t shard_elems, uint64_t seed)
      : shard(bench::random_bf16(shard_elems, seed)), full(2 * shard_elems), recv(shard_elems), acc(shard_elems) {
    ST_CUDA_CHECK(cudaMemset(full.data(), 0, full.bytes()));
    ST_CUDA_CHECK(cudaMemset(recv.data(), 0, recv.bytes()));
    ST_CUDA_CHECK(cudaMemset(acc.data(), 0, acc.bytes()));
    ST_CUDA_CHECK(cudaDeviceSynchronize());
  }
  CudaStream stream;
  DeviceBuffer<bf16> shard;     // this rank's half: all-gather input, and what the peer's copy reads
  DeviceBuffer<bf16> full;      // all-gather output, reduce-scatter input
  DeviceBuffer<bf16> recv;      // reduce-scatter output; the peer's half, for the copies
  DeviceBuffer<float> acc;      // the copy-engine reduce-scatter's sum
  std::vector<CudaEvent> ends;  // ends[i]: recorded after operation i of the round
};

// The traffic between GPUs 0 and 1: operations (all-gather / reduce-scatter turns) issued from the host with at
// most kDepth in flight per GPU, each followed by a timing event on each comm stream.
class TrafficLoop {
 public:
  // `nccl` may be null when no round uses Traffic::kNccl.
  TrafficLoop(int64_t shard_elems, const NcclPair* nccl) : shard_elems_(shard_elems), nccl_(nccl) {
    for (int d = 0; d < kDevices; ++d) {
      DeviceScope on(d);
      sides_[d] = std::make_unique<Side>(shard_elems, static_cast<uint64_t>(100 + d));
    }
  }
  ~TrafficLoop() {
    for (int d = 0; d < kDevices; ++d) {
      DeviceScope on(d);
      sides_[d].reset();
    }
  }
  TrafficLoop(const TrafficLoop&) = delete;
  TrafficLoop& operator=(const TrafficLoop&) = delete;

  // Starts a round of `kind` traffic (not kNone); the previous round must have been finish()ed.
  void begin(Traffic kind) {
    ST_CHECK(kind != Traffic::kNone && (kind != Traffic::kNccl || nccl_ != nullptr), "no traffic, or no NCCL");
    kind_ = kind;
    issued_ = retired_ = 0;
  }
  // Issues operations, keeping kDepth in flight on each GPU, while keep_going() holds (polled, never waited).
  template <typename Pred>
  void pump_while(Pred keep_going) {
    while (keep_going()) {
      if (issued_ - retired_ < kDepth) {
        issue();
      } else if (finished(end(0, retired_)) && finished(end(1, retired_))) {
        ++retired_;
      }
    }
  }
  // Operations of this round known to have finished on both GPUs.
  int64_t retired() const { return retired_; }
  // Waits for everything issued.
  void finish() {
    for (auto& s : sides_) s->stream.synchronize();
    retired_ = issued_;
  }
  // After finish(): GB/s into GPU 0 over the operations that ended between `from` and `to` (timing events on
  // GPU 0), the bytes of all but the first over the time from the first's end to the last's; 0 when fewer
  // than two ended there.
  double gbps(const CudaEvent& from, const CudaEvent& to) const {
    int64_t first = -1, last = -1;
    for (int64_t i = 0; i < issued_; ++i) {
      if (bench::elapsed_ms(from, end(0, i)) < 0 || bench::elapsed_ms(end(0, i), to) < 0) continue;
      if (first < 0) first = i;
      last = i;
    }
    if (last - first < 1) return 0;
    const double bytes = static_cast<double>(last - first) * static_cast<double>(sides_[0]->recv.bytes());
    return bytes / (bench::elapsed_ms(end(0, first), end(0, last)) * 1e-3) / 1e9;
  }
  // After finish(): gbps over operations first .. the last issued.
  double gbps_from(int64_t first) const { return gbps(end(0, first), end(0, issued_ - 1)); }

 private:
  const CudaEvent& end(int device, int64_t op) const { return sides_[device]->ends[static_cast<size_t>(op)]; }

  // One operation on both GPUs: an all-gather turn (even) or a reduce-scatter turn (odd).
  void issue() {
    const bool reduce = issued_ % 2 == 1;
    if (kind_ == Traffic::kNccl) {
      ST_NCCL_CHECK(ncclGroupStart());
      for (int d = 0; d < kDevices; ++d) {
        Side& s = *sides_[d];
        ncclComm_t c = nccl_->comm(d);
        if (reduce) {
          ST_NCCL_CHECK_COMM(ncclReduceScatter(s.full.data(), s.recv.data(), static_cast<size_t>(shard_elems_),
                                               ncclBfloat16, ncclSum, c, s.stream.get()),
                             c);
        } else {
          ST_NCCL_CHECK_COMM(ncclAllGather(s.shard.data(), s.full.data(), static_cast<size_t>(shard_elems_),
                                           ncclBfloat16, c, s.stream.get()),
                             c);
        }
      }
      ST_NCCL_CHECK(ncclGroupEnd());
    }
    for (int d = 0; d < kDevices; ++d) {
      DeviceScope on(d);
      Side& s = *sides_[d];
      const int peer = 1 - d;
      if (kind_ != Traffic::kNccl) {
        // Pulled by this GPU's copy engine, so each direction of the link carries one copy, as in the collective.
        ST_CUDA_CHECK(
            cudaMemcpyPeerAsync(s.recv.data(), d, sides_[peer]->shard.data(), peer, s.recv.bytes(), s.stream.get()));
        if (reduce && kind_ == Traffic::kCe) {
          gpu::GpuContext ctx;
          ctx.stream = s.stream.get();
          gpu::accumulate<bf16>(s.acc.data(), s.recv.data(), shard_elems_, ctx);
        }
      }
      if (static_cast<size_t>(issued_) == s.ends.size()) s.ends.emplace_back(/*timing=*/true);
      s.ends[static_cast<size_t>(issued_)].record(s.stream.get());
    }
    ++issued_;
  }

  int64_t shard_elems_;  // elements each rank contributes to an all-gather
  const NcclPair* nccl_;
  std::unique_ptr<Side> sides_[kDevices];
  Traffic kind_ = Traffic::kNone;
  int64_t issued_ = 0, retired_ = 0;
};

struct ModeResult {
  double ms_per_call = 0, spread = 0;  // median round; (max - min) / median
  double comm_gbps = 0;                // median round
  double alone_gbps = 0;               // the traffic with no GEMM
};

void enable_peer_access() {
  for (int d = 0; d < kDevices; ++d) {
    const int peer = 1 - d;
    int can = 0;
    ST_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, d, peer));
    if (!can) ST_BAD_INPUT("bench_overlap: GPU ", d, " has no peer access to GPU ", peer, " (cudaDeviceCanAccessPeer)");
    DeviceScope on(d);
    const cudaError_t r = cudaDeviceEnablePeerAccess(peer, 0);
    if (r == cudaErrorPeerAccessAlreadyEnabled) {
      (void)cudaGetLastError();
    } else {
      ST_CUDA_CHECK(r);
    }
  }
}

void run(const Options& o) {
  const int devices = cuda_device_count();
  if (devices < kDevices) ST_BAD_INPUT("bench_overlap: needs 2 GPUs (it uses 0 and 1); ", devices, " visible");
  enable_peer_access();
  ST_CUDA_CHECK(cudaSetDevice(0));
  const bool any_nccl =
      std::any_of(o.modes.begin(), o.modes.end(), [](const Mode& m) { return m.traffic == Traffic::kNccl; });
  std::optional<NcclPair> nccl;
  if (any_nccl) nccl.emplace();
  ST_CUDA_CHECK(cudaSetDevice(0));
  const int64_t shard_elems = o.mib * (int64_t{1} << 20) / 2 / static_cast<int64_t>(sizeof(bf16));
  TrafficLoop traffic(shard_elems, nccl ? &*nccl : nullptr);

  CudaStream compute;
  gpu::Blas blas;
  const DeviceBuffer<bf16> a = bench::random_bf16(o.m * o.k, 1, 0.02), b = bench::random_bf16(o.k * o.n, 2, 0.02);
  DeviceBuffer<bf16> c(o.m * o.n);
  const cudaStream_t s = compute.get();

  // One round: `calls` GEMMs on GPU 0, beside `kind` traffic; ms per call, and the traffic's GB/s in *gbps.
  auto round = [&](Traffic kind, double* gbps) {
    CudaEvent start(true), stop(true);
    if (kind != Traffic::kNone) {
      traffic.begin(kind);
      traffic.pump_while([&] { return traffic.retired() < kLead; });
    }
    start.record(s);
    for (int i = 0; i < o.calls; ++i)
      blas.gemm<bf16>(false, false, o.m, o.n, o.k, 1.0f, a.data(), o.k, 0, b.data(), o.n, 0, 0.0f, c.data(), o.n, 0, 1,
                      s);
    stop.record(s);
    if (kind != Traffic::kNone) {
      traffic.pump_while([&] { return !finished(stop); });
      traffic.finish();
      *gbps = traffic.gbps(start, stop);
    }
    stop.synchronize();
    return bench::elapsed_ms(start, stop) / o.calls;
  };

  const double flops = 2.0 * static_cast<double>(o.m) * static_cast<double>(o.n) * static_cast<double>(o.k);
  std::printf("# GEMM bf16 m %lld n %lld k %lld on GPU 0 (%s): %d calls a round, median of %d rounds\n",
              static_cast<long long>(o.m), static_cast<long long>(o.n), static_cast<long long>(o.k),
              cuda_device_name().c_str(), o.calls, o.rounds);
  std::printf(
      "# traffic GPU 0 <-> 1: %lld MiB all-gather output per rank (%.2f MiB each way an operation), "
      "all-gather and reduce-scatter alternating, %lld in flight\n",
      static_cast<long long>(o.mib), static_cast<double>(o.mib) / 2, static_cast<long long>(kDepth));
  std::printf("%-13s %12s %8s %9s %7s %10s %16s\n", "mode", "GEMM ms/call", "TF/s", "slowdown", "spread", "comm GB/s",
              "comm alone GB/s");
  double baseline = 0;
  for (const Mode& mode : o.modes) {
    double gbps = 0;
    round(mode.traffic, &gbps);  // warm-up: cuBLASLt planning, NCCL connections
    std::vector<double> ms, rates;
    for (int r = 0; r < o.rounds; ++r) {
      ms.push_back(round(mode.traffic, &gbps));
      rates.push_back(gbps);
    }
    ModeResult res;
    res.ms_per_call = median(ms);
    res.spread = (*std::max_element(ms.begin(), ms.end()) - *std::min_element(ms.begin(), ms.end())) / res.ms_per_call;
    if (mode.traffic != Traffic::kNone) {
      res.comm_gbps = median(rates);
      traffic.begin(mode.traffic);
      traffic.pump_while([&] { return traffic.retired() < kAloneOps; });
      traffic.finish();
      res.alone_gbps = traffic.gbps_from(kLead);
    }
    if (baseline == 0) baseline = res.ms_per_call;
    char comm[32] = "-", alone[32] = "-";
    if (mode.traffic != Traffic::kNone) {
      std::snprintf(comm, sizeof(comm), "%.1f", res.comm_gbps);
      std::snprintf(alone, sizeof(alone), "%.1f", res.alone_gbps);
    }
    std::printf("%-13s %12.4f %8.1f %8.3fx %6.1f%% %10s %16s\n", mode.name, res.ms_per_call,
                flops / (res.ms_per_call * 1e-3) / 1e12, res.ms_per_call / baseline, 100 * res.spread, comm, alone);
    std::fflush(stdout);
  }
}

}  // namespace
}  // namespace st
#endif

int main(int argc, char** argv) {
  return st::bench::gpu_main("bench_overlap", [&] {
#ifdef SHARDTRAIN_HAVE_CUDA
    // A guard only: the caller sets it. NVLink multicast (NVLS) must stay off on these machines.
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    st::run(st::parse(argc, argv));
#endif
  });
}
