#include "shardtrain/model/cuda_linear.h"

#include <algorithm>
#include <type_traits>

#include "shardtrain/core/error.h"
#include "shardtrain/kernels/gpu/fp8.h"
#include "shardtrain/kernels/gpu/fp8_gemm.h"
#include "shardtrain/kernels/gpu/matmul.h"
#include "shardtrain/kernels/scratch_sizes.h"
#include "shardtrain/model/fp8_policy.h"

namespace st {
namespace {

// The policy groups an operand by the rows of the GEMM's operand as cast (x or W per row; a matrix cast transposed
// per column): per-row scales, cuBLASLt's outer-vector mode, wherever the recipe groups at all.
bool per_row(const Fp8Operand& op) { return op.scaling != Fp8Scaling::kTensor; }

}  // namespace

template <typename T>
CudaLinear<T>::CudaLinear(const Fp8Policy& policy, const ModelConfig& cfg, int64_t max_rows) : policy_(policy) {
  const Fp8Workspace w = fp8_workspace(cfg, max_rows, policy);
  if (w.a == 0) return;
  ST_CHECK((std::is_same_v<T, float> || std::is_same_v<T, bf16>),
           "train.fp8 computes in bf16 or fp32 (its GEMMs write those types)");  // the config refuses fp16 first
  a_ = DeviceBuffer<uint8_t>(w.a);
  b_ = DeviceBuffer<uint8_t>(w.b);
  t_ = DeviceBuffer<uint8_t>(w.t);
  a_scales_ = DeviceBuffer<float>(w.groups);
  b_scales_ = DeviceBuffer<float>(w.groups);
  t_scales_ = DeviceBuffer<float>(w.groups);
  scratch_ = DeviceBuffer<unsigned char>(static_cast<int64_t>(gpu::fp8_quantize_scratch_bytes(2 * w.groups)));
}

template <typename T>
void CudaLinear<T>::cast(const T* x, int64_t rows, int64_t cols, const Fp8Operand& op, Fp8Layout layout,
                         DeviceBuffer<uint8_t>& codes, DeviceBuffer<float>& scales, const gpu::GpuContext& ctx) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bf16>) {
    ST_CHECK(rows * cols <= codes.size() && fp8_groups(op.scaling, rows, cols) <= scales.size(), "FP8 cast of ", rows,
             " x ", cols, " past the workspace sized for ", codes.size(), " codes");
    gpu::GpuContext c = ctx;
    c.scratch = scratch_.data();
    c.scratch_bytes = scratch_.bytes();
    gpu::fp8_quantize_matrix_async<T>(x, rows, cols, op.format, op.scaling, policy_.power_of_2, layout, codes.data(),
                                      scales.data(), c);
  } else {
    ST_CHECK(false, "train.fp8 computes in bf16 or fp32");
  }
}

template <typename T>
void CudaLinear<T>::pair_cast(const T* dy, int64_t rows, int64_t cols, const Fp8Operand& row_major,
                              const Fp8Operand& transposed, const gpu::GpuContext& ctx) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bf16>) {
    ST_CHECK(rows * cols <= std::min(a_.size(), t_.size()), "FP8 cast of ", rows, " x ", cols,
             " past the workspace sized for ", std::min(a_.size(), t_.size()), " codes");
    gpu::GpuContext c = ctx;
    c.scratch = scratch_.data();
    c.scratch_bytes = scratch_.bytes();
    gpu::fp8_quantize_pair_async<T>(dy, rows, cols, policy_.power_of_2,
                                    {row_major.format, row_major.scaling, a_.data(), a_scales_.data()},
                                    {transposed.format, transposed.scaling, t_.data(), t_scales_.data()}, c);
  } else {
    ST_CHECK(false, "train.fp8 computes in bf16 or fp32");
  }
}

template <typename T>
void CudaLinear<T>::fp8_product(const Fp8Gemm& g, const Fp8Source& a, const Fp8Source& b, T* out, int64_t ldo,
                                GradWrite write, const gpu::GpuContext& ctx, OpTimer::Laps* lap, bool backward,
                                const T* bias, const T* residual, const Cast* a_cast) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bf16>) {
    if (lap) (*lap)(backward ? "bwd.fp8_cast" : "fwd.fp8_cast");
    if (a_cast == nullptr) cast(a.x, a.rows, a.cols, g.a, a.layout, a_, a_scales_, ctx);
    cast(b.x, b.rows, b.cols, g.b, b.layout, b_, b_scales_, ctx);
    if (lap) (*lap)(backward ? "bwd.fp8_gemm" : "fwd.fp8_gemm");
    // The GEMM's depth k: the operand's columns as cast, the source's rows when transposed.
    const int64_t m = a.gemm_rows(), n = b.gemm_rows(), k = a.gemm_depth();
    const Cast ac = a_cast ? *a_cast : Cast{a_.data(), a_scales_.data()};
    gpu::fp8_gemm<T>(out, ldo, write, {ac.codes, k, g.a.format, ac.inverse_scales, per_row(g.a)},
                     {b_.data(), k, g.b.format, b_scales_.data(), per_row(g.b)}, m, n, k, ctx, bias, residual);
  }
}

template <typename T>
void CudaLinear<T>::forward(T* out, const T* inp, const T* w, const T* bias, const T* residual, int64_t N, int C,
                            int OC, const gpu::GpuContext& ctx, OpTimer::Laps* lap) {
  if (!policy_.applies(C, OC) || a_.size() == 0) {
    if (residual)
      gpu::matmul_forward_residual<T>(out, inp, w, bias, residual, N, C, OC, ctx);
    else
      gpu::matmul_forward<T>(out, inp, w, bias, N, C, OC, ctx);
    return;
  }
  fp8_product(policy_.forward, {inp, N, C, Fp8Layout::kRowMajor}, {w, OC, C, Fp8Layout::kRowMajor}, out, OC,
              GradWrite::kOverwrite, ctx, lap, false, bias, residual);
}

template <typename T>
void CudaLinear<T>::backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* w, int64_t N, int C,
                             int OC, const gpu::GpuContext& ctx, GradWrite dinp_write, GradWrite param_write,
                             OpTimer::Laps* lap) {
  if (!policy_.applies(C, OC) || a_.size() == 0) {
    gpu::matmul_backward<T>(dinp, dweight, dbias, dout, inp, w, N, C, OC, ctx, dinp_write, param_write);
    return;
  }
  const bool fp8_dweight = dweight && policy_.weight_grad_applies(N);
  if (dinp && fp8_dweight) {
    // dy once for both GEMMs (gpu::fp8_quantize_pair_async): row-major for the input gradient, transposed (kept in t_
    // while the input gradient's GEMM runs) for the weight gradient's; W^T, then x^T, each cast as its GEMM comes.
    if (lap) (*lap)("bwd.fp8_cast");
    pair_cast(dout, N, OC, policy_.input_grad.a, policy_.weight_grad.a, ctx);
    const Cast dy{a_.data(), a_scales_.data()}, dy_t{t_.data(), t_scales_.data()};
    fp8_product(policy_.input_grad, {dout, N, OC, Fp8Layout::kRowMajor}, {w, OC, C, Fp8Layout::kTransposed}, dinp, C,
                dinp_write, ctx, lap, true, nullptr, nullptr, &dy);
    fp8_product(policy_.weight_grad, {dout, N, OC, Fp8Layout::kTransposed}, {inp, N, C, Fp8Layout::kTransposed},
                dweight, C, param_write, ctx, lap, true, nullptr, nullptr, &dy_t);
  } else {
    if (dinp)
      fp8_product(policy_.input_grad, {dout, N, OC, Fp8Layout::kRowMajor}, {w, OC, C, Fp8Layout::kTransposed}, dinp, C,
                  dinp_write, ctx, lap, true);
    if (fp8_dweight)
      fp8_product(policy_.weight_grad, {dout, N, OC, Fp8Layout::kTransposed}, {inp, N, C, Fp8Layout::kTransposed},
                  dweight, C, param_write, ctx, lap, true);
  }
  if (dweight && !fp8_dweight)
    gpu::matmul_backward<T>(nullptr, dweight, nullptr, dout, inp, w, N, C, OC, ctx, dinp_write, param_write);
  if (dbias) gpu::matmul_backward<T>(nullptr, nullptr, dbias, dout, inp, w, N, C, OC, ctx, dinp_write, param_write);
}

template class CudaLinear<float>;
template class CudaLinear<bf16>;
template class CudaLinear<fp16>;

}  // namespace st
