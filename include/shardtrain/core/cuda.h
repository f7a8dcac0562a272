// CUDA basics shared by every GPU source: the CHECK macros for the CUDA runtime and cuBLAS(Lt), RAII
// streams, events and device/pinned buffers, and the bf16 type. Include only from .cu files or from
// sources built when SHARDTRAIN_HAVE_CUDA is defined.
//
//   st::CudaStream s;                                   // owns a non-blocking stream
//   st::DeviceBuffer<st::bf16> x(n);                     // cudaMalloc'd, freed on scope exit
//   ST_CUDA_CHECK(cudaMemsetAsync(x.data(), 0, x.bytes(), s.get()));
//   my_kernel<<<g, b, 0, s.get()>>>(x.data(), n);
//   ST_CUDA_CHECK_LAUNCH();                             // cudaGetLastError after a launch
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <utility>

#include "shardtrain/core/error.h"

namespace st {

using bf16 = __nv_bfloat16;
using fp16 = __half;

namespace detail {
[[noreturn]] void cuda_fail(const char* file, int line, const char* expr, cudaError_t err);
[[noreturn]] void cublas_fail(const char* file, int line, const char* expr, cublasStatus_t status);
}  // namespace detail

// Number of CUDA devices this process can use; 0 (never an error) when there is no driver or device.
int cuda_device_count();
// "NVIDIA H200" for the current device.
std::string cuda_device_name();
// Whether the current device can launch a kernel while its stream's previous kernel still runs (programmatic
// dependent launch: compute capability 9.0 and up). Asked once per device.
bool cuda_programmatic_launch();

}  // namespace st

// A failed CUDA runtime call is an environment fault (kFault): the device or driver is broken, so the
// run may be retried from its last checkpoint. The message carries cudaGetErrorString.
#define ST_CUDA_CHECK(expr)                                                                 \
  do {                                                                                      \
    const cudaError_t st_err_ = (expr);                                                     \
    if (st_err_ != cudaSuccess) ::st::detail::cuda_fail(__FILE__, __LINE__, #expr, st_err_); \
  } while (0)
#define ST_CUDA_CHECK_LAUNCH() ST_CUDA_CHECK(cudaGetLastError())
#define ST_CUBLAS_CHECK(expr)                                                                     \
  do {                                                                                            \
    const cublasStatus_t st_st_ = (expr);                                                         \
    if (st_st_ != CUBLAS_STATUS_SUCCESS) ::st::detail::cublas_fail(__FILE__, __LINE__, #expr, st_st_); \
  } while (0)

namespace st {

class CudaStream {
 public:
  // A stream's claim on the SMs where kernels of several streams wait for them: the blocks of a kHigh stream's kernels
  // are scheduled before those of a kLow one (the default priority), which fill what they leave.
  enum class Priority { kLow, kHigh };
  explicit CudaStream(Priority priority = Priority::kLow) {
    int least = 0, greatest = 0;
    ST_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    const int p = priority == Priority::kHigh ? greatest : least;
    ST_CUDA_CHECK(cudaStreamCreateWithPriority(&s_, cudaStreamNonBlocking, p));
  }
  ~CudaStream() {
    if (s_) cudaStreamDestroy(s_);
  }
  CudaStream(CudaStream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  CudaStream& operator=(CudaStream&& o) noexcept {
    std::swap(s_, o.s_);
    return *this;
  }
  cudaStream_t get() const { return s_; }
  void synchronize() const { ST_CUDA_CHECK(cudaStreamSynchronize(s_)); }

 private:
  cudaStream_t s_ = nullptr;
};

// An event for ordering streams (timing disabled unless asked for).
class CudaEvent {
 public:
  explicit CudaEvent(bool timing = false) {
    ST_CUDA_CHECK(cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming));
  }
  ~CudaEvent() {
    if (e_) cudaEventDestroy(e_);
  }
  CudaEvent(CudaEvent&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  CudaEvent& operator=(CudaEvent&& o) noexcept {
    std::swap(e_, o.e_);
    return *this;
  }
  cudaEvent_t get() const { return e_; }
  void record(cudaStream_t s) { ST_CUDA_CHECK(cudaEventRecord(e_, s)); }
  // Makes `s` wait for the work recorded before this event.
  void wait_on(cudaStream_t s) const { ST_CUDA_CHECK(cudaStreamWaitEvent(s, e_, 0)); }
  void synchronize() const { ST_CUDA_CHECK(cudaEventSynchronize(e_)); }

 private:
  cudaEvent_t e_ = nullptr;
};

// n elements of T from an allocator (device or pinned host memory), uninitialised. Moves, does not copy.
template <typename T, cudaError_t (*Alloc)(void**, size_t), cudaError_t (*Free)(void*)>
class CudaBuffer {
 public:
  CudaBuffer() = default;
  explicit CudaBuffer(int64_t n) : n_(n) {
    if (n > 0) ST_CUDA_CHECK(Alloc(reinterpret_cast<void**>(&p_), bytes()));
  }
  // n elements at p, which another owner allocated and keeps alive for longer (a part of a larger allocation, such as
  // a communicator's symmetric window): never freed through this buffer.
  static CudaBuffer borrow(T* p, int64_t n) {
    CudaBuffer b;
    b.p_ = p;
    b.n_ = n;
    b.owned_ = false;
    return b;
  }
  ~CudaBuffer() {
    if (p_ && owned_) Free(p_);
  }
  CudaBuffer(CudaBuffer&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)), owned_(std::exchange(o.owned_, true)) {}
  CudaBuffer& operator=(CudaBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    std::swap(owned_, o.owned_);
    return *this;
  }
  T* data() const { return p_; }
  int64_t size() const { return n_; }
  size_t bytes() const { return static_cast<size_t>(n_) * sizeof(T); }

 private:
  T* p_ = nullptr;
  int64_t n_ = 0;
  bool owned_ = true;
};

namespace detail {
inline cudaError_t device_alloc(void** p, size_t bytes) { return cudaMalloc(p, bytes); }
inline cudaError_t pinned_alloc(void** p, size_t bytes) { return cudaMallocHost(p, bytes); }
}  // namespace detail

// Device memory (cudaMalloc).
template <typename T>
using DeviceBuffer = CudaBuffer<T, detail::device_alloc, cudaFree>;
// Page-locked host memory (cudaMallocHost), for asynchronous copies.
template <typename T>
using PinnedBuffer = CudaBuffer<T, detail::pinned_alloc, cudaFreeHost>;

// Zeroes the first n elements of `b` (0 <= n <= b.size()) on stream `s`, in stream order with the work around it
// (cudaMemsetAsync: never the legacy default stream, which the non-blocking streams do not wait for).
template <typename T>
void zero_async(DeviceBuffer<T>& b, int64_t n, cudaStream_t s) {
  ST_CUDA_CHECK(cudaMemsetAsync(b.data(), 0, sizeof(T) * static_cast<size_t>(n), s));
}

}  // namespace st
