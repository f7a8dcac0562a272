// Private to src/kernels: when an element-wise loop is worth an OpenMP parallel region.
#pragma once

#include <cstdint>

namespace st::kernels_internal {

// Opening a parallel region costs a few microseconds on an idle machine and milliseconds when the cores
// are shared and a worker is descheduled at the barrier; below ~16k elements of simple work it never pays.
// Loops use `#pragma omp parallel for if (work >= kMinParallelWork)`.
inline constexpr int64_t kMinParallelWork = int64_t{1} << 14;

}  // namespace st::kernels_internal
