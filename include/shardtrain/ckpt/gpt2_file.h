// A .safetensors or .h5 file of GPT-2 tensors under Hugging Face's names, with or without the "transformer." prefix
// (GPT2LMHeadModel's exports carry it; GPT2Model's, the hub's gpt2, do not): what init.from reads, and what a GPT-2
// LoRA checkpoint's merged export reads its base from. Headers are validated on open (SafetensorsReader; for .h5,
// h5_check_disjoint).
//
//   const Gpt2File f("/models/gpt2/model.safetensors");
//   f.read(f.resolve("transformer.h.0.attn.c_attn.weight"), {768, 2304}, out);
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "shardtrain/ckpt/h5.h"
#include "shardtrain/ckpt/safetensors_reader.h"

namespace st {

class Gpt2File {
 public:
  // kBadInput naming the path for anything but a .safetensors or .h5 file, or a bad header.
  explicit Gpt2File(const std::string& path);

  const std::set<std::string>& names() const { return names_; }
  // The name `hf_name` ("transformer.h.0...") has in the file, or kBadInput naming both spellings.
  std::string resolve(const std::string& hf_name) const;
  std::vector<int64_t> shape(const std::string& name) const;
  // The tensor as fp32; its shape must be `shape` (kBadInput naming both).
  void read(const std::string& name, const std::vector<int64_t>& shape, float* out) const;

 private:
  std::string path_;
  std::unique_ptr<SafetensorsReader> st_;
  std::unique_ptr<H5File> h5_;
  std::set<std::string> names_;
};

}  // namespace st
