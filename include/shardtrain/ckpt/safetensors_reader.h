// Reads tensors from a safetensors file (the layout is in safetensors.h) as fp32, one tensor at a time:
// opening parses and validates only the header; read() reads the one tensor asked for.
//
//   SafetensorsReader r("model.safetensors");
//   if (r.has("wte.weight")) r.read("wte.weight", {50257, 768}, buf.data());
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "shardtrain/core/unique_fd.h"
#include "shardtrain/kernels/adamw_host.h"

namespace st {

class SafetensorsReader {
 public:
  // Opens the file and validates the header as the safetensors library does (its Metadata::validate), so that
  // every tensor's bytes are its own and nothing in the file goes unread:
  //  * the header length fits the file and is at most 100,000,000 bytes; the header is a UTF-8 JSON object;
  //  * __metadata__, if present, maps names to strings;
  //  * every tensor has a dtype the format defines (BOOL, U8 ... F64, C64; reading converts F32, F16 and BF16 only),
  //    a shape of integers >= 0 and data_offsets [begin, end] with begin <= end <= the data section's size and
  //    end - begin = the shape's elements x the dtype's size;
  //  * taken in offset order the tensors tile the data section: each begins where the one before it ends (no
  //    overlap, no hole), the first at 0, and the last ends at the end of the file (no trailing bytes).
  // Errors are kBadInput naming the path, the tensor(s) and the offsets, expected against actual.
  explicit SafetensorsReader(const std::string& path);

  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  std::vector<std::string> names() const;
  const std::vector<int64_t>& shape(const std::string& name) const;
  // The tensor's dtype as the header spells it ("F32", "BF16", ...).
  const std::string& dtype(const std::string& name) const;
  // Copies the tensor into out as fp32. Its shape must equal `shape` (the error names the tensor, the file
  // and both shapes); dtypes F32, F16 and BF16 are accepted (any other is kBadInput naming the file, the tensor
  // and the dtype), and converted exactly.
  void read(const std::string& name, const std::vector<int64_t>& shape, float* out) const;
  // Elements [begin, begin + count) of the tensor in row-major order, as read(): only their bytes are read, on up to
  // eight threads. Not for two threads at once.
  void read_range(const std::string& name, int64_t begin, int64_t count, float* out) const;
  // The same elements as 16-bit `kind` (HalfKind::kBF16 or kF16): a tensor stored in `kind` is copied as its bits;
  // any other (F32, or the other 16-bit type) is widened and rounded to nearest even (round_to_half). Returns the
  // first of them that is NaN or infinite as stored, before any rounding (-1: none), so that the check sees what a
  // read as fp32 sees.
  int64_t read_range_half(const std::string& name, int64_t begin, int64_t count, HalfKind kind, uint16_t* out) const;
  const std::string& path() const { return path_; }

 private:
  struct Entry;
  const Entry& entry(const std::string& name) const;
  // The entry of a tensor whose elements [begin, begin + count) a read may take: a dtype it converts, a range inside.
  const Entry& readable(const std::string& name, int64_t begin, int64_t count) const;
  // Elements [first, first + n) (n <= one chunk) of `e` widened to fp32 into out, through thread `thread`'s buffer.
  void read_chunk_wide(const Entry& e, int64_t first, int64_t n, int thread, float* out) const;
  // The threads that read `chunks` chunks, with a buffer each.
  int chunk_threads(int64_t chunks) const;
  struct Entry {
    std::string dtype;
    std::vector<int64_t> shape;
    int64_t begin = 0, end = 0;  // absolute byte offsets in the file
  };
  std::string path_;
  UniqueFd fd_;
  mutable std::vector<std::vector<uint16_t>> raw_;  // read_range's 16-bit chunk, one a thread
  mutable std::vector<std::vector<float>> wide_;    // read_range_half's fp32 chunk, one a thread
  std::map<std::string, Entry> tensors_;
};

}  // namespace st
