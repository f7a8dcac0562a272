// LoRA (Hu et al., 2021, as Hugging Face PEFT computes it): a targeted linear layer y = W x + b of a block becomes
//   y = W x + b + scale * B (A dropout(x)),   A [r, in], B [rows, r], scale = alpha / r (alpha / sqrt(r): rsLoRA)
// with W, b and every other tensor of the model frozen. A starts Kaiming-uniform (a = sqrt(5)), B at zero, so the
// adapted model starts equal to its base.
//
// A family names its linear layers as LoraLinear rows: a row slice of one of its block tensors. Llama's q, k and v
// are row slices of the stacked attn.qkv.weight and its gate and up of mlp.gate_up.weight, each with an adapter of
// its own (PEFT's q_proj, k_proj, ... modules); gpt2's qkv is the whole attn.qkv.weight (PEFT's c_attn).
//
//   for (const LoraAdapter& a : lora_adapters(units[1 + l], cfg.model))   // the block's adapters, family order
//     ... a.linear.weight == "attn.qkv.weight", a.a_offset, a.b_offset ...
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/model/units.h"

namespace st {

// One linear layer of a block that LoRA can target.
struct LoraLinear {
  std::string name;       // as lora.targets names it: "q", "gate", "fc_proj"
  std::string weight;     // the block tensor [out, in] it computes rows of: "attn.qkv.weight"
  int64_t row0 = 0;       // its first row of that tensor's output
  int64_t rows = 0;       // its output features
  int64_t in = 0;         // its input features
  std::string hf_module;  // its module in the Hugging Face model, under each layer: "self_attn.q_proj"
};

// The family's linear layers, in its order (llama: q k v o gate up down; gpt2: qkv proj fc fc_proj).
std::vector<LoraLinear> lora_linears(const ModelConfig& cfg);

// The layers cfg.lora.targets selects, in the family's order. kBadInput naming lora.targets and the family's names
// for a name that is not one of them, a repeated one, or an empty list.
std::vector<LoraLinear> lora_targets(const ModelConfig& cfg);

// alpha / rank, or alpha / sqrt(rank) with rslora.
float lora_scale(const LoraConfig& lora);

// An adapter of a block unit: its layer and where A and B lie in the unit's flat buffer (trainable, so also in its
// gradient buffer).
struct LoraAdapter {
  LoraLinear linear;
  int64_t rank = 0;
  int64_t a_offset = 0, b_offset = 0;
};

// The unit's adapters, in the family's order (empty without LoRA and for the embedding and the head).
std::vector<LoraAdapter> lora_adapters(const UnitLayout& unit, const ModelConfig& cfg);

// The adapters of every block of the unit list (units[1 .. n_layer]), which all lay them out alike (checked), so one
// list serves the models for every block; empty without LoRA or blocks.
std::vector<LoraAdapter> block_lora_adapters(const std::vector<UnitLayout>& units, const ModelConfig& cfg);

// Each adapter's place in the family's lora_linears (what its dropout stream is keyed by, kernels/lora.h), and the
// widest input among them (the width of the dropout buffers).
std::vector<int> lora_linear_indices(const std::vector<LoraAdapter>& adapters, const ModelConfig& cfg);
int64_t widest_lora_input(const std::vector<LoraAdapter>& adapters);

// Elements a model keeps for its adapters: h [max_rows, rank] for each adapter of `slots` blocks (those whose
// activations it keeps at once: n_layer, or 1 with recompute), one dh [max_rows, rank x the most adapters on one
// weight] of backward scratch and, with lora.dropout, the dropped input and its gradient [max_rows, the widest
// adapter's in] each. 0 without LoRA or blocks.
int64_t lora_activation_elems(const ModelConfig& cfg, int64_t max_rows, int64_t slots);

// The model without adapters: cfg with lora.rank 0, whose unit list is the family's own.
ModelConfig base_model(const ModelConfig& cfg);

// Every unit's full flat buffer (numel + frozen_numel elements: trainable tensors, then frozen ones, as units.h
// lays them out) turned into the base model's buffers (base_model's unit list) with each adapter merged into its
// weight: W[row0 + i, :] += scale * (B A)[i, :], summed in double and rounded once. Without LoRA, `full` itself. An
// empty buffer (a unit another stage of a layer split holds, decoder_stage.h) stays empty.
std::vector<std::vector<float>> merge_lora(const ModelConfig& cfg, const std::vector<UnitLayout>& units,
                                           std::vector<std::vector<float>> full);
// One unit of merge_lora (cfg has adapters): `unit` of cfg's unit list, `full` its buffer, as `base_unit` (the same
// unit of base_model(cfg)'s list) with its adapters merged in.
std::vector<float> merge_lora_unit(const ModelConfig& cfg, const UnitLayout& unit, const UnitLayout& base_unit,
                                   const std::vector<float>& full);

// w[i, :] += scale * (B A)[i, :] for the `rows` rows of w (row-major, `in` wide), B [rows, r], A [r, in]: each element
// summed in double and rounded once. What merge_lora and a merged export add to an adapted weight.
void add_lora_delta(float* w, const float* A, const float* B, int64_t rows, int64_t in, int64_t r, float scale);

// Turns a family's unit list into its LoRA unit list (cfg.lora.rank > 0): every tensor frozen, each block's adapters
// appended (every A, then every B, in the family's order), trainable tensors laid out first (units.h).
void add_lora(std::vector<UnitLayout>& units, const ModelConfig& cfg);

}  // namespace st
