#include "shardtrain/ckpt/init_from.h"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>

#include "shardtrain/ckpt/h5.h"
#include "shardtrain/ckpt/hf_dir.h"
#include "shardtrain/ckpt/hf_export.h"
#include "shardtrain/ckpt/safetensors_reader.h"
#include "shardtrain/ckpt/tools.h"
#include "shardtrain/core/error.h"
#include "shardtrain/model/llama/llama_hf.h"

namespace st {
namespace {

// A Hugging Face llama-family directory. Every rank checks every tensor's presence, shape and dtype (from the
// headers), so a bad directory fails on all ranks alike; then it reads only the elements inside its own spans.
void init_from_hf_dir(const std::string& dir, const ModelConfig& cfg, ModelBackend& model) {
  if (!cfg.is_llama())
    ST_BAD_INPUT("init.from ", dir, " is a directory (a Hugging Face llama or qwen2 model); this model is model.arch=",
                 to_string(cfg.arch), ": a GPT-2 model starts from a .safetensors or .h5 file");
  const HfDirWeights weights(dir);
  const std::vector<HfRange> map = llama_hf_tensor_map(cfg, model.units());
  for (const HfRange& r : map) weights.check(r.hf_name, r.hf_shape);
  model.pull_state();  // only the ranges read below change; the padding rows keep their zero init
  for (const HfRange& r : map) {
    UnitShard& sh = model.shard(r.unit);
    const ShardSpan part = intersect(sh.span, ShardSpan{r.offset, r.numel});
    if (part.count == 0) continue;
    weights.read_range(r.hf_name, part.offset - r.offset, part.count,
                       sh.param.data() + (part.offset - sh.span.offset));
  }
  model.push_state();
}

}  // namespace

void init_from_weights(const std::string& path, const ModelConfig& cfg, ModelBackend& model) {
  if (std::filesystem::is_directory(path)) return init_from_hf_dir(path, cfg, model);
  model.pull_state();  // only the tensors read below change; the rest (wte padding rows) keeps its init
  // One reader function per format: reads the tensor `name` of HF shape `shape` into out.
  std::function<void(const std::string&, const std::vector<int64_t>&, float*)> read;
  std::unique_ptr<SafetensorsReader> st_reader;
  std::unique_ptr<H5File> h5;
  const std::optional<ExportFormat> format = export_format_for(path);
  if (format == ExportFormat::kSafetensors) {
    st_reader = std::make_unique<SafetensorsReader>(path);
    read = [&](const std::string& name, const std::vector<int64_t>& shape, float* out) {
      // Hugging Face's GPT2LMHeadModel exports carry "transformer."; GPT2Model's (the hub's gpt2) do not.
      const std::string bare = name.substr(std::string("transformer.").size());
      if (st_reader->has(name))
        st_reader->read(name, shape, out);
      else if (st_reader->has(bare))
        st_reader->read(bare, shape, out);
      else
        ST_BAD_INPUT("init.from ", path, ": tensor ", name, " (or ", bare, ") is missing");
    };
  } else if (format == ExportFormat::kHdf5) {
    h5 = std::make_unique<H5File>(H5File::open_read(path));
    read = [&](const std::string& name, const std::vector<int64_t>& shape, float* out) {
      h5_read_f32(*h5, name, shape, out);
    };
  } else {
    ST_BAD_INPUT("init.from '", path, "': expected a .safetensors or .h5 file, or a Hugging Face model directory");
  }

  std::vector<float> hf, ours;
  for (const HfTensorMap& m : hf_gpt2_tensor_map(cfg, model.units())) {
    UnitShard& sh = model.shard(m.unit);
    const TensorSpec& t = *m.tensor;
    int64_t hf_numel = 1;
    for (int64_t d : m.hf_shape) hf_numel *= d;
    hf.resize(static_cast<size_t>(hf_numel));
    read(m.hf_name, m.hf_shape, hf.data());
    const float* src = hf.data();
    if (m.transpose) {  // Conv1D [in, out] -> ours [out, in]
      ours.resize(static_cast<size_t>(hf_numel));
      transpose_2d(hf.data(), ours.data(), m.hf_shape[0], m.hf_shape[1]);
      src = ours.data();
    }
    // The HF tensor covers [t.offset, t.offset + hf_numel) of the unit (wte: the real vocabulary rows,
    // which come first; the padding rows after them keep their zero init). Keep what this rank owns.
    const ShardSpan part = intersect(sh.span, ShardSpan{t.offset, hf_numel});
    std::copy(src + (part.offset - t.offset), src + (part.offset - t.offset) + part.count,
              sh.param.begin() + (part.offset - sh.span.offset));
  }
  model.push_state();
}

}  // namespace st
