#include "shardtrain/model/cpu_linear.h"

#include "shardtrain/core/error.h"
#include "shardtrain/kernels/matmul.h"

namespace st {

void CpuLinear::set_policy(const Fp8Policy& policy, const ModelConfig& cfg) {
  ST_CHECK(!policy.weights_cast || policy.one_weight_cast(),
           "CpuLinear: weights cast ahead need train.fp8 = tensorwise or delayed");
  policy_ = policy;
  weights_ = block_linear_shapes(cfg);
  n_layer_ = cfg.n_layer;
  history_ = policy.delayed()
                 ? Fp8AmaxHistory(int64_t{n_layer_} * static_cast<int64_t>(weights_.size()), policy.amax_history)
                 : Fp8AmaxHistory();
}

const float* CpuLinear::cast(const float* x, int64_t rows, int64_t cols, const Fp8Operand& op, int operand,
                             LinearSite site, std::vector<float>* buffer) {
  const size_t n = static_cast<size_t>(rows * cols);
  if (buffer->size() < n) buffer->resize(n);
  const std::string what = str_cat("block.", site.layer, " ", site.weight);
  if (!policy_.delayed()) {
    fp8_round_trip(x, rows, cols, op.format, op.scaling, policy_.power_of_2, buffer->data(), what);
    return buffer->data();
  }
  // Delayed, in a training pass: the operand's own maximum is recorded, and the cast scales by the history's (its own
  // while the history holds none, or only zeros). Evaluation scales by its own, as tensorwise.
  unsigned own = 0;
  fp8_maxima(x, rows, cols, Fp8Scaling::kTensor, &own, what);
  const unsigned amax =
      recording_ ? history_.pick(fp8_history_index(fp8_site_index(weights_, n_layer_, site), operand), own, true) : own;
  if (codes_.size() < n) codes_.resize(n);
  float inverse = 0.0f;
  fp8_quantize_with_maxima(x, rows, cols, op.format, Fp8Scaling::kTensor, policy_.power_of_2, Fp8Layout::kRowMajor,
                           &amax, codes_.data(), &inverse);
  for (size_t i = 0; i < n; ++i) (*buffer)[i] = fp8_decode(codes_[i], op.format) * inverse;
  return buffer->data();
}

void CpuLinear::forward(float* out, const float* inp, const float* w, const float* bias, const float* residual,
                        int64_t N, int C, int OC, LinearSite site) {
  if (policy_.applies(C, OC)) {
    inp = cast(inp, N, C, policy_.forward.a, kFp8X, site, &a_);
    if (!policy_.weights_cast) w = cast(w, OC, C, policy_.forward.b, kFp8W, site, &b_);
  }
  if (residual)
    matmul_forward_residual(out, inp, w, bias, residual, N, C, OC);
  else
    matmul_forward(out, inp, w, bias, N, C, OC);
}

void CpuLinear::backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* w,
                         int64_t N, int C, int OC, GradWrite dinp_write, GradWrite param_write, LinearSite site) {
  if (!policy_.applies(C, OC)) {
    matmul_backward(dinp, dweight, dbias, dout, inp, w, N, C, OC, dinp_write, param_write);
    return;
  }
  // Each GEMM with its own casts: the input gradient's, then the weight gradient's; the bias from the fp32 gradient.
  if (dinp) {
    const float* dy = cast(dout, N, OC, policy_.input_grad.a, kFp8Dy, site, &a_);
    const float* wq = policy_.weights_cast ? w : cast(w, OC, C, policy_.input_grad.b, kFp8W, site, &b_);
    matmul_backward(dinp, nullptr, nullptr, dy, inp, wq, N, C, OC, dinp_write, param_write);
  }
  if (dweight) {  // over a token count that is not a multiple of 16 (the GEMM's depth), in fp32 as the GPU's
    const bool fp8 = policy_.weight_grad_applies(N);
    const float* dy = fp8 ? cast(dout, N, OC, policy_.weight_grad.a, kFp8Dy, site, &a_) : dout;
    const float* xq = fp8 ? cast(inp, N, C, policy_.weight_grad.b, kFp8X, site, &b_) : inp;
    matmul_backward(nullptr, dweight, nullptr, dy, xq, w, N, C, OC, dinp_write, param_write);
  }
  if (dbias) matmul_backward(nullptr, nullptr, dbias, dout, inp, w, N, C, OC, dinp_write, param_write);
}

}  // namespace st
