// The GEMMs of a block's linear layers in the CPU models: kernels/matmul.h's, with each operand cast to FP8 and back
// (kernels/fp8.h's round trip: what an FP8 GEMM computes with) where train.fp8's policy applies to the layer
// (model/fp8_policy.h). The bias, the residual and the accumulation stay fp32. Without FP8 each call is the plain
// kernel.
//
//   CpuLinear linear;                 // fp32
//   linear.set_policy(fp8_policy(Fp8Recipe::kTensorwise));
//   linear.forward(out, x, w, bias, nullptr, N, C, OC, "block.2 attn.qkv");
//   linear.backward(dx, dw, db, dy, x, w, N, C, OC, GradWrite::kOverwrite, GradWrite::kAccumulate, "block.2 attn.qkv");
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/kernels/grad_write.h"
#include "shardtrain/model/fp8_policy.h"

namespace st {

class CpuLinear {
 public:
  // Refuses weights_cast without one_weight_cast().
  void set_policy(const Fp8Policy& policy);
  const Fp8Policy& policy() const { return policy_; }

  // out[N, OC] = (residual, when not null) + inp[N, C] @ w[OC, C]^T + bias (may be null).
  void forward(float* out, const float* inp, const float* w, const float* bias, const float* residual, int64_t N, int C,
               int OC, const char* what);
  // matmul_backward's gradients: dinp = dout @ w, dweight = dout^T @ inp, dbias = the column sums of dout (the last
  // from the fp32 gradient); any may be null.
  void backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* w,
                int64_t N, int C, int OC, GradWrite dinp_write, GradWrite param_write, const char* what);

 private:
  // x [rows, cols] as `op` casts it, in *buffer (x itself when FP8 is off for this layer).
  const float* cast(const float* x, int64_t rows, int64_t cols, const Fp8Operand& op, std::vector<float>* buffer,
                    const char* what);

  Fp8Policy policy_;
  std::vector<float> a_, b_;  // the cast operands (FP8 only)
};

}  // namespace st
