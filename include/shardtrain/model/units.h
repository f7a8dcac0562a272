// The model as a list of units: the embedding, each transformer block, and the head.
//
// A unit is the granularity of sharding: its tensors are flattened, in the fixed order listed below,
// into one flat fp32 buffer. The layout depends only on the model config, never on the world size, so
// a rank that owns [offset, offset+count) of a unit can be resharded to any other world size.
//
// Flat order (shapes row-major; matrices in PyTorch nn.Linear layout [out, in]):
//   unit 0       "embedding": wte [Vp, C] (Vp = padded vocab; rows >= vocab_size are zero padding),
//                             wpe [T, C]
//   unit 1+l     "block.l":   ln1.weight [C], ln1.bias [C], attn.qkv.weight [3C, C], attn.qkv.bias [3C],
//                             attn.proj.weight [C, C], attn.proj.bias [C], ln2.weight [C], ln2.bias [C],
//                             mlp.fc.weight [4C, C], mlp.fc.bias [4C], mlp.proj.weight [C, 4C], mlp.proj.bias [C]
//   unit L+1     "head":      lnf.weight [C], lnf.bias [C]   (the LM head itself is wte, tied)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/core/config.h"

namespace st {

enum class InitKind {
  kNormal,        // N(0, 0.02)
  kResidualProj,  // N(0, 0.02 / sqrt(2 * n_layer)): projections that write into the residual stream
  kZeros,
  kOnes,
  kEmbeddingPadded,  // N(0, 0.02) for rows < vocab_size, zero for the padding rows
};

enum class UnitKind { kEmbedding, kBlock, kHead };

struct TensorSpec {
  std::string name;            // e.g. "attn.qkv.weight"
  std::vector<int64_t> shape;  // row-major
  int64_t offset = 0;          // first element in the unit's flat buffer
  int64_t numel = 0;
  InitKind init = InitKind::kNormal;
  bool weight_decay = false;  // AdamW decay: matrices of the blocks only
};

struct UnitLayout {
  UnitKind kind = UnitKind::kBlock;
  int index = 0;  // position in the unit list
  int layer = -1;  // block number for kBlock, -1 otherwise
  std::string name;  // "embedding", "block.3", "head"
  std::vector<TensorSpec> tensors;
  int64_t numel = 0;

  const TensorSpec& tensor(const std::string& name) const;  // throws if absent
};

// The unit list of a GPT-2 model: size n_layer + 2.
std::vector<UnitLayout> build_units(const ModelConfig& cfg);

// Total parameters over all units (padding rows of wte included: they are real memory).
int64_t count_params(const std::vector<UnitLayout>& units);

// Fills elements [begin, end) of the unit's flat buffer into out[0, end-begin) with GPT-2's
// initialisation. Each element is a pure function of (seed, unit index, flat index), so any shard of any
// world size initialises exactly as one process would.
void init_unit_range(const UnitLayout& unit, const ModelConfig& cfg, uint64_t seed, int64_t begin, int64_t end,
                     float* out);

}  // namespace st
