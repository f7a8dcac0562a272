// GPT-2's tensors under Hugging Face's names (GPT2LMHeadModel), for export and init.from.
//
// HF's GPT-2 uses Conv1D, whose weights are [in, out]: our [out, in] matrices are transposed on the way out
// (attn.c_attn.weight is [C, 3C]). transformer.wte.weight keeps only the real vocabulary rows [vocab_size, C]; the
// padding rows exist only in memory. lm_head.weight is tied to wte and not written.
#pragma once

#include <cstdint>
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

}  // namespace st
