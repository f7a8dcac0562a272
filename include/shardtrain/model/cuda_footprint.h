// The device memory of the CUDA models (CudaGpt, CudaLlama) as host arithmetic: every activation buffer's element
// count from the config alone, which the models' constructors allocate and the memory plan sums, and the kernel
// scratch their passes need (kernels/scratch_sizes.h). Host code, so that `shardtrain plan` and the CPU tests size a
// CUDA run without a GPU.
//
//   const CudaModelFootprint f = cuda_model_footprint(cfg.model, B, recompute, DType::kBF16, attention_scratch);
//   // f.activation_bytes: what the model allocates; f.scratch_bytes: what GpuContext::scratch must hold
#pragma once

#include <cstdint>

#include "shardtrain/core/config.h"
#include "shardtrain/model/fp8_policy.h"
#include "shardtrain/model/recompute.h"

namespace st {

// Device bytes a CUDA model allocates for micro-batches of max_batch (activations, backward buffers, logits chunk,
// losses), and the kernel scratch it needs in GpuContext::scratch (at least the attention scratch it was given).
struct CudaModelFootprint {
  int64_t activation_bytes = 0;
  int64_t scratch_bytes = 0;
};

// Classifier rows per chunk: the logits scratch holds at most 256 Mi elements (512 MB in bf16) whatever the
// vocabulary and batch, and the rows are split evenly.
int64_t cuda_classifier_chunk_rows(const ModelConfig& cfg, int64_t BT);

// Device bytes of CudaLmIo (cuda_lm_io.h) for elements of elem_bytes: tokens, targets, the logits chunk, the
// per-token losses and their sum.
int64_t cuda_lm_io_device_bytes(const ModelConfig& cfg, int64_t max_batch, int64_t elem_bytes);

// Element counts of every CudaLlama buffer. `blocks` sets of block activations (model/recompute.h: one shared by the
// recomputed blocks, which backward refills from the saved block input, and one for each other block); every layer
// keeps its output.
struct LlamaActivationSizes {
  int64_t B, T, BT, C, QKV, F, NH, blocks, layers;
  int64_t lora;  // the LoRA adapters' h and dh (CudaLora): lora_activation_elems (model/lora.h); 0 without LoRA
  // train.fp8: the inputs of the q/k/v, gate/up and down projections (norm1, norm2, mlp) kept as their x^T codes, 1
  // byte an element, instead of in the compute type, where fp8_input_codes (model/fp8_policy.h) says. Their values
  // then pass through buffers that only the backward uses otherwise (dbuf_c, dmlp): nothing else takes memory.
  bool coded_qkv = false, coded_gate_up = false, coded_down = false;
  LlamaActivationSizes(const ModelConfig& cfg, int64_t max_batch, Recompute recompute, const Fp8Policy& fp8 = {});
  // A block's norm1, atty, res2, norm2 [C]; qkv [QKV]; gate_up [2F] and mlp [F], in the compute type, less those kept
  // as codes.
  int64_t block_elems() const {
    return (coded_qkv ? 0 : BT * C) + 2 * BT * C + (coded_gate_up ? 0 : BT * C) + BT * QKV + 2 * BT * F +
           (coded_down ? 0 : BT * F);
  }
  // A block's codes: norm1^T, norm2^T [C], mlp^T [F], those kept.
  int64_t block_code_bytes() const {
    return BT * ((coded_qkv ? C : 0) + (coded_gate_up ? C : 0) + (coded_down ? F : 0));
  }
  int64_t block_floats() const { return 2 * BT + B * NH * T; }  // rstd1, rstd2; att_lse
  // Compute-type elements in all: the blocks, the layer outputs, the embedding output, normf, dresid, dnormf,
  // dbuf_c [C], dqkv [QKV], dmlp [F], dgate_up [2F] and the adapters'.
  int64_t elems() const;
  // fp32 elements in all: the blocks', rstdf [BT] and the RoPE tables (cos and sin [T, hs / 2]).
  int64_t floats(int head_dim) const;
};

// Element counts of every CudaGpt buffer, as LlamaActivationSizes.
struct GptActivationSizes {
  int64_t B, T, BT, C, NH, blocks, layers;
  int64_t lora;  // the LoRA adapters' h and dh, as LlamaActivationSizes::lora
  // train.fp8: the inputs of the qkv, fc and proj (MLP) layers (ln1, ln2, fch_gelu) kept as their x^T codes, as
  // LlamaActivationSizes' (through dbuf_c and dfch in the forward).
  bool coded_qkv = false, coded_fc = false, coded_proj = false;
  GptActivationSizes(const ModelConfig& cfg, int64_t max_batch, Recompute recompute, const Fp8Policy& fp8 = {});
  // A block's ln1, atty, res2, ln2 [C]; qkv [3C]; fch, fch_gelu [4C], less those kept as codes.
  int64_t block_elems() const {
    return 15 * BT * C - BT * C * ((coded_qkv ? 1 : 0) + (coded_fc ? 1 : 0) + (coded_proj ? 4 : 0));
  }
  // A block's codes: ln1^T, ln2^T [C], fch_gelu^T [4C], those kept.
  int64_t block_code_bytes() const {
    return BT * C * ((coded_qkv ? 1 : 0) + (coded_fc ? 1 : 0) + (coded_proj ? 4 : 0));
  }
  int64_t block_floats() const { return 4 * BT + B * NH * T; }  // ln1 and ln2 mean and rstd; att_lse
  // The blocks, the layer outputs, the embedding output, lnf, dresid, dlnf, dbuf_c [C], dqkv [3C], dfch [4C] and the
  // adapters'.
  int64_t elems() const;
  int64_t floats() const { return blocks * block_floats() + 2 * BT; }  // + lnf mean and rstd
};

// Bytes of one GPT-2 block backward's deferred column sums (ColumnSums): two LayerNorms and four biases at BT rows.
int64_t gpt_block_column_sums_bytes(int64_t BT, int C);

// The footprint of each family's CUDA model in elements of elem_bytes (4: fp32, 2: bf16/fp16), with at least
// attention_scratch_bytes of kernel scratch (cuDNN attention's, when the model runs it).
CudaModelFootprint cuda_llama_footprint(const ModelConfig& cfg, int64_t max_batch, Recompute recompute,
                                        int64_t elem_bytes, int64_t attention_scratch_bytes, const Fp8Policy& fp8 = {});
CudaModelFootprint cuda_gpt_footprint(const ModelConfig& cfg, int64_t max_batch, Recompute recompute,
                                      int64_t elem_bytes, int64_t attention_scratch_bytes, const Fp8Policy& fp8 = {});
// CudaLinear's FP8 operand codes for micro-batches of up to max_rows tokens (fp8_workspace's region,
// model/fp8_policy.h): they live in the model's kernel scratch (GpuContext::scratch), so cuda_model_footprint's
// scratch_bytes is at least this. 0 when the recipe is off or no layer is eligible.
int64_t cuda_linear_codes_bytes(const ModelConfig& cfg, int64_t max_rows, Fp8Recipe recipe);
// The device bytes CudaLinear allocates itself (cuda_linear.h): the three operands' inverse scales, the scratch of a
// pair of casts, what it keeps per site (Fp8Workspace::kept_maxima, input_scales) and, under delayed, the amax history
// of amax_history steps (cuda_fp8_history.h). 0 when the recipe is off or no layer is eligible.
int64_t cuda_linear_workspace_bytes(const ModelConfig& cfg, int64_t max_rows, Fp8Recipe recipe, int amax_history = 16);

// cfg.arch's footprint in the compute type `dtype` (not kAuto); with train.fp8 on, its scratch also holds
// cuda_linear_codes_bytes.
CudaModelFootprint cuda_model_footprint(const ModelConfig& cfg, int64_t max_batch, Recompute recompute, DType dtype,
                                        int64_t attention_scratch_bytes, Fp8Recipe fp8 = Fp8Recipe::kOff);

}  // namespace st
