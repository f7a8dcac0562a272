#include "shardtrain/ckpt/safetensors_reader.h"

#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>

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
  if (!in_) ST_BAD_INPUT("safetensors file '", path, "' cannot be opened: ", std::strerror(errno));
  std::error_code ec;
  const auto file_bytes = static_cast<int64_t>(std::filesystem::file_size(path, ec));
  uint64_t n = 0;
  in_.read(reinterpret_cast<char*>(&n), 8);
  if (!in_ || file_bytes < 8) ST_BAD_INPUT(path, ": shorter than the 8-byte safetensors header length");
  if (static_cast<int64_t>(n) > file_bytes - 8)
    ST_BAD_INPUT(path, ": header length ", n, " runs past the end of the ", file_bytes, "-byte file");
  std::string text(n, '\0');
  in_.read(text.data(), static_cast<std::streamsize>(n));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    ST_BAD_INPUT(path, ": the safetensors header is not valid JSON: ", e.what());
  }
  if (!header.is_object()) ST_BAD_INPUT(path, ": the safetensors header is not a JSON object");
  const int64_t data_start = 8 + static_cast<int64_t>(n);
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const nlohmann::json& t = it.value();
    Entry e;
    try {
      e.dtype = t.at("dtype").get<std::string>();
      e.shape = t.at("shape").get<std::vector<int64_t>>();
      const auto off = t.at("data_offsets").get<std::vector<int64_t>>();
      if (off.size() != 2) ST_BAD_INPUT(path, ": tensor ", it.key(), ": data_offsets must hold 2 numbers");
      e.begin = data_start + off[0];
      e.end = data_start + off[1];
    } catch (const nlohmann::json::exception& ex) {
      ST_BAD_INPUT(path, ": tensor ", it.key(), ": ", ex.what());
    }
    int64_t numel = 1;
    for (int64_t d : e.shape) numel *= d;
    const int64_t size = dtype_size(e.dtype);
    if (size != 0 && (e.end - e.begin != numel * size || e.begin < data_start || e.end > file_bytes))
      ST_BAD_INPUT(path, ": tensor ", it.key(), " of shape ", shape_str(e.shape), " and dtype ", e.dtype,
                   " has data_offsets that do not fit it or the ", file_bytes, "-byte file");
    tensors_.emplace(it.key(), std::move(e));
  }
}

std::vector<std::string> SafetensorsReader::names() const {
  std::vector<std::string> out;
  for (const auto& [name, e] : tensors_) out.push_back(name);
  return out;
}

const std::vector<int64_t>& SafetensorsReader::shape(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) ST_BAD_INPUT(path_, ": no tensor ", name);
  return it->second.shape;
}

void SafetensorsReader::read(const std::string& name, const std::vector<int64_t>& want, float* out) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) ST_BAD_INPUT(path_, ": no tensor ", name);
  const Entry& e = it->second;
  if (e.shape != want)
    ST_BAD_INPUT(path_, ": tensor ", name, " has shape ", shape_str(e.shape), ", expected ", shape_str(want));
  const int64_t size = dtype_size(e.dtype);
  if (size == 0) ST_BAD_INPUT(path_, ": tensor ", name, " has dtype ", e.dtype, "; F32, F16 and BF16 are supported");
  const int64_t numel = (e.end - e.begin) / size;
  in_.clear();
  in_.seekg(e.begin);
  if (size == 4) {
    in_.read(reinterpret_cast<char*>(out), static_cast<std::streamsize>(numel * 4));
  } else {
    std::vector<uint16_t> raw(static_cast<size_t>(numel));
    in_.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(numel * 2));
    for (int64_t i = 0; i < numel; ++i) {
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
