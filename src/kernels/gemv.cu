#include "gemv.cuh"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <set>
#include <type_traits>
#include <utility>

#include "gpu_pack.cuh"
#include "shardtrain/core/error.h"

namespace st::gpu::kernels_internal {
namespace {

// A decoding step's products read each weight once and do two flops per element: their time is the weights' bytes
// over the memory bandwidth, if enough of them are in flight. A warp computes output columns o, o + warps, ... (warps
// the grid's): its lanes stream W's row o in packs (16 bytes), kDepth packs each in flight at once, every row of x
// against them, fp32 sums reduced across the warp; then residual + bias + product, rounded to T once (as the fused
// cuBLASLt epilogue rounds it). The next column's first packs are read before the sums are reduced and written, so
// that a warp's loads stay in flight from column to column; with the RMSNorm folded in, a warp takes the rows' sums
// of squares once for all its columns.
constexpr int kGemvWarps = 8;

// The blocks a multiprocessor holds at once with kDepth packs in flight a lane over kRows rows: registers for 2 (at
// most 128 a thread) with 8 packs or 4 rows, 3 with 4 packs over fewer rows (4 rows with the norm folded in take more
// than the 85 registers a thread of 3 blocks may have).
constexpr int min_blocks(int depth, int rows) { return depth >= 8 || rows >= 4 ? 2 : 3; }

// A pack of the weights, read with the evict-first hint: they are streamed once a forward through an L2 they do not
// fit, which had better keep the activations and the key/value caches.
template <int kVec, typename T>
__device__ __forceinline__ Pack<T, kVec> load_streaming(const T* p) {
  Pack<T, kVec> pk;
  if constexpr (sizeof(pk) == 16) {
    const uint4 v = __ldcs(reinterpret_cast<const uint4*>(p));
    memcpy(&pk, &v, sizeof(pk));
  } else {
    pk = *reinterpret_cast<const Pack<T, kVec>*>(p);
  }
  return pk;
}

// The L2 policy of streamed weights: evict first (as __ldcs reads them on the register path).
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
// cp_async_16 (gpu_pack.cuh) with an L2 policy.
__device__ __forceinline__ void cp_async_16_hinted(void* dst, const void* src, uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "l"(policy)
               : "memory");
}

// The bytes before a block's ring in its dynamic shared memory: the staged rows, rounded up to 16.
template <typename T>
__host__ __device__ constexpr size_t ring_offset(bool staged, int rows, int C) {
  return staged ? (sizeof(T) * static_cast<size_t>(rows) * static_cast<size_t>(C) + 15) / 16 * 16 : 0;
}
// A block's ring: kGemvRingStages chunks a warp of kDepth 16-byte packs a lane.
constexpr size_t ring_bytes(int depth) {
  return static_cast<size_t>(kGemvWarps) * kGemvRingStages * depth * kWarpSize * 16;
}

// The lane's kDepth packs of row w from element k0 on (those below C), all issued before any is used.
template <int kVec, int kDepth, typename T>
__device__ __forceinline__ void fetch_packs(Pack<T, kVec> (&wp)[kDepth], const T* w, int k0, int lane, int C) {
#pragma unroll
  for (int u = 0; u < kDepth; ++u) {
    const int k = k0 + lane * kVec + u * kWarpSize * kVec;
    if (k < C) wp[u] = load_streaming<kVec>(w + k);
  }
}

// rmsnorm_forward's sum of squares of row x: the lane's packs in order, then the butterfly.
template <int kVec, typename T>
__device__ __forceinline__ float inverse_rms(const T* x, int lane, int C, float eps) {
  float ss = 0.0f;
  for (int k = lane * kVec; k < C; k += kWarpSize * kVec) {
    float v[kVec];
    load<kVec>(x + k, v);
#pragma unroll
    for (int j = 0; j < kVec; ++j) ss += v[j] * v[j];
  }
  return 1.0f / sqrtf(warp_reduce(ss, Add()) / C + eps);
}

// acc[r] += the lane's kDepth packs wp of a column's elements from k0 on (those below C) times row r of x, the rows
// normalised here when kFold (the norm folded in, not staged), as rmsnorm_forward rounds them.
template <int kVec, bool kFold, int kRows, int kDepth, typename T>
__device__ __forceinline__ void add_packs(float (&acc)[kRows], const Pack<T, kVec> (&wp)[kDepth], const T* x,
                                          const T* norm_weight, const float (&rstd)[kRows], int k0, int lane, int C) {
  constexpr int kStride = kWarpSize * kVec;
#pragma unroll
  for (int u = 0; u < kDepth; ++u) {
    const int k = k0 + lane * kVec + u * kStride;
    if (k >= C) break;
    float wv[kVec], g[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) wv[j] = to_f32(wp[u].v[j]);
    if constexpr (kFold) load<kVec>(norm_weight + k, g);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float xv[kVec];
      load<kVec>(x + static_cast<int64_t>(r) * C + k, xv);
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const float xn = kFold ? to_f32(from_f32<T>(xv[j] * rstd[r] * g[j])) : xv[j];
        acc[r] += xn * wv[j];
      }
    }
  }
}

// Column o of every row: the warp's sums reduced, then residual + bias + the sum, rounded to T once.
template <int kRows, typename T>
__device__ __forceinline__ void write_column(T* out, const float (&acc)[kRows], const T* bias, const T* residual,
                                             int64_t o, int OC, int lane) {
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float sum = warp_reduce(acc[r], Add());
    if (lane == 0) {
      const int64_t at = static_cast<int64_t>(r) * OC + o;
      float v = sum;
      if (bias != nullptr) v += to_f32(bias[o]);
      if (residual != nullptr) v += to_f32(residual[at]);
      out[at] = from_f32<T>(v);
    }
  }
}

// kSwiglu (with kStaged, without kNorm): inp is [rows, 2C], each row's gate then up, and the product reads their
// SwiGLU, rounded to T as swiglu_forward writes it. kRing (16-byte packs): the warp's chunks (a column's kDepth packs
// a lane at one k0, column after column) pass through its kGemvRingStages slots of the block's ring, each issued
// kGemvRingStages - 1 chunks before its use; every lane reads back only the packs it copied, so no warp
// synchronisation is needed, and the sums are those of the register path, in the same order.
template <int kVec, bool kNorm, int kRows, int kDepth, bool kStaged, bool kSwiglu, bool kRing, typename T>
__global__ void __launch_bounds__(kGemvWarps* kWarpSize, min_blocks(kDepth, kRows))
    gemv_kernel(T* out, const T* inp, const T* norm_weight, float eps, const T* weight, const T* bias,
                const T* residual, int C, int OC) {
  allow_dependents();
  constexpr int kStride = kWarpSize * kVec;  // the elements of a warp's packs side by side
  constexpr int kChunk = kDepth * kStride;   // the elements of a column one chunk of packs covers
  static_assert(!kRing || sizeof(Pack<T, kVec>) == 16, "the ring copies 16-byte packs");
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kGemvWarps;
  int64_t o = static_cast<int64_t>(blockIdx.x) * kGemvWarps + warp;
  extern __shared__ __align__(16) unsigned char gemv_rows[];
  // kRing: chunk c is the packs of column o + (c / per_column) warps from element (c % per_column) kChunk on.
  const int per_column = (C + kChunk - 1) / kChunk;
  const int64_t chunks = o < OC ? ((OC - 1 - o) / warps + 1) * per_column : 0;
  Pack<T, kVec>* const ring = reinterpret_cast<Pack<T, kVec>*>(gemv_rows + ring_offset<T>(kStaged, kRows, C)) +
                              static_cast<int64_t>(warp) * kGemvRingStages * kDepth * kWarpSize;
  uint64_t policy = 0;
  if constexpr (kRing) policy = evict_first_policy();
  auto issue = [&](int64_t c) {  // chunk c into its slot; a group either way, so that the counts stay aligned
    if (c < chunks) {
      const T* w = weight + (o + c / per_column * warps) * C;
      const int k0 = static_cast<int>(c % per_column) * kChunk;
      Pack<T, kVec>* slot = ring + (c % kGemvRingStages) * kDepth * kWarpSize;
#pragma unroll
      for (int u = 0; u < kDepth; ++u) {
        const int k = k0 + lane * kVec + u * kStride;
        if (k < C) cp_async_16_hinted(slot + u * kWarpSize + lane, w + k, policy);
      }
    }
    cp_async_commit();
  };
  // The first packs of the warp's first column (kRing: its first chunks), read while the kernel that writes inp may
  // still run: the weights do not change during a forward.
  Pack<T, kVec> wp[kDepth];
  if constexpr (kRing) {
    for (int c = 0; c < kGemvRingStages - 1; ++c) issue(c);
  } else if (o < OC) {
    fetch_packs<kVec, kDepth>(wp, weight + o * C, 0, lane, C);
  }
  wait_for_predecessor();
  // kStaged: the block's rows in shared memory as the products read them (normalised and rounded to T where the norm
  // is folded in), written once for all the block's columns: the loop then reads each pack of x once from shared
  // memory and does no norm arithmetic.
  const T* x = inp;
  if constexpr (kStaged) {
    T* xs = reinterpret_cast<T*>(gemv_rows);
    __shared__ float rstd_s[kRows];
    if constexpr (kNorm) {
      if (warp < kRows) {
        const float r = inverse_rms<kVec>(inp + static_cast<int64_t>(warp) * C, lane, C, eps);
        if (lane == 0) rstd_s[warp] = r;
      }
      __syncthreads();
    }
    for (int i = threadIdx.x * kVec; i < kRows * C; i += kGemvWarps * kWarpSize * kVec) {
      float v[kVec];
      if constexpr (kSwiglu) {  // element (r, c) from gate (r, c) and up (r, C + c) of the [rows, 2C] input
        const int at = i + (i / C) * C;
        float u[kVec];
        load<kVec>(inp + at, v);
        load<kVec>(inp + at + C, u);
#pragma unroll
        for (int j = 0; j < kVec; ++j) v[j] = silu(v[j]) * u[j];
      } else {
        load<kVec>(inp + i, v);  // C % kVec == 0: a pack lies in one row
      }
      if constexpr (kNorm) {
        float g[kVec];
        load<kVec>(norm_weight + i % C, g);
#pragma unroll
        for (int j = 0; j < kVec; ++j) v[j] = v[j] * rstd_s[i / C] * g[j];
      }
      store<kVec>(xs + i, v);
    }
    __syncthreads();
    x = xs;
  }
  if (o >= OC) return;
  constexpr bool kFold = kNorm && !kStaged;  // normalise x in the loop
  float rstd[kRows];
  if constexpr (kFold) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) rstd[r] = inverse_rms<kVec>(inp + static_cast<int64_t>(r) * C, lane, C, eps);
  }
  float acc[kRows] = {};
  if constexpr (kRing) {
    for (int64_t c = 0; c < chunks; ++c) {
      issue(c + kGemvRingStages - 1);
      cp_async_wait<kGemvRingStages - 1>();  // chunk c has landed
      const Pack<T, kVec>* slot = ring + (c % kGemvRingStages) * kDepth * kWarpSize;
      const int k0 = static_cast<int>(c % per_column) * kChunk;
#pragma unroll
      for (int u = 0; u < kDepth; ++u)
        if (k0 + lane * kVec + u * kStride < C) wp[u] = slot[u * kWarpSize + lane];
      add_packs<kVec, kFold>(acc, wp, x, norm_weight, rstd, k0, lane, C);
      if (c % per_column == per_column - 1) {
        write_column(out, acc, bias, residual, o + c / per_column * warps, OC, lane);
#pragma unroll
        for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;
      }
    }
    return;
  }
  for (;;) {
    const T* w = weight + o * C;
    for (int k0 = 0; k0 < C; k0 += kChunk) {
      if (k0 > 0) fetch_packs<kVec, kDepth>(wp, w, k0, lane, C);
      add_packs<kVec, kFold>(acc, wp, x, norm_weight, rstd, k0, lane, C);
    }
    const int64_t next = o + warps;
    if (next < OC)
      fetch_packs<kVec, kDepth>(wp, weight + next * C, 0, lane, C);  // in flight while this column's sums end
    write_column(out, acc, bias, residual, o, OC, lane);
    if (next >= OC) return;
    o = next;
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;
  }
}

// The blocks of gemv's grid for OC output columns and the cap.
int gemv_blocks(int OC, int blocks_per_sm) {
  const int columns = (OC + kGemvWarps - 1) / kGemvWarps;  // a warp for each output column
  if (blocks_per_sm <= 0) return columns;
  int device = 0, sms = 0;
  ST_CUDA_CHECK(cudaGetDevice(&device));
  ST_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return std::min(columns, std::max(1, sms * blocks_per_sm));
}

// Lets `kernel` take up to `bytes` of dynamic shared memory on the current device, past the 48 KiB a kernel takes
// without opting in: once a kernel and device (the first call of a decoder's step runs eagerly, before its capture).
void opt_in(const void* kernel, size_t bytes) {
  static std::mutex mu;
  static std::set<std::pair<const void*, int>> done;
  int device = 0;
  ST_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  if (done.count({kernel, device}) != 0) return;
  ST_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  done.insert({kernel, device});
}

// The dynamic shared memory a ring kernel of `depth` may ask for on the current device: its ring after the most rows
// it stages, within what a block may opt in to (its static rstd beside it); 0 where not even the ring fits.
size_t ring_budget(bool staged, int depth) {
  const size_t most = (staged ? kGemvMaxStagedBytes + 16 : 0) + ring_bytes(depth);
  const size_t limit = smem_per_block_optin() - kGemvMaxRows * sizeof(float);
  return std::min(most, limit) >= ring_bytes(depth) ? std::min(most, limit) : 0;
}

// gemv and gemv_swiglu: the kernel for the call's rows, norm, depth, staging, ring and input.
template <bool kSwiglu, typename T>
void launch_gemv(T* out, const T* inp, const T* norm_weight, float eps, const T* weight, const T* bias,
                 const T* residual, int64_t rows, int C, int OC, const GpuContext& ctx, const GemvLaunch& how,
                 bool staged) {
  constexpr int kVec = 16 / sizeof(T);
  const dim3 grid(static_cast<unsigned>(gemv_blocks(OC, how.blocks_per_sm))), block(kGemvWarps * kWarpSize);
  const size_t staged_bytes = staged ? sizeof(T) * static_cast<size_t>(rows) * static_cast<size_t>(C) : 0;
  // The ring where the device's shared memory holds it after the staged rows (a 4090's 99 KiB a block takes a ring of
  // depth 4, or of 8 without staging); the register path where not: the same bits either way.
  const size_t ring_at = ring_offset<T>(staged, static_cast<int>(rows), C);
  const size_t budget = how.ring ? ring_budget(staged, how.depth) : 0;  // the device asked only for a ring
  const bool ring = how.ring && ring_at + ring_bytes(how.depth) <= budget;
  auto launch = [&](auto kernel, bool with_ring) {
    if (with_ring) opt_in(reinterpret_cast<const void*>(kernel), budget);
    launch_after_predecessor(kernel, grid, block, with_ring ? ring_at + ring_bytes(how.depth) : staged_bytes,
                             ctx.stream, out, inp, norm_weight, eps, weight, bias, residual, C, OC);
  };
  // The rows, the norm, the depth, the staging and the ring are the kernel's constants: its registers then hold only
  // what the call needs, and more of its blocks fit a multiprocessor. The ring takes 16-byte packs only.
  auto pick = [&](auto w, auto norm, auto deep, auto stage) {
    constexpr int W = decltype(w)::value, D = decltype(deep)::value;
    constexpr bool N = decltype(norm)::value, S = decltype(stage)::value;
    if constexpr (!kSwiglu || (S && !N)) {
      auto with_ring = [&](auto ring) {
        constexpr bool R = decltype(ring)::value;
        switch (rows) {
          case 1:
            return launch(gemv_kernel<W, N, 1, D, S, kSwiglu, R, T>, R);
          case 2:
            return launch(gemv_kernel<W, N, 2, D, S, kSwiglu, R, T>, R);
          case 3:
            return launch(gemv_kernel<W, N, 3, D, S, kSwiglu, R, T>, R);
          default:
            return launch(gemv_kernel<W, N, 4, D, S, kSwiglu, R, T>, R);
        }
      };
      if constexpr (W == kVec) {
        if (ring) return with_ring(std::true_type());
      }
      with_ring(std::false_type());
    }
  };
  auto with_staging = [&](auto w, auto norm, auto deep) {
    if (staged)
      pick(w, norm, deep, std::true_type());
    else
      pick(w, norm, deep, std::false_type());
  };
  auto with_depth = [&](auto w, auto norm) {
    if (how.depth == 8)
      with_staging(w, norm, Width<8>());
    else
      with_staging(w, norm, Width<4>());
  };
  launch_packed<T>(C % kVec == 0 && all_aligned(16, inp, weight, norm_weight), [&](auto w) {
    if (norm_weight != nullptr)
      with_depth(w, std::true_type());
    else
      with_depth(w, std::false_type());
  });
}

void check_launch(int64_t rows, const GemvLaunch& how) {
  ST_CHECK(rows >= 1 && rows <= kGemvMaxRows, "gemv takes 1 to ", kGemvMaxRows, " rows, got ", rows);
  ST_CHECK(how.depth == 4 || how.depth == 8, "gemv keeps 4 or 8 packs in flight a lane, not ", how.depth);
}

}  // namespace

template <typename T>
void gemv(T* out, const T* inp, const T* norm_weight, float eps, const T* weight, const T* bias, const T* residual,
          int64_t rows, int C, int OC, const GpuContext& ctx, const GemvLaunch& how) {
  check_launch(rows, how);
  if (OC == 0) return;
  const bool staged = how.staged && gemv_stage_fits<T>(rows, C);
  launch_gemv<false, T>(out, inp, norm_weight, eps, weight, bias, residual, rows, C, OC, ctx, how, staged);
}

template <typename T>
bool gemv_swiglu(T* out, const T* gate_up, const T* weight, const T* bias, const T* residual, int64_t rows, int F,
                 int OC, const GpuContext& ctx, const GemvLaunch& how) {
  if (rows < 1 || rows > kGemvMaxRows || !gemv_stage_fits<T>(rows, F)) return false;
  check_launch(rows, how);
  if (OC > 0) launch_gemv<true, T>(out, gate_up, nullptr, 0.0f, weight, bias, residual, rows, F, OC, ctx, how, true);
  return true;
}

#define ST_GEMV_INSTANTIATE(T)                                                                                   \
  template void gemv<T>(T*, const T*, const T*, float, const T*, const T*, const T*, int64_t, int, int,          \
                        const GpuContext&, const GemvLaunch&);                                                   \
  template bool gemv_swiglu<T>(T*, const T*, const T*, const T*, const T*, int64_t, int, int, const GpuContext&, \
                               const GemvLaunch&);
ST_GEMV_INSTANTIATE(float)
ST_GEMV_INSTANTIATE(bf16)
ST_GEMV_INSTANTIATE(fp16)
#undef ST_GEMV_INSTANTIATE

}  // namespace st::gpu::kernels_internal
