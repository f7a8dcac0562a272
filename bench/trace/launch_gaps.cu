// What a dependent launch costs on the device, and what CUDA graphs and programmatic dependent launch (PDL) take
// off it: the question behind the training step's 2-20 us gaps (bench/RESULTS.md, session 16).
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
//   pdl             launches with cudaLaunchAttributeProgrammaticStreamSerialization: the next kernel is launched
//                   while the previous runs and waits for it in cudaGridDependencySynchronize().
// --work sets each kernel's length: the number of dependent FMAs per thread, on 8 blocks per SM of 256 threads
// (0: an empty kernel, so the per-kernel time is the launch-to-launch time). Printed per case: the median over
// --repeats of the chain's time per kernel, in microseconds.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace {

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "bench_launch_gaps: %s: %s\n", what, cudaGetErrorString(e));
  std::exit(1);
}

__global__ void spin_kernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

// Every thread runs `work` dependent FMAs on a value read from `buf` and stores it back, so kernel i+1 reads what
// kernel i wrote. With `pdl`, the kernel waits for its predecessor before it reads.
template <bool kPdl>
__global__ void chain_kernel(float* buf, int work) {
#if __CUDA_ARCH__ >= 900
  if constexpr (kPdl) cudaGridDependencySynchronize();  // PDL needs sm_90; on sm_89 the launch serialises
#endif
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
    if (memset) check(cudaMemsetAsync(s.flag, 0, sizeof(int), s.stream), "cudaMemsetAsync");
    if (!pdl) {
      chain_kernel<false><<<s.blocks, s.threads, 0, s.stream>>>(s.buf, s.work);
      continue;
    }
    cudaLaunchConfig_t config{};
    config.gridDim = s.blocks;
    config.blockDim = s.threads;
    config.stream = s.stream;
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    config.attrs = &attribute;
    config.numAttrs = 1;
    check(cudaLaunchKernelEx(&config, chain_kernel<true>, s.buf, s.work), "cudaLaunchKernelEx");
  }
}

// Microseconds per kernel: the spin, an event, the chain (`issue`), an event.
double time_chain(const Setup& s, long long spin_cycles, const std::function<void()>& issue) {
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "cudaEventCreate");
  check(cudaEventCreate(&b), "cudaEventCreate");
  spin_kernel<<<1, 1, 0, s.stream>>>(spin_cycles);
  check(cudaEventRecord(a, s.stream), "cudaEventRecord");
  issue();
  check(cudaEventRecord(b, s.stream), "cudaEventRecord");
  check(cudaEventSynchronize(b), "cudaEventSynchronize");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return 1e3 * ms / s.kernels;
}

cudaGraphExec_t capture(const Setup& s, bool memset, bool pdl) {
  cudaGraph_t graph;
  check(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  launch_chain(s, memset, pdl);
  check(cudaStreamEndCapture(s.stream, &graph), "cudaStreamEndCapture");
  cudaGraphExec_t exec;
  check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  cudaGraphDestroy(graph);
  return exec;
}

std::vector<int> parse_list(const char* text) {
  std::vector<int> out;
  for (const char* p = text; *p;) {
    out.push_back(std::atoi(p));
    while (*p && *p != ',') ++p;
    if (*p == ',') ++p;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int kernels = 400, repeats = 7;
  std::vector<int> works = {0, 64, 512};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--kernels") {
      kernels = std::atoi(argv[i + 1]);
    } else if (a == "--repeats") {
      repeats = std::atoi(argv[i + 1]);
    } else if (a == "--work") {
      works = parse_list(argv[i + 1]);
    } else {
      std::fprintf(stderr, "bench_launch_gaps: unknown option %s (known: --kernels, --repeats, --work)\n", a.c_str());
      return 2;
    }
  }
  if (kernels < 1 || repeats < 1 || works.empty()) {
    std::fprintf(stderr, "bench_launch_gaps: --kernels and --repeats must be >= 1 and --work non-empty\n");
    return 2;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  Setup s{};
  check(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking), "cudaStreamCreate");
  s.blocks = prop.multiProcessorCount * 8;
  s.kernels = kernels;
  check(cudaMalloc(&s.buf, sizeof(float) * s.blocks * s.threads), "cudaMalloc");
  check(cudaMemset(s.buf, 0, sizeof(float) * s.blocks * s.threads), "cudaMemset");
  check(cudaMalloc(&s.flag, sizeof(int)), "cudaMalloc");
  // The spin outlasts queuing the chain: 4 us of host time per launch at the most, at the GPU's clock.
  int clock_khz = 0;
  check(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0), "cudaDeviceGetAttribute");
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
        {[&] { check(cudaGraphLaunch(plain, s.stream), "cudaGraphLaunch"); }, {}},
        {[&] { check(cudaGraphLaunch(with_memset, s.stream), "cudaGraphLaunch"); }, {}},
        {[&] { launch_chain(s, false, true); }, {}},
    };
    for (Case& c : cases) time_chain(s, spin_cycles, c.issue);  // warm-up
    for (int r = 0; r < repeats; ++r) {
      for (Case& c : cases) c.us.push_back(time_chain(s, spin_cycles, c.issue));  // interleaved
    }
    const int widths[] = {10, 14, 10, 14, 10};  // the header's columns
    std::printf("%8d", work);
    for (size_t i = 0; i < cases.size(); ++i) {
      std::sort(cases[i].us.begin(), cases[i].us.end());
      std::printf(" %*.2f", widths[i], cases[i].us[cases[i].us.size() / 2]);
    }
    std::printf("\n");
    cudaGraphExecDestroy(plain);
    cudaGraphExecDestroy(with_memset);
  }
  check(cudaStreamSynchronize(s.stream), "cudaStreamSynchronize");
  return 0;
}
