#include "shardtrain/core/cuda.h"

#include <atomic>

namespace st {
namespace detail {

void cuda_fail(const char* file, int line, const char* expr, cudaError_t err) {
  fail(ErrorKind::kFault, file, line, expr,
       str_cat("CUDA error ", static_cast<int>(err), " ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
}

void cublas_fail(const char* file, int line, const char* expr, cublasStatus_t status) {
  // cuBLASLt has no error-string function of its own; the status names are cuBLAS's.
  const char* name = "CUBLAS_STATUS_?";
  switch (status) {
    case CUBLAS_STATUS_NOT_INITIALIZED: name = "CUBLAS_STATUS_NOT_INITIALIZED"; break;
    case CUBLAS_STATUS_ALLOC_FAILED: name = "CUBLAS_STATUS_ALLOC_FAILED"; break;
    case CUBLAS_STATUS_INVALID_VALUE: name = "CUBLAS_STATUS_INVALID_VALUE"; break;
    case CUBLAS_STATUS_ARCH_MISMATCH: name = "CUBLAS_STATUS_ARCH_MISMATCH"; break;
    case CUBLAS_STATUS_MAPPING_ERROR: name = "CUBLAS_STATUS_MAPPING_ERROR"; break;
    case CUBLAS_STATUS_EXECUTION_FAILED: name = "CUBLAS_STATUS_EXECUTION_FAILED"; break;
    case CUBLAS_STATUS_INTERNAL_ERROR: name = "CUBLAS_STATUS_INTERNAL_ERROR"; break;
    case CUBLAS_STATUS_NOT_SUPPORTED: name = "CUBLAS_STATUS_NOT_SUPPORTED"; break;
    default: break;
  }
  fail(ErrorKind::kFault, file, line, expr, str_cat("cuBLAS error ", static_cast<int>(status), " ", name));
}

}  // namespace detail

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error so later checks are not confused by it
    return 0;
  }
  return n;
}

bool cuda_programmatic_launch() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> known[kMaxDevices];  // 0 not asked yet, 1 no, 2 yes
  int dev = 0;
  ST_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev >= kMaxDevices) return false;
  int k = known[dev].load(std::memory_order_relaxed);
  if (k == 0) {
    int major = 0;
    ST_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    k = major >= 9 ? 2 : 1;
    known[dev].store(k, std::memory_order_relaxed);
  }
  return k == 2;
}

std::string cuda_device_name() {
  int dev = 0;
  ST_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp p{};
  ST_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
  return p.name;
}

}  // namespace st
