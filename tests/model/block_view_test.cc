// The blocks' views find their tensors by name: a block whose tensors come in another order, with others between
// them (as adapters would be), gives each pointer its own tensor's offset; a missing tensor is named.
#include "shardtrain/model/gpt2/block_view.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "shardtrain/core/error.h"
#include "shardtrain/model/llama/block_view.h"
#include "shardtrain/model/units.h"

namespace st {
namespace {

// The block's tensors in reverse order, with a 5-element tensor before each: every offset differs from the family's.
UnitLayout shuffled_with_extras(const UnitLayout& block) {
  UnitLayout u;
  u.name = block.name;
  for (auto it = block.tensors.rbegin(); it != block.tensors.rend(); ++it) {
    add_tensor(u, "extra." + it->name, {5}, InitKind::kZeros, false);
    add_tensor(u, it->name, it->shape, it->init, it->weight_decay);
  }
  return u;
}

// Where a view's pointer lies in the unit's buffer.
int64_t at(const std::vector<float>& buf, const float* p) { return static_cast<int64_t>(p - buf.data()); }

TEST(BlockView, Gpt2FindsEachTensorByName) {
  ModelConfig c;
  c.n_layer = 1, c.n_head = 2, c.n_embd = 8, c.vocab_size = 16, c.seq_len = 4;
  const UnitLayout u = shuffled_with_extras(build_units(c)[1]);
  const std::vector<float> buf(static_cast<size_t>(u.numel));
  const auto at = [&](const float* p) { return st::at(buf, p); };
  const BlockView<const float> v(buf.data(), u);
  EXPECT_EQ(at(v.ln1w), u.tensor("ln1.weight").offset);
  EXPECT_EQ(at(v.ln1b), u.tensor("ln1.bias").offset);
  EXPECT_EQ(at(v.qkvw), u.tensor("attn.qkv.weight").offset);
  EXPECT_EQ(at(v.qkvb), u.tensor("attn.qkv.bias").offset);
  EXPECT_EQ(at(v.projw), u.tensor("attn.proj.weight").offset);
  EXPECT_EQ(at(v.projb), u.tensor("attn.proj.bias").offset);
  EXPECT_EQ(at(v.ln2w), u.tensor("ln2.weight").offset);
  EXPECT_EQ(at(v.ln2b), u.tensor("ln2.bias").offset);
  EXPECT_EQ(at(v.fcw), u.tensor("mlp.fc.weight").offset);
  EXPECT_EQ(at(v.fcb), u.tensor("mlp.fc.bias").offset);
  EXPECT_EQ(at(v.fcprojw), u.tensor("mlp.proj.weight").offset);
  EXPECT_EQ(at(v.fcprojb), u.tensor("mlp.proj.bias").offset);
  EXPECT_EQ(u.tensor("mlp.proj.bias").offset, 5);  // reversed: the last tensor now follows the first extra
}

TEST(BlockView, LlamaFindsEachTensorByNameWithAndWithoutTheBias) {
  for (bool bias : {false, true}) {
    ModelConfig c;
    c.arch = ModelArch::kLlama;
    c.n_layer = 1, c.n_head = 2, c.n_kv_head = 1, c.n_embd = 8, c.ffn_dim = 12, c.vocab_size = 16, c.seq_len = 4;
    c.qkv_bias = bias;
    const UnitLayout u = shuffled_with_extras(build_units(c)[1]);
    const std::vector<float> buf(static_cast<size_t>(u.numel));
    const auto at = [&](const float* p) { return st::at(buf, p); };
    const LlamaBlockView<const float> v(buf.data(), u);
    EXPECT_EQ(at(v.attn_norm), u.tensor("attn_norm.weight").offset);
    EXPECT_EQ(at(v.qkvw), u.tensor("attn.qkv.weight").offset);
    if (bias) {
      EXPECT_EQ(at(v.qkvb), u.tensor("attn.qkv.bias").offset);
    } else {
      EXPECT_EQ(v.qkvb, nullptr);
    }
    EXPECT_EQ(at(v.ow), u.tensor("attn.o.weight").offset);
    EXPECT_EQ(at(v.mlp_norm), u.tensor("mlp_norm.weight").offset);
    EXPECT_EQ(at(v.gate_up), u.tensor("mlp.gate_up.weight").offset);
    EXPECT_EQ(at(v.down), u.tensor("mlp.down.weight").offset);
  }
}

TEST(BlockView, AMissingTensorIsNamed) {
  UnitLayout u;
  u.name = "block.0";
  add_tensor(u, "attn_norm.weight", {8}, InitKind::kOnes, false);
  const std::vector<float> buf(static_cast<size_t>(u.numel));
  try {
    const LlamaBlockView<const float> v(buf.data(), u);
    FAIL() << "a block without attn.qkv.weight was viewed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unit block.0 has no tensor attn.qkv.weight"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace st
