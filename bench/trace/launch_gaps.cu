// What a dependent launch costs on the device, and what CUDA graphs and programmatic dependent launch (PDL) take
// off it: a bound on the gaps between the training step's kernels (docs/performance.md).
//
//   build/bench_launch_gaps [--kernels 400] [--repeats 7] [--work 0,64,512]
//
// Each case queues one long spin kernel first, so that the host has queued the whole chain before the device
// reaches it; the time measured runs from the spin's end to the chain's end, so it is device time only. The chain
// is --kernels launches on one stream, each reading what the previous wrote (every block stores to one buffer),
// in five ways:
//   stream          plain launches;
//   stream+memset   a 4-byte cudaMemsetAsync before each launch (what cuBLASLt and cuDNN do before their
//                   persistent kernels);
//   graph           the same launches captured once and replayed as a CUDA graph;
//   graph+memset    the memset chain as a graph;
//   pdl             launches as our kernels make them (launch_after_predecessor, src/kernels/gpu_pack.cuh): the
//                   next kernel is launched while the previous runs and waits for it in wait_for_predecessor().
// --work sets each kernel's length: the number of dependent FMAs per thread, on 8 blocks per SM of 256 threads
// (0: an empty kernel, so the per-kernel time is the launch-to-launch time). Printed per case: the median over
// --repeats of the chain's time per kernel, in microseconds.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "../../src/kernels/gpu_pack.cuh"  // launch_after_predecessor, wait_for_predecessor: what our kernels use
#include "../bench_util.h"
#include "shardtrain/core/cuda.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/stats.h"

namespace st {
namespace {

using gpu::kernels_internal::launch_after_predecessor;
using gpu::kernels_internal::wait_for_predecessor;

__global__ void spin_kernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

// Every thread runs `work` dependent FMAs on a value read from `buf` and stores it back, so kernel i+1 reads what
// kernel i wrote. With `pdl`, the kernel waits for its predecessor before it reads.
template <bool kPdl>
__global__ void chain_kernel(float* buf, int work) {
  if constexpr (kPdl) wait_for_predecessor();  // PDL needs sm_90; on sm_89 the launch serialises
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  float v = buf[i];
  for (int k = 0; k < work; ++k) v = fmaf(v, 0.999f, 0.001f);
  buf[i] = v;
}

struct Setup {
  cudaStream_t stream;
  float* buf;
  int* flag;
  int blocks;
  int threads = 256;
  int kernels;
  int work;
};

void launch_chain(const Setup& s, bool memset, bool pdl) {
  for (int k = 0; k < s.kernels; ++k) {
    if (memset) ST_CUDA_CHECK(cudaMemsetAsync(s.flag, 0, sizeof(int), s.stream));
    if (pdl)
      launch_after_predecessor(chain_kernel<true>, s.blocks, s.threads, 0, s.stream, s.buf, s.work);
    else
      chain_kernel<false><<<s.blocks, s.threads, 0, s.stream>>>(s.buf, s.work);
  }
  ST_CUDA_CHECK_LAUNCH();
}

// Microseconds per kernel: the spin, an event, the chain (`issue`), an event.
double time_chain(const Setup& s, long long spin_cycles, const std::function<void()>& issue) {
  CudaEvent a(true), b(true);
  spin_kernel<<<1, 1, 0, s.stream>>>(spin_cycles);
  a.record(s.stream);
  issue();
  b.record(s.stream);
  b.synchronize();
  return 1e3 * bench::elapsed_ms(a, b) / s.kernels;
}

cudaGraphExec_t capture(const Setup& s, bool memset, bool pdl) {
  cudaGraph_t graph;
  ST_CUDA_CHECK(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeThreadLocal));
  launch_chain(s, memset, pdl);
  ST_CUDA_CHECK(cudaStreamEndCapture(s.stream, &graph));
  cudaGraphExec_t exec;
  ST_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  ST_CUDA_CHECK(cudaGraphDestroy(graph));
  return exec;
}

std::vector<int> parse_list(const std::string& text) {
  std::vector<int> out;
  for (size_t p = 0; p < text.size();) {
    out.push_back(std::atoi(text.c_str() + p));
    const size_t comma = text.find(',', p);
    p = comma == std::string::npos ? text.size() : comma + 1;
  }
  return out;
}

void run(int argc, char** argv) {
  int kernels = 400, repeats = 7;
  std::string work_list = "0,64,512";
  std::vector<char*> rest = bench::take_text_flag(argc, argv, "--work", &work_list);
  bench::parse_int_flags(static_cast<int>(rest.size()), rest.data(), "bench_launch_gaps",
                         {{"--kernels", &kernels}, {"--repeats", &repeats}});
  const std::vector<int> works = parse_list(work_list);
  if (kernels < 1 || repeats < 1 || works.empty())
    ST_BAD_INPUT("bench_launch_gaps: --kernels and --repeats must be >= 1 and --work non-empty, got ", kernels, ", ",
                 repeats, ", '", work_list, "'");
  cudaDeviceProp prop{};
  ST_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  CudaStream stream;
  Setup s{};
  s.stream = stream.get();
  s.blocks = prop.multiProcessorCount * 8;
  s.kernels = kernels;
  DeviceBuffer<float> buf(int64_t{s.blocks} * s.threads);
  DeviceBuffer<int> flag(1);
  ST_CUDA_CHECK(cudaMemset(buf.data(), 0, buf.bytes()));
  s.buf = buf.data();
  s.flag = flag.data();
  // The spin outlasts queuing the chain: 4 us of host time per launch at the most, at the GPU's clock.
  int clock_khz = 0;
  ST_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  const long long spin_cycles = static_cast<long long>(clock_khz * 1e3 * (4e-6 * kernels + 2e-3));

  std::printf("# %s, %d SMs, %d kernels a chain, %d blocks x %d threads, median of %d, us per kernel\n", prop.name,
              prop.multiProcessorCount, kernels, s.blocks, s.threads, repeats);
  std::printf("%8s %10s %14s %10s %14s %10s\n", "work", "stream", "stream+memset", "graph", "graph+memset", "pdl");
  for (int work : works) {
    s.work = work;
    cudaGraphExec_t plain = capture(s, false, false), with_memset = capture(s, true, false);
    struct Case {
      std::function<void()> issue;
      std::vector<double> us;
    };
    std::vector<Case> cases = {
        {[&] { launch_chain(s, false, false); }, {}},
        {[&] { launch_chain(s, true, false); }, {}},
        {[&] { ST_CUDA_CHECK(cudaGraphLaunch(plain, s.stream)); }, {}},
        {[&] { ST_CUDA_CHECK(cudaGraphLaunch(with_memset, s.stream)); }, {}},
        {[&] { launch_chain(s, false, true); }, {}},
    };
    for (Case& c : cases) time_chain(s, spin_cycles, c.issue);  // warm-up
    for (int r = 0; r < repeats; ++r) {
      for (Case& c : cases) c.us.push_back(time_chain(s, spin_cycles, c.issue));  // interleaved
    }
    const int widths[] = {10, 14, 10, 14, 10};  // the header's columns
    std::printf("%8d", work);
    for (size_t i = 0; i < cases.size(); ++i) std::printf(" %*.2f", widths[i], st::median(cases[i].us));
    std::printf("\n");
    ST_CUDA_CHECK(cudaGraphExecDestroy(plain));
    ST_CUDA_CHECK(cudaGraphExecDestroy(with_memset));
  }
}

}  // namespace
}  // namespace st

int main(int argc, char** argv) {
  return st::bench::gpu_main("bench_launch_gaps", [&] { st::run(argc, argv); });
}
