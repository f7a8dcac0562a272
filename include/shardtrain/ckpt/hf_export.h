// Full named tensors with Hugging Face names and layouts, in one HDF5 file: GPT-2's (below), or the llama family's
// (model/llama/llama_hf.h: ranges of our units, no transposes).
//
// GPT-2's names and layouts are model/gpt2/gpt2_hf.h's: Conv1D matrices transposed, wte cut to the real vocabulary,
// lm_head tied and not written.
//
//   write_hf_gpt2(path, cfg, units, {P[0], P[1], ...});   // one full flat buffer per unit
#pragma once

#include <string>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/model/gpt2/gpt2_hf.h"
#include "shardtrain/model/units.h"

namespace st {

// Writes every tensor from the units' full flat buffers (params or grads alike) into a new file: a `path` that exists,
// or that appears while the file is written, is kBadInput naming it (as "ckpt.export"), and nothing is replaced. The
// file is written beside `path` as `path`.tmp-<pid> and renamed into place; a failed write leaves neither.
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
