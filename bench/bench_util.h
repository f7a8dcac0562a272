// Shared by the single-GPU kernel benchmarks (bench/attention.cc, bench/gemm_shapes.cc, bench/layernorm.cc):
// integer `--name value` options and, with the CUDA backend, median timing with CUDA events and random operands.
// Not a target of its own: CMakeLists.txt builds each bench/*.cc as a binary.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "shardtrain/core/error.h"
#include "shardtrain/core/stats.h"

#ifdef SHARDTRAIN_HAVE_CUDA
#include "shardtrain/core/cuda.h"
#include "shardtrain/core/rng.h"
#endif

namespace st::bench {

// An integer option `--<name> value` and the variable it sets (parsed with atoi for int, atoll for int64_t).
struct IntFlag {
  IntFlag(const char* flag_name, int* value) : name(flag_name), int_value(value) {}
  IntFlag(const char* flag_name, int64_t* value) : name(flag_name), int64_value(value) {}
  const char* name;  // with the leading "--"
  int* int_value = nullptr;
  int64_t* int64_value = nullptr;
};

// Reads argv[1..] as `--name value` pairs into `flags` (a trailing name without a value is ignored). An unknown
// name throws a bad-input st::Error naming `program`, the argument and the known flags.
//   parse_int_flags(argc, argv, "bench_x", {{"--iters", &iters}, {"--rows", &rows}});
inline void parse_int_flags(int argc, char** argv, const char* program, std::initializer_list<IntFlag> flags) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const IntFlag* flag = std::find_if(flags.begin(), flags.end(), [&](const IntFlag& f) { return a == f.name; });
    if (flag == flags.end()) {
      std::string known;
      for (const IntFlag& f : flags) known += (known.empty() ? "" : ", ") + std::string(f.name);
      ST_BAD_INPUT(program, ": unknown argument ", a, " (", known, ")");
    }
    if (flag->int_value != nullptr) {
      *flag->int_value = std::atoi(argv[i + 1]);
    } else {
      *flag->int64_value = std::atoll(argv[i + 1]);
    }
  }
}

// Takes `--<name> value` (a benchmark's one text option) out of argv[1..] into *value (left as it is when absent)
// and returns the other arguments, argv[0] first, for parse_int_flags:
//   std::vector<char*> rest = take_text_flag(argc, argv, "--dtype", &dtype);
//   parse_int_flags(static_cast<int>(rest.size()), rest.data(), "bench_x", {...});
inline std::vector<char*> take_text_flag(int argc, char** argv, const char* name, std::string* value) {
  std::vector<char*> rest = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == name && i + 1 < argc) {
      *value = argv[++i];
    } else {
      rest.push_back(argv[i]);
    }
  }
  return rest;
}

// A single-GPU benchmark's main: runs body() (which parses the flags and runs the cases) and returns 0, or prints
// the st::Error it threw and returns that error's exit code. Without the CUDA backend or a visible device, body
// does not run and the error names `program`. body's code must itself sit inside #ifdef SHARDTRAIN_HAVE_CUDA.
//   int main(int argc, char** argv) { return st::bench::gpu_main("bench_x", [&] { ... }); }
template <typename Body>
int gpu_main(const char* program, Body&& body) {
  try {
#ifdef SHARDTRAIN_HAVE_CUDA
    if (cuda_device_count() == 0) ST_BAD_INPUT(program, ": no CUDA device visible");
    body();
#else
    (void)body;
    ST_BAD_INPUT(program, " needs the CUDA backend; this build has none");
#endif
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return exit_code_for(e.kind());
  }
}

#ifdef SHARDTRAIN_HAVE_CUDA

// Milliseconds from `a` to `b` (negative when b came first); both recorded with timing, on one device.
inline double elapsed_ms(const CudaEvent& a, const CudaEvent& b) {
  float t = 0;
  ST_CUDA_CHECK(cudaEventElapsedTime(&t, a.get(), b.get()));
  return t;
}

// Median milliseconds of `iters` (>= 1) calls of fn(), after 3 untimed warm-up calls; each call is timed by a
// pair of CUDA events on stream s, so fn must enqueue all its work on s.
template <typename Fn>
double median_ms(cudaStream_t s, int iters, Fn fn) {
  for (int i = 0; i < 3; ++i) fn();
  CudaEvent a(true), b(true);
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    a.record(s);
    fn();
    b.record(s);
    b.synchronize();
    ms.push_back(elapsed_ms(a, b));
  }
  return median(std::move(ms));
}

// n values of T (float, bf16 or fp16) scale * N(0, 1) + shift on the device, element i from
// st::normal_at(7, stream, i); complete on return (the copy is synchronised, so kernels on a non-blocking stream
// see it).
template <typename T>
DeviceBuffer<T> random_device(int64_t n, uint64_t stream, double scale = 1.0, double shift = 0.0) {
  std::vector<T> h(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const double x = shift + scale * normal_at(7, stream, static_cast<uint64_t>(i));
    h[static_cast<size_t>(i)] = static_cast<T>(static_cast<float>(x));
  }
  DeviceBuffer<T> d(n);
  ST_CUDA_CHECK(cudaMemcpy(d.data(), h.data(), d.bytes(), cudaMemcpyHostToDevice));
  ST_CUDA_CHECK(cudaDeviceSynchronize());
  return d;
}

inline DeviceBuffer<bf16> random_bf16(int64_t n, uint64_t stream, double scale = 1.0) {
  return random_device<bf16>(n, stream, scale);
}

#endif  // SHARDTRAIN_HAVE_CUDA

}  // namespace st::bench
