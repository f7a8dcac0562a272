// The GEMMs of a block's linear layers in the CPU models: kernels/matmul.h's, with each operand cast to FP8 and back
// (kernels/fp8.h's round trip: what an FP8 GEMM computes with) where train.fp8's policy applies to the layer
// (model/fp8_policy.h). The bias, the residual and the accumulation stay fp32. Without FP8 each call is the plain
// kernel. Each call names its site (LinearSite: the block and the weight), which errors name and which keys the amax
// history of train.fp8=delayed (model/fp8_history.h): there each cast of a training pass (recording on) records its own
// maximum and scales by the history's for its site and operand; evaluation (recording off) scales by its own, as
// tensorwise, for the history says nothing of held-out text.
//
//   CpuLinear linear;                 // fp32
//   linear.set_policy(fp8_policy(Fp8Recipe::kTensorwise), cfg);
//   linear.forward(out, x, w, bias, nullptr, N, C, OC, {2, "attn.qkv.weight"});
//   linear.backward(dx, dw, db, dy, x, w, N, C, OC, GradWrite::kOverwrite, GradWrite::kAccumulate,
//                   {2, "attn.qkv.weight"});
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/kernels/grad_write.h"
#include "shardtrain/model/fp8_history.h"
#include "shardtrain/model/fp8_policy.h"

namespace st {

class CpuLinear {
 public:
  // The policy for the linear layers of a model of cfg (its sites: cfg.n_layer x block_linear_shapes). Refuses
  // weights_cast without one_weight_cast(). A delayed policy starts an empty history of policy.amax_history steps.
  void set_policy(const Fp8Policy& policy, const ModelConfig& cfg);
  const Fp8Policy& policy() const { return policy_; }

  // out[N, OC] = (residual, when not null) + inp[N, C] @ w[OC, C]^T + bias (may be null).
  void forward(float* out, const float* inp, const float* w, const float* bias, const float* residual, int64_t N, int C,
               int OC, LinearSite site);
  // matmul_backward's gradients: dinp = dout @ w, dweight = dout^T @ inp, dbias = the column sums of dout (the last
  // from the fp32 gradient); any may be null.
  void backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp, const float* w,
                int64_t N, int C, int OC, GradWrite dinp_write, GradWrite param_write, LinearSite site);

  // train.fp8=delayed: the sites' amax history (null under any other recipe), and whether casts record their maxima
  // into its step maxima (off until set).
  Fp8AmaxHistory* history() { return policy_.delayed() ? &history_ : nullptr; }
  void set_recording(bool on) { recording_ = on; }

 private:
  // x [rows, cols] as `op` casts it, in *buffer (x itself when FP8 is off for this layer); `operand` is its index
  // in the site's history (delayed).
  const float* cast(const float* x, int64_t rows, int64_t cols, const Fp8Operand& op, int operand, LinearSite site,
                    std::vector<float>* buffer);

  Fp8Policy policy_;
  std::vector<LinearShape> weights_;  // block_linear_shapes: the sites' order within a block
  int n_layer_ = 0;
  Fp8AmaxHistory history_;
  bool recording_ = false;
  std::vector<float> a_, b_;  // the cast operands (FP8 only)
  std::vector<uint8_t> codes_;
};

}  // namespace st
