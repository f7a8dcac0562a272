// What a block's linear layer computes its three GEMMs in under train.fp8: data, not branches. Each GEMM kind names
// its two operands' FP8 format and how their scales are grouped (kernels/fp8.h); a GEMM takes FP8 when the recipe is
// on and its shape is eligible. The families' linear layers are the block matrices (model/lora.h's lora_linears name
// them); the classifier, attention, norms and embeddings are not linear layers of a block and never take FP8.
//
//   forward        y  = x W^T     x [N, C] E4M3 (per row),       W [OC, C] E4M3 (per row: an output feature)
//   input grad     dx = dy W      dy [N, OC] E5M2 (per row),     W E4M3 (per column: an input feature)
//   weight grad    dW = dy^T x    dy E5M2 (per column),          x E4M3 (per column)
// tensorwise scales each operand as a whole; rowwise as above, with power-of-two scales (torchao's rowwise recipe);
// delayed as tensorwise, by the largest maximum of the operand over the last amax_history steps (model/fp8_history.h).
// Gradients take E5M2 for its range (2^-16 .. 57344) where their magnitudes spread wider than activations'; inputs
// and weights E4M3 for its extra mantissa bit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/kernels/fp8.h"

namespace st {

struct Fp8Operand {
  Fp8Format format = Fp8Format::kE4M3;
  Fp8Scaling scaling = Fp8Scaling::kTensor;
};

struct Fp8Gemm {
  Fp8Operand a, b;  // in the order of the table above
  // cuda: the GEMM accumulates in the FP8 tensor cores' own precision throughout (cuBLASLt's FAST_ACCUM), as torchao
  // runs its output GEMM: faster, less exact. train.fp8_fast_accum sets it for the forward; the gradients' GEMMs never
  // take it. The CPU emulation accumulates in fp32 either way (and refuses the key).
  bool fast_accum = false;
};

struct Fp8Policy {
  Fp8Recipe recipe = Fp8Recipe::kOff;
  bool power_of_2 = false;
  Fp8Gemm forward, input_grad, weight_grad;
  // Where a cast scales an operand by one maximum of the whole tensor, whether the kernel that writes the operand
  // (a norm, SwiGLU, RoPE's backward, ...) folds that maximum in as it writes it (CudaLinear::input_maxima) instead of
  // the cast taking a pass over the tensor: the same bits either way, one read of the tensor fewer. Off only to
  // compare the two. The CPU backend takes its maxima in its casts either way.
  bool producer_maxima = true;
  // dist.fp8_gather (shard/fp8_gather.h): the weights of the layers the policy applies to arrive cast, and both GEMMs
  // that read W take them as they are: on the CPU, the values the codes decode to; on cuda, W's region holds its E4M3
  // codes [out, in] and its inverse scale where fp8_weight_codes says. Needs one_weight_cast().
  bool weights_cast = false;
  // cuda: a layer whose x both casts scale by one maximum of the whole tensor (tensorwise) casts x^T for its weight
  // gradient in the forward, from the read that casts x (gpu::fp8_quantize_pair), and the model keeps those codes, 1
  // byte an element, in place of x itself where only that gradient reads x (fp8_input_codes): the backward's cast of
  // x^T goes, and so does half of what x took of the activations. The same bits either way. Off only to compare the
  // two; the CPU backend keeps x either way.
  bool keep_input_codes = true;
  // cuda, train.fp8=delayed: where the scale of a layer's input is known before the input is (a history of at least
  // one step), the kernel that computes the input writes its codes instead of the input itself
  // (CudaLinear::fused_input, fused_output_grad; llama's RMSNorms into the q/k/v and gate/up projections, the SwiGLU
  // into the down projection, its backward into the gate/up projection's backward). The bits of casting the written
  // tensor, but for an input whose history holds only zeros (scale 1 instead of its own maximum's). Off only to
  // compare the two.
  bool fuse_casts = true;
  // train.fp8=delayed: the steps of maxima a cast's scale looks back over (train.fp8_amax_history); 0 otherwise.
  int amax_history = 0;
  bool delayed() const { return recipe == Fp8Recipe::kDelayed; }

  // Whether a linear layer of `in` inputs and `out` outputs runs in FP8: the recipe is on, and both dimensions are
  // multiples of 16 (FP8 tensor-core GEMMs need 16-byte aligned rows of the operands).
  bool applies(int64_t in, int64_t out) const { return recipe != Fp8Recipe::kOff && in % 16 == 0 && out % 16 == 0; }
  // Whether an applicable layer's weight gradient over `rows` tokens (its GEMM's depth) runs in FP8: a multiple of 16.
  bool weight_grad_applies(int64_t rows) const { return rows % 16 == 0; }
  // Whether a layer of `in` inputs and `out` outputs may keep x^T's codes from its forward (keep_input_codes): it
  // runs in FP8 and both casts of x take one maximum of the whole tensor (fp8_kept_maxima's x).
  bool keeps_input_codes(int64_t in, int64_t out) const;
  // Whether one cast of a weight serves both GEMMs that read it (the forward's W and, transposed, the input
  // gradient's): one scale a tensor and one format (tensorwise). What dist.fp8_gather needs (shard/fp8_gather.h).
  bool one_weight_cast() const {
    return recipe != Fp8Recipe::kOff && forward.b.scaling == Fp8Scaling::kTensor &&
           input_grad.b.scaling == Fp8Scaling::kTensor && forward.b.format == input_grad.b.format;
  }
};

// The recipe's policy; amax_history is the length a delayed recipe's histories keep (ignored by the others).
Fp8Policy fp8_policy(Fp8Recipe recipe, int amax_history = 16);

// Where a weight cast by a gather (Fp8Policy::weights_cast) lies on cuda, given the weight's place in the gathered
// buffer (`w`: its region of numel elements of elem_bytes each): its numel codes from the first 256-byte boundary in
// the region (cuBLASLt's FP8 GEMM picks its algorithm by the operands' alignment: so the codes align as a cast's own
// buffer does), then its inverse scale. Null where they do not fit the region (a weight of under 260 elements in 16
// bits that starts just past a boundary; the gatherer refuses it).
inline uint8_t* fp8_weight_codes(const void* w, int64_t numel, int64_t elem_bytes) {
  const auto at = reinterpret_cast<uintptr_t>(w);
  const uintptr_t codes = (at + 255) / 256 * 256;
  if (codes - at + static_cast<uintptr_t>(numel) + sizeof(float) > static_cast<uintptr_t>(numel * elem_bytes))
    return nullptr;
  return reinterpret_cast<uint8_t*>(codes);
}

// The [out, in] shapes of the family's block matrices that train.fp8 may put in FP8 (each weight of lora_linears
// once, in its order: llama's attn.qkv, attn.o, mlp.gate_up, mlp.down; gpt2's attn.qkv, attn.proj, mlp.fc, mlp.proj),
// with the weight's name.
struct LinearShape {
  int64_t out = 0, in = 0;
  std::string weight;
};
std::vector<LinearShape> block_linear_shapes(const ModelConfig& cfg);

// Which of the blocks' linear layers a call runs: the block's index and the weight's name (block_linear_shapes).
struct LinearSite {
  int layer = -1;  // -1: unnamed
  const char* weight = "";
};
// The site's index among the model's n_layer x weights.size() sites, layer-major in the order of `weights`
// (block_linear_shapes). Throws for a weight none of them names or a layer outside [0, n_layer).
int64_t fp8_site_index(const std::vector<LinearShape>& weights, int n_layer, LinearSite site);

// Whether a CUDA model of cfg keeps the codes of linear layer `l`'s x^T from its forward in place of x: the policy
// allows it for the layer (Fp8Policy::keeps_input_codes); no LoRA (the adapters read x); and every training pass's
// weight gradient runs in FP8 (cfg.seq_len a multiple of 16, so that any micro-batch's tokens are). The model then
// keeps the codes only of layers whose x nothing else in the backward reads (llama: q/k/v, gate/up, down; GPT-2: qkv,
// fc, MLP proj).
bool fp8_input_codes(const ModelConfig& cfg, const Fp8Policy& policy, const LinearShape& l);

// What a linear layer's FP8 casts need at most over the block's layers the policy applies to, for up to max_rows
// tokens, in codes per operand buffer: `a`, each GEMM's first operand (forward x [N, in], input gradient dy [N, out]);
// `b`, its second (W [out, in], W^T, x^T [in, N]); `t`, dy^T [out, N], cast with dy in one pass and kept for the
// weight gradient's GEMM. `groups`: scale groups per operand. All zero when none applies. The three buffers lie in
// one region in that order, each at a 256-byte boundary.
// Per site (a block's linear layer: n_layer x the family's), what CudaLinear keeps from a forward for its backward:
// `kept_maxima`, the maxima of x, W and dy (kMaximaPerSite a site) where the recipe scales any of them as a whole
// tensor; `input_scales`, the inverse scale of a layer's kept x^T codes, one a 256-byte slot (cuBLASLt refuses an
// FP8 GEMM whose scale pointer is only 4-byte aligned), where some layer keeps them (fp8_input_codes).
struct Fp8Workspace {
  static constexpr int64_t kMaximaPerSite = 3, kInputScaleStride = 64;
  int64_t a = 0, b = 0, t = 0, groups = 0;
  int64_t kept_maxima = 0, input_scales = 0;  // unsigned and float elements
  static int64_t aligned(int64_t bytes) { return (bytes + 255) / 256 * 256; }
  int64_t b_offset() const { return aligned(a); }
  int64_t t_offset() const { return b_offset() + aligned(b); }
  int64_t region_bytes() const { return t_offset() + aligned(t); }
};
Fp8Workspace fp8_workspace(const ModelConfig& cfg, int64_t max_rows, const Fp8Policy& policy);
// Whether the policy's casts of x (forward and weight gradient), W (forward and input gradient) or dy (both
// gradients) take one maximum of the whole tensor both times, so that the first cast's maximum serves the second.
struct Fp8KeptMaxima {
  bool x = false, w = false, dy = false;
  bool any() const { return x || w || dy; }
};
Fp8KeptMaxima fp8_kept_maxima(const Fp8Policy& policy);

}  // namespace st
