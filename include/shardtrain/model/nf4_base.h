// QLoRA's frozen base (lora.base_dtype = nf4): how a block's frozen segment (units.h) is stored as NF4.
//
// Each Hugging Face linear layer of a block is quantised whole, as one NF4 tensor (kernels/nf4.h: its absmax mean is
// the layer's), as bitsandbytes quantises it: a matrix that stacks several (llama's q, k, v and gate, up:
// TensorSpec::nf4_rows) is several NF4 tensors. The storage depends on the unit list only, never on the world size.
// The block's other frozen tensors (norm weights, biases) keep fp32 values. One unit's storage is one buffer, its parts
// back to back in tensor order, each starting on a 16-byte boundary (nf4_layout's sections align with it), padded to
// whole 4-byte words: that buffer is what the ranks shard and gather, as words, like a unit's parameters.
//
//   const Nf4UnitStorage s = nf4_unit_storage(unit);           // unit.nf4_base
//   std::vector<float> words(s.words);                         // the storage, 4-byte words
//   nf4_quantize_unit(unit, s, segment.data(), storage_bytes(words));   // segment: the frozen_numel weights
//   nf4_dequantize_unit(unit, s, storage_bytes(words), back.data());    // the weights as the model computes with them
//
// The host view of an NF4 unit (model_backend.h) is its whole frozen segment, since a rank quantises whole tensors:
// pull_unit fills it with kUnwrittenFrozen, and push_unit quantises it again only if it was written (every frozen
// tensor) — a unit pulled for its adapters alone keeps its base as it was.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/kernels/nf4.h"
#include "shardtrain/model/units.h"

namespace st {

struct Nf4Part {
  int tensor = 0;     // index in unit.tensors (a frozen tensor)
  int64_t first = 0;  // its elements [first, first + numel) (a layer's rows of a stacked matrix; else all)
  int64_t numel = 0;
  int64_t byte_offset = 0;  // in the unit's storage
  int64_t bytes = 0;
  bool quantized = false;  // NF4 (nf4_layout(numel)); else numel fp32 values
};

struct Nf4UnitStorage {
  std::vector<Nf4Part> parts;  // the unit's frozen tensors, in order
  int64_t words = 0;           // 4-byte words of the whole storage
};

// The storage of `unit`'s frozen segment (unit.nf4_base; kInternal otherwise).
Nf4UnitStorage nf4_unit_storage(const UnitLayout& unit);

// The unit's storage in `storage` (s.words * 4 bytes, 4-byte aligned, every byte written) from its frozen segment
// (frozen_numel weights, in unit order, as init_unit_range's kFrozen segment). A non-finite weight is refused
// (kBadInput) naming "<unit>.<tensor>" and the element.
void nf4_quantize_unit(const UnitLayout& unit, const Nf4UnitStorage& s, const float* segment, uint8_t* storage);

// The frozen segment as the model computes with it: each quantised weight dequantised (nf4_dequantize), the rest
// as stored.
void nf4_dequantize_unit(const UnitLayout& unit, const Nf4UnitStorage& s, const uint8_t* storage, float* segment);

// "block.3.attn.qkv.weight rows [0, 64)": what errors call a part (the whole tensor's name when it is one part).
std::string nf4_part_name(const UnitLayout& unit, const Nf4Part& p);

// The value pull_unit fills an NF4 unit's frozen view with: a NaN, which no loader writes (they refuse non-finite
// weights before a push).
float unwritten_frozen();

// Whether the view (the whole frozen segment) was written since the pull: true when every frozen tensor's first
// element differs from unwritten_frozen()'s bits, false when none does, and kInternal when some do and some don't.
bool nf4_view_written(const UnitLayout& unit, const float* segment);

// The 4-byte words as bytes (the storage of the CPU backend and of the host, moved as floats by Communicator).
inline uint8_t* storage_bytes(std::vector<float>& words) { return reinterpret_cast<uint8_t*>(words.data()); }
inline const uint8_t* storage_bytes(const std::vector<float>& words) {
  return reinterpret_cast<const uint8_t*>(words.data());
}

}  // namespace st
