#include "shardtrain/ckpt/hf_export.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>

#include "shardtrain/ckpt/file_io.h"
#include "shardtrain/ckpt/h5.h"
#include "shardtrain/core/error.h"
#include "shardtrain/model/llama/llama_hf.h"

namespace st {
namespace {

// Our tensor name within a block -> HF suffix, and whether it is a Conv1D matrix.
const std::map<std::string, std::pair<std::string, bool>>& block_names() {
  static const std::map<std::string, std::pair<std::string, bool>> m = {
      {"ln1.weight", {"ln_1.weight", false}},          {"ln1.bias", {"ln_1.bias", false}},
      {"attn.qkv.weight", {"attn.c_attn.weight", true}}, {"attn.qkv.bias", {"attn.c_attn.bias", false}},
      {"attn.proj.weight", {"attn.c_proj.weight", true}}, {"attn.proj.bias", {"attn.c_proj.bias", false}},
      {"ln2.weight", {"ln_2.weight", false}},          {"ln2.bias", {"ln_2.bias", false}},
      {"mlp.fc.weight", {"mlp.c_fc.weight", true}},    {"mlp.fc.bias", {"mlp.c_fc.bias", false}},
      {"mlp.proj.weight", {"mlp.c_proj.weight", true}}, {"mlp.proj.bias", {"mlp.c_proj.bias", false}},
  };
  return m;
}

}  // namespace

// Blocked, so both sides stay in cache.
void transpose_2d(const float* in, float* out, int64_t rows, int64_t cols) {
  constexpr int64_t kB = 32;
  for (int64_t r0 = 0; r0 < rows; r0 += kB)
    for (int64_t c0 = 0; c0 < cols; c0 += kB)
      for (int64_t r = r0; r < std::min(r0 + kB, rows); ++r)
        for (int64_t c = c0; c < std::min(c0 + kB, cols); ++c) out[c * rows + r] = in[r * cols + c];
}

std::vector<HfTensorMap> hf_gpt2_tensor_map(const ModelConfig& cfg, const std::vector<UnitLayout>& units) {
  if (cfg.arch != ModelArch::kGpt2)
    ST_BAD_INPUT("this model is model.arch=", to_string(cfg.arch), "; GPT-2 Hugging Face names apply to gpt2 only");
  std::vector<HfTensorMap> out;
  for (const UnitLayout& u : units) {
    for (const TensorSpec& t : u.tensors) {
      HfTensorMap m;
      m.unit = u.index;
      m.tensor = &t;
      m.hf_shape = t.shape;
      switch (u.kind) {
        case UnitKind::kEmbedding:
          m.hf_name = "transformer." + t.name + ".weight";
          if (t.name == "wte") m.hf_shape = {cfg.vocab_size, t.shape[1]};
          break;
        case UnitKind::kBlock: {
          const auto& [suffix, conv1d] = block_names().at(t.name);
          m.hf_name = "transformer.h." + std::to_string(u.layer) + "." + suffix;
          m.transpose = conv1d;
          if (conv1d) m.hf_shape = {t.shape[1], t.shape[0]};
          break;
        }
        case UnitKind::kHead:
          m.hf_name = "transformer.ln_f." + t.name.substr(t.name.find('.') + 1);
          break;
      }
      out.push_back(std::move(m));
    }
  }
  return out;
}

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
    ST_FAULT("cannot rename ", tmp, " to ", path, ": ", std::strerror(errno));
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
    ST_FAULT("cannot rename ", tmp, " to ", path, ": ", std::strerror(errno));
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
