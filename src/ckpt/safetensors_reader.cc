#include "shardtrain/ckpt/safetensors_reader.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "bulk_io.h"
#include "shardtrain/core/errno_text.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/excerpt.h"
#include "shardtrain/kernels/adamw_host.h"

namespace st {
namespace {

using file_io_internal::for_each_index;
using file_io_internal::pread_exact;

// Elements of a 16-bit tensor one thread reads and widens at a time (2 MiB of the file).
constexpr int64_t kWidenChunk = int64_t{1} << 20;

// Threads that read a 16-bit tensor: one a core, at most eight.
int reader_threads() { return static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u)); }

// The safetensors library's limit on the header (MAX_HEADER_SIZE): a longer one is refused there too.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// Bytes of one element of the dtypes this reader converts to fp32; 0 for the others.
int64_t dtype_size(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "F16" || dtype == "BF16") return 2;
  return 0;
}

// Bits of one element of every dtype the format defines (the safetensors library's Dtype), 0 for a name it does not.
uint64_t dtype_bits(const std::string& dtype) {
  static const std::map<std::string, uint64_t> bits = {
      {"BOOL", 8},    {"F4", 4},      {"F6_E2M3", 6}, {"F6_E3M2", 6}, {"U8", 8},   {"I8", 8},    {"F8_E5M2", 8},
      {"F8_E4M3", 8}, {"F8_E8M0", 8}, {"I16", 16},    {"U16", 16},    {"F16", 16}, {"BF16", 16}, {"I32", 32},
      {"U32", 32},    {"F32", 32},    {"C64", 64},    {"F64", 64},    {"I64", 64}, {"U64", 64}};
  const auto it = bits.find(dtype);
  return it == bits.end() ? 0 : it->second;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

std::string offsets_str(uint64_t begin, uint64_t end) { return str_cat("[", begin, ", ", end, "]"); }

// One tensor's declared bytes, relative to the data section, for the check that they tile it.
struct Span {
  uint64_t begin = 0, end = 0;
  const std::string* name = nullptr;
};

}  // namespace

SafetensorsReader::SafetensorsReader(const std::string& path)
    : path_(path), fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
  if (!fd_) ST_BAD_INPUT("safetensors file '", path, "' cannot be opened: ", errno_text());
  struct stat st {};
  if (::fstat(fd_.get(), &st) != 0) ST_BAD_INPUT("safetensors file '", path, "': cannot get its size: ", errno_text());
  if (!S_ISREG(st.st_mode)) ST_BAD_INPUT("safetensors file '", path, "' is not a regular file");
  // Every length and offset below comes from the file: each is checked as an unsigned number against the
  // file's size before it sizes an allocation or enters signed arithmetic (a length of 2^63 or more would
  // turn negative in an int64_t and pass a signed bound). The reads below stay within that size.
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  if (file_bytes < 8) ST_BAD_INPUT(path, ": shorter than the 8-byte safetensors header length");
  uint64_t n = 0;
  pread_exact(fd_.get(), path_, reinterpret_cast<char*>(&n), 8, 0);
  if (n > file_bytes - 8)
    ST_BAD_INPUT(path, ": header length ", n, " runs past the end of the ", file_bytes, "-byte file (at most ",
                 file_bytes - 8, " bytes follow the length)");
  if (n > kMaxHeaderBytes)
    ST_BAD_INPUT(path, ": header length ", n, " exceeds the safetensors format's limit of ", kMaxHeaderBytes,
                 " bytes (the safetensors library refuses such a file too)");
  std::string text(n, '\0');
  pread_exact(fd_.get(), path_, text.data(), static_cast<size_t>(n), 8);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);  // refuses text that is not UTF-8, as the format requires
  } catch (const nlohmann::json::exception& e) {
    ST_BAD_INPUT(path, ": the safetensors header is not valid JSON: ", excerpt(e.what()));
  }
  if (!header.is_object()) ST_BAD_INPUT(path, ": the safetensors header is not a JSON object");
  const uint64_t data_start = 8 + n, data_bytes = file_bytes - data_start;  // n <= file_bytes - 8
  std::vector<Span> spans;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      // Free-form text: a map of strings to strings (or null), as the library reads it.
      const nlohmann::json& m = it.value();
      if (!m.is_object() && !m.is_null())
        ST_BAD_INPUT(path, ": __metadata__ is ", excerpt(m.dump()), ", expected an object of strings");
      if (m.is_object())
        for (auto f = m.begin(); f != m.end(); ++f)
          if (!f.value().is_string())
            ST_BAD_INPUT(path, ": __metadata__[\"", excerpt(f.key()), "\"] is ", excerpt(f.value().dump()),
                         ", expected a string (the format's metadata maps strings to strings)");
      continue;
    }
    const nlohmann::json& t = it.value();
    const std::string where = str_cat(path, ": tensor ", excerpt(it.key()));
    if (!t.is_object())
      ST_BAD_INPUT(where, " is ", excerpt(t.dump()), ", expected an object with dtype, shape and data_offsets");
    for (const char* field : {"dtype", "shape", "data_offsets"})
      if (!t.contains(field)) ST_BAD_INPUT(where, " has no ", field, " (expected dtype, shape and data_offsets)");
    if (!t.at("dtype").is_string())
      ST_BAD_INPUT(where, ": dtype is ", excerpt(t.at("dtype").dump()), ", expected a string");
    if (!t.at("shape").is_array())
      ST_BAD_INPUT(where, ": shape is ", excerpt(t.at("shape").dump()), ", expected a list");
    if (!t.at("data_offsets").is_array())
      ST_BAD_INPUT(where, ": data_offsets is ", excerpt(t.at("data_offsets").dump()), ", expected a list of 2 numbers");
    Entry e;
    e.dtype = t.at("dtype").get<std::string>();
    const uint64_t bits = dtype_bits(e.dtype);
    if (bits == 0)
      ST_BAD_INPUT(where, " has dtype ", excerpt(e.dtype),
                   ", which the safetensors format does not define (it defines BOOL, U8, I8, I16, U16, I32, U32, I64, "
                   "U64, F4, F6_E2M3, F6_E3M2, F8_E5M2, F8_E4M3, F8_E8M0, F16, BF16, F32, F64 and C64)");
    // Negative numbers are refused by name: nlohmann would convert them to huge unsigned values.
    for (const nlohmann::json& d : t.at("shape"))
      if (!d.is_number_unsigned()) ST_BAD_INPUT(where, ": shape holds ", excerpt(d.dump()), ", expected integers >= 0");
    for (const nlohmann::json& o : t.at("data_offsets"))
      if (!o.is_number_unsigned())
        ST_BAD_INPUT(where, ": data_offsets holds ", excerpt(o.dump()), ", expected integers >= 0");
    const auto dims = t.at("shape").get<std::vector<uint64_t>>();
    const auto off = t.at("data_offsets").get<std::vector<uint64_t>>();
    if (off.size() != 2) ST_BAD_INPUT(where, ": data_offsets must hold 2 numbers, it holds ", off.size());
    // A tensor's elements fit its bytes, and its bytes fit the file. Every dtype has at least 4 bits, so no
    // tensor of the file holds more than 2 elements a byte; the product is bounded by that before it is
    // multiplied on (in 128 bits: the bound and a dimension below 2^63 cannot wrap it).
    unsigned __int128 numel = 1;
    for (uint64_t d : dims) {
      numel *= d;
      if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          numel > static_cast<unsigned __int128>(data_bytes) * 2)
        ST_BAD_INPUT(where, ": shape ", excerpt(t.at("shape").dump()), " holds more elements than the ", file_bytes,
                     "-byte file has bytes");
      e.shape.push_back(static_cast<int64_t>(d));
    }
    if (off[0] > off[1] || off[1] > data_bytes)
      ST_BAD_INPUT(where, ": data_offsets ", offsets_str(off[0], off[1]), " do not lie within the ", data_bytes,
                   "-byte data section (bytes [", data_start, ", ", file_bytes,
                   ") of the file); expected begin <= end <= ", data_bytes);
    const unsigned __int128 need_bits = numel * bits;        // numel <= 2^65, bits <= 64
    const uint64_t elements = static_cast<uint64_t>(numel);  // <= 2 * data_bytes < 2^65: see below
    if (need_bits % 8 != 0)
      ST_BAD_INPUT(where, " of shape ", shape_str(e.shape), " and dtype ", e.dtype, " holds ", elements,
                   " elements of ", bits, " bits, which is not a whole number of bytes");
    const unsigned __int128 need = need_bits / 8;
    if (need != off[1] - off[0])
      ST_BAD_INPUT(where, " of shape ", shape_str(e.shape), " and dtype ", e.dtype, " needs ",
                   static_cast<uint64_t>(std::min<unsigned __int128>(need, std::numeric_limits<uint64_t>::max())),
                   " bytes (", elements, " elements of ", bits, " bits), its data_offsets ",
                   offsets_str(off[0], off[1]), " hold ", off[1] - off[0]);
    // All within the file's size, so within int64_t.
    e.begin = static_cast<int64_t>(data_start + off[0]);
    e.end = static_cast<int64_t>(data_start + off[1]);
    const auto placed = tensors_.emplace(it.key(), std::move(e)).first;
    spans.push_back(Span{off[0], off[1], &placed->first});
  }
  // The format's rule (the library's Metadata::validate): taken in the order of their offsets, each tensor begins
  // where the one before it ends and the last ends at the end of the file. So no two tensors share a byte (one
  // tensor's bytes read as another's), no byte of the data section is left out, and nothing trails the data.
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end != b.end ? a.end < b.end : *a.name < *b.name;
  });
  uint64_t at = 0;
  const Span* before = nullptr;
  for (const Span& s : spans) {
    if (s.begin < at)
      ST_BAD_INPUT(path, ": tensor ", excerpt(*s.name), " has data_offsets ", offsets_str(s.begin, s.end),
                   ", which overlap tensor ", excerpt(*before->name), "'s ", offsets_str(before->begin, before->end),
                   ": every tensor's bytes must be its own (expected it to begin at ", at, ", where ",
                   excerpt(*before->name), " ends; it begins at ", s.begin, ")");
    if (s.begin > at)
      ST_BAD_INPUT(path, ": bytes [", at, ", ", s.begin, ") of the data section belong to no tensor (a hole ",
                   before ? str_cat("between tensor ", excerpt(*before->name), ", which ends at ", at, ", and ")
                          : std::string("before "),
                   "tensor ", excerpt(*s.name), ", whose data_offsets are ", offsets_str(s.begin, s.end),
                   "): the tensors must index the whole data section, back to back");
    at = s.end;
    before = &s;
  }
  if (at != data_bytes)
    ST_BAD_INPUT(path, ": bytes [", at, ", ", data_bytes, ") of the ", data_bytes,
                 "-byte data section belong to no tensor (",
                 before ? str_cat("the last tensor, ", excerpt(*before->name), ", ends at ", at)
                        : std::string("the header declares no tensor"),
                 "; expected the data to end there): the file has trailing bytes, or its header leaves a tensor out");
}

std::vector<std::string> SafetensorsReader::names() const {
  std::vector<std::string> out;
  for (const auto& [name, e] : tensors_) out.push_back(name);
  return out;
}

const SafetensorsReader::Entry& SafetensorsReader::entry(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) ST_BAD_INPUT(path_, ": no tensor ", name);
  return it->second;
}

const std::vector<int64_t>& SafetensorsReader::shape(const std::string& name) const { return entry(name).shape; }

const std::string& SafetensorsReader::dtype(const std::string& name) const { return entry(name).dtype; }

void SafetensorsReader::read(const std::string& name, const std::vector<int64_t>& want, float* out) const {
  const Entry& e = entry(name);
  if (e.shape != want)
    ST_BAD_INPUT(path_, ": tensor ", name, " has shape ", shape_str(e.shape), ", expected ", shape_str(want));
  const int64_t size = dtype_size(e.dtype);
  read_range(name, 0, size == 0 ? 0 : (e.end - e.begin) / size, out);
}

const SafetensorsReader::Entry& SafetensorsReader::readable(const std::string& name, int64_t begin,
                                                            int64_t count) const {
  const Entry& e = entry(name);
  const int64_t size = dtype_size(e.dtype);
  if (size == 0) ST_BAD_INPUT(path_, ": tensor ", name, " has dtype ", e.dtype, "; F32, F16 and BF16 are supported");
  const int64_t numel = (e.end - e.begin) / size;
  ST_CHECK(begin >= 0 && count >= 0 && begin <= numel && count <= numel - begin, path_, ": tensor ", name,
           ": elements [", begin, ", ", begin + count, ") of ", numel);
  return e;
}

void SafetensorsReader::read_chunk_wide(const Entry& e, int64_t first, int64_t n, int thread, float* out) const {
  if (e.dtype == "F32") {
    pread_exact(fd_.get(), path_, reinterpret_cast<char*>(out), static_cast<size_t>(n * 4), e.begin + first * 4);
    return;
  }
  std::vector<uint16_t>& raw = raw_[static_cast<size_t>(thread)];
  raw.resize(static_cast<size_t>(kWidenChunk));
  pread_exact(fd_.get(), path_, reinterpret_cast<char*>(raw.data()), static_cast<size_t>(n * 2), e.begin + first * 2);
  widen_half(raw.data(), n, e.dtype == "BF16" ? HalfKind::kBF16 : HalfKind::kF16, out);
}

int SafetensorsReader::chunk_threads(int64_t chunks) const {
  const int threads = static_cast<int>(std::min<int64_t>(chunks, reader_threads()));
  if (static_cast<int>(raw_.size()) < threads) raw_.resize(static_cast<size_t>(threads));
  if (static_cast<int>(wide_.size()) < threads) wide_.resize(static_cast<size_t>(threads));
  return threads;
}

void SafetensorsReader::read_range(const std::string& name, int64_t begin, int64_t count, float* out) const {
  const Entry& e = readable(name, begin, count);
  // A chunk at a time on several threads, a 16-bit chunk widened by the thread that read it while its bytes are in
  // its cache: one read(2) at a time copies a file in the page cache several times slower.
  const int64_t chunks = (count + kWidenChunk - 1) / kWidenChunk;
  for_each_index(chunks, chunk_threads(chunks), [&](int thread, int64_t c) {
    const int64_t at = c * kWidenChunk;
    read_chunk_wide(e, begin + at, std::min(kWidenChunk, count - at), thread, out + at);
    return true;
  });
}

int64_t SafetensorsReader::read_range_half(const std::string& name, int64_t begin, int64_t count, HalfKind kind,
                                           uint16_t* out) const {
  ST_CHECK(kind == HalfKind::kBF16 || kind == HalfKind::kF16, "read_range_half needs bf16 or fp16");
  const Entry& e = readable(name, begin, count);
  const bool same = e.dtype == (kind == HalfKind::kBF16 ? "BF16" : "F16");
  // Chunks on several threads as read_range reads them; each thread notes the first non-finite element of its own
  // chunks, and the least of those is the tensor's.
  const int64_t chunks = (count + kWidenChunk - 1) / kWidenChunk;
  const int threads = chunk_threads(chunks);
  std::vector<int64_t> first(static_cast<size_t>(std::max(threads, 1)), -1);
  for_each_index(chunks, threads, [&](int thread, int64_t c) {
    const int64_t at = c * kWidenChunk, n = std::min(kWidenChunk, count - at);
    int64_t bad = -1;
    if (same) {
      pread_exact(fd_.get(), path_, reinterpret_cast<char*>(out + at), static_cast<size_t>(n * 2),
                  e.begin + (begin + at) * 2);
      // An exponent of all ones is inf or NaN: looked for in a loop that vectorises, then found.
      const uint16_t exponent = kind == HalfKind::kBF16 ? 0x7f80 : 0x7c00;
      const uint16_t* v = out + at;
      int64_t found = 0;
      for (int64_t i = 0; i < n; ++i) found += (v[i] & exponent) == exponent;
      for (int64_t i = 0; found > 0 && bad < 0; ++i)
        if ((v[i] & exponent) == exponent) bad = at + i;
    } else {
      std::vector<float>& wide = wide_[static_cast<size_t>(thread)];
      wide.resize(static_cast<size_t>(kWidenChunk));
      read_chunk_wide(e, begin + at, n, thread, wide.data());
      for (int64_t i = 0; i < n && bad < 0; ++i)
        if (!std::isfinite(wide[static_cast<size_t>(i)])) bad = at + i;
      for (int64_t i = 0; i < n; ++i)
        out[at + i] = kind == HalfKind::kBF16 ? round_to_bf16(wide[static_cast<size_t>(i)])
                                              : round_to_f16(wide[static_cast<size_t>(i)]);
    }
    int64_t& mine = first[static_cast<size_t>(thread)];
    if (bad >= 0 && (mine < 0 || bad < mine)) mine = bad;
    return true;
  });
  int64_t bad = -1;
  for (int64_t f : first)
    if (f >= 0 && (bad < 0 || f < bad)) bad = f;
  return bad;
}

}  // namespace st
