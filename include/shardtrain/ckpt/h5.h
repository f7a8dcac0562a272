// RAII over HDF5 handles (files, datasets, dataspaces, property lists, attributes), and ST_H5_CHECK,
// which reports the failing call with HDF5's own error stack.
//
//   st::H5File f = st::H5File::create("out.h5");
//   st::h5_write_f32(f, "transformer.wte.weight", {V, C}, data);
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "shardtrain/core/error.h"

namespace st {

namespace detail {
// HDF5's current error stack on one line: the OS error text where a system call failed, the outermost record
// (what the library was doing) and the innermost (why it failed); "no HDF5 error stack" if empty.
std::string h5_error_stack();
}  // namespace detail

// A hid_t that closes itself with the matching H5*close. Moves, never copies.
class H5Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  H5Handle() = default;
  H5Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  H5Handle(H5Handle&& o) noexcept : id_(o.id_), closer_(o.closer_) { o.id_ = H5I_INVALID_HID; }
  H5Handle& operator=(H5Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      closer_ = o.closer_;
      o.id_ = H5I_INVALID_HID;
    }
    return *this;
  }
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;
  ~H5Handle() { reset(); }

  hid_t get() const { return id_; }
  // Gives up ownership without closing, e.g. to close explicitly and check the result.
  hid_t release() {
    const hid_t id = id_;
    id_ = H5I_INVALID_HID;
    return id;
  }
  void reset() {
    if (id_ >= 0 && closer_ != nullptr) closer_(id_);
    id_ = H5I_INVALID_HID;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

class H5File {
 public:
  // Creates (truncating) a file for writing; errors name the path.
  static H5File create(const std::string& path);
  static H5File open_read(const std::string& path);
  hid_t id() const { return h_.get(); }
  const std::string& path() const { return path_; }
  // Flushes HDF5's buffers to the OS and closes the file.
  void close();

 private:
  H5Handle h_;
  std::string path_;
};

// Writes a contiguous fp32 dataset at `name` (intermediate groups are created).
void h5_write_f32(const H5File& f, const std::string& name, const std::vector<int64_t>& shape, const float* data);
void h5_write_i32(const H5File& f, const std::string& name, const std::vector<int64_t>& shape, const int32_t* data);
// Creates a 1-D float32 (IEEE little-endian) dataset of `count` elements at `name` (intermediate groups are
// created) whose storage HDF5 allocates now and never writes: contiguous layout, H5D_ALLOC_TIME_EARLY,
// H5D_FILL_TIME_NEVER. The caller writes the raw bytes itself at h5_dataset_offset once the file is closed.
H5Handle h5_create_f32_unfilled(const H5File& f, const std::string& name, int64_t count);
// The file offset of a contiguous dataset's raw data; -1 if it has none (0 elements).
int64_t h5_dataset_offset(const H5File& f, hid_t ds, const std::string& name);
// The file offset of `ds`'s elements where the file holds them as this machine's fp32 in one contiguous run without
// filters, so that a plain read of the file's bytes gives them; -1 otherwise (or with 0 elements), where
// h5_read_f32_range is the way to read them.
int64_t h5_native_f32_offset(const H5File& f, hid_t ds, const std::string& name);
// Reads a whole floating-point dataset as fp32; the shape must match exactly (the error names the file, dataset and
// both shapes) and the dataset must be of HDF5's float class (an integer one is kBadInput naming it).
void h5_read_f32(const H5File& f, const std::string& name, const std::vector<int64_t>& shape, float* data);

// Every dataset reachable from the root by hard links, as its path without the leading "/" ("transformer.wte.weight",
// "units/head/param"), in name order. kBadInput naming the file if it cannot be walked.
std::vector<std::string> h5_dataset_names(const H5File& f);
// Checks that no two of these datasets (name, open handle) hold the same bytes of the file: each contiguous
// dataset's raw data [offset, offset + storage size) is its own. kBadInput naming the file, both datasets and their
// byte ranges. Datasets without one contiguous run (chunked, compact, empty) are HDF5's own to index and skipped.
void h5_check_disjoint(const H5File& f, const std::vector<std::pair<std::string, hid_t>>& datasets);

// Groups. h5_create_group creates `name` (its parent must exist; kFault naming the file) and tracks its
// links in creation order, so that h5_list_group returns them in the order they were written.
H5Handle h5_create_group(const H5File& f, const std::string& name);
H5Handle h5_open_group(const H5File& f, const std::string& name);  // kBadInput naming the file if absent
// Names of the links in `group` (called `name` in messages): in creation order where tracked, else by name.
std::vector<std::string> h5_list_group(const H5File& f, hid_t group, const std::string& name);

// Scalar int64 attributes on a file, group or dataset; `obj_name` is only for messages. Writing fails
// with kFault naming the file; reading fails with kBadInput naming the file, object and attribute if the
// attribute is absent or not a scalar integer.
void h5_write_attr_i64(const H5File& f, hid_t obj, const std::string& obj_name, const std::string& attr, int64_t value);
int64_t h5_read_attr_i64(const H5File& f, hid_t obj, const std::string& obj_name, const std::string& attr);

// kBadInput naming the file and dataset if absent.
H5Handle h5_open_dataset(const H5File& f, const std::string& name);
std::vector<int64_t> h5_dataset_shape(const H5File& f, hid_t ds, const std::string& name);
// Reads elements [offset, offset + count) of the 1-D floating-point dataset `ds` (called `name` in
// messages) into out as fp32, through a hyperslab of the file space, so only those elements are read.
// kBadInput if the dataset is not 1-D floating point or does not hold the range; count 0 reads nothing.
//
//   H5Handle ds = h5_open_dataset(f, "/units/block.0/param");
//   h5_read_f32_range(f, ds.get(), "/units/block.0/param", 100, 50, out);   // elements 100..149
void h5_read_f32_range(const H5File& f, hid_t ds, const std::string& name, int64_t offset, int64_t count, float* out);

}  // namespace st

#define ST_H5_CHECK(expr)                                                                          \
  do {                                                                                             \
    if ((expr) < 0)                                                                                \
      ::st::detail::fail(::st::ErrorKind::kFault, __FILE__, __LINE__, #expr,                       \
                         "HDF5: " + ::st::detail::h5_error_stack());                               \
  } while (0)
