// Helpers shared by the checkpoint tests: a temporary directory per test, capturing an st::Error of an
// expected kind, bit-exact float comparison, and what the HF export files hold.
#pragma once

#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/resource.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "../common/child_process.h"
#include "../common/temp_dir.h"
#include "shardtrain/ckpt/hf_export.h"
#include "shardtrain/core/error.h"
#include "shardtrain/model/lora.h"
#include "shardtrain/shard/model_backend.h"
#include "shardtrain/train/step_engine.h"

namespace st::testing {

// Runs fn, which must throw st::Error of kind `kind`; returns its message ("" and a failure otherwise).
inline std::string error_message(ErrorKind kind, const std::function<void()>& fn) {
  try {
    fn();
  } catch (const st::Error& e) {
    EXPECT_EQ(static_cast<int>(e.kind()), static_cast<int>(kind)) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected st::Error, nothing was thrown";
  return "";
}
inline std::string bad_input_message(const std::function<void()>& fn) {
  return error_message(ErrorKind::kBadInput, fn);
}
inline std::string fault_message(const std::function<void()>& fn) { return error_message(ErrorKind::kFault, fn); }

inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// True where `dir` is on a tmpfs (which refuses O_DIRECT before Linux 6.6 and takes it since).
inline bool on_tmpfs(const std::string& dir) {
  struct statfs fs {};
  return ::statfs(dir.c_str(), &fs) == 0 && fs.f_type == 0x01021994;  // TMPFS_MAGIC
}

// Runs fn in a child process under RLIMIT_FSIZE = limit bytes with SIGXFSZ ignored (as the shardtrain binary
// runs: write(2) then fails with EFBIG), and expects it to throw kFault whose message holds `want`. The child
// ends through exit(), so a crash in an exit handler fails the test too. The limit and the signal's disposition
// are process-wide, hence the child.
inline void expect_fault_past_file_size_limit(rlim_t limit, const std::string& want, const std::function<void()>& fn) {
  const int status = exit_status_in_child([&] {
    std::signal(SIGXFSZ, SIG_IGN);
    const rlimit lim{limit, limit};
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) return 10;
    try {
      fn();
    } catch (const st::Error& e) {
      if (e.kind() == ErrorKind::kFault && contains(e.what(), want)) return 0;
      std::fprintf(stderr, "expected a fault holding \"%s\", got: %s\n", want.c_str(), e.what());
      return 11;
    }
    return 12;
  });
  EXPECT_EQ(status, 0) << "10: setrlimit failed, 11: wrong error, 12: no error, > 128: killed by a signal";
}

// What a world holds, gathered in full: every unit's param, m and v, in that order (collective).
inline std::vector<std::vector<float>> full_state(ModelBackend& m) {
  std::vector<std::vector<float>> out;
  for (const UnitLayout& u : m.units()) {
    const UnitShard& sh = m.shard(u.index);
    for (const std::vector<float>* part : {&sh.param, &sh.m, &sh.v}) {
      std::vector<float> full(static_cast<size_t>(sh.slot * m.comm().world_size()));
      m.comm().all_gather(part->data(), sh.slot, full.data());
      full.resize(static_cast<size_t>(u.numel));
      out.push_back(std::move(full));
    }
  }
  return out;
}

// Bit patterns, so that NaN payloads, -0.0 and denormals must survive exactly.
inline std::vector<uint32_t> bits(const float* p, size_t n) {
  std::vector<uint32_t> out(n);
  if (n != 0) std::memcpy(out.data(), p, n * sizeof(float));
  return out;
}
inline std::vector<uint32_t> bits(const std::vector<float>& v) { return bits(v.data(), v.size()); }

// Deterministic, distinct float values: a mix of ordinary numbers and the awkward special values.
inline std::vector<float> pattern(size_t n, uint32_t salt) {
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ (salt * 0x9e3779b9u);
    x ^= x >> 15;
    x *= 0x85ebca6bu;
    x ^= x >> 13;
    uint32_t b;
    switch (i % 7) {
      case 3:
        b = 0x7fc00000u | (x & 0x3fffffu) | 1u;  // a NaN with a payload
        break;
      case 5:
        b = x & 0x807fffffu;  // a denormal (or +-0)
        break;
      default:
        b = (x & 0x80ffffffu) | 0x3e000000u;  // |v| in [0.125, 1) roughly, either sign
    }
    std::memcpy(&out[i], &b, 4);
  }
  return out;
}

// The random model that train.seed draws for c.model without its adapters (base_model), written as a GPT-2 file at
// `path` (write_hf_gpt2): a base for init.from.
inline void write_seed_model(const Config& c, const std::string& path) {
  Config base = c;
  base.model = base_model(c.model);
  SoloCommunicator solo;
  StepEngine e(base, solo);
  const std::vector<std::vector<float>> full = e.gather_params();
  std::vector<const float*> ptrs;
  for (const std::vector<float>& f : full) ptrs.push_back(f.data());
  write_hf_gpt2(path, base.model, e.units(), ptrs);
}

// Removes dataset `name` from HDF5 file `path` (its link) and gives the file back the size it had, which a manifest
// records: a reader then passes the size check and meets the missing dataset.
inline void remove_dataset_keeping_size(const std::string& path, const std::string& name) {
  const uintmax_t size = std::filesystem::file_size(path);
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0) << path;
  ASSERT_GE(H5Ldelete(f, name.c_str(), H5P_DEFAULT), 0) << path << " " << name;
  ASSERT_GE(H5Fclose(f), 0) << path;
  ASSERT_LE(std::filesystem::file_size(path), size) << path;
  std::filesystem::resize_file(path, size);
}

// The elements of a tensor of this shape (1 for a scalar).
inline int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// What an HF tensor holds: its slice of the full unit buffers `params`, transposed for Conv1D (ours [out, in],
// HF's [in, out]).
inline std::vector<float> hf_tensor_values(const HfTensorMap& t, const std::vector<std::vector<float>>& params) {
  const float* src = params[static_cast<size_t>(t.unit)].data() + t.tensor->offset;
  const int64_t n = numel_of(t.hf_shape);
  std::vector<float> out(static_cast<size_t>(n));
  if (!t.transpose) {
    std::memcpy(out.data(), src, static_cast<size_t>(n) * sizeof(float));
  } else {
    const int64_t rows = t.tensor->shape[0], cols = t.tensor->shape[1];
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) out[static_cast<size_t>(c * rows + r)] = src[r * cols + c];
  }
  return out;
}

// The header length at the start of a safetensors file's bytes: 8 bytes, little-endian. blob holds at least 8.
inline uint64_t safetensors_header_len(const std::string& blob) {
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(blob[i])) << (8 * i);
  return n;
}

// A safetensors file's bytes as given, valid or not: the 8-byte little-endian `length` (header.size() for a
// well-formed file), then `header` and `data`.
inline std::string safetensors_file(uint64_t length, const std::string& header, const std::string& data = "") {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>(length >> (8 * i));
  return out + header + data;
}

}  // namespace st::testing
