#include "shardtrain/ckpt/hf_export.h"

#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "ckpt_test_util.h"
#include "shardtrain/ckpt/h5.h"
#include "shardtrain/model/units.h"

namespace st {
namespace {

using testing::bad_input_message;
using testing::bits;
using testing::contains;
using testing::pattern;
using testing::TempDir;

ModelConfig small_model() {
  ModelConfig m;
  m.n_layer = 2;
  m.n_head = 2;
  m.n_embd = 8;
  m.vocab_size = 100;  // padded to 128 in memory
  m.seq_len = 16;
  return m;
}

struct Model {
  ModelConfig cfg;
  std::vector<UnitLayout> units;
  std::vector<std::vector<float>> buffers;

  explicit Model(const ModelConfig& c) : cfg(c), units(build_units(c)) {
    for (const UnitLayout& u : units) buffers.push_back(pattern(static_cast<size_t>(u.numel), 17 + u.index));
  }
  std::vector<const float*> in() const {
    std::vector<const float*> p;
    for (const auto& b : buffers) p.push_back(b.data());
    return p;
  }
};

std::vector<float*> out_ptrs(std::vector<std::vector<float>>& bufs) {
  std::vector<float*> p;
  for (auto& b : bufs) p.push_back(b.data());
  return p;
}

TEST(HfExport, RoundTripIsBitExactAndPaddingRowsComeBackZero) {
  TempDir dir;
  const Model m(small_model());
  const std::string path = dir.file("model.h5");
  write_hf_gpt2(path, m.cfg, m.units, m.in());
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"model.h5"});  // the .tmp was renamed away

  std::vector<std::vector<float>> back;
  for (const UnitLayout& u : m.units) back.emplace_back(u.numel, 42.0f);
  read_hf_gpt2(path, m.cfg, m.units, out_ptrs(back));

  const TensorSpec& wte = m.units[0].tensor("wte");
  const int64_t C = m.cfg.n_embd, V = m.cfg.vocab_size, Vp = m.cfg.padded_vocab();
  ASSERT_EQ(wte.shape, (std::vector<int64_t>{Vp, C}));
  for (size_t u = 0; u < m.units.size(); ++u) {
    if (u == 0) {
      // Real rows exactly; padding rows (not in the file) zero.
      EXPECT_EQ(bits(back[0].data() + wte.offset, V * C), bits(m.buffers[0].data() + wte.offset, V * C));
      EXPECT_EQ(std::vector<float>(back[0].begin() + wte.offset + V * C, back[0].begin() + wte.offset + Vp * C),
                std::vector<float>((Vp - V) * C, 0.0f));
      const int64_t rest = wte.offset + wte.numel;
      EXPECT_EQ(bits(back[0].data() + rest, back[0].size() - rest),
                bits(m.buffers[0].data() + rest, back[0].size() - rest));
    } else {
      EXPECT_EQ(bits(back[u]), bits(m.buffers[u])) << m.units[u].name;
    }
  }
}

TEST(HfExport, FileHoldsHfNamesAndShapesWithWteRealRowsOnly) {
  TempDir dir;
  const Model m(small_model());
  const std::string path = dir.file("model.h5");
  write_hf_gpt2(path, m.cfg, m.units, m.in());
  const H5File f = H5File::open_read(path);
  const int64_t C = m.cfg.n_embd;
  auto shape = [&](const std::string& name) {
    H5Handle ds = h5_open_dataset(f, name);
    return h5_dataset_shape(f, ds.get(), name);
  };
  EXPECT_EQ(shape("transformer.wte.weight"), (std::vector<int64_t>{m.cfg.vocab_size, C}));
  EXPECT_EQ(shape("transformer.wpe.weight"), (std::vector<int64_t>{m.cfg.seq_len, C}));
  EXPECT_EQ(shape("transformer.h.1.attn.c_attn.weight"), (std::vector<int64_t>{C, 3 * C}));
  EXPECT_EQ(shape("transformer.h.1.attn.c_attn.bias"), (std::vector<int64_t>{3 * C}));
  EXPECT_EQ(shape("transformer.h.0.mlp.c_fc.weight"), (std::vector<int64_t>{C, 4 * C}));
  EXPECT_EQ(shape("transformer.h.0.mlp.c_proj.weight"), (std::vector<int64_t>{4 * C, C}));
  EXPECT_EQ(shape("transformer.ln_f.bias"), (std::vector<int64_t>{C}));
  EXPECT_EQ(H5Lexists(f.id(), "lm_head.weight", H5P_DEFAULT), 0);  // tied to wte, not written
  H5Handle root = h5_open_group(f, "/");
  EXPECT_EQ(h5_list_group(f, root.get(), "/").size(), size_t{2 + 12 * 2 + 2});
}

TEST(HfExport, Conv1DWeightIsTheTransposeOfOurs) {
  TempDir dir;
  const Model m(small_model());
  const std::string path = dir.file("model.h5");
  write_hf_gpt2(path, m.cfg, m.units, m.in());
  const H5File f = H5File::open_read(path);
  const int64_t C = m.cfg.n_embd;
  for (const auto& [ours, hf, out_dim, in_dim] : std::vector<std::tuple<std::string, std::string, int64_t, int64_t>>{
           {"attn.qkv.weight", "transformer.h.1.attn.c_attn.weight", 3 * C, C},
           {"mlp.proj.weight", "transformer.h.1.mlp.c_proj.weight", C, 4 * C}}) {
    const UnitLayout& block1 = m.units[2];
    ASSERT_EQ(block1.name, "block.1");
    const TensorSpec& t = block1.tensor(ours);
    ASSERT_EQ(t.shape, (std::vector<int64_t>{out_dim, in_dim}));
    std::vector<float> file(static_cast<size_t>(t.numel));
    h5_read_f32(f, hf, {in_dim, out_dim}, file.data());
    const float* src = m.buffers[2].data() + t.offset;
    int64_t mismatches = 0;
    for (int64_t o = 0; o < out_dim; ++o)
      for (int64_t i = 0; i < in_dim; ++i)
        mismatches += bits(&file[i * out_dim + o], 1) != bits(&src[o * in_dim + i], 1);
    EXPECT_EQ(mismatches, 0) << hf;
  }
}

TEST(HfExport, ShapeMismatchOnReadNamesTheDatasetAndBothShapes) {
  TempDir dir;
  const Model m(small_model());
  const std::string path = dir.file("model.h5");
  write_hf_gpt2(path, m.cfg, m.units, m.in());
  ModelConfig longer = small_model();
  longer.seq_len = 32;
  const std::vector<UnitLayout> units = build_units(longer);
  std::vector<std::vector<float>> back;
  for (const UnitLayout& u : units) back.emplace_back(u.numel);
  const std::string msg = bad_input_message([&] { read_hf_gpt2(path, longer, units, out_ptrs(back)); });
  EXPECT_TRUE(contains(msg, path + ": dataset transformer.wpe.weight has shape [16, 8], expected [32, 8]")) << msg;
}

// The writer takes the units in any order, one at a time, and writes what write_hf_gpt2 writes from all at once.
TEST(HfExport, TheWriterTakesTheUnitsOneAtATimeInAnyOrder) {
  TempDir dir;
  const Model m(small_model());
  write_hf_gpt2(dir.file("whole.h5"), m.cfg, m.units, m.in());
  {
    HfWeightsWriter w(dir.file("units.h5"), m.cfg, m.units);
    for (int u = static_cast<int>(m.units.size()) - 1; u >= 0; --u) {
      const std::vector<float> one = m.buffers[static_cast<size_t>(u)];  // this unit's buffer alone
      w.write_unit(u, one.data());
    }
    w.commit();
  }
  for (const char* file : {"whole.h5", "units.h5"}) {
    std::vector<std::vector<float>> back;
    for (const UnitLayout& u : m.units) back.emplace_back(static_cast<size_t>(u.numel), -1.0f);
    std::vector<float*> out = out_ptrs(back);
    read_hf_gpt2(dir.file(file), m.cfg, m.units, out);
    for (size_t u = 1; u < m.units.size(); ++u) EXPECT_EQ(bits(back[u]), bits(m.buffers[u])) << file << " unit " << u;
  }
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"units.h5", "whole.h5"}));
}

// A unit handed over twice, or a commit before every unit, is an internal error; a writer that never commits leaves
// neither the file nor its temporary.
TEST(HfExport, AWriterThatDoesNotCommitLeavesNothing) {
  TempDir dir;
  const Model m(small_model());
  {
    HfWeightsWriter w(dir.file("model.h5"), m.cfg, m.units);
    w.write_unit(0, m.buffers[0].data());
    EXPECT_TRUE(contains(testing::error_message(ErrorKind::kInternal, [&] { w.write_unit(0, m.buffers[0].data()); }),
                         "unit 0 handed to the export twice"));
    EXPECT_TRUE(contains(testing::error_message(ErrorKind::kInternal, [&] { w.commit(); }),
                         "the export was committed without unit "));
  }
  EXPECT_TRUE(dir.entries().empty());
}

}  // namespace
}  // namespace st
