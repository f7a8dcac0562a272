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

#include "shardtrain/ckpt/file_io.h"
#include "shardtrain/ckpt/h5.h"
#include "shardtrain/core/config.h"
#include "shardtrain/model/gpt2/gpt2_hf.h"
#include "shardtrain/model/llama/llama_hf.h"
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

// write_hf_weights a unit at a time, for a writer that holds one unit's buffer at once (ckpt.export at the end of a
// run gathers the units in turn): the same file, each unit's tensors written when it is handed over.
//
//   HfWeightsWriter w(path, cfg, units);         // kBadInput if `path` exists; the temporary file is created here
//   for (int u = 0; u < n; ++u) w.write_unit(u, buffer_of(u));
//   w.commit();                                  // every unit written (else kInternal); renamed into place
//
// A writer destroyed before commit() removes its temporary file. `units` must outlive the writer.
class HfWeightsWriter {
 public:
  HfWeightsWriter(const std::string& path, const ModelConfig& cfg, const std::vector<UnitLayout>& units);
  HfWeightsWriter(const HfWeightsWriter&) = delete;
  HfWeightsWriter& operator=(const HfWeightsWriter&) = delete;
  // Writes the tensors of unit `unit` from its full flat buffer; each unit once.
  void write_unit(int unit, const float* buffer);
  void commit();

 private:
  std::string path_, tmp_;
  ModelConfig cfg_;
  const std::vector<UnitLayout>& units_;
  std::vector<bool> written_;
  RemoveOnFailure cleanup_;  // declared before file_: the file is closed before a failed write removes it
  H5File file_;
  std::vector<HfRange> llama_map_;     // the family's tensors: one of the two maps is empty
  std::vector<HfTensorMap> gpt2_map_;  // (points into units_)
  std::vector<float> scratch_;         // a transposed GPT-2 matrix
};

// Reads every tensor back into the units' flat buffers; wte padding rows are set to zero. Shapes must
// match the config (errors name the file, the dataset and both shapes).
void read_hf_gpt2(const std::string& path, const ModelConfig& cfg, const std::vector<UnitLayout>& units,
                  const std::vector<float*>& unit_buffers);

}  // namespace st
