// Full named tensors with Hugging Face names and layouts, in one HDF5 file: GPT-2's (below), or the llama family's
// (model/llama/llama_hf.h: ranges of our units, no transposes).
//
// HF's GPT-2 uses Conv1D, whose weights are [in, out]: our [out, in] matrices are transposed on the way
// out (attn.c_attn.weight is [C, 3C]). transformer.wte.weight keeps only the real vocabulary rows
// [vocab_size, C]; the padding rows exist only in memory. lm_head.weight is tied to wte and not written.
//
//   write_hf_gpt2(path, cfg, units, {P[0], P[1], ...});   // one full flat buffer per unit
#pragma once

#include <string>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/model/units.h"

namespace st {

struct HfTensorMap {
  std::string hf_name;            // "transformer.h.0.attn.c_attn.weight"
  int unit = 0;                   // index into the unit list
  const TensorSpec* tensor = nullptr;
  bool transpose = false;         // Conv1D layout
  std::vector<int64_t> hf_shape;  // shape as written
};

// The mapping for every tensor of every unit, in unit order.
std::vector<HfTensorMap> hf_gpt2_tensor_map(const ModelConfig& cfg, const std::vector<UnitLayout>& units);

// [rows, cols] row-major -> [cols, rows]: between our [out, in] matrices and HF's Conv1D [in, out].
void transpose_2d(const float* in, float* out, int64_t rows, int64_t cols);

// Writes every tensor from the units' full flat buffers (params or grads alike).
void write_hf_gpt2(const std::string& path, const ModelConfig& cfg, const std::vector<UnitLayout>& units,
                   const std::vector<const float*>& unit_buffers);

// The family's names: write_hf_gpt2 for gpt2; for llama, the tensors of llama_hf_tensor_map (embed_tokens and
// lm_head cut to vocab_size rows, q/k/v and gate/up split), fp32.
void write_hf_weights(const std::string& path, const ModelConfig& cfg, const std::vector<UnitLayout>& units,
                      const std::vector<const float*>& unit_buffers);

// Reads every tensor back into the units' flat buffers; wte padding rows are set to zero. Shapes must
// match the config (errors name the file, the dataset and both shapes).
void read_hf_gpt2(const std::string& path, const ModelConfig& cfg, const std::vector<UnitLayout>& units,
                  const std::vector<float*>& unit_buffers);

}  // namespace st
