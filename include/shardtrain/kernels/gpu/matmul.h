// Dense layer on the GPU through cuBLASLt: the st::matmul_* contract (kernels/matmul.h) on device pointers,
// plus the Blas object that owns the cuBLASLt state and a general row-major strided-batched GEMM.
//
//   st::gpu::Blas blas;                                   // handle + 32 MiB workspace, once per stream
//   st::gpu::GpuContext ctx{stream, &blas, scratch, scratch_bytes};
//   st::gpu::matmul_forward<bf16>(out, inp, w, b, N, C, OC, ctx);
//
// Precision: operands and outputs are T; products accumulate in fp32 (CUBLAS_COMPUTE_32F, never TF32, so
// T = float keeps parity with the CPU reference). T in {float, bf16, fp16}; bf16/fp16 outputs are rounded
// once, at the store.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "shardtrain/core/cuda.h"
#include "shardtrain/kernels/fp8_gemm.h"
#include "shardtrain/kernels/gpu/context.h"
#include "shardtrain/kernels/grad_write.h"
#include "shardtrain/kernels/scratch_sizes.h"

namespace st::gpu {

// Optional fused epilogue of Blas::gemm, applied to x = alpha op(A) op(B) + beta C before the store.
struct GemmEpilogue {
  const void* bias = nullptr;       // [n] of T, added to every row of x
  void* gelu_aux = nullptr;         // if set: gelu_aux = x (same layout as C, ldc % 8 == 0) and C = gelu(x)
  const void* dgelu_aux = nullptr;  // if set (no bias, no gelu_aux): C = gelu'(dgelu_aux) * x, elementwise
  const void* c_in = nullptr;  // if set: the beta term reads this matrix (C's layout) instead of C; C is only written
};

// Owns a cuBLASLt handle, a device workspace, and one plan (descriptors, layouts, heuristic algorithm)
// per distinct GEMM (type, transposes, shape, leading dimensions, batch, strides, epilogue, pointer
// alignment), so repeated calls only set pointers and launch. Not thread-safe, and the workspace is
// shared by every call: use one Blas per stream.
class Blas {
 public:
  static constexpr size_t kDefaultWorkspaceBytes = kBlasWorkspaceBytes;

  explicit Blas(size_t workspace_bytes = kDefaultWorkspaceBytes);
  ~Blas();
  Blas(Blas&& o) noexcept;
  Blas& operator=(Blas&& o) noexcept;
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  // Row-major strided-batched GEMM, for i in [0, batch):
  //   C_i[m,n] = alpha * op(A_i)[m,k] @ op(B_i)[k,n] + beta * C_i      (then `ep`, if any)
  // with X_i = X + i * stride_x (elements). All matrices are row-major with leading dimension (row pitch)
  // ld: A is stored [m,k] (lda >= k), or [k,m] (lda >= m) when trans_a; B is stored [k,n] (ldb >= n), or
  // [n,k] (ldb >= k) when trans_b; C is [m,n] (ldc >= n). beta = 0 never reads C (it may hold NaNs).
  // Throws st::Error naming the shape when cuBLASLt has no algorithm for it.
  template <typename T>
  void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const T* a, int64_t lda,
            int64_t stride_a, const T* b, int64_t ldb, int64_t stride_b, float beta, T* c, int64_t ldc,
            int64_t stride_c, int batch, cudaStream_t stream, const GemmEpilogue& ep = {});

  // As gemm, but returns false (and launches nothing) instead of throwing when there is no algorithm:
  // for callers with a fallback, e.g. an epilogue cuBLASLt may not fuse for this type or alignment.
  template <typename T>
  bool try_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const T* a, int64_t lda,
                int64_t stride_a, const T* b, int64_t ldb, int64_t stride_b, float beta, T* c, int64_t ldc,
                int64_t stride_c, int batch, cudaStream_t stream, const GemmEpilogue& ep = {});

  // st::fp8_gemm (kernels/fp8_gemm.h) for T in {float, bf16}, on `stream`, codes, scales and out on the device: one
  // cuBLASLt call, FP8 operands in the TN layout, fp32 accumulation with FAST_ACCUM off (cuBLASLt promotes the tensor
  // cores' partial sums to fp32 at intervals; between them Hopper's FP8 accumulator keeps about 13 mantissa bits),
  // the inverse scales read from device memory (scalar mode or, per row, outer-vector mode), D = out in T rounded
  // once, beta 1 reading out for kAccumulate. Refuses what
  // check_fp8_gemm refuses, and throws st::Error naming the GEMM (describe_fp8_gemm) when cuBLASLt has no algorithm
  // for it on this device. Plans sit among gemm's (plan_count, algorithms, use_algorithms), keyed by the formats,
  // scale modes, T, shape, leading dimensions and alignments; an FP8 plan takes the heuristic's first algorithm (or
  // the one use_algorithms gave), never timed.
  // With bias (the BIAS epilogue, n elements of T) and residual (C = residual, beta 1, D = out; kOverwrite only).
  // fast_accum: FAST_ACCUM on (the tensor cores' own accumulator throughout, no promotion: faster, less exact;
  // Fp8Gemm::fast_accum), a plan of its own.
  template <typename T>
  void fp8_gemm(T* out, int64_t ldo, GradWrite write, const Fp8GemmOperand& a, const Fp8GemmOperand& b, int64_t m,
                int64_t n, int64_t k, cudaStream_t stream, const T* bias = nullptr, const T* residual = nullptr,
                bool fast_accum = false);

  // Number of distinct GEMMs planned so far (each is planned once), FP8 ones included.
  size_t plan_count() const { return plans_.size(); }

  // Tuning: for each new plan, time the first `candidates` algorithms cuBLASLt's heuristic lists (on scratch
  // operands of the plan's shape, so no caller data is touched; at most 2 GiB and a quarter of the free memory,
  // else untimed) and keep the fastest; 0 or 1 takes the heuristic's first. `agree`, when set, is called with this
  // process's pick (an index into the list; 0 when `time_here` is false) for every plan made while tuning and
  // returns the one to use: processes that must compute the same bits pass one process's pick around. Plans
  // already made keep their algorithm.
  void set_tuning(int candidates, bool time_here = true, std::function<int(int)> agree = {});

  // Every plan's algorithm (format_gemm_algorithms in kernels/gemm_algorithms.h: a line per plan), and the
  // reverse (st::Error naming the line if the text does not parse): plans made after use_algorithms() take the
  // listed algorithm for their key (checked with cublasLtMatmulAlgoCheck; st::Error naming the GEMM if cuBLASLt
  // rejects it) instead of planning anew. With the same cuBLASLt on the same kind of device, a later process then
  // computes the same bits.
  std::string algorithms() const;
  void use_algorithms(const std::string& text);

  // What tuning found so far: plans timed, and the sum over them of one call with the heuristic's first
  // algorithm and with the chosen one.
  struct TuningStats {
    int plans = 0;
    double first_ms = 0, chosen_ms = 0;
  };
  const TuningStats& tuning_stats() const { return tuning_stats_; }

 private:
  struct Plan;
  using Key = std::array<int64_t, 19>;

  // Milliseconds per call of each of `count` heuristic results on random scratch operands (gpu::fill_uniform) of the
  // plan's shape (element counts of A, B, C; a bias of n and a C-shaped aux when the epilogue has them); infinity for
  // one that fails to launch. Empty when the scratch would exceed 2 GiB or cannot be allocated: the caller keeps the
  // first.
  std::vector<double> time_algorithms(const Plan& plan, const cublasLtMatmulHeuristicResult_t* results, int count,
                                      float beta, cudaDataType_t type, int64_t a_elems, int64_t b_elems,
                                      int64_t c_elems, int64_t bias_elems, bool aux, cudaStream_t stream);

  // For a new plan: the algorithm use_algorithms() gave for `key`, if any, checked with cublasLtMatmulAlgoCheck
  // (st::Error naming `what` if cuBLASLt rejects it) and set in the plan; false when there is none.
  bool take_preset(const Key& key, Plan& plan, const std::string& what);
  // cuBLASLt's heuristic list for the plan's descriptors, the workspace and the alignments (bytes) of cuBLASLt's A,
  // B and C/D: up to results.size() entries, `returned` of them filled. NOT_SUPPORTED: no algorithm.
  cublasStatus_t heuristic(const Plan& plan, int64_t align_first, int64_t align_second, int64_t align_out,
                           std::vector<cublasLtMatmulHeuristicResult_t>& results, int& returned);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  int tune_candidates_ = 0;
  bool time_here_ = true;
  std::function<int(int)> agree_;
  std::map<Key, cublasLtMatmulAlgo_t> presets_;
  TuningStats tuning_stats_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

// out[N,OC] = inp[N,C] @ weight[OC,C]^T + bias[OC]. bias may be null. out is overwritten.
template <typename T>
void matmul_forward(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int C, int OC,
                    const GpuContext& ctx);

// out[N,OC] = residual + inp @ weight^T + bias, like st::matmul_forward_residual: one cuBLASLt call (beta = 1
// reading the residual, bias epilogue) where it has an algorithm; otherwise out = residual + bias, then the
// product accumulated onto it. The fused sum is rounded to T once, the unfused one twice. out may be residual.
template <typename T>
void matmul_forward_residual(T* out, const T* inp, const T* weight, const T* bias, const T* residual, int64_t N, int C,
                             int OC, const GpuContext& ctx);

// out[N,OC] = norm @ weight^T + bias with norm the RMSNorm of inp's rows, like st::rmsnorm_matmul_forward. Up to 4
// rows (a decoding step) are one kernel that normalises the rows as it reads them, as rmsnorm_forward would have
// written them, and leaves norm and rstd unwritten; more are rmsnorm_forward into norm and rstd, then matmul_forward.
template <typename T>
void rmsnorm_matmul_forward(T* out, T* norm, float* rstd, const T* inp, const T* norm_weight, float eps,
                            const T* weight, const T* bias, int64_t N, int C, int OC, const GpuContext& ctx);

// out[N,OC] = residual + swiglu(gate_up) @ weight^T + bias, like st::swiglu_matmul_forward_residual (gate_up
// [N, 2F], each row's gate then up): a SwiGLU block's down projection as a decoding step runs it. Up to 4 rows whose
// SwiGLU fits a block's shared memory are one kernel that stages it there as swiglu_forward would have written it,
// and leaves mlp unwritten; otherwise swiglu_forward into mlp[N, F], then matmul_forward_residual. out may be
// residual.
template <typename T>
void swiglu_matmul_forward_residual(T* out, T* mlp, const T* gate_up, const T* weight, const T* bias, const T* residual,
                                    int64_t N, int F, int OC, const GpuContext& ctx);

// pre_gelu[N,OC] = matmul_forward(inp, weight, bias); out[N,OC] = gelu(pre_gelu), the tanh GELU of
// kernels/gelu.h. Both are overwritten; pre_gelu is what gelu_backward needs. For T = bf16 or fp16 with
// OC % 8 == 0 this is one cuBLASLt call when it has a GELU_AUX(_BIAS) algorithm for the operands' alignment
// (out is then the GELU of the fp32 product, not of its T rounding). Otherwise, and always for T = float (CPU
// parity), it is a GEMM plus an element-wise GELU kernel in fp32 with an accurate expf.
template <typename T>
void matmul_forward_gelu(T* out, T* pre_gelu, const T* inp, const T* weight, const T* bias, int64_t N, int C, int OC,
                         const GpuContext& ctx);

// Accumulates, like st::matmul_backward: dinp[N,C] += dout @ weight; dweight[OC,C] += dout^T @ inp;
// dbias[OC] += sum_n dout[n,:]. dinp, dweight and dbias may be null (not needed: a frozen weight / no bias), and
// what is null is not computed; dinp_write = kOverwrite writes dinp = dout @ weight without reading it, param_write =
// kOverwrite likewise dweight and dbias (the values of adding to zeroed ones). The bias sum runs in fp32 in a fixed
// order that depends only on (N, OC), so it is bit-reproducible; it needs ctx.scratch of
// matmul_backward_scratch_bytes(N, OC) bytes when dbias is given, or, with ctx.column_sums, as much room there, and
// dbias is then complete only after that ColumnSums's finish() (column_sums.h).
template <typename T>
void matmul_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, int64_t N, int C,
                     int OC, const GpuContext& ctx, GradWrite dinp_write = GradWrite::kAccumulate,
                     GradWrite param_write = GradWrite::kAccumulate);

// The backward of out = gelu(pre_gelu) @ weight^T + bias in one pass over the input gradient, like
// st::matmul_backward_gelu: dinp[N,C] = gelu'(pre_gelu) * (dout @ weight), overwritten (in the MLP, the gradient
// of the GELU's input); dweight and dbias from inp (= gelu(pre_gelu)), as matmul_backward (param_write; either may
// be null). For T = bf16/fp16 with C % 8 == 0 the GELU derivative runs in cuBLASLt's DGELU epilogue when it has an
// algorithm for it; otherwise, and always for T = float, it is matmul_backward and gelu_backward in place.
template <typename T>
void matmul_backward_gelu(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                          const T* pre_gelu, int64_t N, int C, int OC, const GpuContext& ctx,
                          GradWrite param_write = GradWrite::kAccumulate);
// Scratch of matmul_backward: fp32 partial column sums of dout, [chunks(N)][OC], chunks(N) <= 128.

}  // namespace st::gpu
