// The GEMMs of a block's linear layers in the CUDA models: CpuLinear's calls (cpu_linear.h) on device buffers in the
// compute type T. Without FP8 each call is kernels/gpu/matmul.h's; where train.fp8's policy (model/fp8_policy.h)
// applies to a layer, each GEMM casts its two operands on the fly (gpu::fp8_quantize_matrix_async: the CPU's codes
// and scales, transposed for W^T, dy^T and x^T, which the TN-only FP8 GEMMs read) and runs gpu::fp8_gemm, with the
// bias and the residual in its epilogue; the bias gradient sums the T gradient. The backward casts dy once for both of
// its GEMMs (gpu::fp8_quantize_pair_async: row-major and transposed from one read).
//
//   CudaLinear<bf16> linear(fp8_policy(Fp8Recipe::kTensorwise), cfg, max_batch * cfg.seq_len);
//   linear.forward(a.qkv, a.norm1, p.qkvw, p.qkvb, nullptr, N, C, QKV, ctx);
//   linear.backward(dx, dw, db, dqkv, a.norm1, p.qkvw, N, C, QKV, ctx, GradWrite::kOverwrite, GradWrite::kOverwrite);
//
// A call may name its site: its block and its weight (LinearSite). A forward so named keeps the maxima of its casts of
// x and W where the backward casts them again with the same groups (the tensorwise recipe: one maximum a tensor both
// times; rowwise groups x by rows forward and by columns backward), and that site's backward takes them instead of a
// pass over x and W of its own. The backward must then follow its forward with the same x and W, as a step's does
// (recompute runs the block's forward again first).
//
// Where a named site's cast scales x (forward) or dy (backward) by one maximum of the whole tensor, the kernel that
// writes that operand can take the maximum as it writes it (input_maxima, Fp8Policy::producer_maxima): the cast then
// reads the operand once, for its codes, and gets the bits a pass of its own would take.
//
// Under train.fp8=delayed (Fp8Policy::delayed, model/cuda_fp8_history.h) a named site's casts take their maxima as
// tensorwise's do (the producer's, kept ones, or a pass of their own); in a training pass (recording on) they record
// them in the history and scale by its pick for the operand (history()->pick): its largest over the last steps, or
// the operand's own while the history is empty. Evaluation (recording off) and an unnamed site cast as tensorwise.
//
// The operands' codes live in ctx.scratch, the model's kernel scratch, from a layer's casts to its last GEMM: no
// kernel in between uses it (the GEMMs get a context without it), and a kernel's scratch holds nothing from one call
// to the next, so the codes cost no memory of their own where the attention's scratch is the larger
// (cuda_linear_codes_bytes, cuda_footprint.h). The inverse scales and the casts' maxima are CudaLinear's own.
//
// With Fp8Policy::weights_cast (dist.fp8_gather, shard/fp8_gather.h) a layer's W arrives cast: its region holds W's
// E4M3 codes [OC, C] and its inverse scale where fp8_weight_codes says. The forward's GEMM reads them in place, and
// the input gradient's reads them transposed (gpu::fp8_transpose into slot b): no cast of W at all.
//
// Where a model keeps a layer's x^T codes in place of x (fp8_input_codes, model/fp8_policy.h), the forward takes a
// buffer of N x C bytes for them (x_t_codes): it casts x for its GEMM and x^T into that buffer from one read, and keeps
// x^T's inverse scale as the site's. The site's backward then takes the same buffer and reads the codes for the
// weight gradient instead of casting x^T (x itself may then be gone: inp unread). A backward so called must have a
// token count whose weight gradient runs in FP8 (Fp8Policy::weight_grad_applies).
//
// A weight gradient over a token count that is not a multiple of 16 (its GEMM's depth) runs in T, as on the CPU
// (Fp8Policy::weight_grad_applies). Everything runs on ctx.stream, without waiting: a non-finite operand makes the
// GEMM's outputs NaN, which the step's non-finite gradient check then catches.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/core/cuda.h"
#include "shardtrain/core/cuda_timer.h"
#include "shardtrain/kernels/gpu/context.h"
#include "shardtrain/kernels/grad_write.h"
#include "shardtrain/model/cuda_footprint.h"
#include "shardtrain/model/cuda_fp8_history.h"
#include "shardtrain/model/fp8_policy.h"

namespace st {

// The operand of a linear layer that another kernel writes: the forward's input x, or the backward's output gradient
// dy (which both backward GEMMs read).
enum class LinearInput { kX, kDy };

template <typename T>
class CudaLinear {
 public:
  CudaLinear() = default;
  // Allocates cuda_linear_workspace_bytes(cfg, max_rows, policy.recipe, policy.amax_history) (cuda_footprint.h;
  // nothing without FP8); the calls' contexts then need cuda_linear_codes_bytes of scratch. T must be float or bf16
  // when FP8 is on (the FP8 GEMMs write those).
  CudaLinear(const Fp8Policy& policy, const ModelConfig& cfg, int64_t max_rows);

  const Fp8Policy& policy() const { return policy_; }
  // train.fp8=delayed: the amax history of the blocks' casts (null under any other recipe, or with no layer in FP8).
  CudaFp8History* history() { return history_.get(); }
  int64_t allocated_bytes() const {
    return a_scales_.bytes() + b_scales_.bytes() + t_scales_.bytes() + maxima_.bytes() + kept_.bytes() +
           input_scales_.bytes() + (history_ ? history_->allocated_bytes() : 0);
  }
  // The scratch each call's context must hold (0 without FP8).
  int64_t codes_bytes() const { return codes_bytes_; }

  // The slot for the maximum of operand `input` of the site's next call, for the kernel about to write that operand
  // to fold its maximum into as it writes it (the `amax` of rmsnorm_forward, swiglu_forward, rope_backward, ...):
  // zeroed here on ctx.stream. That call (the site's next forward for kX, its next backward for kDy) then casts the
  // operand with the maximum found there, once, instead of a pass of its own; the kernel must write the very tensor
  // the call casts, and nothing may change it in between. nullptr, and nothing queued, where that cast takes no such
  // maximum: an unnamed site, a layer not in FP8, a recipe that groups the operand by rows or columns, or
  // policy().producer_maxima off.
  //   gpu::rmsnorm_forward<T>(norm1, rstd1, x, attn_norm, eps, N, C, ctx,
  //                           linear.input_maxima({layer, "attn.qkv.weight"}, LinearInput::kX, ctx));
  //   linear.forward(qkv, norm1, qkvw, qkvb, nullptr, N, C, QKV, ctx, nullptr, {layer, "attn.qkv.weight"});
  unsigned* input_maxima(LinearSite site, LinearInput input, const gpu::GpuContext& ctx);

  // out[N, OC] = (residual, when not null; it may be out) + inp[N, C] @ w[OC, C]^T + bias (may be null).
  // With `lap` (the caller's profile of this pass), an FP8 layer's casts and GEMMs get laps of their own:
  // "fwd.fp8_cast" and "fwd.fp8_gemm" (backward: "bwd.*"); the caller names its next region itself.
  // With x_t_codes (a named site of a layer that Fp8Policy::keeps_input_codes), x^T's codes go there too.
  void forward(T* out, const T* inp, const T* w, const T* bias, const T* residual, int64_t N, int C, int OC,
               const gpu::GpuContext& ctx, OpTimer::Laps* lap = nullptr, LinearSite site = {},
               uint8_t* x_t_codes = nullptr);
  // With recompute, the re-run forward of a layer whose output no backward reads (a block's last): only what the
  // site's backward takes from its forward, without the GEMM. x^T's codes into x_t_codes (as forward() writes them)
  // and the kept maxima of x and W (where the recipe keeps them for the backward's casts); nothing outside FP8, where
  // the backward reads x and W themselves.
  void forward_without_output(const T* inp, const T* w, int64_t N, int C, int OC, const gpu::GpuContext& ctx,
                              OpTimer::Laps* lap, LinearSite site, uint8_t* x_t_codes);
  // train.fp8=delayed: a site's input x whose producer writes its codes itself, with the history's maximum for x
  // known ahead, and never x (gpu::swiglu_forward_fp8). Taken where the policy fuses casts (Fp8Policy::fuse_casts),
  // the history holds a step, the layer runs in FP8 and may keep x^T's codes, and both of x's casts take one format;
  // otherwise empty, and the producer writes x as before. The caller asks only where nothing reads x after the
  // forward (its block keeps x^T's codes in place of x, fp8_input_codes). q: x's codes for the forward's GEMM (the
  // call's scratch); q_t: x_t_codes (null where the call keeps none); inverse_scale: where the kernel writes 1 / scale
  // (the site's kept one with x_t_codes); own: where it folds x's maximum (zeroed here); amax: the history's maximum of
  // x; format: the codes'. The site's next call is then forward_fused or forward_fused_without_output.
  struct FusedInput {
    uint8_t* q = nullptr;
    uint8_t* q_t = nullptr;
    float* inverse_scale = nullptr;
    unsigned* own = nullptr;
    const unsigned* amax = nullptr;
    Fp8Format format = Fp8Format::kE4M3;
  };
  std::optional<FusedInput> fused_input(LinearSite site, int64_t N, int C, int OC, uint8_t* x_t_codes,
                                        const gpu::GpuContext& ctx);
  // forward() and forward_without_output() of a site whose producer wrote x's codes (fused_input, with the same
  // x_t_codes): the GEMM reads them (the re-run reads none), x's maximum is recorded into the history, and W is cast
  // (its maximum kept) as forward() does, or read as its codes under Fp8Policy::weights_cast.
  void forward_fused(T* out, const T* w, const T* bias, const T* residual, int64_t N, int C, int OC,
                     const gpu::GpuContext& ctx, OpTimer::Laps* lap, LinearSite site, uint8_t* x_t_codes);
  void forward_fused_without_output(const T* w, int64_t N, int C, int OC, const gpu::GpuContext& ctx,
                                    OpTimer::Laps* lap, LinearSite site);
  // The same for a site's output gradient dy (gpu::swiglu_backward_fp8): its codes written by the kernel that computes
  // it, never dy itself, where the policy fuses casts, the history holds a step, the layer runs in FP8 with its weight
  // gradient too (N tokens a multiple of 16), and both of dy's casts take one format. q: dy's codes [N, OC] for the
  // input gradient (the call's scratch), q_t: dy^T's [OC, N] for the weight gradient, inverse_scale: one for both;
  // own: dy's maximum (the site's kept slot, zeroed here); amax: the history's maximum of dy. The caller asks only
  // where nothing else reads dy (no bias gradient, no adapters); the site's next call is backward_fused.
  std::optional<FusedInput> fused_output_grad(LinearSite site, int64_t N, int C, int OC, const gpu::GpuContext& ctx);
  // backward() of a site whose dy codes a kernel wrote (fused_output_grad): dy's maximum recorded, then the input
  // gradient's GEMM (W^T cast as backward() casts it) and the weight gradient's (x^T from x_t_codes, or cast from inp).
  void backward_fused(T* dinp, T* dweight, const T* inp, const T* w, int64_t N, int C, int OC,
                      const gpu::GpuContext& ctx, GradWrite dinp_write, GradWrite param_write, OpTimer::Laps* lap,
                      LinearSite site, const uint8_t* x_t_codes);
  // gpu::matmul_backward's gradients (dinp = dout @ w, dweight = dout^T @ inp, dbias = dout's column sums; any may be
  // null), written or added to as dinp_write and param_write say. With x_t_codes (the site's forward's), the weight
  // gradient reads them and inp may be null.
  void backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* w, int64_t N, int C, int OC,
                const gpu::GpuContext& ctx, GradWrite dinp_write, GradWrite param_write, OpTimer::Laps* lap = nullptr,
                LinearSite site = {}, const uint8_t* x_t_codes = nullptr);

 private:
  // Where a cast's maxima go or come from: nowhere (the cast takes its own), into `at` (taken = false: the cast takes
  // them there, for a later cast), or from `at` (taken = true).
  struct Maxima {
    unsigned* at = nullptr;
    bool taken = false;
    // train.fp8=delayed: the operand's index in the history (fp8_history_index), whose pick the cast scales by
    // instead of `at`, its own maximum; -1: `at` itself.
    int64_t history = -1;
  };
  // A GEMM operand's source: x [rows, cols], cast in its layout or transposed. As the GEMM reads it: gemm_rows() rows
  // of gemm_depth() codes.
  struct Fp8Source {
    const T* x;
    int64_t rows, cols;
    Fp8Layout layout;
    Maxima maxima = {};
    int64_t gemm_rows() const { return layout == Fp8Layout::kRowMajor ? rows : cols; }
    int64_t gemm_depth() const { return layout == Fp8Layout::kRowMajor ? cols : rows; }
  };
  // Where a cast goes: its codes (in the call's scratch) and inverse scales, with their capacities.
  struct Slot {
    uint8_t* codes;
    int64_t capacity;
    float* inverse_scales;
    int64_t groups;
  };
  // The three slots in ctx.scratch: each GEMM's first operand (a), its second (b), and dy^T (t).
  struct Slots {
    Slot a, b, t;
  };
  Slots slots(const gpu::GpuContext& ctx);
  // out [a's GEMM rows, b's GEMM rows] (ldo) = the product of the two operands cast as g says into a and b (written or
  // added to as `write` says; with the bias and the residual in the GEMM), with laps "fwd." or "bwd." + fp8_cast,
  // fp8_gemm. With a_cast true, slot a already holds operand a (its source then gives only the GEMM's shape); with
  // b_cast, slot b holds operand b.
  void fp8_product(const Fp8Gemm& g, const Fp8Source& a, const Fp8Source& b, const Slot& sa, const Slot& sb, T* out,
                   int64_t ldo, GradWrite write, const gpu::GpuContext& ctx, OpTimer::Laps* lap, bool backward,
                   const T* bias = nullptr, const T* residual = nullptr, bool a_cast = false, bool b_cast = false);
  // Fp8Policy::weights_cast: W [OC, C]'s codes and inverse scale as its region holds them (fp8_weight_codes), and the
  // codes transposed into slot b's with that inverse scale, for the input gradient.
  Slot weight_codes(const T* w, int OC, int C) const;
  Slot transposed_weight(const T* w, int OC, int C, const Slot& b, const gpu::GpuContext& ctx);
  // fused_input's site: the history's record of x's maximum, which the producer folded into x's kept slot.
  void record_fused_x(LinearSite site, const gpu::GpuContext& ctx);
  // The maximum a cast with `m` scales by: m.at, or under delayed the history's pick for it (on ctx.stream).
  const unsigned* applied(const Maxima& m, const gpu::GpuContext& ctx);
  // Whether a cast of an operand with maxima `m` takes the history's maximum ahead (gpu::fp8_quantize_ahead_async)
  // and folds its own in as it reads the operand, with no pass of its own for it: train.fp8=delayed once the history
  // holds a step (Fp8Policy::fuse_casts), for maxima no producer took.
  bool ahead(const Maxima& m, const Fp8Operand& op) const;
  // That cast: x's codes in its layout into q and transposed into q_t (either may be null) with the history's scale for
  // m's operand, 1 / scale into *inverse_scale, x's maximum into m.at and recorded by the history (on ctx.stream).
  void cast_ahead(const T* x, int64_t rows, int64_t cols, Fp8Format format, const Maxima& m, uint8_t* q, uint8_t* q_t,
                  float* inverse_scale, const gpu::GpuContext& ctx);
  // The maxima of the site's dy for its backward's casts: the producer's (produced), else a pass of the cast's own;
  // under delayed kept in the site's slot either way, for the history's pick.
  Maxima dy_maxima(LinearSite site, bool produced);
  // The source cast as `op` says into `slot`.
  void cast(const Fp8Source& src, const Fp8Operand& op, const Slot& slot, const gpu::GpuContext& ctx);
  // The kept maxima of a site's input (x) or weight (w), or none: an unnamed site, or a recipe whose backward groups
  // them otherwise.
  Maxima kept(LinearSite site, bool weight, bool taken);
  // A named site's index in weights_, refused when it names none of the blocks' linear layers or a layer past the
  // model's.
  int64_t site_index(LinearSite site) const;
  // Whether input_maxima hands out the slot of (site, input).
  bool takes_input_maxima(LinearSite site, LinearInput input) const;
  // Where the site's dy maximum is kept.
  unsigned* dy_slot(LinearSite site);
  // The slot of the site's kept x^T codes (forward's x_t_codes) for N tokens, with the site's inverse scale.
  Slot input_codes(LinearSite site, uint8_t* codes, int64_t N, int C);
  // Whether a producer was handed the slot of (site, input) since the call that last cast that operand; the call
  // that casts it asks once, and clears it.
  bool produced(LinearSite site, LinearInput input);
  // A forward's first act at a site (forward, forward_without_output): refuses x^T's codes asked of a layer that keeps
  // none, and returns produced(site, kX), whether x's maximum is in the kept slot already.
  bool start_forward(LinearSite site, int C, int OC, const uint8_t* x_t_codes);
  // x [rows, cols] (dy, or a forward's x) cast row-major into `row` and transposed into `tr` in one pass
  // (gpu::fp8_quantize_pair_async), with the maxima where `maxima` says (both casts grouped alike).
  void pair_cast(const T* x, int64_t rows, int64_t cols, const Fp8Operand& row_major, const Fp8Operand& transposed,
                 const Slot& row, const Slot& tr, Maxima maxima, const gpu::GpuContext& ctx);
  // ctx with the casts' own scratch (the maxima), or with none (the GEMMs: the codes sit in ctx's).
  gpu::GpuContext with_maxima(const gpu::GpuContext& ctx);
  static gpu::GpuContext without_scratch(const gpu::GpuContext& ctx);

  Fp8Policy policy_;
  Fp8Workspace workspace_;
  int64_t codes_bytes_ = 0;
  DeviceBuffer<float> a_scales_, b_scales_, t_scales_;
  DeviceBuffer<unsigned char> maxima_;  // the casts' group maxima
  std::vector<LinearShape> weights_;    // block_linear_shapes, in the order of a site's index
  int n_layer_ = 0;
  Fp8KeptMaxima keep_;                // which operands' maxima a forward keeps for its backward
  DeviceBuffer<unsigned> kept_;       // [layer][weight][x, w, dy]: one maximum each
  DeviceBuffer<float> input_scales_;  // [layer][weight]: the inverse scale of the x^T codes a forward kept (strided)
  std::vector<char> handed_;          // [layer][weight][x, dy]: a producer has the slot (input_maxima, produced)
  std::unique_ptr<CudaFp8History> history_;  // train.fp8=delayed
};

}  // namespace st
