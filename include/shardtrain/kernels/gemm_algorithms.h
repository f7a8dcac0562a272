// The GEMM algorithms a backend computes with, and what they were picked on. A checkpoint keeps them (manifest
// field gemm_algorithms) so that a resumed run on the same kind of device with the same cuBLASLt takes the same
// algorithms, and so computes the same bits, whatever timing would pick this time (train.gemm_autotune).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace st {

struct GemmAlgorithms {
  std::string device;   // the GPU's name, as cudaGetDeviceProperties gives it
  int64_t library = 0;  // cublasLtGetVersion()
  std::string plans;    // format_gemm_algorithms(): one line per planned GEMM; empty: none recorded

  bool empty() const { return plans.empty(); }
};

// One GEMM of `plans`: its plan key (19 integers: data type, transposes, m, n, k, leading dimensions, strides,
// batch, epilogue, alignments; gpu::Blas defines them) and cuBLASLt's opaque algorithm (eight 64-bit words).
struct GemmAlgorithmEntry {
  std::array<int64_t, 19> key{};
  std::array<uint64_t, 8> algo{};
};

// "gemm", the key in decimal and the algorithm in hex, space-separated, a line per entry.
std::string format_gemm_algorithms(const std::vector<GemmAlgorithmEntry>& entries);
// The reverse; blank lines are skipped. st::Error (kBadInput) naming the line and what was expected otherwise.
std::vector<GemmAlgorithmEntry> parse_gemm_algorithms(const std::string& text);

}  // namespace st
