// A streaming writer of fp32 or bf16 safetensors files (https://huggingface.co/docs/safetensors), the format
// Hugging Face loads with safetensors.torch.load_file / from_pretrained.
//
// File layout:
//   bytes [0, 8)        N, the header length, unsigned 64-bit little-endian
//   bytes [8, 8 + N)    UTF-8 JSON, in the order the tensors were declared:
//                         {"<name>": {"dtype": "F32" | "BF16", "shape": [...], "data_offsets": [begin, end]}, ...,
//                          "__metadata__": {"format": "pt"}}
//                       padded with spaces (0x20) so that the data section starts 8-byte aligned
//   bytes [8 + N, EOF)  the tensors' raw little-endian fp32 bytes, back to back in declaration order;
//                       data_offsets are byte offsets relative to the start of this data section, and
//                       the last tensor ends exactly at the end of the file
//
// Contract:
//  * Every tensor is declared up front (name and row-major shape), so the whole header, with all offsets,
//    is computed from the shapes and written before any data. The data then streams one tensor at a time:
//    the writer never holds more than the caller's current tensor.
//  * Names are unique, non-empty and not "__metadata__"; dimensions are >= 0 (a tensor may be empty).
//    A violation is kInternal, thrown by the constructor before the file is created.
//  * write() must be called once per tensor, in declaration order, with exactly that tensor's element
//    count; anything else is kInternal naming the tensor. finish() is kInternal unless every tensor was
//    written; it flushes, fsyncs and closes the file.
//  * The writer writes `path` itself, truncating it. Atomicity (write a temporary name, then rename) is
//    the caller's business. I/O failures (cannot create, disk full) are kFault naming the path and
//    strerror. A writer destroyed before finish() closes the file and leaves it incomplete.
//  * The caller always hands fp32. An F32 tensor is written as it is in memory (little-endian host, checked at
//    compile time), so NaN payloads, -0.0 and denormals survive bit for bit. A BF16 tensor is rounded to nearest
//    even (round_to_bf16: any NaN becomes the canonical NaN), which is exact for values that came from bf16.
//
//   SafetensorsWriter w(path, {{"a", {2, 3}}, {"b", {4}}});   // header written here
//   w.write("a", a_data, 6);
//   w.write("b", b_data, 4);
//   w.finish();                                                // fsync + close
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/core/unique_fd.h"

namespace st {

enum class SafetensorsDtype { kF32, kBF16 };

struct SafetensorsTensor {
  std::string name;            // e.g. "transformer.h.0.attn.c_attn.weight"
  std::vector<int64_t> shape;  // row-major; {} is a scalar (1 element)
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
};

// Bytes of a tensor's data in the file.
int64_t safetensors_bytes(const SafetensorsTensor& t);

// The header JSON for these tensors (their dtypes, offsets back to back), padded with spaces so that
// 8 + size() is a multiple of 8. This is exactly the text SafetensorsWriter writes after the length.
std::string safetensors_header(const std::vector<SafetensorsTensor>& tensors);

class SafetensorsWriter {
 public:
  // Validates the tensor list, creates `path` (truncating) and writes the length and the header.
  SafetensorsWriter(const std::string& path, std::vector<SafetensorsTensor> tensors);
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;
  ~SafetensorsWriter();

  // Appends the next tensor's `numel` elements; `name` must be the next declared tensor.
  void write(const std::string& name, const float* data, int64_t numel);
  // Checks that every tensor was written, then flushes, fsyncs and closes the file.
  void finish();

  // Bytes the complete file has: 8 + header + data.
  int64_t file_bytes() const { return file_bytes_; }
  const std::string& path() const { return path_; }

 private:
  void write_all(const void* data, int64_t bytes);

  std::string path_;
  std::vector<SafetensorsTensor> tensors_;
  size_t next_ = 0;  // index of the next tensor to write
  UniqueFd fd_;
  int64_t file_bytes_ = 0;
};

}  // namespace st
