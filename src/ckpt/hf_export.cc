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

// The temporary file a writer of `path` (ckpt.export: it must not exist) writes: next to the target under a name of
// this process's own, renamed into place by commit() only if nothing has taken `path` meanwhile, so a reader never
// sees a half-written file and nothing is replaced.
std::string temporary_of(const std::string& path) {
  check_output_dir(path, "ckpt.export");
  refuse_existing(path, "ckpt.export");
  return path + ".tmp-" + std::to_string(::getpid());
}

}  // namespace

HfWeightsWriter::HfWeightsWriter(const std::string& path, const ModelConfig& cfg, const std::vector<UnitLayout>& units)
    : path_(path),
      tmp_(temporary_of(path)),
      cfg_(cfg),
      units_(units),
      written_(units.size(), false),
      cleanup_(tmp_),
      file_(H5File::create(tmp_)) {
  // The family's names, once (a layout it cannot name fails before any write).
  if (cfg.is_llama())
    llama_map_ = llama_hf_tensor_map(cfg_, units_);
  else
    gpt2_map_ = hf_gpt2_tensor_map(cfg_, units_);
}

void HfWeightsWriter::write_unit(int unit, const float* buffer) {
  ST_CHECK(unit >= 0 && unit < static_cast<int>(units_.size()) && !written_[static_cast<size_t>(unit)], "unit ", unit,
           " handed to the export twice or out of range (", units_.size(), " units)");
  for (const HfRange& r : llama_map_)
    if (r.unit == unit) h5_write_f32(file_, r.hf_name, r.hf_shape, buffer + r.offset);
  for (const HfTensorMap& m : gpt2_map_) {
    if (m.unit != unit) continue;
    const float* src = buffer + m.tensor->offset;
    if (m.transpose) {
      scratch_.resize(static_cast<size_t>(m.tensor->numel));
      transpose_2d(src, scratch_.data(), m.tensor->shape[0], m.tensor->shape[1]);
      src = scratch_.data();
    }
    h5_write_f32(file_, m.hf_name, m.hf_shape, src);  // wte: the leading vocab_size rows are contiguous
  }
  written_[static_cast<size_t>(unit)] = true;
}

void HfWeightsWriter::commit() {
  for (size_t u = 0; u < units_.size(); ++u)
    ST_CHECK(written_[u], "the export was committed without unit ", units_[u].name);
  file_.close();
  fsync_path(tmp_);  // HDF5 never fsyncs
  cleanup_.dismiss();
  commit_new_file(tmp_, path_, "ckpt.export");
}

void write_hf_gpt2(const std::string& path, const ModelConfig& cfg, const std::vector<UnitLayout>& units,
                   const std::vector<const float*>& unit_buffers) {
  ModelConfig gpt2 = cfg;
  gpt2.arch = ModelArch::kGpt2;
  write_hf_weights(path, gpt2, units, unit_buffers);
}

void write_hf_weights(const std::string& path, const ModelConfig& cfg, const std::vector<UnitLayout>& units,
                      const std::vector<const float*>& unit_buffers) {
  ST_ENFORCE_EQ(unit_buffers.size(), units.size());
  HfWeightsWriter w(path, cfg, units);
  for (size_t u = 0; u < units.size(); ++u) w.write_unit(static_cast<int>(u), unit_buffers[u]);
  w.commit();
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
