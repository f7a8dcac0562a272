#include "shardtrain/kernels/gpu/fp8_gemm.h"

#include <algorithm>
#include <memory>
#include <type_traits>
#include <vector>

#include "blas_plan.cuh"
#include "shardtrain/core/error.h"
#include "shardtrain/kernels/gpu/matmul.h"

namespace st::gpu {

using kernels_internal::alignment_of;

// cuBLASLt's FP8 GEMM. As Blas::gemm (matmul.cu), the row-major out [m, n] = A [m, k] . B [n, k]^T is computed as the
// column-major out^T [n, m] = B . A^T: cuBLASLt's A is our B (k x n column-major with our ldb, transposed: the "T" of
// "TN"), its B our A (k x m column-major, not transposed: the "N"). Its scales follow its operands: cuBLASLt's A scale
// is our B's inverse scales (outer-vector mode: its M = our n elements), its B scale our A's (its N = our m).

namespace {

cudaDataType_t fp8_type(Fp8Format f) { return f == Fp8Format::kE4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }

template <typename T>
constexpr cudaDataType_t kOutType = std::is_same_v<T, float> ? CUDA_R_32F : CUDA_R_16BF;
template <typename T>
constexpr const char* kOutName = std::is_same_v<T, float> ? "fp32" : "bf16";

int32_t scale_mode(const Fp8GemmOperand& x) {
  return x.per_row ? CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F : CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
}

void set_attribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const void* value, size_t bytes) {
  ST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, value, bytes));
}

// The scales are device pointers that change from call to call; the plan keeps the descriptor, so they are set anew
// before each launch.
void set_scale_pointers(cublasLtMatmulDesc_t desc, const Fp8GemmOperand& a, const Fp8GemmOperand& b) {
  const void* first = b.inverse_scales;
  const void* second = a.inverse_scales;
  set_attribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &first, sizeof(first));
  set_attribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &second, sizeof(second));
}

int compute_capability(int device) {
  int major = 0, minor = 0;
  ST_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  ST_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major * 10 + minor;
}

// out[i, j] += bias[j]: the bias of an fp32-output FP8 GEMM, for which cuBLASLt has no BIAS epilogue (on the H200 its
// heuristic answers NOT_SUPPORTED); one more rounding than the bf16 path's fused add.
__global__ void add_bias_kernel(float* out, int64_t ldo, const float* bias, int64_t m, int64_t n) {
  for (int64_t i = blockIdx.x; i < m; i += gridDim.x)
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) out[i * ldo + j] += bias[j];
}

}  // namespace

bool fp8_gemm_supported(int device) { return compute_capability(device) >= 89; }

bool fp8_rowwise_gemm_supported(int device) { return compute_capability(device) / 10 == 9; }

template <typename T>
void Blas::fp8_gemm(T* out, int64_t ldo, GradWrite write, const Fp8GemmOperand& a, const Fp8GemmOperand& b, int64_t m,
                    int64_t n, int64_t k, cudaStream_t stream, const T* bias, const T* residual, bool fast_accum) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, bf16>, "FP8 GEMMs write float or bf16");
  check_fp8_gemm(a, b, m, n, k, ldo);
  ST_CHECK(!residual || write == GradWrite::kOverwrite, describe_fp8_gemm(a, b, m, n, k, ldo),
           ": a residual replaces out's old value; it takes GradWrite::kOverwrite");
  if (m == 0 || n == 0) return;
  const T* c_in = residual ? residual : out;
  const int64_t align_a = alignment_of(a.codes, 0), align_b = alignment_of(b.codes, 0);
  const int64_t align_out = std::min(alignment_of(out, 0), alignment_of(c_in, 0));
  // fp32 outputs take their bias after the GEMM (add_bias_kernel); bf16 outputs in cuBLASLt's epilogue.
  const T* epilogue_bias = std::is_same_v<T, bf16> ? bias : nullptr;
  const int64_t align_bias = epilogue_bias ? alignment_of(epilogue_bias, 0) : 0;
  const cudaDataType_t type_a = fp8_type(a.format), type_b = fp8_type(b.format);
  // An FP8 plan's key starts with an FP8 type (CUDA_R_8F_E4M3 = 28, CUDA_R_8F_E5M2 = 29), which never starts a gemm
  // key (T's type: 0, 2 or 14), so the two kinds share plans_ and the algorithm lists without clashing.
  const Key key = {type_a,  type_b,  kOutType<T>, a.per_row,  b.per_row,          m, n, k, a.ld, b.ld, ldo,
                   align_a, align_b, align_out,   align_bias, fast_accum ? 1 : 0, 0, 0, 0};
  std::unique_ptr<Plan>& slot = plans_[key];
  if (!slot) {
    auto plan = std::make_unique<Plan>();
    ST_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t transposed = CUBLAS_OP_T, plain = CUBLAS_OP_N;
    set_attribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &transposed, sizeof(transposed));
    set_attribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &plain, sizeof(plain));
    const int32_t mode_first = scale_mode(b), mode_second = scale_mode(a);
    set_attribute(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_first, sizeof(mode_first));
    set_attribute(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_second, sizeof(mode_second));
    set_scale_pointers(plan->desc, a, b);
    if (fast_accum) {
      const int8_t on = 1;
      set_attribute(plan->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &on, sizeof(on));
    }
    if (epilogue_bias) {  // a vector over cuBLASLt's M, our n: the output features
      const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
      const int32_t bias_type = kOutType<T>;
      set_attribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue));
      set_attribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type));
      set_attribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &epilogue_bias, sizeof(epilogue_bias));
    }
    ST_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->first, type_b, k, n, b.ld));
    ST_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->second, type_a, k, m, a.ld));
    // C and D alike: out, in T (cuBLASLt's FP8 GEMMs with a bf16 or fp32 D take C of D's type).
    ST_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->out, kOutType<T>, n, m, ldo));
    cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
    if (!take_preset(key, *plan, describe_fp8_gemm(a, b, m, n, k, ldo))) {
      std::vector<cublasLtMatmulHeuristicResult_t> results(1);
      int returned = 0;
      status = heuristic(*plan, align_b, align_a, align_out, results, returned);
      if (status == CUBLAS_STATUS_SUCCESS && returned > 0 && results[0].state == CUBLAS_STATUS_SUCCESS) {
        plan->algo = results[0].algo;
        plan->found = true;
      }
    }
    // A GEMM without an algorithm is not cached: each call is told, with the heuristic's status (NOT_SUPPORTED where
    // the device or the scale mode has no FP8 kernel; cuBLASLt may also answer INVALID_VALUE for a mode it lacks).
    if (!plan->found) plans_.erase(key);
    ST_CHECK(plan->found, "cuBLASLt has no algorithm for the ", describe_fp8_gemm(a, b, m, n, k, ldo), " with ",
             kOutName<T>, " output on this device (heuristic: ", cublasLtGetStatusString(status),
             "); FP8 GEMMs need compute capability 8.9 or higher, rowwise scales 9.x");
    slot = std::move(plan);
  }
  set_scale_pointers(slot->desc, a, b);
  if (epilogue_bias)
    set_attribute(slot->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &epilogue_bias, sizeof(epilogue_bias));
  const float alpha = 1.0f, beta = write == GradWrite::kAccumulate || residual ? 1.0f : 0.0f;
  ST_CUBLAS_CHECK(cublasLtMatmul(handle_, slot->desc, &alpha, b.codes, slot->first, a.codes, slot->second, &beta, c_in,
                                 slot->out, out, slot->out, &slot->algo, workspace_, workspace_bytes_, stream));
  if constexpr (std::is_same_v<T, float>) {
    if (bias) {
      add_bias_kernel<<<static_cast<unsigned>(std::min<int64_t>(m, 65535)), 256, 0, stream>>>(out, ldo, bias, m, n);
      ST_CUDA_CHECK_LAUNCH();
    }
  }
}

template <typename T>
void fp8_gemm(T* out, int64_t ldo, GradWrite write, const Fp8GemmOperand& a, const Fp8GemmOperand& b, int64_t m,
              int64_t n, int64_t k, const GpuContext& ctx, const T* bias, const T* residual, bool fast_accum) {
  ST_CHECK(ctx.blas != nullptr, "GpuContext::blas is null; fp8_gemm needs a Blas");
  ctx.blas->fp8_gemm(out, ldo, write, a, b, m, n, k, ctx.stream, bias, residual, fast_accum);
}

#define ST_INSTANTIATE_FP8_GEMM(T)                                                                                  \
  template void Blas::fp8_gemm<T>(T*, int64_t, GradWrite, const Fp8GemmOperand&, const Fp8GemmOperand&, int64_t,    \
                                  int64_t, int64_t, cudaStream_t, const T*, const T*, bool);                        \
  template void fp8_gemm<T>(T*, int64_t, GradWrite, const Fp8GemmOperand&, const Fp8GemmOperand&, int64_t, int64_t, \
                            int64_t, const GpuContext&, const T*, const T*, bool);

ST_INSTANTIATE_FP8_GEMM(float)
ST_INSTANTIATE_FP8_GEMM(bf16)
#undef ST_INSTANTIATE_FP8_GEMM

}  // namespace st::gpu
