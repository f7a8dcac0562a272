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
CudaLinear<T>::CudaLinear(const Fp8Policy& policy, const ModelConfig& cfg, int64_t max_rows)
    : policy_(policy), workspace_(fp8_workspace(cfg, max_rows, policy)) {
  if (workspace_.a == 0) return;
  ST_CHECK((std::is_same_v<T, float> || std::is_same_v<T, bf16>),
           "train.fp8 computes in bf16 or fp32 (its GEMMs write those types)");  // the config refuses fp16 first
  codes_bytes_ = workspace_.region_bytes();
  a_scales_ = DeviceBuffer<float>(workspace_.groups);
  b_scales_ = DeviceBuffer<float>(workspace_.groups);
  t_scales_ = DeviceBuffer<float>(workspace_.groups);
  maxima_ = DeviceBuffer<unsigned char>(static_cast<int64_t>(gpu::fp8_quantize_scratch_bytes(2 * workspace_.groups)));
}

template <typename T>
typename CudaLinear<T>::Slots CudaLinear<T>::slots(const gpu::GpuContext& ctx) {
  ST_CHECK(ctx.scratch != nullptr && ctx.scratch_bytes >= static_cast<size_t>(codes_bytes_), "train.fp8's codes need ",
           codes_bytes_, " bytes of the model's kernel scratch, the context has ", ctx.scratch_bytes);
  auto* base = static_cast<uint8_t*>(ctx.scratch);
  const Fp8Workspace& w = workspace_;
  return {{base, w.a, a_scales_.data(), w.groups},
          {base + w.b_offset(), w.b, b_scales_.data(), w.groups},
          {base + w.t_offset(), w.t, t_scales_.data(), w.groups}};
}

template <typename T>
gpu::GpuContext CudaLinear<T>::with_maxima(const gpu::GpuContext& ctx) {
  gpu::GpuContext c = ctx;
  c.scratch = maxima_.data();
  c.scratch_bytes = maxima_.bytes();
  return c;
}

template <typename T>
gpu::GpuContext CudaLinear<T>::without_scratch(const gpu::GpuContext& ctx) {
  gpu::GpuContext c = ctx;
  c.scratch = nullptr;
  c.scratch_bytes = 0;
  return c;
}

template <typename T>
void CudaLinear<T>::cast(const T* x, int64_t rows, int64_t cols, const Fp8Operand& op, Fp8Layout layout,
                         const Slot& slot, const gpu::GpuContext& ctx) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bf16>) {
    ST_CHECK(rows * cols <= slot.capacity && fp8_groups(op.scaling, rows, cols) <= slot.groups, "FP8 cast of ", rows,
             " x ", cols, " past the workspace sized for ", slot.capacity, " codes");
    gpu::fp8_quantize_matrix_async<T>(x, rows, cols, op.format, op.scaling, policy_.power_of_2, layout, slot.codes,
                                      slot.inverse_scales, with_maxima(ctx));
  } else {
    ST_CHECK(false, "train.fp8 computes in bf16 or fp32");
  }
}

template <typename T>
void CudaLinear<T>::pair_cast(const T* dy, int64_t rows, int64_t cols, const Fp8Operand& row_major,
                              const Fp8Operand& transposed, const Slot& row, const Slot& tr,
                              const gpu::GpuContext& ctx) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bf16>) {
    ST_CHECK(rows * cols <= std::min(row.capacity, tr.capacity), "FP8 cast of ", rows, " x ", cols,
             " past the workspace sized for ", std::min(row.capacity, tr.capacity), " codes");
    gpu::fp8_quantize_pair_async<T>(dy, rows, cols, policy_.power_of_2,
                                    {row_major.format, row_major.scaling, row.codes, row.inverse_scales},
                                    {transposed.format, transposed.scaling, tr.codes, tr.inverse_scales},
                                    with_maxima(ctx));
  } else {
    ST_CHECK(false, "train.fp8 computes in bf16 or fp32");
  }
}

template <typename T>
void CudaLinear<T>::fp8_product(const Fp8Gemm& g, const Fp8Source& a, const Fp8Source& b, const Slot& sa,
                                const Slot& sb, T* out, int64_t ldo, GradWrite write, const gpu::GpuContext& ctx,
                                OpTimer::Laps* lap, bool backward, const T* bias, const T* residual, bool a_cast) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bf16>) {
    if (lap) (*lap)(backward ? "bwd.fp8_cast" : "fwd.fp8_cast");
    if (!a_cast) cast(a.x, a.rows, a.cols, g.a, a.layout, sa, ctx);
    cast(b.x, b.rows, b.cols, g.b, b.layout, sb, ctx);
    if (lap) (*lap)(backward ? "bwd.fp8_gemm" : "fwd.fp8_gemm");
    // The GEMM's depth k: the operand's columns as cast, the source's rows when transposed.
    const int64_t m = a.gemm_rows(), n = b.gemm_rows(), k = a.gemm_depth();
    gpu::fp8_gemm<T>(out, ldo, write, {sa.codes, k, g.a.format, sa.inverse_scales, per_row(g.a)},
                     {sb.codes, k, g.b.format, sb.inverse_scales, per_row(g.b)}, m, n, k, without_scratch(ctx), bias,
                     residual);
  }
}

template <typename T>
void CudaLinear<T>::forward(T* out, const T* inp, const T* w, const T* bias, const T* residual, int64_t N, int C,
                            int OC, const gpu::GpuContext& ctx, OpTimer::Laps* lap) {
  if (!policy_.applies(C, OC) || codes_bytes_ == 0) {
    if (residual)
      gpu::matmul_forward_residual<T>(out, inp, w, bias, residual, N, C, OC, ctx);
    else
      gpu::matmul_forward<T>(out, inp, w, bias, N, C, OC, ctx);
    return;
  }
  const Slots s = slots(ctx);
  fp8_product(policy_.forward, {inp, N, C, Fp8Layout::kRowMajor}, {w, OC, C, Fp8Layout::kRowMajor}, s.a, s.b, out, OC,
              GradWrite::kOverwrite, ctx, lap, false, bias, residual);
}

template <typename T>
void CudaLinear<T>::backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* w, int64_t N, int C,
                             int OC, const gpu::GpuContext& ctx, GradWrite dinp_write, GradWrite param_write,
                             OpTimer::Laps* lap) {
  if (!policy_.applies(C, OC) || codes_bytes_ == 0) {
    gpu::matmul_backward<T>(dinp, dweight, dbias, dout, inp, w, N, C, OC, ctx, dinp_write, param_write);
    return;
  }
  const bool fp8_dweight = dweight && policy_.weight_grad_applies(N);
  const Slots s = slots(ctx);
  if (dinp && fp8_dweight) {
    // dy once for both GEMMs (gpu::fp8_quantize_pair_async): row-major for the input gradient, transposed (kept in
    // slot t while the input gradient's GEMM runs) for the weight gradient's; W^T, then x^T, each as its GEMM comes.
    if (lap) (*lap)("bwd.fp8_cast");
    pair_cast(dout, N, OC, policy_.input_grad.a, policy_.weight_grad.a, s.a, s.t, ctx);
    fp8_product(policy_.input_grad, {dout, N, OC, Fp8Layout::kRowMajor}, {w, OC, C, Fp8Layout::kTransposed}, s.a, s.b,
                dinp, C, dinp_write, ctx, lap, true, nullptr, nullptr, true);
    fp8_product(policy_.weight_grad, {dout, N, OC, Fp8Layout::kTransposed}, {inp, N, C, Fp8Layout::kTransposed}, s.t,
                s.b, dweight, C, param_write, ctx, lap, true, nullptr, nullptr, true);
  } else {
    if (dinp)
      fp8_product(policy_.input_grad, {dout, N, OC, Fp8Layout::kRowMajor}, {w, OC, C, Fp8Layout::kTransposed}, s.a,
                  s.b, dinp, C, dinp_write, ctx, lap, true);
    if (fp8_dweight)
      fp8_product(policy_.weight_grad, {dout, N, OC, Fp8Layout::kTransposed}, {inp, N, C, Fp8Layout::kTransposed},
                  s.a, s.b, dweight, C, param_write, ctx, lap, true);
  }
  if (dweight && !fp8_dweight)
    gpu::matmul_backward<T>(nullptr, dweight, nullptr, dout, inp, w, N, C, OC, ctx, dinp_write, param_write);
  if (dbias) gpu::matmul_backward<T>(nullptr, nullptr, dbias, dout, inp, w, N, C, OC, ctx, dinp_write, param_write);
}

template class CudaLinear<float>;
template class CudaLinear<bf16>;
template class CudaLinear<fp16>;

}  // namespace st
