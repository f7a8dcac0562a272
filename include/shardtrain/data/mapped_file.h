// A read-only memory mapping of a whole file (RAII): the mapping lives exactly as long as the object.
//
// Movable, not copyable. An empty file is valid and has size() == 0 and data() == nullptr (mmap(2)
// refuses zero-length mappings). The pages are mapped lazily by the kernel, so opening a multi-GB file is
// cheap; reading it runs at page-cache / disk bandwidth.
//
//   st::MappedFile f("data/train_000001.bin");   // throws kBadInput naming the path if it cannot be opened
//   const uint8_t* bytes = f.data();               // valid for [0, f.size())
#pragma once

#include <cstdint>
#include <string>

namespace st {

class MappedFile {
 public:
  // Opens and maps `path`. A path that cannot be opened or is not a regular file throws kBadInput naming
  // the path and the OS error; a failing mmap(2) of an opened file throws kFault.
  explicit MappedFile(const std::string& path);
  ~MappedFile();

  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  int64_t size() const { return size_; }  // bytes
  const std::string& path() const { return path_; }

 private:
  void release() noexcept;

  std::string path_;
  const uint8_t* data_ = nullptr;
  int64_t size_ = 0;
};

}  // namespace st
