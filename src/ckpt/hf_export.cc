#include "shardtrain/ckpt/hf_export.h"

#include <unistd.h>

#include <algorithm>
#include <functional>
#include <map>

#include "shardtrain/ckpt/file_io.h"
#include "shardtrain/ckpt/h5.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/new_file.h"
#include "shardtrain/model/llama/llama_hf.h"

namespace st {
namespace {

// Writes a new HDF5 file at `path` (ckpt.export: it must not exist) through `fill`: written next to the target under a
// name of this process's own and renamed into place only if nothing has taken `path` meanwhile, so a reader never
// sees a half-written file and nothing is replaced; a failed write removes the temporary file (its HDF5 handles are
// closed first: f is declared after the guard).
void write_new_h5(const std::string& path, const std::function<void(H5File&)>& fill) {
  check_output_dir(path, "ckpt.export");
  refuse_existing(path, "ckpt.export");
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  {
    RemoveOnFailure cleanup(tmp);
    H5File f = H5File::create(tmp);
    fill(f);
    f.close();
    fsync_path(tmp);  // HDF5 never fsyncs
    cleanup.dismiss();
  }
  commit_new_file(tmp, path, "ckpt.export");
}

}  // namespace

void write_hf_gpt2(const std::string& path, const ModelConfig& cfg, const std::vector<UnitLayout>& units,
                   const std::vector<const float*>& unit_buffers) {
  ST_ENFORCE_EQ(unit_buffers.size(), units.size());
  write_new_h5(path, [&](H5File& f) {
    std::vector<float> scratch;
    for (const HfTensorMap& m : hf_gpt2_tensor_map(cfg, units)) {
      const float* src = unit_buffers[m.unit] + m.tensor->offset;
      if (m.transpose) {
        scratch.resize(m.tensor->numel);
        transpose_2d(src, scratch.data(), m.tensor->shape[0], m.tensor->shape[1]);
        src = scratch.data();
      }
      h5_write_f32(f, m.hf_name, m.hf_shape, src);  // wte: the leading vocab_size rows are contiguous
    }
  });
}

void write_hf_weights(const std::string& path, const ModelConfig& cfg, const std::vector<UnitLayout>& units,
                      const std::vector<const float*>& unit_buffers) {
  if (cfg.arch == ModelArch::kGpt2) {
    write_hf_gpt2(path, cfg, units, unit_buffers);
    return;
  }
  ST_ENFORCE_EQ(unit_buffers.size(), units.size());
  write_new_h5(path, [&](H5File& f) {
    for (const HfRange& r : llama_hf_tensor_map(cfg, units))
      h5_write_f32(f, r.hf_name, r.hf_shape, unit_buffers[static_cast<size_t>(r.unit)] + r.offset);
  });
}

void read_hf_gpt2(const std::string& path, const ModelConfig& cfg, const std::vector<UnitLayout>& units,
                  const std::vector<float*>& unit_buffers) {
  ST_ENFORCE_EQ(unit_buffers.size(), units.size());
  H5File f = H5File::open_read(path);
  std::vector<float> scratch;
  for (const HfTensorMap& m : hf_gpt2_tensor_map(cfg, units)) {
    float* dst = unit_buffers[m.unit] + m.tensor->offset;
    if (m.transpose) {
      scratch.resize(m.tensor->numel);
      h5_read_f32(f, m.hf_name, m.hf_shape, scratch.data());
      transpose_2d(scratch.data(), dst, m.hf_shape[0], m.hf_shape[1]);
    } else {
      std::fill(dst, dst + m.tensor->numel, 0.0f);
      h5_read_f32(f, m.hf_name, m.hf_shape, dst);
    }
  }
}

}  // namespace st
