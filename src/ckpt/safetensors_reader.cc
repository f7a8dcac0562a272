#include "shardtrain/ckpt/safetensors_reader.h"

#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <limits>

#include "shardtrain/core/errno_text.h"
#include "shardtrain/core/error.h"

namespace st {
namespace {

int64_t dtype_size(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "F16" || dtype == "BF16") return 2;
  return 0;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

float half_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      int e = -1;
      uint32_t m = mant;
      do {
        ++e;
        m <<= 1;
      } while ((m & 0x400u) == 0);
      bits = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((m & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path), in_(path, std::ios::binary) {
  if (!in_) ST_BAD_INPUT("safetensors file '", path, "' cannot be opened: ", errno_text());
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) ST_BAD_INPUT("safetensors file '", path, "': cannot get its size: ", ec.message());
  // Every length and offset below comes from the file: each is checked as an unsigned number against the
  // file's size before it sizes an allocation or enters signed arithmetic (a length of 2^63 or more would
  // turn negative in an int64_t and pass a signed bound).
  const uint64_t file_bytes = size;
  uint64_t n = 0;
  in_.read(reinterpret_cast<char*>(&n), 8);
  if (!in_ || file_bytes < 8) ST_BAD_INPUT(path, ": shorter than the 8-byte safetensors header length");
  if (n > file_bytes - 8)
    ST_BAD_INPUT(path, ": header length ", n, " runs past the end of the ", file_bytes, "-byte file (at most ",
                 file_bytes - 8, " bytes follow the length)");
  std::string text(n, '\0');
  in_.read(text.data(), static_cast<std::streamsize>(n));
  if (!in_) ST_BAD_INPUT(path, ": the ", n, "-byte safetensors header could not be read (file truncated?)");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    ST_BAD_INPUT(path, ": the safetensors header is not valid JSON: ", e.what());
  }
  if (!header.is_object()) ST_BAD_INPUT(path, ": the safetensors header is not a JSON object");
  const uint64_t data_start = 8 + n, data_bytes = file_bytes - data_start;  // n <= file_bytes - 8
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const nlohmann::json& t = it.value();
    const std::string where = str_cat(path, ": tensor ", it.key());
    Entry e;
    std::vector<uint64_t> off;
    try {
      e.dtype = t.at("dtype").get<std::string>();
      // Negative numbers are refused by name: nlohmann would convert them to huge unsigned values.
      for (const nlohmann::json& d : t.at("shape"))
        if (!d.is_number_unsigned()) ST_BAD_INPUT(where, ": shape holds ", d.dump(), ", expected integers >= 0");
      for (const nlohmann::json& o : t.at("data_offsets"))
        if (!o.is_number_unsigned())
          ST_BAD_INPUT(where, ": data_offsets holds ", o.dump(), ", expected integers >= 0");
      const auto dims = t.at("shape").get<std::vector<uint64_t>>();
      off = t.at("data_offsets").get<std::vector<uint64_t>>();
      if (off.size() != 2) ST_BAD_INPUT(where, ": data_offsets must hold 2 numbers, it holds ", off.size());
      // A tensor's elements fit its bytes, and its bytes fit the file: the shape's product is bounded by
      // the data section's size before it is multiplied on, so it never wraps.
      uint64_t numel = 1;
      for (uint64_t d : dims) {
        if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) || (d != 0 && numel > data_bytes / d))
          ST_BAD_INPUT(where, ": shape ", t.at("shape").dump(), " holds more elements than the ", file_bytes,
                       "-byte file has bytes");
        numel *= d;
        e.shape.push_back(static_cast<int64_t>(d));
      }
      if (off[0] > off[1] || off[1] > data_bytes)
        ST_BAD_INPUT(where, ": data_offsets [", off[0], ", ", off[1], "] do not lie within the ", data_bytes,
                     "-byte data section (bytes [", data_start, ", ", file_bytes, ") of the file)");
      const uint64_t size = static_cast<uint64_t>(dtype_size(e.dtype));
      if (size != 0 && (numel > data_bytes / size || off[1] - off[0] != numel * size))
        ST_BAD_INPUT(where, " of shape ", shape_str(e.shape), " and dtype ", e.dtype, " needs ", numel, " x ", size,
                     " bytes, its data_offsets [", off[0], ", ", off[1], "] hold ", off[1] - off[0]);
    } catch (const nlohmann::json::exception& ex) {
      ST_BAD_INPUT(where, ": ", ex.what());
    }
    // All within the file's size, so within int64_t.
    e.begin = static_cast<int64_t>(data_start + off[0]);
    e.end = static_cast<int64_t>(data_start + off[1]);
    tensors_.emplace(it.key(), std::move(e));
  }
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

void SafetensorsReader::read_range(const std::string& name, int64_t begin, int64_t count, float* out) const {
  const Entry& e = entry(name);
  const int64_t size = dtype_size(e.dtype);
  if (size == 0) ST_BAD_INPUT(path_, ": tensor ", name, " has dtype ", e.dtype, "; F32, F16 and BF16 are supported");
  const int64_t numel = (e.end - e.begin) / size;
  ST_CHECK(begin >= 0 && count >= 0 && begin <= numel && count <= numel - begin, path_, ": tensor ", name,
           ": elements [", begin, ", ", begin + count, ") of ", numel);
  in_.clear();
  in_.seekg(e.begin + begin * size);
  if (size == 4) {
    in_.read(reinterpret_cast<char*>(out), static_cast<std::streamsize>(count * 4));
  } else {
    std::vector<uint16_t> raw(static_cast<size_t>(count));
    in_.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(count * 2));
    for (int64_t i = 0; i < count; ++i) {
      if (e.dtype == "BF16") {
        const uint32_t bits = static_cast<uint32_t>(raw[static_cast<size_t>(i)]) << 16;
        std::memcpy(out + i, &bits, 4);
      } else {
        out[i] = half_to_float(raw[static_cast<size_t>(i)]);
      }
    }
  }
  if (!in_) ST_BAD_INPUT(path_, ": tensor ", name, " could not be read (file truncated?)");
}

}  // namespace st
