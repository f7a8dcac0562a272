#include "shardtrain/ckpt/h5.h"

#include <algorithm>
#include <cstdint>

namespace st {
namespace detail {

std::string h5_error_stack() {
  // Walked from the API call down to the innermost failure. A failed system call's record (the sec2 driver's)
  // embeds the time, a newline and the OS's own text ("error message = 'File too large'"): that text leads,
  // and each record is cut before its time stamp.
  struct Stack {
    std::vector<std::string> records;
    std::string os_error;
  } stack;
  auto walk = [](unsigned, const H5E_error2_t* e, void* data) -> herr_t {
    auto* s = static_cast<Stack*>(data);
    std::string desc = e->desc ? e->desc : "";
    const std::string key = "error message = '";
    if (const size_t at = desc.find(key); at != std::string::npos) {
      const size_t begin = at + key.size(), end = desc.find('\'', begin);
      s->os_error = desc.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    }
    if (const size_t at = desc.find(": time = "); at != std::string::npos) desc.resize(at);
    if (const size_t at = desc.find(", errno = "); at != std::string::npos) desc.resize(at);
    std::replace(desc.begin(), desc.end(), '\n', ' ');
    s->records.push_back(std::string(e->func_name ? e->func_name : "?") + ": " + desc);
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, walk, &stack);
  if (stack.records.empty()) return "no HDF5 error stack";
  // The outermost record says what the library was doing, the innermost why it failed.
  std::string out = stack.records.front();
  if (stack.records.size() > 1) out += "; ... " + stack.records.back();
  return stack.os_error.empty() ? out : stack.os_error + " (HDF5: " + out + ")";
}

}  // namespace detail

namespace {

// Called before every file is created or opened, so before HDF5's first call in the process.
//
// HDF5 registers H5_term_library with atexit() unless told not to. When a write fails (a full disk, or the
// file-size limit), H5Fclose cannot flush the file's metadata and fails; HDF5 before 1.14.1 (Debian ships
// 1.10) then frees the file's structure but leaves its ID registered, and H5_term_library at exit closes that
// ID again and crashes (SIGSEGV in H5F__close_cb), turning a reported fault into a core dump. Without the
// atexit hook the process ends normally: every file it meant to keep was closed explicitly (H5File::close), and
// the OS reclaims the rest.
//
// HDF5 also prints its error stack to stderr by default; we carry it in the exception instead. In a thread-safe
// HDF5 build (Debian's) the default error stack and its auto-print setting are per thread, so every thread
// that opens a file silences its own.
void prepare_hdf5() {
  static const bool no_atexit = [] {
    H5dont_atexit();
    return true;
  }();
  static thread_local const bool silenced = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)no_atexit;
  (void)silenced;
}

std::vector<hsize_t> to_hsize(const std::vector<int64_t>& shape) { return {shape.begin(), shape.end()}; }

void write_dataset(const H5File& f, const std::string& name, const std::vector<int64_t>& shape, hid_t type,
                   const void* data) {
  const std::vector<hsize_t> dims = to_hsize(shape);
  H5Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
  ST_H5_CHECK(space.get());
  H5Handle lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  ST_H5_CHECK(H5Pset_create_intermediate_group(lcpl.get(), 1));
  H5Handle ds(H5Dcreate2(f.id(), name.c_str(), type, space.get(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
  if (ds.get() < 0) ST_FAULT("cannot create dataset ", name, " in ", f.path(), ": ", detail::h5_error_stack());
  hsize_t elements = 1;
  for (hsize_t d : dims) elements *= d;
  if (elements == 0) return;  // nothing to write (and data may be null)
  if (H5Dwrite(ds.get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
    ST_FAULT("cannot write dataset ", name, " of ", f.path(), ": ", detail::h5_error_stack());
}

std::string shape_str(const std::vector<hsize_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace

H5File H5File::create(const std::string& path) {
  prepare_hdf5();
  H5File f;
  f.path_ = path;
  f.h_ = H5Handle(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  if (f.h_.get() < 0) ST_FAULT("cannot create HDF5 file ", path, ": ", detail::h5_error_stack());
  return f;
}

H5File H5File::open_read(const std::string& path) {
  prepare_hdf5();
  H5File f;
  f.path_ = path;
  f.h_ = H5Handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (f.h_.get() < 0) ST_BAD_INPUT("cannot open HDF5 file ", path, ": ", detail::h5_error_stack());
  return f;
}

void H5File::close() {
  if (h_.get() < 0) return;
  if (H5Fflush(h_.get(), H5F_SCOPE_GLOBAL) < 0) {
    const std::string stack = detail::h5_error_stack();
    h_.reset();
    ST_FAULT("cannot flush HDF5 file ", path_, ": ", stack);
  }
  // Closing writes the last metadata (superblock EOF) and can fail, e.g. when the disk is full.
  if (H5Fclose(h_.release()) < 0) ST_FAULT("cannot close HDF5 file ", path_, ": ", detail::h5_error_stack());
}

void h5_write_f32(const H5File& f, const std::string& name, const std::vector<int64_t>& shape, const float* data) {
  write_dataset(f, name, shape, H5T_NATIVE_FLOAT, data);
}

void h5_write_i32(const H5File& f, const std::string& name, const std::vector<int64_t>& shape, const int32_t* data) {
  write_dataset(f, name, shape, H5T_NATIVE_INT32, data);
}

H5Handle h5_create_f32_unfilled(const H5File& f, const std::string& name, int64_t count) {
  // The caller writes the bytes of host floats verbatim as the file's IEEE little-endian ones.
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "raw float32 writes assume a little-endian host");
  const hsize_t dims = static_cast<hsize_t>(count);
  H5Handle space(H5Screate_simple(1, &dims, nullptr), H5Sclose);
  ST_H5_CHECK(space.get());
  H5Handle lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  ST_H5_CHECK(lcpl.get());
  ST_H5_CHECK(H5Pset_create_intermediate_group(lcpl.get(), 1));
  H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  ST_H5_CHECK(dcpl.get());
  ST_H5_CHECK(H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS));
  ST_H5_CHECK(H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY));
  ST_H5_CHECK(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER));
  H5Handle ds(H5Dcreate2(f.id(), name.c_str(), H5T_IEEE_F32LE, space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT),
              H5Dclose);
  if (ds.get() < 0) ST_FAULT("cannot create dataset ", name, " in ", f.path(), ": ", detail::h5_error_stack());
  return ds;
}

int64_t h5_dataset_offset(const H5File& f, hid_t ds, const std::string& name) {
  const haddr_t at = H5Dget_offset(ds);
  if (at == HADDR_UNDEF) return -1;
  if (at > static_cast<haddr_t>(INT64_MAX)) ST_FAULT(f.path(), ": dataset ", name, " has file offset ", at);
  return static_cast<int64_t>(at);
}

int64_t h5_native_f32_offset(const H5File& f, hid_t ds, const std::string& name) {
  H5Handle type(H5Dget_type(ds), H5Tclose);
  ST_H5_CHECK(type.get());
  const htri_t native = H5Tequal(type.get(), H5T_NATIVE_FLOAT);
  ST_H5_CHECK(native);
  H5Handle dcpl(H5Dget_create_plist(ds), H5Pclose);
  ST_H5_CHECK(dcpl.get());
  if (native == 0 || H5Pget_layout(dcpl.get()) != H5D_CONTIGUOUS || H5Pget_nfilters(dcpl.get()) != 0) return -1;
  return h5_dataset_offset(f, ds, name);
}

void h5_read_f32(const H5File& f, const std::string& name, const std::vector<int64_t>& shape, float* data) {
  H5Handle ds(H5Dopen2(f.id(), name.c_str(), H5P_DEFAULT), H5Dclose);
  if (ds.get() < 0) ST_BAD_INPUT(f.path(), ": dataset ", name, " is missing");
  H5Handle space(H5Dget_space(ds.get()), H5Sclose);
  ST_H5_CHECK(space.get());
  const int rank = H5Sget_simple_extent_ndims(space.get());
  ST_H5_CHECK(rank);
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  ST_H5_CHECK(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr));
  const std::vector<hsize_t> want = to_hsize(shape);
  if (dims != want)
    ST_BAD_INPUT(f.path(), ": dataset ", name, " has shape ", shape_str(dims), ", expected ", shape_str(want));
  // HDF5 would convert integers too: a dataset of another class is not weights.
  H5Handle type(H5Dget_type(ds.get()), H5Tclose);
  ST_H5_CHECK(type.get());
  if (H5Tget_class(type.get()) != H5T_FLOAT) ST_BAD_INPUT(f.path(), ": dataset ", name, " is not floating point");
  ST_H5_CHECK(H5Dread(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data));
}

H5Handle h5_create_group(const H5File& f, const std::string& name) {
  H5Handle gcpl(H5Pcreate(H5P_GROUP_CREATE), H5Pclose);
  ST_H5_CHECK(gcpl.get());
  ST_H5_CHECK(H5Pset_link_creation_order(gcpl.get(), H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED));
  H5Handle g(H5Gcreate2(f.id(), name.c_str(), H5P_DEFAULT, gcpl.get(), H5P_DEFAULT), H5Gclose);
  if (g.get() < 0) ST_FAULT("cannot create group ", name, " in ", f.path(), ": ", detail::h5_error_stack());
  return g;
}

H5Handle h5_open_group(const H5File& f, const std::string& name) {
  // H5Lexists first: opening a missing path would fill the error stack with noise.
  const htri_t exists = name == "/" ? 1 : H5Lexists(f.id(), name.c_str(), H5P_DEFAULT);
  if (exists <= 0) ST_BAD_INPUT(f.path(), ": group ", name, " is missing");
  H5Handle g(H5Gopen2(f.id(), name.c_str(), H5P_DEFAULT), H5Gclose);
  if (g.get() < 0) ST_BAD_INPUT(f.path(), ": ", name, " is not a group: ", detail::h5_error_stack());
  return g;
}

std::vector<std::string> h5_list_group(const H5File& f, hid_t group, const std::string& name) {
  H5G_info_t info;
  if (H5Gget_info(group, &info) < 0)
    ST_BAD_INPUT(f.path(), ": cannot list group ", name, ": ", detail::h5_error_stack());
  H5Handle gcpl(H5Gget_create_plist(group), H5Pclose);
  ST_H5_CHECK(gcpl.get());
  unsigned order_flags = 0;
  ST_H5_CHECK(H5Pget_link_creation_order(gcpl.get(), &order_flags));
  const H5_index_t index = (order_flags & H5P_CRT_ORDER_INDEXED) ? H5_INDEX_CRT_ORDER : H5_INDEX_NAME;
  std::vector<std::string> names;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t len = H5Lget_name_by_idx(group, ".", index, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    if (len < 0) ST_BAD_INPUT(f.path(), ": cannot list group ", name, ": ", detail::h5_error_stack());
    std::string link(static_cast<size_t>(len) + 1, '\0');
    if (H5Lget_name_by_idx(group, ".", index, H5_ITER_INC, i, link.data(), link.size(), H5P_DEFAULT) < 0)
      ST_BAD_INPUT(f.path(), ": cannot list group ", name, ": ", detail::h5_error_stack());
    link.resize(static_cast<size_t>(len));
    names.push_back(std::move(link));
  }
  return names;
}

void h5_write_attr_i64(const H5File& f, hid_t obj, const std::string& obj_name, const std::string& attr,
                       int64_t value) {
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  ST_H5_CHECK(space.get());
  H5Handle a(H5Acreate2(obj, attr.c_str(), H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (a.get() < 0 || H5Awrite(a.get(), H5T_NATIVE_INT64, &value) < 0)
    ST_FAULT("cannot write attribute ", attr, " of ", obj_name, " in ", f.path(), ": ", detail::h5_error_stack());
}

int64_t h5_read_attr_i64(const H5File& f, hid_t obj, const std::string& obj_name, const std::string& attr) {
  const htri_t exists = H5Aexists(obj, attr.c_str());
  if (exists < 0)
    ST_BAD_INPUT(f.path(), ": cannot look up attribute ", attr, " of ", obj_name, ": ", detail::h5_error_stack());
  if (exists == 0) ST_BAD_INPUT(f.path(), ": attribute ", attr, " of ", obj_name, " is missing");
  H5Handle a(H5Aopen(obj, attr.c_str(), H5P_DEFAULT), H5Aclose);
  if (a.get() < 0)
    ST_BAD_INPUT(f.path(), ": cannot open attribute ", attr, " of ", obj_name, ": ", detail::h5_error_stack());
  H5Handle type(H5Aget_type(a.get()), H5Tclose);
  H5Handle space(H5Aget_space(a.get()), H5Sclose);
  ST_H5_CHECK(type.get());
  ST_H5_CHECK(space.get());
  const hssize_t points = H5Sget_simple_extent_npoints(space.get());
  if (H5Tget_class(type.get()) != H5T_INTEGER || points != 1)
    ST_BAD_INPUT(f.path(), ": attribute ", attr, " of ", obj_name, " is not a scalar integer");
  int64_t value = 0;
  if (H5Aread(a.get(), H5T_NATIVE_INT64, &value) < 0)
    ST_BAD_INPUT(f.path(), ": cannot read attribute ", attr, " of ", obj_name, ": ", detail::h5_error_stack());
  return value;
}

H5Handle h5_open_dataset(const H5File& f, const std::string& name) {
  const htri_t exists = H5Lexists(f.id(), name.c_str(), H5P_DEFAULT);
  if (exists <= 0) ST_BAD_INPUT(f.path(), ": dataset ", name, " is missing");
  H5Handle ds(H5Dopen2(f.id(), name.c_str(), H5P_DEFAULT), H5Dclose);
  if (ds.get() < 0) ST_BAD_INPUT(f.path(), ": ", name, " is not a dataset: ", detail::h5_error_stack());
  return ds;
}

std::vector<int64_t> h5_dataset_shape(const H5File& f, hid_t ds, const std::string& name) {
  H5Handle space(H5Dget_space(ds), H5Sclose);
  if (space.get() < 0)
    ST_BAD_INPUT(f.path(), ": cannot read the shape of dataset ", name, ": ", detail::h5_error_stack());
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 0) ST_BAD_INPUT(f.path(), ": dataset ", name, " has no simple shape: ", detail::h5_error_stack());
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  ST_H5_CHECK(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr));
  return {dims.begin(), dims.end()};
}

void h5_read_f32_range(const H5File& f, hid_t ds, const std::string& name, int64_t offset, int64_t count, float* out) {
  H5Handle type(H5Dget_type(ds), H5Tclose);
  ST_H5_CHECK(type.get());
  if (H5Tget_class(type.get()) != H5T_FLOAT) ST_BAD_INPUT(f.path(), ": dataset ", name, " is not floating point");
  H5Handle file_space(H5Dget_space(ds), H5Sclose);
  ST_H5_CHECK(file_space.get());
  const int rank = H5Sget_simple_extent_ndims(file_space.get());
  hsize_t extent = 0;
  if (rank != 1 || H5Sget_simple_extent_dims(file_space.get(), &extent, nullptr) < 0)
    ST_BAD_INPUT(f.path(), ": dataset ", name, " has ", rank, " dimensions, expected 1");
  if (offset < 0 || count < 0 || static_cast<hsize_t>(offset) + static_cast<hsize_t>(count) > extent)
    ST_BAD_INPUT(f.path(), ": dataset ", name, " holds ", extent, " elements, cannot read [", offset, ", ",
                 offset + count, ")");
  if (count == 0) return;
  const hsize_t start = static_cast<hsize_t>(offset), n = static_cast<hsize_t>(count);
  ST_H5_CHECK(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &start, nullptr, &n, nullptr));
  H5Handle mem_space(H5Screate_simple(1, &n, nullptr), H5Sclose);
  ST_H5_CHECK(mem_space.get());
  if (H5Dread(ds, H5T_NATIVE_FLOAT, mem_space.get(), file_space.get(), H5P_DEFAULT, out) < 0)
    ST_FAULT("cannot read elements [", offset, ", ", offset + count, ") of dataset ", name, " in ", f.path(), ": ",
             detail::h5_error_stack());
}

std::vector<std::string> h5_dataset_names(const H5File& f) {
  struct Found {
    std::vector<std::string> names;
    bool failed = false;
  } found;
  // Links, not objects: a dataset reached by two links (a hard link) is listed under both names.
  auto visit = [](hid_t group, const char* name, const H5L_info_t* info, void* data) -> herr_t {
    auto* out = static_cast<Found*>(data);
    if (info->type != H5L_TYPE_HARD) return 0;  // soft and external links lead elsewhere: not this file's data
    const hid_t obj = H5Oopen(group, name, H5P_DEFAULT);
    if (obj < 0) {
      out->failed = true;
      return -1;
    }
    if (H5Iget_type(obj) == H5I_DATASET) out->names.emplace_back(name);
    H5Oclose(obj);
    return 0;
  };
  if (H5Lvisit(f.id(), H5_INDEX_NAME, H5_ITER_INC, visit, &found) < 0 || found.failed)
    ST_BAD_INPUT(f.path(), ": cannot list its datasets: ", detail::h5_error_stack());
  return found.names;
}

void h5_check_disjoint(const H5File& f, const std::vector<std::pair<std::string, hid_t>>& datasets) {
  struct Bytes {
    haddr_t begin, end;
    const std::string* name;
  };
  std::vector<Bytes> spans;
  for (const auto& [name, ds] : datasets) {
    const haddr_t at = H5Dget_offset(ds);
    if (at == HADDR_UNDEF) continue;  // chunked, compact, or never written: HDF5 indexes those itself
    const hsize_t bytes = H5Dget_storage_size(ds);
    if (bytes == 0) continue;
    if (at > HADDR_MAX - bytes)
      ST_BAD_INPUT(f.path(), ": dataset ", name, " has its ", bytes, " bytes at file offset ", at, ", past any file");
    spans.push_back(Bytes{at, at + bytes, &name});
  }
  std::sort(spans.begin(), spans.end(),
            [](const Bytes& a, const Bytes& b) { return a.begin != b.begin ? a.begin < b.begin : *a.name < *b.name; });
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i].begin < spans[i - 1].end)
      ST_BAD_INPUT(f.path(), ": datasets ", *spans[i - 1].name, " (bytes [", spans[i - 1].begin, ", ",
                   spans[i - 1].end, ")) and ", *spans[i].name, " (bytes [", spans[i].begin, ", ", spans[i].end,
                   ")) overlap: every dataset's bytes must be its own (expected ", *spans[i].name, " to begin at ",
                   spans[i - 1].end, " or later)");
}

}  // namespace st
