#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "gpu_pack.cuh"
#include "shardtrain/core/error.h"
#include "shardtrain/kernels/gpu/flash_attention.h"

namespace st::gpu {

using namespace kernels_internal;  // gpu_pack.cuh

// One file of about 940 lines on purpose: the three tensor-core kernels share the PTX wrappers, the tile loaders and
// the warp-level products below (one dynamic shared-memory layout, one accumulator layout), all inlined into each
// kernel; splitting them would only move those helpers into a header of their own, shared by nothing else.
//
// Two implementations of one contract (see the header):
//
// Tensor-core path (T = bf16/fp16, hs in {16, 32, 64, 128}). A block has 4 warps; each warp owns 16 rows of
// the block's 64-row tile and computes its 16 x N products with mma.sync m16n8k16 (fp32 accumulators),
// operands fetched from shared memory by ldmatrix. Shared-memory rows are padded by 8 elements (16 bytes) so
// the 8 row addresses of an ldmatrix fall in distinct banks. Tiles arrive by cp.async, zero-filled past T.
//   forward:   block = (64 queries, head, batch); loops over the key tiles 0..diagonal (tiles wholly above
//              the diagonal are never visited; only the diagonal tile is masked). The next K tile loads while
//              the softmax and P V run, the next V tile while the next Q K^T runs.
//   dk/dv:     block = (64 keys, K/V head, batch); loops over the query heads that share the K/V head (one,
//              without grouping), in order, and for each over the query tiles from the diagonal down,
//              recomputing P^T = exp(K Q^T * scale - lse) and accumulating dV += P^T dO, dK += dS^T Q in
//              registers: a K/V head's gradient sums its query heads without atomics or partial buffers.
//   dq:        block = (64 queries, head, batch); loops over the key tiles up to the diagonal, accumulating
//              dQ += dS K in registers.
// The streamed tiles of the backward kernels are double-buffered; at hs = 128 they have 32 rows instead of 64,
// which keeps the two 16 x 128 fp32 accumulators of dk/dv (128 registers per thread) from spilling.
// Splitting dq from dk/dv recomputes P and dP once more, but every output element then has one owner that
// sums in a fixed order: no atomics, bit-reproducible.
//
// Generic path (anything else, in particular T = float for the fp32 parity tests): one warp per row (query
// row for forward and dq, key row of a K/V head for dk/dv, over its query heads in order), lanes over 32 keys (queries)
// at a time for the dot products and over the head dimension for the accumulations, fp32 throughout, the same fixed
// orders. Simple and slow.

namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kWarpRows = 16;              // rows of an mma A operand: the rows one warp owns
constexpr int kTile = kWarps * kWarpRows;  // 64: rows a block owns
constexpr int kPad = 8;                    // elements of padding per shared-memory row (16 bytes)
constexpr unsigned kFullMask = 0xffffffffu;

struct Max {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// All dynamic shared memory of this file, under one name and type (different extern __shared__ declarations
// of one name would conflict).
__device__ __forceinline__ unsigned char* dynamic_smem() {
  extern __shared__ __align__(16) unsigned char st_flash_smem[];
  return st_flash_smem;
}

// ---------------------------------------------------------------------------------------------------------------
// PTX wrappers. The ones that touch shared memory are volatile so they are neither hoisted out of loops nor
// merged across the barriers between tile refills.

// smem_addr and the cp.async wrappers are in gpu_pack.cuh.

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, register i receives it: lane l
// holds row l/4, columns 2(l%4) and 2(l%4)+1 (with .trans: rows 2(l%4) and 2(l%4)+1 of column l/4).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// d[16x8] += a[16x16] b[16x8], fp32 accumulators.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, bf16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    static_assert(std::is_same_v<T, fp16>, "tensor-core path: T must be bf16 or fp16");
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats rounded to T, `lo` in the low half (the lower column index of an mma operand register).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t u;
  if constexpr (std::is_same_v<T, bf16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    memcpy(&u, &v, sizeof(u));
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    memcpy(&u, &v, sizeof(u));
  }
  return u;
}

// ---------------------------------------------------------------------------------------------------------------
// Tiles and warp-level products.

// Rows [row0, row0 + kRows) of a row-major matrix with leading dimension ld (columns [0, kHs) at g) into
// shared memory s with row stride kHs + kPad, by cp.async; rows >= T_ are zero-filled. The caller commits.
template <int kRows, int kHs, typename T>
__device__ __forceinline__ void load_tile(T* s, const T* g, int64_t ld, int row0, int T_) {
  constexpr int kChunks = kHs * static_cast<int>(sizeof(T)) / 16;  // 16-byte chunks per row
  constexpr int kStride = kHs + kPad;
#pragma unroll
  for (int c0 = 0; c0 < kRows * kChunks; c0 += kThreads) {
    const int c = c0 + static_cast<int>(threadIdx.x);
    if (c < kRows * kChunks) {
      const int r = c / kChunks, col = c % kChunks * 8;
      const int t = row0 + r;
      const bool valid = t < T_;
      cp_async_16(s + r * kStride + col, g + static_cast<int64_t>(valid ? t : 0) * ld + col, valid);
    }
  }
}

// acc[16 x kN] = A[16 x kK] B[kN x kK]^T. A's 16 rows start at sA, B's kN rows at sB, both row-major with row
// stride kStride. acc is in the mma accumulator layout: acc[n][c] is at row l/4 + 8(c/2), column
// 8n + 2(l%4) + c%2 for lane l.
template <typename T, int kK, int kN, int kStride>
__device__ __forceinline__ void warp_mma_abt(float (&acc)[kN / 8][4], const T* sA, const T* sB) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
#pragma unroll
  for (int n = 0; n < kN / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
  for (int k = 0; k < kK; k += 16) {
    uint32_t a[4];  // rows 0-7 / 8-15 x columns k..k+7 / k+8..k+15
    ldmatrix_x4(a, sA + (lane % 16) * kStride + k + lane / 16 * 8);
#pragma unroll
    for (int n = 0; n < kN; n += 16) {
      // B rows n..n+7 x (k.., k+8..), then rows n+8..n+15 x (k.., k+8..): the col-major k x 8 operands of the
      // n-tiles n and n+8.
      uint32_t b[4];
      ldmatrix_x4(b, sB + (n + lane % 8 + lane / 16 * 8) * kStride + k + lane / 8 % 2 * 8);
      mma_16816<T>(acc[n / 8], a, b[0], b[1]);
      mma_16816<T>(acc[n / 8 + 1], a, b[2], b[3]);
    }
  }
}

// acc[16 x kN] += P[16 x kK] B[kK x kN]. P is a warp_mma_abt-layout fp32 tile, rounded to T here (the
// accumulator layout of two adjacent n-tiles is the A operand layout of one k-step, so no data moves); B's kK
// rows start at sB, row-major with row stride kStride, read transposed by ldmatrix.
template <typename T, int kK, int kN, int kStride>
__device__ __forceinline__ void warp_mma_pb(float (&acc)[kN / 8][4], const float (&p)[kK / 8][4], const T* sB) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
#pragma unroll
  for (int k = 0; k < kK; k += 16) {
    const uint32_t a[4] = {pack2<T>(p[k / 8][0], p[k / 8][1]), pack2<T>(p[k / 8][2], p[k / 8][3]),
                           pack2<T>(p[k / 8 + 1][0], p[k / 8 + 1][1]), pack2<T>(p[k / 8 + 1][2], p[k / 8 + 1][3])};
#pragma unroll
    for (int n = 0; n < kN; n += 16) {
      // B rows k..k+7 / k+8..k+15 x columns n..n+7, then x columns n+8..n+15.
      uint32_t b[4];
      ldmatrix_x4_trans(b, sB + (k + lane % 8 + lane / 8 % 2 * 8) * kStride + n + lane / 16 * 8);
      mma_16816<T>(acc[n / 8], a, b[0], b[1]);
      mma_16816<T>(acc[n / 8 + 1], a, b[2], b[3]);
    }
  }
}

// f(value, half, row, column) for each accumulator value of a 16 x kN warp tile; half = row / 8 is a
// compile-time index once unrolled (for per-row registers), row and column are relative to the tile.
template <int kN, typename F>
__device__ __forceinline__ void for_each_acc(float (&acc)[kN / 8][4], F&& f) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
#pragma unroll
  for (int n = 0; n < kN / 8; ++n) {
#pragma unroll
    for (int c = 0; c < 4; ++c) f(acc[n][c], c / 2, lane / 4 + 8 * (c / 2), 8 * n + 2 * (lane % 4) + c % 2);
  }
}

// p[0..1] (+)= x0, x1 at a 4-byte aligned pair of T, in fp32, rounded once.
template <typename T>
__device__ __forceinline__ void add_pair(T* p, float x0, float x1) {
  float x[2];
  load<2>(p, x);
  x[0] += x0;
  x[1] += x1;
  store<2>(p, x);
}

template <int kHs>
struct Stride {
  static constexpr int value = kHs + kPad;
};

// Element offsets of a head's column block in the first row of batch b: qkv rows are [NH q heads | NKV k heads |
// NKV v heads] of hs values (row stride ld), out/dout rows [NH heads] (row stride C). Query head h reads K/V
// head h / group.
struct QkvLayout {
  int64_t C, ld, to_v;  // out's row stride, qkv's row stride, a K head's offset to its V head
  int hs, group;
  __host__ __device__ QkvLayout(int NH, int NKV, int hs_)
      : C(static_cast<int64_t>(NH) * hs_),
        ld(static_cast<int64_t>(NH + 2 * NKV) * hs_),
        to_v(static_cast<int64_t>(NKV) * hs_),
        hs(hs_),
        group(NH / NKV) {}
  __device__ int64_t q(int b, int T_, int h) const {
    return static_cast<int64_t>(b) * T_ * ld + static_cast<int64_t>(h) * hs;
  }
  __device__ int64_t k_head(int b, int T_, int kvh) const {
    return static_cast<int64_t>(b) * T_ * ld + C + static_cast<int64_t>(kvh) * hs;
  }
  __device__ int64_t v_head(int b, int T_, int kvh) const { return k_head(b, T_, kvh) + to_v; }
  __device__ int64_t k(int b, int T_, int h) const { return k_head(b, T_, h / group); }
  __device__ int64_t v(int b, int T_, int h) const { return v_head(b, T_, h / group); }
  __device__ int64_t o(int b, int T_, int h) const {
    return static_cast<int64_t>(b) * T_ * C + static_cast<int64_t>(h) * hs;
  }
};

// ---------------------------------------------------------------------------------------------------------------
// Tensor-core forward.

template <typename T, int kHs>
constexpr size_t forward_smem_bytes() {
  return static_cast<size_t>(3 * kTile * Stride<kHs>::value) * sizeof(T);  // Q, K, V tiles of 64 rows
}

template <typename T, int kHs>
__global__ void __launch_bounds__(kThreads)
    flash_forward_kernel(T* __restrict__ out, float* __restrict__ lse, const T* __restrict__ qkv, int T_, int NH,
                         int NKV, float scale) {
  constexpr int kS = Stride<kHs>::value;
  T* sQ = reinterpret_cast<T*>(dynamic_smem());
  T* sK = sQ + kTile * kS;
  T* sV = sK + kTile * kS;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize, lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int h = blockIdx.y, b = blockIdx.z;
  // Longest rows (most key tiles) first, so the short ones fill the tail of the grid.
  const int q0 = (static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x)) * kTile;
  const int qw = q0 + warp * kWarpRows;  // this warp's first query
  const QkvLayout lay(NH, NKV, kHs);
  const int64_t ld = lay.ld;
  const T* q_g = qkv + lay.q(b, T_, h);
  const T* k_g = qkv + lay.k(b, T_, h);
  const T* v_g = qkv + lay.v(b, T_, h);
  const float sl2 = scale * kLog2e;  // exp(x * scale) = exp2(x * sl2)

  load_tile<kTile, kHs>(sQ, q_g, ld, q0, T_);
  load_tile<kTile, kHs>(sK, k_g, ld, 0, T_);
  cp_async_commit();
  load_tile<kTile, kHs>(sV, v_g, ld, 0, T_);
  cp_async_commit();

  float o[kHs / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY};  // running max of the unscaled scores of rows l/4 and l/4 + 8
  float l[2] = {0.0f, 0.0f};            // running sum of this thread's share of exp, relative to m
  const int nk = q0 / kTile + 1;        // key tiles 0..diagonal (key and query tiles coincide)
  for (int jk = 0; jk < nk; ++jk) {
    const int k0 = jk * kTile;
    cp_async_wait<1>();  // this thread's copies of K tile jk (and Q) landed ...
    __syncthreads();     // ... and everyone else's
    float s[kTile / 8][4];
    warp_mma_abt<T, kHs, kTile, kS>(s, sQ + warp * kWarpRows * kS, sK);
    __syncthreads();  // every warp is done with sK
    if (jk + 1 < nk) load_tile<kTile, kHs>(sK, k_g, ld, k0 + kTile, T_);
    cp_async_commit();  // possibly empty: keeps the wait<1> counts uniform

    if (jk == nk - 1) {  // the diagonal tile: keys > query (including keys >= T_) are masked
      for_each_acc<kTile>(s, [&](float& x, int, int r, int c) {
        if (k0 + c > qw + r) x = -INFINITY;
      });
    }
    // Online softmax. Every row has an unmasked score in every visited tile (key k0 <= its query), so the max
    // is finite and exp2(-inf) = 0 takes care of the masked ones and of the first tile's m = -inf.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < kTile / 8; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 1));  // the 4 lanes of a quad share a row
      mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 2));
      const float m_new = fmaxf(m[r], mx);
      const float corr = exp2f((m[r] - m_new) * sl2);
      const float base = m_new * sl2;
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < kTile / 8; ++n) {
#pragma unroll
        for (int c = 2 * r; c < 2 * r + 2; ++c) {
          s[n][c] = exp2f(fmaf(s[n][c], sl2, -base));
          sum += s[n][c];
        }
      }
      l[r] = l[r] * corr + sum;
      m[r] = m_new;
#pragma unroll
      for (int d = 0; d < kHs / 8; ++d) {
        o[d][2 * r] *= corr;
        o[d][2 * r + 1] *= corr;
      }
    }

    cp_async_wait<1>();  // V tile jk
    __syncthreads();
    warp_mma_pb<T, kTile, kHs, kS>(o, s, sV);
    __syncthreads();  // every warp is done with sV
    if (jk + 1 < nk) load_tile<kTile, kHs>(sV, v_g, ld, k0 + kTile, T_);
    cp_async_commit();
  }

  const int64_t lse_row0 = (static_cast<int64_t>(b) * NH + h) * T_;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = l[r];
    sum += __shfl_xor_sync(kFullMask, sum, 1);
    sum += __shfl_xor_sync(kFullMask, sum, 2);
    const int q = qw + lane / 4 + 8 * r;
    if (q < T_) {
      const float inv = 1.0f / sum;
      T* o_g = out + (static_cast<int64_t>(b) * T_ + q) * lay.C + static_cast<int64_t>(h) * kHs + 2 * (lane % 4);
#pragma unroll
      for (int d = 0; d < kHs / 8; ++d) {
        const float x[2] = {o[d][2 * r] * inv, o[d][2 * r + 1] * inv};
        store<2>(o_g + 8 * d, x);
      }
      if (lane % 4 == 0) lse[lse_row0 + q] = m[r] * scale + logf(sum);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Tensor-core backward.

// Rows of the tiles a backward block streams through (query tiles for dk/dv, key tiles for dq).
template <int kHs>
struct Inner {
  static constexpr int value = kHs == 128 ? 32 : 64;
};

template <typename T, int kHs>
constexpr size_t dkdv_smem_bytes() {
  constexpr int kS = Stride<kHs>::value, kIn = Inner<kHs>::value;
  // K, V of the block; Q, dO double-buffered; lse, D double-buffered.
  return static_cast<size_t>((2 * kTile + 4 * kIn) * kS) * sizeof(T) + 4 * kIn * sizeof(float);
}

template <typename T, int kHs>
constexpr size_t dq_smem_bytes() {
  constexpr int kS = Stride<kHs>::value, kIn = Inner<kHs>::value;
  return static_cast<size_t>((2 * kTile + 4 * kIn) * kS) * sizeof(T);  // Q, dO of the block; K, V double-buffered
}

template <typename T, int kHs>
__global__ void __launch_bounds__(kThreads)
    flash_backward_dkdv_kernel(T* __restrict__ dqkv, const T* __restrict__ dout, const T* __restrict__ qkv,
                               const float* __restrict__ lse, const float* __restrict__ D, int T_, int NH, int NKV,
                               float scale) {
  constexpr int kS = Stride<kHs>::value, kIn = Inner<kHs>::value;
  T* sK = reinterpret_cast<T*>(dynamic_smem());
  T* sV = sK + kTile * kS;
  T* sQ = sV + kTile * kS;                                   // [2][kIn][kS]
  T* sdO = sQ + 2 * kIn * kS;                                // [2][kIn][kS]
  float* sL = reinterpret_cast<float*>(sdO + 2 * kIn * kS);  // [2][kIn]: lse * log2(e), +inf past T_
  float* sD = sL + 2 * kIn;                                  // [2][kIn]: D, 0 past T_
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize, lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int kvh = blockIdx.y, b = blockIdx.z;           // the block's K/V head
  const int k0 = static_cast<int>(blockIdx.x) * kTile;  // tile 0 (the most query tiles) first
  const int kw = k0 + warp * kWarpRows;                 // this warp's first key
  const QkvLayout lay(NH, NKV, kHs);
  const int64_t ld = lay.ld;
  const int group = NH / NKV;  // query heads kvh * group .. kvh * group + group - 1 read this K/V head
  const float sl2 = scale * kLog2e;

  const int iq0 = k0 / kIn;  // the query tile starting at k0: every earlier query precedes every key here
  const int nq = (T_ + kIn - 1) / kIn;
  const int nqh = nq - iq0;  // query tiles per query head
  const int n_steps = group * nqh;

  // Step `step` (query head kvh * group + step / nqh, query tile iq0 + step % nqh) into buffer buf. The plain
  // stores of lse/D are ordered by the same barriers as the cp.async copies: each buffer is refilled only after
  // the barrier that ends the iteration reading it.
  auto load_queries = [&](int step, int buf) {
    const int h = kvh * group + step / nqh;
    const int q0 = (iq0 + step % nqh) * kIn;
    const int64_t row0 = (static_cast<int64_t>(b) * NH + h) * T_;
    load_tile<kIn, kHs>(sQ + buf * kIn * kS, qkv + lay.q(b, T_, h), ld, q0, T_);
    load_tile<kIn, kHs>(sdO + buf * kIn * kS, dout + lay.o(b, T_, h), lay.C, q0, T_);
    for (int i = static_cast<int>(threadIdx.x); i < kIn; i += kThreads) {
      const int q = q0 + i;
      // +inf: P = exp2(s * sl2 - inf) = 0 for the zero-filled queries past T_, so they add nothing.
      sL[buf * kIn + i] = q < T_ ? lse[row0 + q] * kLog2e : INFINITY;
      sD[buf * kIn + i] = q < T_ ? D[row0 + q] : 0.0f;
    }
  };

  load_tile<kTile, kHs>(sK, qkv + lay.k_head(b, T_, kvh), ld, k0, T_);
  load_tile<kTile, kHs>(sV, qkv + lay.v_head(b, T_, kvh), ld, k0, T_);
  load_queries(0, 0);
  cp_async_commit();

  // The query heads of the group, one after the other, each over its query tiles in order: one fixed summation
  // order into the registers, whatever the grouping.
  float dk[kHs / 8][4] = {}, dv[kHs / 8][4] = {};
  for (int step = 0; step < n_steps; ++step) {
    const int buf = step & 1;
    if (step + 1 < n_steps) load_queries(step + 1, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();  // tile iq (and K, V) landed
    __syncthreads();
    const T* sQb = sQ + buf * kIn * kS;
    const T* sdOb = sdO + buf * kIn * kS;
    const float* sLb = sL + buf * kIn;
    const float* sDb = sD + buf * kIn;
    const int q0 = (iq0 + step % nqh) * kIn;
    const bool diagonal = kw + kWarpRows - 1 > q0;  // some key of this warp follows some query of the tile

    // P^T = exp(K Q^T * scale - lse), 0 where key > query.
    float pt[kIn / 8][4];
    warp_mma_abt<T, kHs, kIn, kS>(pt, sK + warp * kWarpRows * kS, sQb);
    for_each_acc<kIn>(pt, [&](float& x, int, int r, int c) {
      x = (diagonal && kw + r > q0 + c) ? 0.0f : exp2f(fmaf(x, sl2, -sLb[c]));
    });
    warp_mma_pb<T, kIn, kHs, kS>(dv, pt, sdOb);  // dV += P^T dO

    // dS^T = P^T * (dP^T - D), dP^T = V dO^T.
    float dst[kIn / 8][4];
    warp_mma_abt<T, kHs, kIn, kS>(dst, sV + warp * kWarpRows * kS, sdOb);
#pragma unroll
    for (int n = 0; n < kIn / 8; ++n) {
#pragma unroll
      for (int c = 0; c < 4; ++c) dst[n][c] = pt[n][c] * (dst[n][c] - sDb[8 * n + 2 * (lane % 4) + c % 2]);
    }
    warp_mma_pb<T, kIn, kHs, kS>(dk, dst, sQb);  // dK += dS^T Q (times scale at the end)
    __syncthreads();  // every warp is done with buffer buf before the next iteration refills it
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = kw + lane / 4 + 8 * r;
    if (key < T_) {
      T* dk_g = dqkv + lay.k_head(b, T_, kvh) + key * ld + 2 * (lane % 4);
      T* dv_g = dk_g + lay.to_v;
#pragma unroll
      for (int d = 0; d < kHs / 8; ++d) {
        add_pair(dk_g + 8 * d, dk[d][2 * r] * scale, dk[d][2 * r + 1] * scale);
        add_pair(dv_g + 8 * d, dv[d][2 * r], dv[d][2 * r + 1]);
      }
    }
  }
}

template <typename T, int kHs>
__global__ void __launch_bounds__(kThreads)
    flash_backward_dq_kernel(T* __restrict__ dqkv, const T* __restrict__ dout, const T* __restrict__ qkv,
                             const float* __restrict__ lse, const float* __restrict__ D, int T_, int NH, int NKV,
                             float scale) {
  constexpr int kS = Stride<kHs>::value, kIn = Inner<kHs>::value;
  T* sQ = reinterpret_cast<T*>(dynamic_smem());
  T* sdO = sQ + kTile * kS;
  T* sK = sdO + kTile * kS;   // [2][kIn][kS]
  T* sV = sK + 2 * kIn * kS;  // [2][kIn][kS]
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize, lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int h = blockIdx.y, b = blockIdx.z;
  const int q0 = (static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x)) * kTile;  // longest first
  const int qw = q0 + warp * kWarpRows;
  const QkvLayout lay(NH, NKV, kHs);
  const int64_t ld = lay.ld;
  const T* q_g = qkv + lay.q(b, T_, h);
  const T* k_g = qkv + lay.k(b, T_, h);
  const T* v_g = qkv + lay.v(b, T_, h);
  const T* do_g = dout + lay.o(b, T_, h);
  const int64_t row0 = (static_cast<int64_t>(b) * NH + h) * T_;
  const float sl2 = scale * kLog2e;

  auto load_keys = [&](int jk, int buf) {
    load_tile<kIn, kHs>(sK + buf * kIn * kS, k_g, ld, jk * kIn, T_);
    load_tile<kIn, kHs>(sV + buf * kIn * kS, v_g, ld, jk * kIn, T_);
  };
  load_tile<kTile, kHs>(sQ, q_g, ld, q0, T_);
  load_tile<kTile, kHs>(sdO, do_g, lay.C, q0, T_);
  load_keys(0, 0);
  cp_async_commit();

  // This thread's rows l/4 and l/4 + 8: +inf lse past T_ makes their P (and dS) 0.
  float lse2[2], Dr[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int q = qw + lane / 4 + 8 * r;
    lse2[r] = q < T_ ? lse[row0 + q] * kLog2e : INFINITY;
    Dr[r] = q < T_ ? D[row0 + q] : 0.0f;
  }

  const int nk_all = (T_ + kIn - 1) / kIn;
  const int nk = min(nk_all, (q0 + kTile - 1) / kIn + 1);  // key tiles 0..the one holding the tile's last query
  float dq[kHs / 8][4] = {};
  for (int jk = 0; jk < nk; ++jk) {
    const int buf = jk & 1;
    if (jk + 1 < nk) load_keys(jk + 1, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();  // key tile jk (and Q, dO) landed
    __syncthreads();
    const T* sKb = sK + buf * kIn * kS;
    const T* sVb = sV + buf * kIn * kS;
    const int k0 = jk * kIn;
    const bool diagonal = k0 + kIn - 1 > qw;  // some key of the tile follows some query of this warp

    float p[kIn / 8][4];  // P = exp(Q K^T * scale - lse), 0 where key > query
    warp_mma_abt<T, kHs, kIn, kS>(p, sQ + warp * kWarpRows * kS, sKb);
    for_each_acc<kIn>(p, [&](float& x, int half, int r, int c) {
      x = (diagonal && k0 + c > qw + r) ? 0.0f : exp2f(fmaf(x, sl2, -lse2[half]));
    });
    float ds[kIn / 8][4];  // dS = P * (dP - D), dP = dO V^T
    warp_mma_abt<T, kHs, kIn, kS>(ds, sdO + warp * kWarpRows * kS, sVb);
    for_each_acc<kIn>(ds, [&](float& x, int half, int, int) { x -= Dr[half]; });
#pragma unroll
    for (int n = 0; n < kIn / 8; ++n) {
#pragma unroll
      for (int c = 0; c < 4; ++c) ds[n][c] *= p[n][c];
    }
    warp_mma_pb<T, kIn, kHs, kS>(dq, ds, sKb);  // dQ += dS K (times scale at the end)
    __syncthreads();                            // every warp is done with buffer buf
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int q = qw + lane / 4 + 8 * r;
    if (q < T_) {
      T* dq_g = dqkv + lay.q(b, T_, h) + q * ld + 2 * (lane % 4);
#pragma unroll
      for (int d = 0; d < kHs / 8; ++d) add_pair(dq_g + 8 * d, dq[d][2 * r] * scale, dq[d][2 * r + 1] * scale);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// D[b,h,t] = dout[b,t,h-th head] . out[b,t,h-th head], fp32; one warp per (b, t, h), lanes over hs. Shared
// by both paths.

constexpr int kRowDotWarps = 8;

template <typename T>
__global__ void __launch_bounds__(kRowDotWarps* kWarpSize)
    row_dot_kernel(float* __restrict__ D, const T* __restrict__ dout, const T* __restrict__ out, int B, int T_, int NH,
                   int hs) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowDotWarps + threadIdx.x / kWarpSize;  // (b*T + t)*NH + h
  if (row >= static_cast<int64_t>(B) * T_ * NH) return;  // whole warps: the reduction needs every lane
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int h = static_cast<int>(row % NH);
  const int64_t bt = row / NH;
  const int64_t off = row * hs;  // = bt * C + h * hs
  float sum = 0.0f;
  for (int d = lane; d < hs; d += kWarpSize) sum += to_f32(dout[off + d]) * to_f32(out[off + d]);
  sum = warp_reduce(sum, Add());
  if (lane == 0) D[(bt / T_ * NH + h) * T_ + bt % T_] = sum;
}

// ---------------------------------------------------------------------------------------------------------------
// Generic path: one warp per row, fp32. Rows are flattened as ((b*NH + h)*T + i), the index of lse and D.

constexpr int kGenericWarps = 4;

struct RowIndex {
  int64_t row;  // (b*NH + h)*T + i
  int b, h, i;
};
__device__ __forceinline__ RowIndex row_index(int64_t row, int T_, int NH) {
  const int64_t bh = row / T_;
  return {row, static_cast<int>(bh / NH), static_cast<int>(bh % NH), static_cast<int>(row % T_)};
}

__device__ __forceinline__ float dot_row(const float* x, const float* y, int n) {
  float s = 0.0f;
  for (int d = 0; d < n; ++d) s += x[d] * y[d];
  return s;
}
template <typename T>
__device__ __forceinline__ float dot_row(const float* x, const T* y, int n) {
  float s = 0.0f;
  for (int d = 0; d < n; ++d) s += x[d] * to_f32(y[d]);
  return s;
}

// Shared floats per warp of each generic kernel.
__host__ __device__ inline int generic_forward_floats(int hs) { return 2 * hs + kWarpSize; }
__host__ __device__ inline int generic_dq_floats(int hs) { return 3 * hs + kWarpSize; }
__host__ __device__ inline int generic_dkdv_floats(int hs) { return 4 * hs + 2 * kWarpSize; }

template <typename T>
__global__ void __launch_bounds__(kGenericWarps* kWarpSize)
    generic_forward_kernel(T* __restrict__ out, float* __restrict__ lse, const T* __restrict__ qkv, int B, int T_,
                           int NH, int NKV, int hs, float scale) {
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize, lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kGenericWarps + warp;
  if (row >= static_cast<int64_t>(B) * NH * T_) return;  // whole warps only: no block barriers below
  const RowIndex ri = row_index(row, T_, NH);
  float* sq = reinterpret_cast<float*>(dynamic_smem()) + warp * generic_forward_floats(hs);
  float* acc = sq + hs;  // element d owned by lane d % 32
  float* sp = acc + hs;  // the current 32 probabilities
  const QkvLayout lay(NH, NKV, hs);
  const int64_t ld = lay.ld;
  const T* base = qkv + lay.q(ri.b, T_, ri.h);
  const T* k = qkv + lay.k(ri.b, T_, ri.h);
  const T* v = qkv + lay.v(ri.b, T_, ri.h);
  for (int d = lane; d < hs; d += kWarpSize) {
    sq[d] = to_f32(base[ri.i * ld + d]);
    acc[d] = 0.0f;
  }
  __syncwarp();

  float m = -INFINITY, l = 0.0f;  // running max and sum, identical in every lane
  for (int j0 = 0; j0 <= ri.i; j0 += kWarpSize) {
    const int j = j0 + lane;
    const float s = j <= ri.i ? dot_row(sq, k + j * ld, hs) * scale : -INFINITY;
    const float m_new = fmaxf(m, warp_reduce(s, Max()));  // finite: key j0 <= i
    const float p = j <= ri.i ? expf(s - m_new) : 0.0f;
    const float corr = expf(m - m_new);
    l = l * corr + warp_reduce(p, Add());
    m = m_new;
    sp[lane] = p;
    __syncwarp();
    const int n = min(kWarpSize, ri.i - j0 + 1);
    for (int d = lane; d < hs; d += kWarpSize) {
      float a = acc[d] * corr;
      for (int jj = 0; jj < n; ++jj) a += sp[jj] * to_f32(v[(j0 + jj) * ld + d]);
      acc[d] = a;
    }
    __syncwarp();  // sp is rewritten next round
  }
  const float inv = 1.0f / l;
  T* o = out + lay.o(ri.b, T_, ri.h) + ri.i * lay.C;
  for (int d = lane; d < hs; d += kWarpSize) o[d] = from_f32<T>(acc[d] * inv);
  if (lane == 0) lse[row] = m + logf(l);
}

// dq of query row i: sum over keys j <= i of dS_ij k_j, dS_ij = P_ij (dout_i . v_j - D_i).
template <typename T>
__global__ void __launch_bounds__(kGenericWarps* kWarpSize)
    generic_dq_kernel(T* __restrict__ dqkv, const T* __restrict__ dout, const T* __restrict__ qkv,
                      const float* __restrict__ lse, const float* __restrict__ D, int B, int T_, int NH, int NKV,
                      int hs, float scale) {
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize, lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kGenericWarps + warp;
  if (row >= static_cast<int64_t>(B) * NH * T_) return;
  const RowIndex ri = row_index(row, T_, NH);
  float* sq = reinterpret_cast<float*>(dynamic_smem()) + warp * generic_dq_floats(hs);
  float* sdo = sq + hs;
  float* dq = sdo + hs;  // element d owned by lane d % 32
  float* sds = dq + hs;
  const QkvLayout lay(NH, NKV, hs);
  const int64_t ld = lay.ld;
  const T* base = qkv + lay.q(ri.b, T_, ri.h);
  const T* k = qkv + lay.k(ri.b, T_, ri.h);
  const T* v = qkv + lay.v(ri.b, T_, ri.h);
  const T* dout_i = dout + lay.o(ri.b, T_, ri.h) + ri.i * lay.C;
  for (int d = lane; d < hs; d += kWarpSize) {
    sq[d] = to_f32(base[ri.i * ld + d]);
    sdo[d] = to_f32(dout_i[d]);
    dq[d] = 0.0f;
  }
  __syncwarp();
  const float lse_i = lse[row], D_i = D[row];
  for (int j0 = 0; j0 <= ri.i; j0 += kWarpSize) {
    const int j = j0 + lane;
    float ds = 0.0f;
    if (j <= ri.i) {
      const float p = expf(dot_row(sq, k + j * ld, hs) * scale - lse_i);
      ds = p * (dot_row(sdo, v + j * ld, hs) - D_i);
    }
    sds[lane] = ds;
    __syncwarp();
    const int n = min(kWarpSize, ri.i - j0 + 1);
    for (int d = lane; d < hs; d += kWarpSize) {
      float a = dq[d];
      for (int jj = 0; jj < n; ++jj) a += sds[jj] * to_f32(k[(j0 + jj) * ld + d]);
      dq[d] = a;
    }
    __syncwarp();
  }
  T* dst = dqkv + lay.q(ri.b, T_, ri.h) + ri.i * ld;
  for (int d = lane; d < hs; d += kWarpSize) dst[d] = from_f32<T>(to_f32(dst[d]) + dq[d] * scale);
}

// dk, dv of key row j of K/V head kvh: sums over the group's query heads h (in order) and queries i >= j of
// dS_ij q_i and P_ij dout_i. Rows are flattened as ((b*NKV + kvh)*T + j).
template <typename T>
__global__ void __launch_bounds__(kGenericWarps* kWarpSize)
    generic_dkdv_kernel(T* __restrict__ dqkv, const T* __restrict__ dout, const T* __restrict__ qkv,
                        const float* __restrict__ lse, const float* __restrict__ D, int B, int T_, int NH, int NKV,
                        int hs, float scale) {
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize, lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kGenericWarps + warp;
  if (row >= static_cast<int64_t>(B) * NKV * T_) return;
  const RowIndex ri = row_index(row, T_, NKV);  // ri.h is the K/V head, ri.i the key index
  float* sk = reinterpret_cast<float*>(dynamic_smem()) + warp * generic_dkdv_floats(hs);
  float* sv = sk + hs;
  float* dk = sv + hs;  // dk, dv: element d owned by lane d % 32
  float* dv = dk + hs;
  float* sp = dv + hs;
  float* sds = sp + kWarpSize;
  const QkvLayout lay(NH, NKV, hs);
  const int64_t ld = lay.ld;
  const T* k_j = qkv + lay.k_head(ri.b, T_, ri.h) + ri.i * ld;
  for (int d = lane; d < hs; d += kWarpSize) {
    sk[d] = to_f32(k_j[d]);
    sv[d] = to_f32(k_j[lay.to_v + d]);
    dk[d] = dv[d] = 0.0f;
  }
  __syncwarp();
  for (int h = ri.h * lay.group; h < (ri.h + 1) * lay.group; ++h) {
    const T* q = qkv + lay.q(ri.b, T_, h);
    const T* dout_b = dout + lay.o(ri.b, T_, h);
    const float* lse_bh = lse + (static_cast<int64_t>(ri.b) * NH + h) * T_;
    const float* D_bh = D + (static_cast<int64_t>(ri.b) * NH + h) * T_;
    for (int i0 = ri.i; i0 < T_; i0 += kWarpSize) {
      const int i = i0 + lane;
      float p = 0.0f, ds = 0.0f;
      if (i < T_) {
        p = expf(dot_row(sk, q + i * ld, hs) * scale - lse_bh[i]);
        ds = p * (dot_row(sv, dout_b + i * lay.C, hs) - D_bh[i]);
      }
      sp[lane] = p;
      sds[lane] = ds;
      __syncwarp();
      const int n = min(kWarpSize, T_ - i0);
      for (int d = lane; d < hs; d += kWarpSize) {
        float ak = dk[d], av = dv[d];
        for (int ii = 0; ii < n; ++ii) {
          ak += sds[ii] * to_f32(q[(i0 + ii) * ld + d]);
          av += sp[ii] * to_f32(dout_b[(i0 + ii) * lay.C + d]);
        }
        dk[d] = ak;
        dv[d] = av;
      }
      __syncwarp();
    }
  }
  T* dst = dqkv + lay.k_head(ri.b, T_, ri.h) + ri.i * ld;
  for (int d = lane; d < hs; d += kWarpSize) {
    dst[d] = from_f32<T>(to_f32(dst[d]) + dk[d] * scale);
    dst[lay.to_v + d] = from_f32<T>(to_f32(dst[lay.to_v + d]) + dv[d]);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Host side.

struct Shape {
  int B, T_, NH, NKV, hs;
  float scale;
  bool empty() const { return B == 0 || T_ == 0; }
  int64_t rows() const { return static_cast<int64_t>(B) * NH * T_; }      // (b, h, t) rows
  int64_t kv_rows() const { return static_cast<int64_t>(B) * NKV * T_; }  // (b, K/V head, t) rows
};

Shape check_shape(int B, int T_, int NH, int NKV, int hs, const char* what) {
  ST_CHECK(B >= 0 && T_ >= 0, what, ": B = ", B, ", T = ", T_, " must be >= 0");
  ST_CHECK(NH > 0 && NKV > 0 && NH % NKV == 0, what, ": NH = ", NH, " is not a positive multiple of NKV = ", NKV);
  ST_CHECK(hs > 0, what, ": head size hs = ", hs, " must be > 0");
  return Shape{B, T_, NH, NKV, hs, 1.0f / std::sqrt(static_cast<float>(hs))};
}

// The GPT-2 form: NKV = NH heads of size C / NH.
void check_heads(int C, int NH, const char* what) {
  ST_CHECK(NH > 0 && C > 0 && C % NH == 0, what, ": C = ", C, " is not a positive multiple of NH = ", NH);
}

// The tensor-core kernels need T = bf16/fp16, an instantiated head size, and 16-byte aligned bases for their
// 16-byte copies (with hs a multiple of 8, every row and head offset then stays aligned).
template <typename T, typename... Ptrs>
bool use_tensor_cores(int hs, const Ptrs*... ptrs) {
  if constexpr (std::is_same_v<T, float>) {
    return false;
  } else {
    return (hs == 16 || hs == 32 || hs == 64 || hs == 128) && all_aligned(16, ptrs...);
  }
}

// Calls f(std::integral_constant<int, hs>()) for an instantiated head size.
template <typename F>
void dispatch_head_size(int hs, F&& f) {
  switch (hs) {
    case 16:
      f(std::integral_constant<int, 16>());
      break;
    case 32:
      f(std::integral_constant<int, 32>());
      break;
    case 64:
      f(std::integral_constant<int, 64>());
      break;
    case 128:
      f(std::integral_constant<int, 128>());
      break;
    default:
      ST_CHECK(false, "flash attention: no tensor-core kernel for head size ", hs);
  }
}

// Kernels default to 48 KB of dynamic shared memory; above that they must opt in, up to the device's limit.
template <typename Kernel>
void allow_smem(Kernel* kernel, size_t bytes, const char* what) {
  constexpr size_t kDefaultLimit = 48 * 1024;
  if (bytes <= kDefaultLimit) return;
  const size_t limit = smem_per_block_optin();
  ST_CHECK(bytes <= limit, what, " needs ", bytes, " bytes of shared memory per block; the device allows ", limit);
  ST_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

unsigned generic_grid(int64_t rows) { return static_cast<unsigned>((rows + kGenericWarps - 1) / kGenericWarps); }
size_t generic_smem(int floats_per_warp) {
  return static_cast<size_t>(kGenericWarps) * floats_per_warp * sizeof(float);
}

// Blocks of the tensor-core kernels: (64-row tiles, heads, batch); heads = NH (query heads) or NKV (K/V heads).
dim3 tile_grid(const Shape& s, int heads) {
  ST_CHECK(s.B <= 65535 && heads <= 65535, "flash attention: B = ", s.B, " and ", heads, " heads must be <= 65535");
  return dim3(static_cast<unsigned>((s.T_ + kTile - 1) / kTile), static_cast<unsigned>(heads),
              static_cast<unsigned>(s.B));
}

}  // namespace

template <typename T>
void flash_attention_forward(T* out, float* lse, const T* qkv, int B, int T_, int NH, int NKV, int hs,
                             const GpuContext& ctx) {
  const Shape s = check_shape(B, T_, NH, NKV, hs, "flash_attention_forward");
  if (s.empty()) return;
  if (use_tensor_cores<T>(s.hs, out, qkv)) {
    if constexpr (!std::is_same_v<T, float>) {
      dispatch_head_size(s.hs, [&](auto hs_c) {
        constexpr int kHs = decltype(hs_c)::value;
        constexpr size_t smem = forward_smem_bytes<T, kHs>();
        allow_smem(flash_forward_kernel<T, kHs>, smem, "flash_forward_kernel");
        flash_forward_kernel<T, kHs>
            <<<tile_grid(s, NH), kThreads, smem, ctx.stream>>>(out, lse, qkv, T_, NH, NKV, s.scale);
        ST_CUDA_CHECK_LAUNCH();
      });
    }
  } else {
    const size_t smem = generic_smem(generic_forward_floats(s.hs));
    allow_smem(generic_forward_kernel<T>, smem, "generic_forward_kernel");
    generic_forward_kernel<T><<<generic_grid(s.rows()), kGenericWarps * kWarpSize, smem, ctx.stream>>>(
        out, lse, qkv, B, T_, NH, NKV, hs, s.scale);
    ST_CUDA_CHECK_LAUNCH();
  }
}

template <typename T>
void flash_attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse, int B, int T_,
                              int NH, int NKV, int hs, const GpuContext& ctx) {
  const Shape s = check_shape(B, T_, NH, NKV, hs, "flash_attention_backward");
  if (s.empty()) return;
  const size_t need = flash_attention_backward_scratch_bytes(B, T_, NH, NKV, hs);
  ST_CHECK(ctx.scratch != nullptr && ctx.scratch_bytes >= need, "flash_attention_backward needs ", need,
           " bytes of scratch; GpuContext has ", ctx.scratch_bytes);
  float* D = static_cast<float*>(ctx.scratch);

  constexpr int kRowDotBlock = kRowDotWarps * kWarpSize;
  row_dot_kernel<T>
      <<<static_cast<unsigned>((s.rows() + kRowDotWarps - 1) / kRowDotWarps), kRowDotBlock, 0, ctx.stream>>>(
          D, dout, out, B, T_, NH, s.hs);
  ST_CUDA_CHECK_LAUNCH();

  if (use_tensor_cores<T>(s.hs, dqkv, dout, qkv)) {
    if constexpr (!std::is_same_v<T, float>) {
      dispatch_head_size(s.hs, [&](auto hs_c) {
        constexpr int kHs = decltype(hs_c)::value;
        constexpr size_t dkdv_smem = dkdv_smem_bytes<T, kHs>(), dq_smem = dq_smem_bytes<T, kHs>();
        allow_smem(flash_backward_dkdv_kernel<T, kHs>, dkdv_smem, "flash_backward_dkdv_kernel");
        allow_smem(flash_backward_dq_kernel<T, kHs>, dq_smem, "flash_backward_dq_kernel");
        flash_backward_dkdv_kernel<T, kHs>
            <<<tile_grid(s, NKV), kThreads, dkdv_smem, ctx.stream>>>(dqkv, dout, qkv, lse, D, T_, NH, NKV, s.scale);
        ST_CUDA_CHECK_LAUNCH();
        flash_backward_dq_kernel<T, kHs>
            <<<tile_grid(s, NH), kThreads, dq_smem, ctx.stream>>>(dqkv, dout, qkv, lse, D, T_, NH, NKV, s.scale);
        ST_CUDA_CHECK_LAUNCH();
      });
    }
  } else {
    const size_t dkdv_smem = generic_smem(generic_dkdv_floats(s.hs)), dq_smem = generic_smem(generic_dq_floats(s.hs));
    allow_smem(generic_dkdv_kernel<T>, dkdv_smem, "generic_dkdv_kernel");
    allow_smem(generic_dq_kernel<T>, dq_smem, "generic_dq_kernel");
    generic_dkdv_kernel<T><<<generic_grid(s.kv_rows()), kGenericWarps * kWarpSize, dkdv_smem, ctx.stream>>>(
        dqkv, dout, qkv, lse, D, B, T_, NH, NKV, hs, s.scale);
    ST_CUDA_CHECK_LAUNCH();
    generic_dq_kernel<T><<<generic_grid(s.rows()), kGenericWarps * kWarpSize, dq_smem, ctx.stream>>>(
        dqkv, dout, qkv, lse, D, B, T_, NH, NKV, hs, s.scale);
    ST_CUDA_CHECK_LAUNCH();
  }
}

template <typename T>
void flash_attention_forward(T* out, float* lse, const T* qkv, int B, int T_, int C, int NH, const GpuContext& ctx) {
  check_heads(C, NH, "flash_attention_forward");
  flash_attention_forward<T>(out, lse, qkv, B, T_, NH, NH, C / NH, ctx);
}

template <typename T>
void flash_attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse, int B, int T_,
                              int C, int NH, const GpuContext& ctx) {
  check_heads(C, NH, "flash_attention_backward");
  flash_attention_backward<T>(dqkv, dout, qkv, out, lse, B, T_, NH, NH, C / NH, ctx);
}

#define ST_INSTANTIATE_FLASH_ATTENTION(T)                                                                            \
  template void flash_attention_forward<T>(T*, float*, const T*, int, int, int, int, int, const GpuContext&);        \
  template void flash_attention_backward<T>(T*, const T*, const T*, const T*, const float*, int, int, int, int, int, \
                                            const GpuContext&);                                                      \
  template void flash_attention_forward<T>(T*, float*, const T*, int, int, int, int, const GpuContext&);             \
  template void flash_attention_backward<T>(T*, const T*, const T*, const T*, const float*, int, int, int, int,      \
                                            const GpuContext&);

ST_INSTANTIATE_FLASH_ATTENTION(float)
ST_INSTANTIATE_FLASH_ATTENTION(bf16)
ST_INSTANTIATE_FLASH_ATTENTION(fp16)
#undef ST_INSTANTIATE_FLASH_ATTENTION

}  // namespace st::gpu
