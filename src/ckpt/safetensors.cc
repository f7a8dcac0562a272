#include "shardtrain/ckpt/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <set>

#include <nlohmann/json.hpp>

#include "shardtrain/core/errno_text.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/unique_fd.h"
#include "shardtrain/kernels/adamw_host.h"

// safetensors stores little-endian data; we write memory as it is, which is only right on such a host.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the safetensors writer assumes a little-endian host");

namespace st {
namespace {

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void validate(const std::vector<SafetensorsTensor>& tensors) {
  std::set<std::string> seen;
  for (const SafetensorsTensor& t : tensors) {
    ST_CHECK(!t.name.empty(), "safetensors: empty tensor name");
    ST_CHECK(t.name != "__metadata__", "safetensors: a tensor may not be called __metadata__");
    ST_CHECK(seen.insert(t.name).second, "safetensors: tensor ", t.name, " is declared twice");
    for (int64_t d : t.shape) ST_CHECK(d >= 0, "safetensors: tensor ", t.name, " has a negative dimension ", d);
  }
}

}  // namespace

int64_t safetensors_bytes(const SafetensorsTensor& t) {
  return numel_of(t.shape) * (t.dtype == SafetensorsDtype::kBF16 ? 2 : 4);
}

std::string safetensors_header(const std::vector<SafetensorsTensor>& tensors) {
  validate(tensors);
  // ordered_json keeps the declaration order, which is also the order of the data.
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  int64_t at = 0;
  for (const SafetensorsTensor& t : tensors) {
    const int64_t bytes = safetensors_bytes(t);
    h[t.name] = {{"dtype", t.dtype == SafetensorsDtype::kBF16 ? "BF16" : "F32"}, {"shape", t.shape}, {"data_offsets", {at, at + bytes}}};
    at += bytes;
  }
  h["__metadata__"] = {{"format", "pt"}};
  std::string text = h.dump();
  // The data section starts at 8 + N; pad N with spaces (which JSON parsers skip) to a multiple of 8.
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

SafetensorsWriter::SafetensorsWriter(const std::string& path, std::vector<SafetensorsTensor> tensors)
    : path_(path), tensors_(std::move(tensors)) {
  const std::string header = safetensors_header(tensors_);  // validates before anything touches the disk
  int64_t data_bytes = 0;
  for (const SafetensorsTensor& t : tensors_) data_bytes += safetensors_bytes(t);
  file_bytes_ = 8 + static_cast<int64_t>(header.size()) + data_bytes;

  fd_ = UniqueFd(::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd_) ST_FAULT("cannot create ", path_, ": ", errno_text());
  unsigned char len[8];
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  write_all(len, 8);
  write_all(header.data(), static_cast<int64_t>(header.size()));
}

SafetensorsWriter::~SafetensorsWriter() = default;

void SafetensorsWriter::write(const std::string& name, const float* data, int64_t numel) {
  ST_CHECK(fd_.get() >= 0, path_, ": write(", name, ") after finish()");
  ST_CHECK(next_ < tensors_.size(), path_, ": write(", name, "): all ", tensors_.size(), " tensors are written");
  const SafetensorsTensor& t = tensors_[next_];
  ST_CHECK(name == t.name, path_, ": write(", name, "): the next declared tensor is ", t.name);
  ST_CHECK(numel == numel_of(t.shape), path_, ": write(", name, "): ", numel, " elements, the shape holds ",
           numel_of(t.shape));
  if (t.dtype == SafetensorsDtype::kF32) {
    write_all(data, numel * static_cast<int64_t>(sizeof(float)));
  } else {
    // Converted in bounded chunks: never a second copy of the whole tensor.
    constexpr int64_t kChunk = int64_t{1} << 20;
    std::vector<uint16_t> half(static_cast<size_t>(std::min(numel, kChunk)));
    for (int64_t at = 0; at < numel; at += kChunk) {
      const int64_t n = std::min(kChunk, numel - at);
      for (int64_t i = 0; i < n; ++i) half[static_cast<size_t>(i)] = round_to_bf16(data[at + i]);
      write_all(half.data(), n * 2);
    }
  }
  ++next_;
}

void SafetensorsWriter::finish() {
  ST_CHECK(fd_.get() >= 0, path_, ": finish() called twice");
  ST_CHECK(next_ == tensors_.size(), path_, ": finish() after ", next_, " of ", tensors_.size(),
           " tensors; the next is ", tensors_[next_].name);
  UniqueFd fd = std::move(fd_);  // closed on every path below
  if (::fsync(fd.get()) != 0) ST_FAULT("cannot fsync ", path_, ": ", errno_text());
  if (fd.close() != 0) ST_FAULT("cannot close ", path_, ": ", errno_text());
}

void SafetensorsWriter::write_all(const void* data, int64_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    // Linux moves at most about 2 GiB per write(2); ask for 1 GiB at a time.
    const size_t want = static_cast<size_t>(std::min<int64_t>(bytes, int64_t{1} << 30));
    const ssize_t n = ::write(fd_.get(), p, want);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) ST_FAULT("cannot write ", path_, ": ", errno_text());
    if (n == 0) ST_FAULT("cannot write ", path_, ": write(2) wrote nothing");
    p += n;
    bytes -= n;
  }
}

}  // namespace st
