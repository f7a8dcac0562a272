#include "gpu_pack.cuh"
#include "shardtrain/kernels/gpu/reduce.h"

namespace st::gpu {

using namespace kernels_internal;  // gpu_pack.cuh

namespace {

constexpr int kBlock = 256;
// The sums always run kReduceBlocks x kBlock threads (enough to keep an H200 streaming), so the summation
// tree depends on n only: results are bit-identical across runs and devices.

struct Square {
  __device__ __forceinline__ float operator()(float x) const { return x * x; }
};
struct Identity {
  __device__ __forceinline__ float operator()(float x) const { return x; }
};

// Per-block partial[blockIdx.x] = sum of f(x[i]) over the block's grid-stride share.
template <int kVec, typename T, typename F>
__global__ void partial_sum_kernel(double* partial, const T* x, int64_t n, F f) {
  __shared__ double shared[kWarpSize];
  float acc = 0;
  for_each_pack<kVec>(n, thread_index(), thread_count(), [&](int64_t i, auto w) {
    constexpr int W = decltype(w)::value;
    float v[W];
    load<W>(x + i, v);
    for (int k = 0; k < W; ++k) acc += f(v[k]);
  });
  const double block = block_reduce(static_cast<double>(acc), Add(), shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = block;
}

// One block: *out += sum of the kReduceBlocks partials.
__global__ void finish_sum_kernel(double* out, const double* partial) {
  __shared__ double shared[kWarpSize];
  double acc = 0;
  for (int i = threadIdx.x; i < kReduceBlocks; i += blockDim.x) acc += partial[i];
  acc = block_reduce(acc, Add(), shared);
  if (threadIdx.x == 0) *out += acc;
}

template <typename T, typename F>
void reduce_sum(const T* x, int64_t n, double* out, F f, const GpuContext& ctx) {
  if (n == 0) return;
  ST_CHECK(ctx.scratch != nullptr && ctx.scratch_bytes >= reduce_scratch_bytes(), "reduction needs ",
           reduce_scratch_bytes(), " bytes of scratch, ctx has ", ctx.scratch_bytes);
  auto* partial = static_cast<double*>(ctx.scratch);
  launch_packed<T>(all_aligned(16, x), [&](auto w) {
    partial_sum_kernel<decltype(w)::value><<<kReduceBlocks, kBlock, 0, ctx.stream>>>(partial, x, n, f);
  });
  finish_sum_kernel<<<1, kBlock, 0, ctx.stream>>>(out, partial);
  ST_CUDA_CHECK_LAUNCH();
}

__global__ void sum_in_order_kernel(const double* parts, int64_t n, double* out) {
  double acc = 0;
  for (int64_t i = 0; i < n; ++i) acc += parts[i];
  *out = acc;
}

template <int kVec, typename T>
__global__ void convert_kernel(T* out, const float* in, int64_t n) {
  for_each_pack<kVec>(n, thread_index(), thread_count(), [&](int64_t i, auto w) {
    constexpr int W = decltype(w)::value;
    float v[W];
    load<W>(in + i, v);
    store<W>(out + i, v);
  });
}

// The accumulations, and with kSquares the sum of squares of what they store: run on the reduction grid
// (kReduceBlocks x kBlock), a thread's packs are partial_sum_kernel's, summed in the same order, so partial[] gets
// the bits sum_of_squares would take from the stored values in a second pass.
template <bool kSquares>
struct StoredSquares {
  float sum = 0;
  template <int W>
  __device__ __forceinline__ void add(const float (&a)[W]) {
    if constexpr (kSquares)
      for (int k = 0; k < W; ++k) sum += Square()(a[k]);
  }
  __device__ __forceinline__ void finish(double* partial) {
    if constexpr (kSquares) {
      __shared__ double shared[kWarpSize];
      const double block = block_reduce(static_cast<double>(sum), Add(), shared);
      if (threadIdx.x == 0) partial[blockIdx.x] = block;
    }
  }
};

template <int kVec, bool kOverwrite, bool kSquares, typename T>
__global__ void accumulate_kernel(float* acc, const T* in, int64_t n, double* partial) {
  StoredSquares<kSquares> squares;
  for_each_pack<kVec>(n, thread_index(), thread_count(), [&](int64_t i, auto w) {
    constexpr int W = decltype(w)::value;
    float a[W], v[W];
    load<W>(in + i, v);
    if constexpr (kOverwrite) {
      for (int k = 0; k < W; ++k) a[k] = v[k];
    } else {
      load<W>(acc + i, a);
      for (int k = 0; k < W; ++k) a[k] += v[k];
    }
    store<W>(acc + i, a);
    squares.add(a);
  });
  squares.finish(partial);
}

template <int kVec, bool kOverwrite, bool kSquares, typename T>
__global__ void accumulate_parts_kernel(float* acc, const T* parts, int nparts, int64_t stride, int64_t n,
                                        double* partial) {
  StoredSquares<kSquares> squares;
  for_each_pack<kVec>(n, thread_index(), thread_count(), [&](int64_t i, auto w) {
    constexpr int W = decltype(w)::value;
    float s[W], v[W];
    load<W>(parts + i, s);
    for (int q = 1; q < nparts; ++q) {
      load<W>(parts + q * stride + i, v);
      for (int k = 0; k < W; ++k) s[k] += v[k];
    }
    if constexpr (!std::is_same_v<T, float>)
      for (int k = 0; k < W; ++k) s[k] = to_f32(from_f32<T>(s[k]));  // what a reduce-scatter in T delivers
    if constexpr (!kOverwrite) {
      load<W>(acc + i, v);
      for (int k = 0; k < W; ++k) s[k] = v[k] + s[k];
    }
    store<W>(acc + i, s);
    squares.add(s);
  });
  squares.finish(partial);
}

unsigned grid_packs(int64_t n, int vec) { return grid_for((n + vec - 1) / vec, kBlock); }

// Launches an accumulation kernel (`launch(Width, overwrite, squares, grid, partial)`), and with `sum_sq` the sum
// of squares' finish. The fused pass needs the pack width sum_of_squares would take for acc alone; where the input's
// alignment gives another, the accumulation and the sum run as two passes, with the same bits.
template <typename T, typename Launch>
void launch_accumulation(float* acc, const T* in, int64_t n, double* sum_sq, bool packed, const GpuContext& ctx,
                         GradWrite write, Launch&& launch) {
  const bool overwrite = write == GradWrite::kOverwrite;
  const bool fused = sum_sq != nullptr && packed == all_aligned(16, acc);
  double* partial = nullptr;
  if (fused) {
    ST_CHECK(ctx.scratch != nullptr && ctx.scratch_bytes >= reduce_scratch_bytes(), "the sum of squares needs ",
             reduce_scratch_bytes(), " bytes of scratch, ctx has ", ctx.scratch_bytes);
    partial = static_cast<double*>(ctx.scratch);
  }
  launch_packed<float>(packed, [&](auto w) {
    constexpr int W = decltype(w)::value;
    const unsigned grid = fused ? kReduceBlocks : grid_packs(n, W);
    if (overwrite && fused) launch(w, std::true_type(), std::true_type(), grid, partial);
    if (overwrite && !fused) launch(w, std::true_type(), std::false_type(), grid, partial);
    if (!overwrite && fused) launch(w, std::false_type(), std::true_type(), grid, partial);
    if (!overwrite && !fused) launch(w, std::false_type(), std::false_type(), grid, partial);
  });
  if (fused) {
    finish_sum_kernel<<<1, kBlock, 0, ctx.stream>>>(sum_sq, partial);
    ST_CUDA_CHECK_LAUNCH();
  } else if (sum_sq != nullptr) {
    reduce_sum(static_cast<const float*>(acc), n, sum_sq, Square(), ctx);
  }
}

}  // namespace

template <typename T>
void sum_of_squares(const T* x, int64_t n, double* out, const GpuContext& ctx) {
  reduce_sum(x, n, out, Square(), ctx);
}

void sum(const float* x, int64_t n, double* out, const GpuContext& ctx) { reduce_sum(x, n, out, Identity(), ctx); }

// The element-wise kernels move fp32 in packs of four: 16 bytes of fp32 and 4 * sizeof(T) bytes of T.
template <typename T>
void convert(T* out, const float* in, int64_t n, const GpuContext& ctx) {
  if (n == 0) return;
  launch_packed<float>(all_aligned(16, in) && all_aligned(4 * sizeof(T), out), [&](auto w) {
    constexpr int W = decltype(w)::value;
    convert_kernel<W><<<grid_packs(n, W), kBlock, 0, ctx.stream>>>(out, in, n);
  });
}

void sum_in_order(const double* parts, int64_t n, double* out, const GpuContext& ctx) {
  sum_in_order_kernel<<<1, 1, 0, ctx.stream>>>(parts, n, out);
  ST_CUDA_CHECK_LAUNCH();
}

template <typename T>
void accumulate(float* acc, const T* in, int64_t n, const GpuContext& ctx, GradWrite write, double* sum_sq) {
  if (n == 0) return;
  const bool packed = all_aligned(16, acc) && all_aligned(4 * sizeof(T), in);
  launch_accumulation(acc, in, n, sum_sq, packed, ctx, write,
                      [&](auto w, auto overwrite, auto squares, unsigned grid, double* partial) {
                        accumulate_kernel<decltype(w)::value, decltype(overwrite)::value, decltype(squares)::value>
                            <<<grid, kBlock, 0, ctx.stream>>>(acc, in, n, partial);
                      });
}

template <typename T>
void accumulate_parts(float* acc, const T* parts, int nparts, int64_t stride, int64_t n, const GpuContext& ctx,
                      GradWrite write, double* sum_sq) {
  ST_CHECK(nparts >= 1 && n >= 0 && stride >= n, "accumulate_parts: ", nparts, " parts of ", n, " at stride ", stride);
  if (n == 0) return;
  // Every part starts 4 * sizeof(T) bytes aligned when the first does and the stride keeps it.
  const bool packed = all_aligned(16, acc) && all_aligned(4 * sizeof(T), parts) && stride % 4 == 0;
  launch_accumulation(
      acc, parts, n, sum_sq, packed, ctx, write,
      [&](auto w, auto overwrite, auto squares, unsigned grid, double* partial) {
        accumulate_parts_kernel<decltype(w)::value, decltype(overwrite)::value, decltype(squares)::value>
            <<<grid, kBlock, 0, ctx.stream>>>(acc, parts, nparts, stride, n, partial);
      });
}

template void sum_of_squares<float>(const float*, int64_t, double*, const GpuContext&);
template void sum_of_squares<bf16>(const bf16*, int64_t, double*, const GpuContext&);
template void sum_of_squares<fp16>(const fp16*, int64_t, double*, const GpuContext&);
template void convert<float>(float*, const float*, int64_t, const GpuContext&);
template void convert<bf16>(bf16*, const float*, int64_t, const GpuContext&);
template void convert<fp16>(fp16*, const float*, int64_t, const GpuContext&);
template void accumulate<float>(float*, const float*, int64_t, const GpuContext&, GradWrite, double*);
template void accumulate<bf16>(float*, const bf16*, int64_t, const GpuContext&, GradWrite, double*);
template void accumulate<fp16>(float*, const fp16*, int64_t, const GpuContext&, GradWrite, double*);
template void accumulate_parts<float>(float*, const float*, int, int64_t, int64_t, const GpuContext&, GradWrite,
                                      double*);
template void accumulate_parts<bf16>(float*, const bf16*, int, int64_t, int64_t, const GpuContext&, GradWrite, double*);
template void accumulate_parts<fp16>(float*, const fp16*, int, int64_t, int64_t, const GpuContext&, GradWrite, double*);

}  // namespace st::gpu
