#include "shardtrain/model/cuda_footprint.h"

#include <algorithm>
#include <initializer_list>

#include "shardtrain/core/error.h"
#include "shardtrain/kernels/scratch_sizes.h"
#include "shardtrain/model/fp8_history.h"
#include "shardtrain/model/fp8_policy.h"
#include "shardtrain/model/lora.h"

namespace st {
namespace {

// B x T = 16 x 1024 at a 50304-wide vocabulary: 4 chunks of 4096 rows. Each chunk's weight-gradient GEMM reads and
// writes the whole [Vp, C] gradient once, so fewer, larger chunks cost less traffic and fewer roundings of that
// gradient than many small ones.
constexpr int64_t kLogitsChunkElems = int64_t{256} << 20;

// Whether a block keeps the x^T codes of the input of its linear layer `weight` in place of the input
// (fp8_input_codes).
bool keeps_codes(const ModelConfig& cfg, const Fp8Policy& fp8, const char* weight) {
  for (const LinearShape& l : block_linear_shapes(cfg))
    if (l.weight == weight) return fp8_input_codes(cfg, fp8, l);
  return false;
}

// The kernel scratch is one buffer that each pass uses in turn: it holds the largest need.
int64_t largest(std::initializer_list<size_t> needs) { return static_cast<int64_t>(std::max(needs)); }

}  // namespace

int64_t cuda_classifier_chunk_rows(const ModelConfig& cfg, int64_t BT) {
  const int64_t max_rows = std::max<int64_t>(1, std::min<int64_t>(BT, kLogitsChunkElems / cfg.padded_vocab()));
  const int64_t chunks = (BT + max_rows - 1) / max_rows;
  return (BT + chunks - 1) / chunks;
}

int64_t cuda_lm_io_device_bytes(const ModelConfig& cfg, int64_t max_batch, int64_t elem_bytes) {
  const int64_t BT = max_batch * cfg.seq_len;
  const int64_t logits = cuda_classifier_chunk_rows(cfg, BT) * cfg.padded_vocab() * elem_bytes;
  return logits + BT * 4 + 2 * BT * 4 + 8;  // + the losses; tokens and targets; their sum
}

LlamaActivationSizes::LlamaActivationSizes(const ModelConfig& cfg, int64_t max_batch, Recompute recompute,
                                           const Fp8Policy& fp8)
    : B(max_batch),
      T(cfg.seq_len),
      BT(max_batch * cfg.seq_len),
      C(cfg.n_embd),
      QKV(cfg.qkv_dim()),
      F(cfg.mlp_dim()),
      NH(cfg.n_head),
      blocks(recompute.sets(cfg.n_layer)),
      layers(cfg.n_layer),
      lora(lora_activation_elems(cfg, BT, blocks)),
      coded_qkv(keeps_codes(cfg, fp8, "attn.qkv.weight")),
      coded_gate_up(keeps_codes(cfg, fp8, "mlp.gate_up.weight")),
      coded_down(keeps_codes(cfg, fp8, "mlp.down.weight")) {}

int64_t LlamaActivationSizes::elems() const {
  return blocks * block_elems() + layers * BT * C + BT * C + 4 * BT * C + BT * QKV + 3 * BT * F + lora;
}

int64_t LlamaActivationSizes::floats(int head_dim) const { return blocks * block_floats() + BT + T * head_dim; }

GptActivationSizes::GptActivationSizes(const ModelConfig& cfg, int64_t max_batch, Recompute recompute,
                                       const Fp8Policy& fp8)
    : B(max_batch),
      T(cfg.seq_len),
      BT(max_batch * cfg.seq_len),
      C(cfg.n_embd),
      NH(cfg.n_head),
      blocks(recompute.sets(cfg.n_layer)),
      layers(cfg.n_layer),
      lora(lora_activation_elems(cfg, BT, blocks)),
      coded_qkv(keeps_codes(cfg, fp8, "attn.qkv.weight")),
      coded_fc(keeps_codes(cfg, fp8, "mlp.fc.weight")),
      coded_proj(keeps_codes(cfg, fp8, "mlp.proj.weight")) {}

int64_t GptActivationSizes::elems() const {
  return blocks * block_elems() + layers * BT * C + BT * C + 4 * BT * C + 3 * BT * C + 4 * BT * C + lora;
}

int64_t gpt_block_column_sums_bytes(int64_t BT, int C) {
  auto floats = [](size_t bytes) { return static_cast<int64_t>(bytes / sizeof(float)); };
  size_t b = 2 * gpu::column_sums_reserved_bytes(floats(gpu::layernorm_backward_scratch_bytes(BT, C)));
  for (int oc : {C, 4 * C, C, 3 * C})
    b += gpu::column_sums_reserved_bytes(floats(gpu::matmul_backward_scratch_bytes(BT, oc)));
  return static_cast<int64_t>(b);
}

CudaModelFootprint cuda_llama_footprint(const ModelConfig& cfg, int64_t max_batch, Recompute recompute,
                                        int64_t elem_bytes, int64_t attention_scratch_bytes, const Fp8Policy& fp8) {
  const LlamaActivationSizes z(cfg, max_batch, recompute, fp8);
  const int B = static_cast<int>(z.B), T_ = static_cast<int>(z.T), C = static_cast<int>(z.C);
  CudaModelFootprint f;
  f.activation_bytes = z.elems() * elem_bytes + z.blocks * z.block_code_bytes() + z.floats(cfg.head_dim()) * 4 +
                       cuda_lm_io_device_bytes(cfg, max_batch, elem_bytes);
  f.scratch_bytes =
      largest({gpu::embedding_backward_scratch_bytes(B, T_, C), gpu::rmsnorm_backward_scratch_bytes(z.BT, C),
               cfg.qkv_bias ? gpu::matmul_backward_scratch_bytes(z.BT, static_cast<int>(z.QKV)) : 0,
               gpu::flash_attention_backward_scratch_bytes(B, T_, cfg.n_head, cfg.kv_heads(), cfg.head_dim()),
               gpu::reduce_scratch_bytes(), static_cast<size_t>(attention_scratch_bytes)});
  return f;
}

CudaModelFootprint cuda_gpt_footprint(const ModelConfig& cfg, int64_t max_batch, Recompute recompute,
                                      int64_t elem_bytes, int64_t attention_scratch_bytes, const Fp8Policy& fp8) {
  const GptActivationSizes z(cfg, max_batch, recompute, fp8);
  const int B = static_cast<int>(z.B), T_ = static_cast<int>(z.T), C = static_cast<int>(z.C),
            NH = static_cast<int>(z.NH);
  CudaModelFootprint f;
  f.activation_bytes = z.elems() * elem_bytes + z.blocks * z.block_code_bytes() + z.floats() * 4 +
                       cuda_lm_io_device_bytes(cfg, max_batch, elem_bytes) + gpt_block_column_sums_bytes(z.BT, C);
  f.scratch_bytes = largest(
      {gpu::embedding_backward_scratch_bytes(B, T_, C), gpu::layernorm_backward_scratch_bytes(z.BT, C),
       gpu::matmul_backward_scratch_bytes(z.BT, 4 * C), gpu::flash_attention_backward_scratch_bytes(B, T_, C, NH),
       gpu::reduce_scratch_bytes(), static_cast<size_t>(attention_scratch_bytes)});
  return f;
}

int64_t cuda_linear_workspace_bytes(const ModelConfig& cfg, int64_t max_rows, Fp8Recipe recipe, int amax_history) {
  const Fp8Workspace w = fp8_workspace(cfg, max_rows, fp8_policy(recipe, amax_history));
  if (w.a == 0) return 0;
  // delayed: CudaFp8History's ring of amax_history entries, the step's maxima, the history's and the applied ones.
  const int64_t history = recipe == Fp8Recipe::kDelayed
                              ? (amax_history + 3) * int64_t{cfg.n_layer} *
                                    static_cast<int64_t>(block_linear_shapes(cfg).size()) * kFp8Operands
                              : 0;
  return 3 * w.groups * static_cast<int64_t>(sizeof(float)) +
         static_cast<int64_t>(gpu::fp8_quantize_scratch_bytes(2 * w.groups)) +
         (w.kept_maxima + history) * static_cast<int64_t>(sizeof(unsigned)) +
         w.input_scales * static_cast<int64_t>(sizeof(float));
}

int64_t cuda_linear_codes_bytes(const ModelConfig& cfg, int64_t max_rows, Fp8Recipe recipe) {
  const Fp8Workspace w = fp8_workspace(cfg, max_rows, fp8_policy(recipe));
  return w.a == 0 ? 0 : w.region_bytes();
}

CudaModelFootprint cuda_model_footprint(const ModelConfig& cfg, int64_t max_batch, Recompute recompute, DType dtype,
                                        int64_t attention_scratch_bytes, Fp8Recipe fp8) {
  ST_CHECK(dtype != DType::kAuto, "cuda_model_footprint needs a resolved compute type");
  const int64_t t = dtype_bytes(dtype);
  CudaModelFootprint f =
      cfg.is_llama() ? cuda_llama_footprint(cfg, max_batch, recompute, t, attention_scratch_bytes, fp8_policy(fp8))
                     : cuda_gpt_footprint(cfg, max_batch, recompute, t, attention_scratch_bytes, fp8_policy(fp8));
  f.scratch_bytes = std::max(f.scratch_bytes, cuda_linear_codes_bytes(cfg, max_batch * cfg.seq_len, fp8));
  return f;
}

}  // namespace st
