// The model as a list of units: the embedding, each transformer block, and the head.
//
// A unit is the granularity of sharding: its tensors are flattened, in a fixed order, into one flat fp32 buffer.
// The layout depends only on the model config, never on the world size, so a rank that owns [offset, offset+count)
// of a unit can be resharded to any other world size. Each family lists its tensors (matrices in PyTorch nn.Linear
// layout [out, in], row-major; Vp = the padded vocabulary, whose rows >= vocab_size are zero padding):
//
// gpt2 (src/model/gpt2/gpt2_family.cc):
//   unit 0       "embedding": wte [Vp, C], wpe [T, C]
//   unit 1+l     "block.l":   ln1.weight [C], ln1.bias [C], attn.qkv.weight [3C, C], attn.qkv.bias [3C],
//                             attn.proj.weight [C, C], attn.proj.bias [C], ln2.weight [C], ln2.bias [C],
//                             mlp.fc.weight [4C, C], mlp.fc.bias [4C], mlp.proj.weight [C, 4C], mlp.proj.bias [C]
//   unit L+1     "head":      lnf.weight [C], lnf.bias [C]   (the LM head is wte, tied)
// llama (src/model/llama/llama_family.cc), with D = C / H the head dimension, KV key/value heads, F = ffn_dim:
//   unit 0       "embedding": embed_tokens [Vp, C]
//   unit 1+l     "block.l":   attn_norm.weight [C], attn.qkv.weight [(H + 2 KV) D, C] (q, k, v projections stacked),
//                             attn.qkv.bias [(H + 2 KV) D] (model.qkv_bias only), attn.o.weight [C, C],
//                             mlp_norm.weight [C], mlp.gate_up.weight [2F, C] (gate, then up), mlp.down.weight [C, F]
//   unit L+1     "head":      norm.weight [C], lm_head [Vp, C] (untied only: tied, the LM head is embed_tokens)
//
// Each tensor has a role. Full fine-tuning trains every tensor. With LoRA (model.lora.rank > 0, model/lora.h) every
// tensor above is frozen and each block gains its adapters, "lora.<target>.A" [r, in] and "lora.<target>.B" [rows, r]
// for each targeted linear layer, in the family's order of its linear layers. A unit's trainable tensors come first
// in its flat buffer, [0, numel): that is the sharded state (master weights, gradients, AdamW moments); its frozen
// tensors follow, [numel, numel + frozen_numel): held in their storage dtype only, sharded and gathered the same way,
// never given a gradient. A wholly frozen unit (numel 0) has no gradient, reduce-scatter or optimizer step. With
// lora.base_dtype = nf4 a block's frozen segment is stored as QLoRA's NF4 instead (nf4_base, model/nf4_base.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/core/config.h"

namespace st {

enum class InitKind {
  kNormal,        // N(0, 0.02)
  kResidualProj,  // N(0, 0.02 / sqrt(2 * n_layer)): GPT-2's projections that write into the residual stream
  kZeros,
  kOnes,
  kEmbeddingPadded,  // N(0, 0.02) for rows < vocab_size, zero for the padding rows
  kKaimingUniform,   // U(-1/sqrt(in), 1/sqrt(in)) with in = shape.back(): PEFT's LoRA A (Kaiming-uniform, a = sqrt(5))
};

enum class UnitKind { kEmbedding, kBlock, kHead };

struct TensorSpec {
  std::string name;            // e.g. "attn.qkv.weight"
  std::vector<int64_t> shape;  // row-major
  int64_t offset = 0;          // first element in the unit's flat buffer (frozen tensors: >= the unit's numel)
  int64_t numel = 0;
  InitKind init = InitKind::kNormal;
  bool weight_decay = false;  // AdamW decay: the family's rule (both: the matrices of the blocks only; LoRA adapters)
  bool frozen = false;        // no gradient, no optimizer state (the LoRA base)
  // Where the tensor's random initialisation draws from: its offset in the unit without LoRA (an adapter's continues
  // past the base's), so a frozen base initialises as the same model trained in full.
  int64_t init_index = 0;
  // An NF4 base's matrix that stacks several Hugging Face linear layers (llama's q, k, v; gate, up): their row counts,
  // in order, each quantised as its own NF4 tensor as bitsandbytes quantises each layer (model/nf4_base.h). Empty:
  // the matrix is one layer.
  std::vector<int64_t> nf4_rows;
};

struct UnitLayout {
  UnitKind kind = UnitKind::kBlock;
  int index = 0;     // position in the unit list
  int layer = -1;    // block number for kBlock, -1 otherwise
  std::string name;  // "embedding", "block.3", "head"
  std::vector<TensorSpec> tensors;
  int64_t numel = 0;         // trainable elements: the sharded state
  int64_t frozen_numel = 0;  // frozen elements, after them
  // The frozen segment is stored as NF4 (lora.base_dtype = nf4: the blocks; model/nf4_base.h), not in the compute
  // dtype.
  bool nf4_base = false;

  const TensorSpec& tensor(const std::string& name) const;  // throws if absent
  const TensorSpec* find(const std::string& name) const;    // null if absent
};

// The unit list of the config's family (cfg.arch), with cfg.lora's adapters and roles: size n_layer + 2.
std::vector<UnitLayout> build_units(const ModelConfig& cfg);

// Appends a trainable tensor at the end of the unit's flat buffer (for the families' unit lists).
void add_tensor(UnitLayout& u, std::string name, std::vector<int64_t> shape, InitKind init, bool decay);

// Total parameters over all units, frozen ones included (padding rows of wte included: they are real memory).
int64_t count_params(const std::vector<UnitLayout>& units);
// The trainable ones only (the sharded state's elements).
int64_t count_trainable_params(const std::vector<UnitLayout>& units);

// A unit's trainable or frozen segment: [0, numel) or [numel, numel + frozen_numel) of its flat buffer.
enum class Segment { kTrainable, kFrozen };

// Fills elements [begin, end) of the unit's segment (offsets relative to the segment's start) into out[0, end-begin)
// with each tensor's InitKind. Each element is a pure function of (seed, unit index, the tensor's init_index and
// the element), so any shard of any world size initialises exactly as one process would.
void init_unit_range(const UnitLayout& unit, const ModelConfig& cfg, uint64_t seed, int64_t begin, int64_t end,
                     float* out, Segment segment = Segment::kTrainable);

// What a unit's flat buffer holds: its parameters (every tensor), or its gradients (the trainable tensors only).
enum class ViewOf { kParams, kGrads };

// The tensor's place in a unit's buffer; null in a gradient buffer for a frozen tensor, which has no gradient.
template <typename P>
P* tensor_in(P* buffer, const TensorSpec& t, ViewOf of = ViewOf::kParams) {
  return of == ViewOf::kGrads && t.frozen ? nullptr : buffer + t.offset;
}

}  // namespace st
