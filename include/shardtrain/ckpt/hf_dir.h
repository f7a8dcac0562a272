// The weights of a Hugging Face model directory: model.safetensors, or the files model.safetensors.index.json's
// weight_map names (a sharded checkpoint). Each file's header is read once, when a tensor in it is first asked
// for; tensor data is read only by range (SafetensorsReader::read_range), never a whole file.
//
//   HfDirWeights w("Llama-3.2-1B");
//   w.check("model.norm.weight", {2048});                      // present, that shape, a readable dtype
//   w.read_range("model.norm.weight", 0, 2048, out);
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "shardtrain/ckpt/safetensors_reader.h"

namespace st {

class HfDirWeights {
 public:
  // Reads the index (when there is one: its weight_map must be an object of file names within `dir`) and opens every
  // file it names, validating each header (SafetensorsReader) and that each file holds exactly the tensors the index
  // places in it; kBadInput naming the directory if it holds neither model.safetensors nor
  // model.safetensors.index.json, and naming the file and the tensor otherwise.
  explicit HfDirWeights(const std::string& dir);

  bool has(const std::string& name) const;
  // Every tensor of the directory, in name order.
  std::vector<std::string> names() const;
  // The path of the file that holds `name`, for messages; its shape and dtype (as the header spells it).
  std::string path_of(const std::string& name) const;
  const std::vector<int64_t>& shape(const std::string& name) const;
  const std::string& dtype(const std::string& name) const;
  // kBadInput naming the tensor and the file(s) looked in if it is missing, and naming the file and the tensor if
  // its shape differs from `shape` (both shapes) or its dtype is not F32, F16 or BF16.
  void check(const std::string& name, const std::vector<int64_t>& shape) const;
  // Elements [begin, begin + count) of a tensor, converted to fp32 exactly.
  void read_range(const std::string& name, int64_t begin, int64_t count, float* out) const;
  // The same elements as 16-bit `kind` (SafetensorsReader::read_range_half): the first non-finite one, or -1.
  int64_t read_range_half(const std::string& name, int64_t begin, int64_t count, HalfKind kind, uint16_t* out) const;
  // The safetensors file that holds `name` (per the index), relative to the directory.
  const std::string& file_of(const std::string& name) const;

 private:
  const SafetensorsReader& reader(const std::string& file) const;

  std::string dir_;
  std::string index_path_;                         // empty: a single model.safetensors
  std::map<std::string, std::string> weight_map_;  // tensor -> file (single file: every tensor it holds)
  mutable std::map<std::string, std::unique_ptr<SafetensorsReader>> readers_;  // by file name
};

}  // namespace st
