#include "shardtrain/ckpt/hf_export.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <map>

#include "shardtrain/ckpt/file_io.h"
#include "shardtrain/ckpt/h5.h"
#include "shardtrain/core/errno_text.h"
#include "shardtrain/core/error.h"
#include "shardtrain/model/llama/llama_hf.h"

namespace st {
void write_hf_gpt2(const std::string& path, const ModelConfig& cfg, const std::vector<UnitLayout>& units,
                   const std::vector<const float*>& unit_buffers) {
  ST_ENFORCE_EQ(unit_buffers.size(), units.size());
  // Written next to the target and renamed into place, so a reader never sees a half-written file; a failed
  // write removes the temporary file (its HDF5 handles are closed first: f is declared after the guard).
  check_output_dir(path, "ckpt.export");
  const std::string tmp = path + ".tmp";
  RemoveOnFailure cleanup(tmp);
  H5File f = H5File::create(tmp);
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
  f.close();
  fsync_path(tmp);  // HDF5 never fsyncs
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    ST_FAULT("cannot rename ", tmp, " to ", path, ": ", errno_text());
  cleanup.dismiss();
}

void write_hf_weights(const std::string& path, const ModelConfig& cfg, const std::vector<UnitLayout>& units,
                      const std::vector<const float*>& unit_buffers) {
  if (cfg.arch == ModelArch::kGpt2) {
    write_hf_gpt2(path, cfg, units, unit_buffers);
    return;
  }
  ST_ENFORCE_EQ(unit_buffers.size(), units.size());
  check_output_dir(path, "ckpt.export");
  const std::string tmp = path + ".tmp";
  RemoveOnFailure cleanup(tmp);
  H5File f = H5File::create(tmp);
  for (const HfRange& r : llama_hf_tensor_map(cfg, units))
    h5_write_f32(f, r.hf_name, r.hf_shape, unit_buffers[static_cast<size_t>(r.unit)] + r.offset);
  f.close();
  fsync_path(tmp);
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    ST_FAULT("cannot rename ", tmp, " to ", path, ": ", errno_text());
  cleanup.dismiss();
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
