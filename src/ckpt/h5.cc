#include "shardtrain/ckpt/h5.h"

namespace st {
namespace detail {

std::string h5_error_stack() {
  std::string out;
  auto walk = [](unsigned n, const H5E_error2_t* e, void* data) -> herr_t {
    auto* s = static_cast<std::string*>(data);
    if (!s->empty()) *s += "; ";
    *s += std::string(e->func_name ? e->func_name : "?") + ": " + (e->desc ? e->desc : "");
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, walk, &out);
  return out.empty() ? "no HDF5 error stack" : out;
}

}  // namespace detail

namespace {

// HDF5 prints its error stack to stderr by default; we carry it in the exception instead.
void silence_hdf5_auto_print() {
  static const bool once = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)once;
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
  ST_H5_CHECK(H5Dwrite(ds.get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data));
}

std::string shape_str(const std::vector<hsize_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace

H5File H5File::create(const std::string& path) {
  silence_hdf5_auto_print();
  H5File f;
  f.path_ = path;
  f.h_ = H5Handle(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  if (f.h_.get() < 0) ST_FAULT("cannot create HDF5 file ", path, ": ", detail::h5_error_stack());
  return f;
}

H5File H5File::open_read(const std::string& path) {
  silence_hdf5_auto_print();
  H5File f;
  f.path_ = path;
  f.h_ = H5Handle(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (f.h_.get() < 0) ST_BAD_INPUT("cannot open HDF5 file ", path, ": ", detail::h5_error_stack());
  return f;
}

void H5File::close() {
  if (h_.get() >= 0) ST_H5_CHECK(H5Fflush(h_.get(), H5F_SCOPE_GLOBAL));
  h_.reset();
}

void h5_write_f32(const H5File& f, const std::string& name, const std::vector<int64_t>& shape, const float* data) {
  write_dataset(f, name, shape, H5T_NATIVE_FLOAT, data);
}

void h5_write_i32(const H5File& f, const std::string& name, const std::vector<int64_t>& shape, const int32_t* data) {
  write_dataset(f, name, shape, H5T_NATIVE_INT32, data);
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
  ST_H5_CHECK(H5Dread(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data));
}

}  // namespace st
