#include "shardtrain/model/cpu_linear.h"

#include "shardtrain/core/error.h"
#include "shardtrain/kernels/matmul.h"

namespace st {

void CpuLinear::set_policy(const Fp8Policy& policy) {
  ST_CHECK(!policy.weights_cast || policy.one_weight_cast(),
           "CpuLinear: weights cast ahead need train.fp8 = tensorwise");
  policy_ = policy;
}

const float* CpuLinear::cast(const float* x, int64_t rows, int64_t cols, const Fp8Operand& op,
                             std::vector<float>* buffer, const char* what) {
  if (buffer->size() < static_cast<size_t>(rows * cols)) buffer->resize(static_cast<size_t>(rows * cols));
  fp8_round_trip(x, rows, cols, op.format, op.scaling, policy_.power_of_2, buffer->data(), what);
  return buffer->data();
}

void CpuLinear::forward(float* out, const float* inp, const float* w, const float* bias, const float* residual,
                        int64_t N, int C, int OC, const char* what) {
  if (policy_.applies(C, OC)) {
    inp = cast(inp, N, C, policy_.forward.a, &a_, what);
    if (!policy_.weights_cast) w = cast(w, OC, C, policy_.forward.b, &b_, what);
  }
  if (residual)
    matmul_forward_residual(out, inp, w, bias, residual, N, C, OC);
  else
    matmul_forward(out, inp, w, bias, N, C, OC);
}

void CpuLinear::backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* w,
                         int64_t N, int C, int OC, GradWrite dinp_write, GradWrite param_write, const char* what) {
  if (!policy_.applies(C, OC)) {
    matmul_backward(dinp, dweight, dbias, dout, inp, w, N, C, OC, dinp_write, param_write);
    return;
  }
  // Each GEMM with its own casts: the input gradient's, then the weight gradient's; the bias from the fp32 gradient.
  if (dinp) {
    const float* dy = cast(dout, N, OC, policy_.input_grad.a, &a_, what);
    const float* wq = policy_.weights_cast ? w : cast(w, OC, C, policy_.input_grad.b, &b_, what);
    matmul_backward(dinp, nullptr, nullptr, dy, inp, wq, N, C, OC, dinp_write, param_write);
  }
  if (dweight) {  // over a token count that is not a multiple of 16 (the GEMM's depth), in fp32 as the GPU's
    const bool fp8 = policy_.weight_grad_applies(N);
    const float* dy = fp8 ? cast(dout, N, OC, policy_.weight_grad.a, &a_, what) : dout;
    const float* xq = fp8 ? cast(inp, N, C, policy_.weight_grad.b, &b_, what) : inp;
    matmul_backward(nullptr, dweight, nullptr, dy, xq, w, N, C, OC, dinp_write, param_write);
  }
  if (dbias) matmul_backward(nullptr, nullptr, dbias, dout, inp, w, N, C, OC, dinp_write, param_write);
}

}  // namespace st
