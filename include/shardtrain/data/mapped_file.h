// A read-only memory mapping of a whole file (RAII): the mapping lives exactly as long as the object.
//
// Movable, not copyable. An empty file is valid and has size() == 0 and data() == nullptr (mmap(2)
// refuses zero-length mappings). The pages are mapped lazily by the kernel, so opening a multi-GB file is
// cheap; reading it runs at page-cache / disk bandwidth.
//
// Contract: the file must not change while it is mapped. A data file truncated (or rewritten in place) under a
// running job makes the kernel answer a read past its new end with SIGBUS. The first MappedFile installs a SIGBUS
// handler that, when the faulting address lies in a live mapping, writes "error: ... data file PATH changed while
// the job was reading it ..." to stderr and ends the process with exit code 2 (kExitBadInput: retrying on the same
// file will not help). A SIGBUS anywhere else goes to the disposition the handler replaced (by default: the process
// dies of SIGBUS). Replacing a file by renaming a new one over it is safe: the mapping keeps the old one.
//
//   st::MappedFile f("data/train_000001.bin");   // throws kBadInput naming the path if it cannot be opened
//   const uint8_t* bytes = f.data();               // valid for [0, f.size())
#pragma once

#include <cstdint>
#include <string>

namespace st {

// The mappings the SIGBUS handler covers at once; one past it maps unguarded (a glob of more data files).
inline constexpr int kMaxGuardedMappings = 4096;

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
  int guard_slot_ = -1;  // this mapping's entry in the SIGBUS handler's table, or -1
};

}  // namespace st
