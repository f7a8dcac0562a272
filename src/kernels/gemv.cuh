// Private to src/kernels/*.cu (and bench/decode_gemv.cc, which times its grid sizes): the matrix-vector product of a
// decoding step, which matmul_forward and its residual, GELU and RMSNorm forms take for at most kGemvMaxRows rows.
#pragma once

#include <cstddef>
#include <cstdint>

#include "shardtrain/kernels/gpu/context.h"

namespace st::gpu::kernels_internal {

// The most rows gemv takes; more go to cuBLASLt.
inline constexpr int kGemvMaxRows = 4;

// How gemv runs (bench/decode_gemv.cc times the choices): the grid holds at most blocks_per_sm blocks (8 warps
// each) a multiprocessor, each warp taking several output columns in turn where there are more columns than warps (0:
// a warp for each column); each lane keeps `depth` 16-byte packs of weights in flight (4 or 8); with `staged`, a
// block first writes its rows to shared memory as the products read them (normalised where the norm is folded in),
// where they take at most kGemvMaxStagedBytes, and each warp reads them from there. With `ring`, the weights' packs
// pass through a ring of kGemvRingStages chunks a warp in shared memory (cp.async, issued kGemvRingStages - 1 chunks
// ahead of their use) instead of registers: more bytes in flight a multiprocessor, bounded by its shared memory; where
// a block's shared memory on the device cannot hold the ring after the staged rows, the registers (the same bits).
struct GemvLaunch {
  int blocks_per_sm = 2;
  int depth = 8;
  bool staged = true;
  bool ring = false;
};
inline constexpr int kGemvRingStages = 4;
inline constexpr size_t kGemvMaxStagedBytes = 48 << 10;

// Whether `rows` rows of C elements of T are staged where GemvLaunch::staged asks: they fit the block's shared memory,
// kGemvMaxStagedBytes of it with the norm's statistics (a float a row) beside them, the most a kernel takes without
// opting in to more.
template <typename T>
bool gemv_stage_fits(int64_t rows, int C) {
  return sizeof(T) * static_cast<size_t>(rows) * static_cast<size_t>(C) + kGemvMaxRows * sizeof(float) <=
         kGemvMaxStagedBytes;
}

// out[rows, OC] = residual + x @ weight^T + bias, with x = inp, or, when norm_weight is given, inp's rows through
// RMSNorm: round_T(inp * rstd * norm_weight) with rstd = 1 / sqrt(mean(inp^2) + eps), as rmsnorm_forward writes
// them, bit for bit (its sum of squares in the same order). residual, bias and norm_weight may be null; out may be
// residual. Sums in fp32, rounded to T once. rows in [1, kGemvMaxRows]. Launched after its predecessor on sm_90
// (launch_after_predecessor): it reads the first packs of its weights before the kernel before it has finished.
template <typename T>
void gemv(T* out, const T* inp, const T* norm_weight, float eps, const T* weight, const T* bias, const T* residual,
          int64_t rows, int C, int OC, const GpuContext& ctx, const GemvLaunch& how = {});

// out[rows, OC] = residual + swiglu(gate_up) @ weight^T + bias, gate_up [rows, 2F] (each row's gate then up): gemv
// staged with the rows' SwiGLU, as swiglu_forward would have written it (the same bits as it followed by gemv).
// False, and nothing launched, where the rows' SwiGLU exceeds kGemvMaxStagedBytes or there are more than
// kGemvMaxRows rows; the caller then runs the two kernels.
template <typename T>
bool gemv_swiglu(T* out, const T* gate_up, const T* weight, const T* bias, const T* residual, int64_t rows, int F,
                 int OC, const GpuContext& ctx, const GemvLaunch& how = {});

}  // namespace st::gpu::kernels_internal
