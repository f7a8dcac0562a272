#include "shardtrain/ckpt/gpt2_file.h"

#include <optional>
#include <utility>

#include "shardtrain/ckpt/tools.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/excerpt.h"

namespace st {
namespace {

std::string shown(const std::string& path) { return excerpt(path, kExcerptPathChars); }

}  // namespace

Gpt2File::Gpt2File(const std::string& path) : path_(path) {
  const std::optional<ExportFormat> format = export_format_for(path);
  if (format == ExportFormat::kSafetensors) {
    st_ = std::make_unique<SafetensorsReader>(path);
    for (const std::string& n : st_->names()) names_.insert(n);
  } else if (format == ExportFormat::kHdf5) {
    h5_ = std::make_unique<H5File>(H5File::open_read(path));
    std::vector<H5Handle> open;
    std::vector<std::pair<std::string, hid_t>> datasets;
    for (const std::string& n : h5_dataset_names(*h5_)) {
      names_.insert(n);
      open.push_back(h5_open_dataset(*h5_, n));
      datasets.emplace_back(n, open.back().get());
    }
    h5_check_disjoint(*h5_, datasets);
  } else {
    ST_BAD_INPUT("init.from '", shown(path),
                 "': expected a .safetensors or .h5 file, or a Hugging Face model directory");
  }
}

std::string Gpt2File::resolve(const std::string& hf_name) const {
  const std::string bare = hf_name.substr(std::string("transformer.").size());
  if (names_.count(hf_name) != 0) return hf_name;
  if (names_.count(bare) != 0) return bare;
  ST_BAD_INPUT("init.from ", shown(path_), ": tensor ", hf_name, " (or ", bare, ") is missing");
}

std::vector<int64_t> Gpt2File::shape(const std::string& name) const {
  if (st_) return st_->shape(name);
  const H5Handle ds = h5_open_dataset(*h5_, name);
  return h5_dataset_shape(*h5_, ds.get(), name);
}

void Gpt2File::read(const std::string& name, const std::vector<int64_t>& shape, float* out) const {
  if (st_)
    st_->read(name, shape, out);
  else
    h5_read_f32(*h5_, name, shape, out);
}

}  // namespace st
