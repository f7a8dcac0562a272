#include <cmath>

#include "gpu_pack.cuh"
#include "shardtrain/core/error.h"
#include "shardtrain/kernels/gpu/attention.h"
#include "shardtrain/kernels/gpu/matmul.h"

namespace st::gpu {

using namespace kernels_internal;  // gpu_pack.cuh

// Per head, q/k/v are T x hs matrices strided inside qkv with pitch 3C, and (b, h) -> offset is not one
// stride, so one strided-batched GEMM cannot read them in place. They are first permuted to contiguous
// [B,NH,T,hs] in scratch; then every product is one GEMM batched over the B*NH heads.

namespace {

constexpr int kBlock = 256;
constexpr int kRowsPerBlock = kBlock / kWarpSize;  // softmax kernels: one warp per row

struct Max {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

size_t region_bytes(int64_t elements, size_t elem_size) {
  constexpr size_t kAlign = 256;
  return (static_cast<size_t>(elements) * elem_size + kAlign - 1) / kAlign * kAlign;
}

// Shape and scratch carving shared by forward and backward.
template <typename T>
struct Heads {
  int B, T_, C, NH, hs;
  int64_t head_elems() const { return static_cast<int64_t>(B) * T_ * C; }  // one [B,NH,T,hs] tensor
  int64_t att_elems() const { return static_cast<int64_t>(B) * NH * T_ * T_; }
  int batch() const { return B * NH; }
  T* region(void* scratch, int i) const {  // the i-th [B,NH,T,hs] region
    return reinterpret_cast<T*>(static_cast<char*>(scratch) + i * region_bytes(head_elems(), sizeof(T)));
  }
};

template <typename T>
Heads<T> heads(int B, int T_, int C, int NH) {
  ST_CHECK(NH > 0 && C % NH == 0, "C = ", C, " is not a multiple of NH = ", NH);
  return Heads<T>{B, T_, C, NH, C / NH};
}

void check_context(const GpuContext& ctx, size_t need, const char* what) {
  ST_CHECK(ctx.blas != nullptr, what, ": GpuContext::blas is null");
  ST_CHECK(ctx.scratch != nullptr && ctx.scratch_bytes >= need, what, " needs ", need,
           " bytes of scratch; GpuContext has ", ctx.scratch_bytes);
}

// dst[b,h,t,d] = src[(b*T + t) * ld + h*hs + d]: one head-major copy of a [B,T,*] row-major tensor.
template <typename T>
__global__ void rows_to_heads_kernel(T* dst, const T* src, int64_t ld, int B, int T_, int NH, int hs) {
  const int64_t n = static_cast<int64_t>(B) * NH * T_ * hs;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int d = static_cast<int>(i % hs);
    const int t = static_cast<int>(i / hs % T_);
    const int64_t bh = i / (static_cast<int64_t>(hs) * T_);
    const int h = static_cast<int>(bh % NH);
    const int64_t b = bh / NH;
    dst[i] = src[(b * T_ + t) * ld + h * hs + d];
  }
}

// The inverse: dst[(b*T + t) * ld + h*hs + d] (+)= src[b,h,t,d]; iterates in dst order for coalesced stores.
template <typename T>
__global__ void heads_to_rows_kernel(T* dst, int64_t ld, const T* src, bool accumulate, int B, int T_, int NH, int hs) {
  const int C = NH * hs;
  const int64_t n = static_cast<int64_t>(B) * T_ * C;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int c = static_cast<int>(i % C);
    const int64_t bt = i / C;
    const int64_t b = bt / T_;
    const int t = static_cast<int>(bt % T_);
    const int h = c / hs, d = c % hs;
    const float v = to_f32(src[((b * NH + h) * T_ + t) * hs + d]);
    T* p = dst + bt * ld + c;
    *p = from_f32<T>(accumulate ? to_f32(*p) + v : v);
  }
}

// In place on each row of [rows, T] scores (row r is query i = r % T): softmax over keys [0, i] in fp32,
// keys > i written 0.
template <typename T>
__global__ void causal_softmax_kernel(T* att, int64_t rows, int T_) {
  const int64_t row = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / kWarpSize;
  if (row >= rows) return;  // whole warps only: the shuffles below need every lane
  const int lane = threadIdx.x % kWarpSize;
  const int i = static_cast<int>(row % T_);
  T* s = att + row * T_;
  float mx = -INFINITY;
  for (int j = lane; j <= i; j += kWarpSize) mx = fmaxf(mx, to_f32(s[j]));
  mx = warp_reduce(mx, Max());
  float sum = 0.0f;
  for (int j = lane; j <= i; j += kWarpSize) sum += expf(to_f32(s[j]) - mx);
  sum = warp_reduce(sum, Add());
  const float inv = 1.0f / sum;
  for (int j = lane; j < T_; j += kWarpSize) s[j] = from_f32<T>(j <= i ? expf(to_f32(s[j]) - mx) * inv : 0.0f);
}

// In place: dS = P * (dP - sum_{j<=i} P dP) for keys [0, i] in fp32, 0 for keys > i (where dP, computed in
// full, is meaningless).
template <typename T>
__global__ void causal_softmax_backward_kernel(T* datt, const T* att, int64_t rows, int T_) {
  const int64_t row = blockIdx.x * int64_t{kRowsPerBlock} + threadIdx.x / kWarpSize;
  if (row >= rows) return;
  const int lane = threadIdx.x % kWarpSize;
  const int i = static_cast<int>(row % T_);
  const T* p = att + row * T_;
  T* d = datt + row * T_;
  float dot = 0.0f;
  for (int j = lane; j <= i; j += kWarpSize) dot += to_f32(p[j]) * to_f32(d[j]);
  dot = warp_reduce(dot, Add());
  for (int j = lane; j < T_; j += kWarpSize) d[j] = from_f32<T>(j <= i ? to_f32(p[j]) * (to_f32(d[j]) - dot) : 0.0f);
}

template <typename T>
void rows_to_heads(T* dst, const T* src, int64_t ld, const Heads<T>& s, cudaStream_t stream) {
  rows_to_heads_kernel<<<grid_for(s.head_elems(), kBlock), kBlock, 0, stream>>>(dst, src, ld, s.B, s.T_, s.NH, s.hs);
  ST_CUDA_CHECK_LAUNCH();
}

template <typename T>
void heads_to_rows(T* dst, int64_t ld, const T* src, bool accumulate, const Heads<T>& s, cudaStream_t stream) {
  heads_to_rows_kernel<<<grid_for(s.head_elems(), kBlock), kBlock, 0, stream>>>(dst, ld, src, accumulate, s.B, s.T_,
                                                                                s.NH, s.hs);
  ST_CUDA_CHECK_LAUNCH();
}

unsigned softmax_grid(int64_t rows) { return static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock); }

}  // namespace

template <typename T>
size_t attention_forward_scratch_bytes(int B, int T_, int C, int NH) {
  return 3 * region_bytes(static_cast<int64_t>(B) * T_ * C, sizeof(T));
}

template <typename T>
size_t attention_backward_scratch_bytes(int B, int T_, int C, int NH) {
  return 6 * region_bytes(static_cast<int64_t>(B) * T_ * C, sizeof(T)) +
         region_bytes(static_cast<int64_t>(B) * NH * T_ * T_, sizeof(T));
}

template <typename T>
void attention_forward(T* out, T* att, const T* qkv, int B, int T_, int C, int NH, const GpuContext& ctx) {
  const Heads<T> s = heads<T>(B, T_, C, NH);
  if (s.head_elems() == 0) return;
  check_context(ctx, attention_forward_scratch_bytes<T>(B, T_, C, NH), "attention_forward");
  const int64_t C3 = 3 * static_cast<int64_t>(C), hs = s.hs, TT = static_cast<int64_t>(T_) * T_;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  T* q = s.region(ctx.scratch, 0);
  T* k = s.region(ctx.scratch, 1);
  T* v = s.region(ctx.scratch, 2);
  T* y = q;  // q is dead once the scores are computed
  rows_to_heads(q, qkv, C3, s, ctx.stream);
  rows_to_heads(k, qkv + C, C3, s, ctx.stream);
  rows_to_heads(v, qkv + 2 * C, C3, s, ctx.stream);

  // att[T,T] = scale q[T,hs] k^T, per head.
  ctx.blas->gemm(false, true, T_, T_, hs, scale, q, hs, T_ * hs, k, hs, T_ * hs, 0.0f, att, T_, TT, s.batch(),
                 ctx.stream);
  causal_softmax_kernel<<<softmax_grid(s.att_elems() / T_), kBlock, 0, ctx.stream>>>(att, s.att_elems() / T_, T_);
  ST_CUDA_CHECK_LAUNCH();
  // y[T,hs] = att[T,T] v[T,hs]; the zeros above the diagonal apply the mask.
  ctx.blas->gemm(false, false, T_, hs, T_, 1.0f, att, T_, TT, v, hs, T_ * hs, 0.0f, y, hs, T_ * hs, s.batch(),
                 ctx.stream);
  heads_to_rows(out, C, y, /*accumulate=*/false, s, ctx.stream);
}

template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* att, int B, int T_, int C, int NH,
                        const GpuContext& ctx) {
  const Heads<T> s = heads<T>(B, T_, C, NH);
  if (s.head_elems() == 0) return;
  check_context(ctx, attention_backward_scratch_bytes<T>(B, T_, C, NH), "attention_backward");
  const int64_t C3 = 3 * static_cast<int64_t>(C), hs = s.hs, TT = static_cast<int64_t>(T_) * T_;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  T* q = s.region(ctx.scratch, 0);
  T* k = s.region(ctx.scratch, 1);
  T* v = s.region(ctx.scratch, 2);
  T* dy = s.region(ctx.scratch, 3);
  T* dq = dy;  // dy is dead once dP and dv are computed
  T* dk = s.region(ctx.scratch, 4);
  T* dv = s.region(ctx.scratch, 5);
  T* datt = s.region(ctx.scratch, 6);
  rows_to_heads(q, qkv, C3, s, ctx.stream);
  rows_to_heads(k, qkv + C, C3, s, ctx.stream);
  rows_to_heads(v, qkv + 2 * C, C3, s, ctx.stream);
  rows_to_heads(dy, dout, C, s, ctx.stream);
  const int batch = s.batch();
  Blas& blas = *ctx.blas;

  // y = P v:  dP[T,T] = dy[T,hs] v^T;  dv[T,hs] = P^T dy.
  blas.gemm(false, true, T_, T_, hs, 1.0f, dy, hs, T_ * hs, v, hs, T_ * hs, 0.0f, datt, T_, TT, batch, ctx.stream);
  blas.gemm(true, false, T_, hs, T_, 1.0f, att, T_, TT, dy, hs, T_ * hs, 0.0f, dv, hs, T_ * hs, batch, ctx.stream);
  causal_softmax_backward_kernel<<<softmax_grid(s.att_elems() / T_), kBlock, 0, ctx.stream>>>(datt, att,
                                                                                              s.att_elems() / T_, T_);
  ST_CUDA_CHECK_LAUNCH();
  // S = scale q k^T:  dq[T,hs] = scale dS k;  dk[T,hs] = scale dS^T q.
  blas.gemm(false, false, T_, hs, T_, scale, datt, T_, TT, k, hs, T_ * hs, 0.0f, dq, hs, T_ * hs, batch, ctx.stream);
  blas.gemm(true, false, T_, hs, T_, scale, datt, T_, TT, q, hs, T_ * hs, 0.0f, dk, hs, T_ * hs, batch, ctx.stream);

  heads_to_rows(dqkv, C3, dq, /*accumulate=*/true, s, ctx.stream);
  heads_to_rows(dqkv + C, C3, dk, /*accumulate=*/true, s, ctx.stream);
  heads_to_rows(dqkv + 2 * C, C3, dv, /*accumulate=*/true, s, ctx.stream);
}

#define ST_INSTANTIATE_ATTENTION(T)                                                                             \
  template void attention_forward<T>(T*, T*, const T*, int, int, int, int, const GpuContext&);                  \
  template void attention_backward<T>(T*, const T*, const T*, const T*, int, int, int, int, const GpuContext&); \
  template size_t attention_forward_scratch_bytes<T>(int, int, int, int);                                       \
  template size_t attention_backward_scratch_bytes<T>(int, int, int, int);

ST_INSTANTIATE_ATTENTION(float)
ST_INSTANTIATE_ATTENTION(bf16)
ST_INSTANTIATE_ATTENTION(fp16)
#undef ST_INSTANTIATE_ATTENTION

}  // namespace st::gpu
